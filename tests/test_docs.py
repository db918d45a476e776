"""The docs are checked: every runnable code block runs, every link and test reference resolves.

The conventions are in docs/development.md ("Documentation"); the reader is tests/docs_check.py.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest
from docs_check import (
    ROOT,
    anchors,
    broken_links,
    code_blocks,
    doc_files,
    missing_paths,
    missing_tests,
    private_classes,
    slug,
)

_BLOCK_TIMEOUT = 120


# TorchRL 0.14.1 warns about its own classes (``WeightUpdaterBase`` subclasses) when its
# collectors module is imported; the warning is attributed to ``abc``, whose ``__new__`` runs
# the subclass hook.
_TORCHRL_OWN_WARNING = "ignore::DeprecationWarning:abc"


def _python_blocks() -> list:
    return [
        pytest.param(block, id=block.where)
        for path in doc_files()
        for block in code_blocks(path)
        if block.language == "python"
    ]


@pytest.mark.long
@pytest.mark.parametrize("block", _python_blocks())
def test_docs_python_block_runs(block, tmp_path: pathlib.Path) -> None:
    if block.skip_reason:
        pytest.skip(block.skip_reason)
    script = tmp_path / "block.py"
    script.write_text(block.code)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-W", "error", "-W", _TORCHRL_OWN_WARNING, str(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=_BLOCK_TIMEOUT,
    )
    assert done.returncode == 0, f"{block.where} failed:\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_links_and_anchors_resolve(path: pathlib.Path) -> None:
    assert broken_links(path) == []


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_only_tests_that_exist(path: pathlib.Path) -> None:
    assert missing_tests(path) == []


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_only_files_of_ours_that_exist(path: pathlib.Path) -> None:
    assert missing_paths(path) == []


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_build_only_classes_a_public_module_exports(path: pathlib.Path) -> None:
    assert private_classes(path) == []


def test_docs_pages_are_all_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    unlinked = [p.name for p in doc_files()[1:] if f"(docs/{p.name})" not in readme]
    assert unlinked == []


def test_docs_readme_is_a_first_read() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 230, f"README.md has {lines} lines; move reference material into docs/"


def test_docs_runtime_dependencies_name_every_package_and_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    text = (ROOT / "docs" / "development.md").read_text()
    section = text.split("## Runtime dependencies", 1)[1].split("\n## ", 1)[0]
    required = [re.match(r"[\w.-]+", dep).group(0) for dep in project["dependencies"]]
    unnamed = [
        name
        for name in required
        if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", section)
    ]
    unnamed += [
        f"[{extra}]"
        for extra in project["optional-dependencies"]
        if extra not in {"dev", "test"} and f"`{extra}`" not in section
    ]
    assert unnamed == [], f"docs/development.md's runtime dependencies leave out {unnamed}"


def test_docs_most_python_blocks_run() -> None:
    blocks = [b for b in _python_blocks() if b.values[0].skip_reason is None]
    assert len(blocks) >= 8  # the convention has teeth: most examples run


def test_slug_follows_githubs_rule() -> None:
    assert slug("Tensor frames (`common/frames.py`)") == "tensor-frames-commonframespy"
    assert slug("The rest of TorchRL's API") == "the-rest-of-torchrls-api"
    assert slug("3. Weight push (`bench/weight_push.py`)") == "3-weight-push-benchweight_pushpy"


def test_checker_reports_a_broken_link_anchor_and_test(tmp_path: pathlib.Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def test_real():\n    pass\n")
    (docs / "a.md").write_text("# A\n\n## Real heading\n")
    page = docs / "b.md"
    page.write_text(
        "# B\n\n[ok](a.md#real-heading) [file](missing.md) [anchor](a.md#nowhere)\n"
        "[self](#b) [outside](../../etc/passwd) `[in code](missing.md)`\n"
        "```python\n[in a block](missing.md)\n```\n"
        "tests/test_x.py::test_real tests/test_x.py::test_gone tests/test_y.py::test_real\n"
    )
    assert anchors(docs / "a.md") == {"a", "real-heading"}
    problems = broken_links(page, root=tmp_path)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "missing.md: no such file",
        "a.md#nowhere: no heading with anchor #nowhere in " + str((docs / "a.md").resolve()),
        "../../etc/passwd: points outside the repository",
    ]
    assert len(missing_tests(page, root=tmp_path)) == 2


def test_checker_reports_a_class_built_in_prose_that_only_a_private_module_holds(
    tmp_path: pathlib.Path,
) -> None:
    package = tmp_path / "learner_client"
    package.mkdir()
    (package / "__init__.py").write_text('__all__ = ["Shown"]\n')
    (package / "_inner.py").write_text("class Shown: ...\nclass Hidden: ...\n")
    page = tmp_path / "a.md"
    page.write_text(
        "`Shown(1)` and `x = Hidden(2)`; `obj.Hidden(3)` is a method, `Hidden` is not built,\n"
        "`GymEnv(4)` is not ours.\n```python\nHidden(5)\n```\n"
    )
    problems = private_classes(page, root=tmp_path)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "`Hidden(...)`: a private class; name a public one (a package's __all__ or a module "
        "without _)"
    ]


def test_checker_reads_skip_markers_and_refuses_malformed_ones(tmp_path: pathlib.Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "<!-- docs-test: skip (needs a cluster) -->\n```python\nx = 1\n```\n\n"
        "````markdown\n```python\nnot a block\n```\n````\n"
    )
    blocks = code_blocks(page)
    assert [(b.line, b.language, b.skip_reason) for b in blocks] == [
        (2, "python", "needs a cluster"),
        (6, "markdown", None),
    ]
    page.write_text("<!-- docs-test: skipp -->\n```python\nx = 1\n```\n")
    with pytest.raises(ValueError, match="malformed marker"):
        code_blocks(page)
    page.write_text("```python\nx = 1\n")
    with pytest.raises(ValueError, match="never closed"):
        code_blocks(page)
