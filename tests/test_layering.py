"""Dependencies point one way (common <- actor_service, learner_client <- apps); no torchrl.

The libraries (``common``, ``actor_service``, ``learner_client``) never import torchrl, nor the
applications built on them (``apps``), except where TorchRL interop is asked for by name:
``rlfleet-grpo --loss torchrl`` in ``apps`` and the TorchRL-env actor (``--kind torchrl``, the
``rlfleet[torchrl]`` extra) in ``actor_service``. Each has one module that may import torchrl
inside its functions (on that path only, never when a package loads).

A package uses another package only through its public modules: ``common._x`` is private to
``common``, whoever imports it.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "common": {"actor_service", "learner_client", "apps", "torchrl", "bench"},
    "actor_service": {"learner_client", "apps", "torchrl", "bench"},
    "learner_client": {"actor_service", "apps", "torchrl", "bench"},
    "apps": {"torchrl", "bench"},
}
OUR_PACKAGES = ("common", "actor_service", "learner_client", "apps", "bench")
#: Modules that may import these packages inside functions (never at module level).
LAZY_INTEROP = {
    "apps/grpo/_torchrl_loss.py": {"torchrl"},
    "actor_service/_kinds/torchrl/core.py": {"torchrl"},
    "actor_service/_kinds/torchrl/pool.py": {"torchrl"},
}


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every absolute import; ``from a import b`` gives ``a.b``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _imported_packages(path: pathlib.Path) -> set[str]:
    """Top-level packages imported, leaving out the lazy interop imports allowed for ``path``."""
    lazy = LAZY_INTEROP.get(_shown(path), set()) & _function_local_packages(path)
    return {name.split(".")[0] for _, name in _imports(path)} - lazy


def _function_local_packages(path: pathlib.Path) -> set[str]:
    """Packages imported only inside function bodies (none at module or class level)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    inside = {
        id(node)
        for func in ast.walk(tree)
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(func)
    }
    packages: dict[str, bool] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and getattr(node, "level", 0) == 0:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            for name in names:
                top = (name or "").split(".")[0]
                packages[top] = packages.get(top, True) and id(node) in inside
    return {top for top, only_inside in packages.items() if only_inside}


def private_imports(path: pathlib.Path, package: str) -> list[str]:
    """``file:line: name`` of every import of another package's private (``_``) module or name."""
    found = []
    for line, name in _imports(path):
        top, *rest = name.split(".")
        if top == package or top not in OUR_PACKAGES:
            continue
        if any(part.startswith("_") and not part.startswith("__") for part in rest):
            found.append(f"{_shown(path)}:{line}: {name}")
    return found


def _shown(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_point_one_way(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_packages(path) & FORBIDDEN[package])
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.parametrize("package", OUR_PACKAGES)
def test_package_imports_no_private_module_of_another_package(package: str) -> None:
    offenders = [
        offender
        for path in sorted((ROOT / package).rglob("*.py"))
        for offender in private_imports(path, package)
    ]
    assert not offenders, "import the public name instead:\n" + "\n".join(offenders)


def test_lazy_interop_imports_must_stay_inside_functions(tmp_path: pathlib.Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    import torchrl\n")
    assert _function_local_packages(probe) == {"torchrl"}
    probe.write_text("import torchrl\n\ndef f():\n    import torchrl.objectives\n")
    assert _function_local_packages(probe) == set()


def test_private_imports_are_found_in_every_import_form(tmp_path: pathlib.Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import common._protowire\n"
        "from common._protowire import varint\n"
        "from common import _protowire\n"
        "from common.errors import RlfleetError\n"
        "from learner_client._fleet import Fleet\n"
        "from common.rlfleet.v1 import actor_service_pb2\n"
        "import torch._dynamo\n"
        "from bench import __version__\n"
    )
    assert private_imports(probe, "learner_client") == [
        f"{probe}:1: common._protowire",
        f"{probe}:2: common._protowire.varint",
        f"{probe}:3: common._protowire",
    ]
