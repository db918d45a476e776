"""Every import inside rlfleet, type-only and function-level ones included, points one way.

The graph's nodes are our modules (a package's ``__init__`` is the package's node); an edge is
any import statement anywhere in the file: at module level, under ``if TYPE_CHECKING:`` or
inside a function. A lazy or type-only import hides a circle at run time, not in the design,
so the graph must have no cycle at all.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("common", "actor_service", "learner_client", "apps")


def module_name(path: pathlib.Path) -> str:
    """The dotted module name of ``path`` under ROOT (``a/b/__init__.py`` is ``a.b``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, pathlib.Path]:
    """Every module of our packages, generated stubs left out."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "_pb2" not in path.name:
                found[module_name(path)] = path
    return found


def imported(path: pathlib.Path, name: str, known: set[str]) -> set[str]:
    """Our modules that ``path`` (module ``name``) imports, anywhere in the file."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            candidates = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for candidate in candidates:
            target = _longest_known(candidate, known)
            if target is not None and target != name:
                found.add(target)
    return found


def _longest_known(dotted: str, known: set[str]) -> str | None:
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return None


def graph() -> dict[str, set[str]]:
    """``{module: modules it imports}`` over all our packages."""
    found = modules()
    known = set(found)
    return {name: imported(path, name, known) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_import_graph_has_no_cycle() -> None:
    assert cycles(graph()) == []


def test_cycles_are_found_through_type_only_and_function_level_imports(
    tmp_path: pathlib.Path,
) -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.low import X\n"
        "def f():\n    from pkg import other, top\n"
    )
    assert imported(probe, "pkg.top", {"pkg.low", "pkg.other", "pkg.top"}) == {
        "pkg.low",
        "pkg.other",
    }
