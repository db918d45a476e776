"""Every import inside rlfleet, type-only and function-level ones included, points one way.

The graph's nodes are our modules (a package's ``__init__`` is the package's node); an edge is
any import statement anywhere in the file: at module level, under ``if TYPE_CHECKING:`` or
inside a function. A lazy or type-only import hides a circle at run time, not in the design,
so the graph must have no cycle at all.

Inside ``actor_service`` the roles are layers (``_cli`` over ``_serve`` over ``_kinds`` over
``_core``), each kind of actor is one folder under ``_kinds`` that imports no other kind, and
no kind's helper is left flat at the package's top.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("common", "actor_service", "learner_client", "apps")
KINDS = "actor_service._kinds"
#: The module beside the kind folders that names every kind (it imports each kind's core).
REGISTRY = KINDS + ".registry"
#: The roles of ``actor_service``, lowest first: a role imports only the ones before it.
ACTOR_LAYERS = ("actor_service._core", KINDS, "actor_service._serve", "actor_service._cli")
#: File names of kind helpers (TensorDict, LLM, vLLM, TorchRL, env) that belong in a kind folder.
KIND_HELPER = re.compile(r"^_(td|llm|vllm|torchrl|env)[_.]")


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


def kind_of(module: str) -> str | None:
    """The actor kind whose folder holds ``module`` (``actor_service._kinds.<kind>...``), if any."""
    prefix = KINDS + "."
    if module == REGISTRY or not module.startswith(prefix):
        return None
    return module[len(prefix) :].split(".")[0]


def imports_between_kinds(edges: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import from one actor kind's folder into another's."""
    return sorted(
        f"{source} -> {target}"
        for source, targets in edges.items()
        for target in targets
        if kind_of(source) and kind_of(target) and kind_of(source) != kind_of(target)
    )


def layer_of(module: str) -> int | None:
    """The index of ``module``'s role in :data:`ACTOR_LAYERS`, if it has one."""
    for index, layer in enumerate(ACTOR_LAYERS):
        if module == layer or module.startswith(layer + "."):
            return index
    return None


def upward_actor_imports(edges: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import from an actor role into a role above it."""
    found = []
    for source, targets in edges.items():
        low = layer_of(source)
        for target in targets:
            high = layer_of(target)
            if low is not None and high is not None and high > low:
                found.append(f"{source} -> {target}")
    return sorted(found)


def test_actor_kinds_import_no_other_kind() -> None:
    assert imports_between_kinds(graph()) == []


def test_actor_roles_import_only_the_roles_below() -> None:
    assert upward_actor_imports(graph()) == []


def test_actor_kind_helpers_live_in_their_kind_folder() -> None:
    flat = [
        str(path.relative_to(ROOT))
        for folder in (ROOT / "actor_service", ROOT / "actor_service" / "_core")
        for path in sorted(folder.glob("*.py"))
        if KIND_HELPER.match(path.name)
    ]
    assert flat == []


def test_imports_between_kinds_and_upward_are_found() -> None:
    edges = {
        f"{KINDS}.env.core": {f"{KINDS}.torchrl.batch", "actor_service._core._frames"},
        f"{KINDS}.llm.turns": {f"{KINDS}.llm.models"},
        "actor_service._core._base": {f"{KINDS}.env.pool"},
        KINDS: {f"{KINDS}.env.core", f"{KINDS}.llm.core"},
    }
    assert imports_between_kinds(edges) == [
        f"{KINDS}.env.core -> {KINDS}.torchrl.batch",
    ]
    assert upward_actor_imports(edges) == [f"actor_service._core._base -> {KINDS}.env.pool"]
    assert KIND_HELPER.match("_td_batch.py")
    assert KIND_HELPER.match("_vllm_engine.py")
    assert KIND_HELPER.match("_torchrl.py")
    assert not KIND_HELPER.match("_frames.py")
