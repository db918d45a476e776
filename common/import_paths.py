"""Import paths of user factories: ``package.module:function``, checked and loaded.

One rule for every place a user names a factory (an actor's ``--policy`` and ``--env-factory``,
an LLM task, a TorchRL env or policy factory).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any, cast

__all__ = ["IMPORT_PATH_RE", "load_callable"]

#: A factory's import path: ``package.module:function`` (dots after the colon name a
#: nested attribute, ``module:Class.method``).
IMPORT_PATH_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def load_callable(spec: object) -> Callable[..., Any]:
    """Import the function named by ``"package.module:function"``.

    Args:
        spec: The dotted module path, a colon, then the attribute name (dots allowed
            for nested attributes).

    Returns:
        The callable.

    Raises:
        ValueError: Not a string, or a malformed one; the import fails (the module raises
            or calls ``sys.exit``), the attribute is missing or is not callable. A Ctrl-C
            during the import stays a ``KeyboardInterrupt``.
    """
    if not isinstance(spec, str) or not IMPORT_PATH_RE.match(spec):
        raise ValueError(f"expected 'package.module:function', got {spec!r}")
    module_name, attr = spec.split(":")
    try:
        target: Any = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # a module may exit as it loads
        raised = exc if isinstance(exc, Exception) else f"{type(exc).__name__}({exc})"
        raise ValueError(f"cannot import module {module_name!r} of {spec!r}: {raised}") from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(
                f"module {module_name!r} has no attribute {attr!r} ({spec!r})"
            ) from None
    if not callable(target):
        raise ValueError(f"{spec!r} names a {type(target).__name__}, not a callable")
    return cast("Callable[..., Any]", target)
