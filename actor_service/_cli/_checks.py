"""What ``rlfleet-actor`` checks before it binds a port, so bad input exits 2, not 1.

:func:`check_before_binding` checks what every actor would fail on at start (a
``--device`` this machine does not have), then hands over to the checks of the actor's
kind (``check.py`` in its folder under ``actor_service._kinds``). A check raises
``ValueError`` with the reason; the command line turns it into its usage error (exit 2).
"""

from __future__ import annotations

from actor_service._config import ActorConfig
from common.config import local_device

__all__ = ["check_before_binding"]


def check_before_binding(config: ActorConfig) -> None:
    """Raise ``ValueError`` if an actor of ``config`` would fail to start on its env or models.

    Raises:
        ValueError: The reason, naming the factory, the model and the offending keys.
    """
    if config.device != "cpu":
        local_device(config.device, "--device")
    from actor_service._kinds.registry import KINDS

    KINDS[config.kind].check(config)
