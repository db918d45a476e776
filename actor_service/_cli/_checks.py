"""What ``rlfleet-actor`` checks before it binds a port, so bad input exits 2, not 1.

:func:`check_before_binding` checks what every actor would fail on at start (a
``--device`` this machine does not have, a factory module this process cannot import),
then hands over to the checks of the actor's kind (``check.py`` in its folder under
``actor_service._kinds``). A check raises ``ValueError`` with the reason; the command line
turns it into its usage error (exit 2).
"""

from __future__ import annotations

import importlib
import os
import sys

from actor_service._config import ActorConfig
from common.config import local_device

__all__ = ["check_before_binding", "unimportable_message"]


def check_before_binding(config: ActorConfig) -> None:
    """Raise ``ValueError`` if an actor of ``config`` would fail to start on its env or models.

    Raises:
        ValueError: The reason, naming the factory, the model and the offending keys.
    """
    if config.device != "cpu":
        local_device(config.device, "--device")
    _check_importable(config)
    from actor_service._kinds.registry import KINDS

    KINDS[config.kind].check(config)


def _check_importable(config: ActorConfig) -> None:
    """Import the module of each ``module:function`` factory of an env or TorchRL actor.

    A module that raises, calls ``sys.exit`` or raises ``KeyboardInterrupt`` as it is imported
    is refused by name too: the actor would otherwise end with a traceback, or exit 0 unserved.
    """
    if config.kind == "llm":
        return  # its model specs name checkpoints (``rlfleet:tiny-qwen2``), not modules
    specs = [("env_factory", config.env_factory)] if isinstance(config.env_factory, str) else []
    specs += [(f"model {m.model_id!r}", m.path) for m in config.models if ":" in m.path]
    for what, spec in specs:
        module = spec.partition(":")[0]
        if not module:
            continue
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(unimportable_message(what, spec, exc)) from exc
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # the module's own code
            raised = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise ValueError(
                f"{what} {spec!r}: importing {module!r} raised {raised} (fix the module: "
                "it must import without raising or exiting)"
            ) from None


def unimportable_message(what: str, spec: str, exc: ImportError) -> str:
    """Why the ACTOR process cannot import ``spec``'s module: its own path, and the fix."""
    module = spec.partition(":")[0]
    path = os.environ.get("PYTHONPATH", "")
    shown = repr(path) if path else "(unset)"
    return (
        f"{what} {spec!r}: this actor process cannot import {module!r} ({exc}). The actor is "
        f"its own process (python {sys.executable}, working directory {os.getcwd()}) and "
        f"imports factories from its own sys.path {sys.path}, PYTHONPATH "
        f"{shown}, not from the learner's. Fix: put the folder that "
        f"holds {module!r} (the script's folder, for its factories) on the actor's "
        f"PYTHONPATH; LocalFleet's actors inherit the learner's environment, so set "
        f"os.environ['PYTHONPATH'] before the fleet starts, or export it where the actor runs"
    )
