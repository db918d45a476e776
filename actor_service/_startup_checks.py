"""Start-up checks an actor passes before its port is bound (else the CLI exits 2).

:func:`parse_config` checks each value alone; these check what needs torch or
the env: the ``--device`` exists on this machine, and a TorchRL-env actor can
build its env and models.
"""

from __future__ import annotations

from actor_service._config import ActorConfig

__all__ = ["check_startup"]


def check_startup(config: ActorConfig) -> None:
    """Refuse a config this process cannot serve, with a message naming the flag.

    Raises:
        ValueError: ``--device`` names no device torch has here; ``--kind torchrl`` with
            torchrl missing (the message names the extra), an env factory that raises or
            returns no TorchRL env, or a model the kind cannot build (the env is built
            once here, then closed).
    """
    if config.device != "cpu":
        _check_device(config.device)
    if config.kind == "torchrl":
        from actor_service._core._torchrl import check_torchrl_config

        try:
            check_torchrl_config(config)
        except ValueError as exc:
            raise ValueError(f"--kind torchrl: {exc}") from None


def _check_device(name: str) -> None:
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"--device: {name!r} is not a torch device") from None
    if device.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise ValueError(
            f"--device {name}: this machine has no CUDA device torch can use "
            "(torch.cuda.is_available() is False); run with --device cpu"
        )
    if (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(
            f"--device {name}: no such CUDA device (torch sees {torch.cuda.device_count()})"
        )
