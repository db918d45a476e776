"""Reads the Markdown docs: fenced code blocks, relative links, heading anchors, test references.

The rules (documented in docs/development.md): every ```` ```python ```` block runs unless the
line just before its fence is ``<!-- docs-test: skip (reason) -->``; every relative link points
at an existing file and every ``#anchor`` at a heading of its target; every
``tests/<path>.py::test_name`` names a test that exists; every file path of ours in
backticks exists; every class of ours built in inline code (```DnsWatcher(...)```) is one a
public module exports.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]

_FENCE = re.compile(r"^ {0,3}(`{3,})(.*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:(.*?)-->\s*$")
_SKIP = re.compile(r"^\s*skip \((.+)\)\s*$")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_TEST_REF = re.compile(r"\b(tests/[\w/]+\.py)::(\w+)")


def doc_files(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """README.md and every page under docs/."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block: where it starts, its language, its code and its skip reason."""

    path: pathlib.Path
    line: int
    language: str
    code: str
    skip_reason: str | None

    @property
    def where(self) -> str:
        """``file:line`` of the opening fence, relative to the repository root."""
        return f"{_relative(self.path)}:{self.line}"


def code_blocks(path: pathlib.Path) -> list[Block]:
    """Every fenced code block of a Markdown file, with its skip marker if it has one.

    Raises:
        ValueError: A fence is never closed, or a ``docs-test`` comment is malformed.
    """
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        ticks, info = opening.group(1), opening.group(2).strip()
        end = next(
            (
                j
                for j in range(i + 1, len(lines))
                if re.fullmatch(rf" {{0,3}}{ticks}`*\s*", lines[j])
            ),
            None,
        )
        if end is None:
            raise ValueError(f"{_relative(path)}:{i + 1}: code fence never closed")
        language = info.split()[0] if info else ""
        reason = _skip_reason(path, lines[i - 1] if i else "", i)
        blocks.append(Block(path, i + 1, language, "\n".join(lines[i + 1 : end]) + "\n", reason))
        i = end + 1
    return blocks


def _skip_reason(path: pathlib.Path, previous: str, index: int) -> str | None:
    marker = _MARKER.match(previous)
    if not marker:
        return None
    skip = _SKIP.match(marker.group(1))
    if not skip:
        raise ValueError(
            f"{_relative(path)}:{index}: malformed marker {previous.strip()!r}; "
            "write <!-- docs-test: skip (reason) -->"
        )
    return skip.group(1)


def prose_lines(path: pathlib.Path) -> list[tuple[int, str]]:
    """``(line number, text)`` of the lines outside code blocks, inline code removed."""
    return [(number, _INLINE_CODE.sub("", text)) for number, text in _outside_blocks(path)]


def _outside_blocks(path: pathlib.Path) -> list[tuple[int, str]]:
    inside = set()
    for block in code_blocks(path):
        inside.update(range(block.line, block.line + block.code.count("\n") + 2))
    lines = path.read_text().splitlines()
    return [(number, text) for number, text in enumerate(lines, 1) if number not in inside]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's ``-1``, ``-2`` for repeats."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, text in _outside_blocks(path):
        heading = _HEADING.match(text)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """Every relative link of a Markdown file whose file or anchor does not exist."""
    problems = []
    for number, text in prose_lines(path):
        for target in _LINK.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # http:, https:, mailto: are not followed
            problem = _check_target(path, target, root)
            if problem:
                problems.append(f"{_relative(path)}:{number}: {target}: {problem}")
    return problems


def _check_target(path: pathlib.Path, target: str, root: pathlib.Path) -> str | None:
    file_part, _, anchor = target.partition("#")
    destination = (path.parent / file_part).resolve() if file_part else path
    if not destination.is_relative_to(root.resolve()):
        return "points outside the repository"
    if not destination.exists():
        return "no such file"
    if not anchor:
        return None
    if destination.suffix != ".md":
        return "an anchor into a file that is not Markdown"
    if anchor not in anchors(destination):
        return f"no heading with anchor #{anchor} in {_relative(destination)}"
    return None


def missing_tests(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """Every ``tests/<path>.py::test_name`` in a Markdown file that names no existing test."""
    problems = []
    for number, text in enumerate(path.read_text().splitlines(), 1):
        for file_name, test_name in _TEST_REF.findall(text):
            test_file = root / file_name
            if not test_file.exists():
                problems.append(f"{_relative(path)}:{number}: {file_name}: no such file")
            elif test_name not in _function_names(test_file):
                problems.append(f"{_relative(path)}:{number}: no {test_name} in {file_name}")
    return problems


#: A file path in backticks (`actor_service/_kinds/env/core.py`, `_core/_base.py`).
_PATH_REF = re.compile(r"`([\w.-]+(?:/[\w.-]+)+\.(?:py|md|sh|toml|proto|ya?ml|json|txt))`")
#: The repository's top folders: a path starting with one is the project's own.
_OURS = (
    "actor_service",
    "learner_client",
    "common",
    "apps",
    "tests",
    "bench",
    "docs",
    "scripts",
    "docker",
    "protos",
    ".ci",
)
#: Where a path starting with a private module (``_core/...``) is looked up.
_PRIVATE_HOMES = ("actor_service", "learner_client", "common", "tests/actor_service")


def missing_paths(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """Every path of the project's own in backticks (not another repository's) that is gone."""
    problems = []
    for number, text in _outside_blocks(path):
        for ref in _PATH_REF.findall(text):
            first = ref.split("/")[0]
            if first.startswith("_"):
                homes = [root / home / ref for home in _PRIVATE_HOMES]
            elif first in _OURS:
                homes = [root / ref]
            else:
                continue  # TorchRL's or a user's file
            if not any(home.exists() for home in homes):
                problems.append(f"{_relative(path)}:{number}: `{ref}`: no such file")
    return problems


#: A class called in inline code (`DnsWatcher(target)`), not a method (`.Name(`).
_CLASS_CALL = re.compile(r"(?<![\w.])([A-Z]\w*)\(")
#: The packages whose classes a reader may build: their public modules and ``__all__``.
_PACKAGES = ("actor_service", "learner_client", "common", "apps")


def private_classes(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """Every class of ours built in inline code that no public module or ``__all__`` exports."""
    defined, public = _our_classes(root)
    problems = []
    for number, text in _outside_blocks(path):
        for span in _INLINE_CODE.finditer(text):
            for name in _CLASS_CALL.findall(span.group(0)):
                if name in defined and name not in public:
                    problems.append(
                        f"{_relative(path)}:{number}: `{name}(...)`: a private class; "
                        "name a public one (a package's __all__ or a module without _)"
                    )
    return problems


@functools.cache
def _our_classes(root: pathlib.Path) -> tuple[frozenset[str], frozenset[str]]:
    """``(every top-level class of our packages, those a public module or __all__ exports)``."""
    defined: set[str] = set()
    public: set[str] = set()
    for package in _PACKAGES:
        for module in (root / package).rglob("*.py"):
            parts = module.relative_to(root).parts
            tree = ast.parse(module.read_text(), filename=str(module))
            classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
            defined |= classes
            if any(part.startswith("_") and part != "__init__.py" for part in parts):
                continue
            public |= {name for name in classes if not name.startswith("_")}
            public |= _all_names(tree)
    return frozenset(defined), frozenset(public)


def _all_names(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return set()


def _function_names(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def _relative(path: pathlib.Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
