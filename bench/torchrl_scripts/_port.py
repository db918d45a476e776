"""The port of a TorchRL script: its ``Collector(...)`` call becomes a ``GrpcCollector``.

:func:`port_source` rewrites one file's source and nothing else of it: the statement that
builds the collector gets the fleet as the first argument, ``sync=True`` and the
script's own arguments (positional ones by their TorchRL names), and is preceded by one
line making the fleet (``fleet = LocalFleet(...)``: the collector given the fleet starts it
and stops it at ``shutdown()``, also where a helper builds and returns the collector); one
import line and a header comment are added. The rest of the file is left byte for byte.
:func:`check_port` is the other side of that promise: it diffs an original against a
port and names every line changed outside the collector statement, so a test fails when a
port changes anything else.

``sync=True`` is the one argument the port adds: TorchRL's ``Collector`` collects each
batch after the previous update, which a fleet does in sync mode (its default,
``sync=False``, keeps a batch ahead per actor, as ``MultiaSyncCollector`` does). A script
that passes ``sync=`` itself (``Collector(..., num_collectors=N, sync=False)``, TorchRL's
``MultiaSyncCollector`` form) keeps its own.

A script may build its collector with one of ``torchrl.trainers.helpers``' collector helpers
instead, as ``helper(**kwargs)`` with ``kwargs`` a dict literal of the same source (``redq``'s
``collector_helper(**collector_helper_kwargs)``): the port then passes ``sync=helper is
sync_sync_collector`` (``sync_sync_collector`` builds a ``MultiSyncCollector``,
``sync_async_collector`` a ``MultiaSyncCollector``) and each key of the dict by its
``Collector`` name, read from the dict; the keys that lay the envs out (``env_kwargs``,
``num_env_per_collector``, ``num_collectors``) are the fleet's to say, not the collector's.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib

__all__ = ["IMPORT_LINES", "PortError", "check_port", "collector_call", "port_source"]

#: TorchRL 0.14.1 ``Collector``'s first positional parameters, for positional arguments.
_POSITIONAL = ("create_env_fn", "policy")
#: A collector helper's keyword names that ``Collector`` spells otherwise.
_HELPER_RENAMED = {"env_fns": "create_env_fn"}
#: A collector helper's keywords that lay the envs out: on a fleet, its actors and ``num_envs``.
_HELPER_LAYOUT = ("env_kwargs", "num_env_per_collector", "num_collectors")
_MARK = "# rlfleet"
IMPORT_LINES = (
    "from learner_client import GrpcCollector, LocalFleet  # rlfleet: the fleet's collector",
)
_HEADER = (
    "# rlfleet port: this file is TorchRL's, unchanged but for the statement that builds the",
    "# collector (a LocalFleet of actors on the script's own env and policy factories, and a",
    "# GrpcCollector over it with the script's collector arguments): bench/torchrl_scripts.",
)


class PortError(ValueError):
    """A script's collector cannot be found, or a port changes more than its collector."""


@dataclasses.dataclass(frozen=True)
class CollectorCall:
    """Where the ``Collector(...)`` call is: its statement's lines (1-based, inclusive)."""

    call: ast.Call
    first_line: int
    last_line: int


def collector_call(source: str, name: str = "Collector") -> CollectorCall:
    """The one call to ``name`` in ``source`` and the statement that holds it.

    Raises:
        PortError: No such call, or more than one.
    """
    tree = ast.parse(source)
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
    ]
    if len(calls) != 1:
        raise PortError(f"expected one call to {name}(...), found {len(calls)}")
    (call,) = calls
    statements = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.stmt)
        and not isinstance(node, ast.FunctionDef | ast.If | ast.With | ast.For | ast.Try)
        and node.lineno <= call.lineno
        and (node.end_lineno or 0) >= (call.end_lineno or 0)
    ]
    innermost = max(statements, key=lambda node: node.lineno)
    return CollectorCall(call, innermost.lineno, innermost.end_lineno or innermost.lineno)


def _arguments(source: str, call: ast.Call) -> list[str]:
    """The call's arguments as ``name=expression`` source text, positional ones named."""
    if isinstance(call.func, ast.Name) and call.func.id not in ("Collector", "GrpcCollector"):
        return _helper_arguments(source, call)
    if len(call.args) > len(_POSITIONAL):
        raise PortError(f"Collector(...) has {len(call.args)} positional arguments")
    texts = [
        f"{name}={ast.get_source_segment(source, arg)}"
        for name, arg in zip(_POSITIONAL, call.args, strict=False)
    ]
    for keyword in call.keywords:
        if keyword.arg is None:
            raise PortError("Collector(**kwargs) cannot be ported by name")
        texts.append(str(ast.get_source_segment(source, keyword)))
    return texts


def _helper_arguments(source: str, call: ast.Call) -> list[str]:
    """A collector helper's ``helper(**kwargs)`` as ``GrpcCollector`` arguments (module doc)."""
    helper = ast.unparse(call.func)
    (keyword,) = call.keywords if len(call.keywords) == 1 and not call.args else (None,)
    if keyword is None or keyword.arg is not None or not isinstance(keyword.value, ast.Name):
        raise PortError(f"expected {helper}(**kwargs), got {ast.unparse(call)}")
    name = keyword.value.id
    literals = [
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Assign)
        and [ast.unparse(target) for target in node.targets] == [name]
        and isinstance(node.value, ast.Dict)
    ]
    if len(literals) != 1:
        raise PortError(f"expected one dict literal assigned to {name}, found {len(literals)}")
    keys = [key.value for key in literals[0].keys if isinstance(key, ast.Constant)]
    if len(keys) != len(literals[0].keys) or not all(isinstance(key, str) for key in keys):
        raise PortError(f"{name}'s keys are not all string literals")
    texts = [f"sync={helper} is sync_sync_collector"]
    texts += [f'{_HELPER_RENAMED.get(k, k)}={name}["{k}"]' for k in keys if k not in _HELPER_LAYOUT]
    return texts


def port_source(source: str, fleet: str, call_name: str = "Collector") -> str:
    """``source`` with its collector built by ``GrpcCollector`` over ``LocalFleet(fleet)``.

    Args:
        source: A TorchRL script or helper module holding one ``Collector(...)`` call.
        fleet: The source text of ``LocalFleet``'s arguments (the script's factories).
        call_name: The call that builds the collector: ``Collector``, or the name a
            collector helper is called by (``helper(**kwargs)``, see the module doc).

    Raises:
        PortError: See :func:`collector_call`; or ``**kwargs`` in a ``Collector`` call.
    """
    found = collector_call(source, call_name)
    lines = source.splitlines()
    statement = lines[found.first_line - 1]
    indent = statement[: len(statement) - len(statement.lstrip())]
    inner = indent + "    "
    given = _arguments(source, found.call)
    sets_sync = any(text.startswith("sync=") for text in given)
    arguments = ["fleet", *([] if sets_sync else ["sync=True"]), *given]
    new_call = "GrpcCollector(\n" + "".join(f"{inner}{a},\n" for a in arguments) + f"{indent})"
    call = found.call
    head = lines[call.lineno - 1][: call.col_offset]
    tail = lines[(call.end_lineno or call.lineno) - 1][call.end_col_offset or 0 :]
    before = lines[found.first_line - 1 : call.lineno - 1]
    after = lines[(call.end_lineno or call.lineno) : found.last_line]
    fleet_line = f"{indent}fleet = LocalFleet({fleet})  {_MARK}: the collector starts and stops it"
    ported = [fleet_line, *before, *(head + new_call + tail).splitlines(), *after]
    out = lines[: found.first_line - 1] + ported + lines[found.last_line :]
    out = _insert_imports(out, source)
    return "\n".join(_insert_header(out)) + "\n"


def _insert_imports(lines: list[str], source: str) -> list[str]:
    """The import lines, right after the last top-level import of the original."""
    last = max(
        (n.end_lineno or n.lineno)
        for n in ast.parse(source).body
        if isinstance(n, ast.Import | ast.ImportFrom)
    )
    return lines[:last] + list(IMPORT_LINES) + lines[last:]


def _insert_header(lines: list[str]) -> list[str]:
    """The header comment, after the licence comment block that opens the file."""
    end = 0
    while end < len(lines) and lines[end].startswith("#"):
        end += 1
    return lines[:end] + list(_HEADER) + lines[end:]


def check_port(original: str, ported: str, call_name: str = "Collector") -> list[str]:
    """Every difference between ``original`` and ``ported`` that is not the port's own.

    Allowed: the header comment, the import lines, the fleet line, and the collector
    statement (the call to ``call_name``), which must call ``GrpcCollector`` with ``fleet``
    first and every argument of the original, unchanged. Returns one message per other
    change (an empty list for a faithful port).
    """
    found = collector_call(original, call_name)
    problems = []
    matcher = difflib.SequenceMatcher(None, original.splitlines(), ported.splitlines(), False)
    new_lines = ported.splitlines()
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        inside = found.first_line - 1 <= i1 and i2 <= found.last_line
        added = new_lines[j1:j2]
        if tag != "insert" and not inside:
            problems.append(f"original lines {i1 + 1}-{i2} changed outside the collector")
        elif tag == "insert" and not inside and not all(_ours(line) for line in added):
            problems.append(f"lines {j1 + 1}-{j2} of the port added outside the collector")
    problems += _check_call(original, found, ported)
    return problems


def _ours(line: str) -> bool:
    return line in IMPORT_LINES or line in _HEADER or line.lstrip().startswith("fleet = ")


def _check_call(original: str, found: CollectorCall, ported: str) -> list[str]:
    """The ported call carries the fleet and the original's arguments."""
    try:
        new = collector_call(ported, "GrpcCollector")
    except PortError as exc:
        return [str(exc)]
    first = new.call.args[0] if new.call.args else None
    if first is None or ast.unparse(first) != "fleet":
        return ["GrpcCollector's first argument is not the fleet"]
    theirs = {ast.unparse(ast.parse(text, mode="eval").body) for text in _kw(original, found)}
    ours = {ast.unparse(ast.parse(text, mode="eval").body) for text in _kw(ported, new)}
    ours -= {"dict(sync=True)"} - theirs  # the one argument a port adds, unless it had it
    missing, extra = theirs - ours, ours - theirs
    return [f"argument {a} differs from the original" for a in sorted(missing | extra)]


def _kw(source: str, found: CollectorCall) -> list[str]:
    """Keyword arguments as ``dict(name=value)``-parsable text, positional ones named."""
    call = found.call
    if call.args and ast.unparse(call.args[0]) == "fleet":  # the port's fleet
        call = ast.Call(call.func, call.args[1:], call.keywords)
    return [f"dict({text})" for text in _arguments(source, call)]
