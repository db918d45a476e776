"""The reference learners' device: ``--learner-device``, checked before anything starts.

The learner's model, optimiser and delivered batches live on one device: ``cpu`` (the
default), ``cuda`` or ``cuda:N``. With several ranks on a machine (``--nproc-per-node N``
or torchrun's ``LOCAL_WORLD_SIZE``) ``cuda`` means one GPU per rank, ``cuda:LOCAL_RANK``
(:func:`rank_device`), and the ranks average their gradients over NCCL; NCCL refuses two
ranks on one GPU, so a machine needs as many visible GPUs as ranks.
:func:`check_learner_device` refuses, before a fleet or a rank is started, a device that is
not ``cpu``/``cuda``/``cuda:N``, CUDA on a machine without it, a GPU index torch does not
see, one ``cuda:N`` for several ranks, and more ranks than GPUs.
"""

from __future__ import annotations

import os

import torch

__all__ = [
    "LEARNER_DEVICE_HELP",
    "check_learner_device",
    "cuda_device_count",
    "rank_device",
    "ranks_per_node",
]

#: The help text of every reference learner's ``--learner-device``.
LEARNER_DEVICE_HELP = (
    "device of the learner's model, optimiser and batches: cpu, cuda (cuda:LOCAL_RANK on "
    "each rank; NCCL between ranks) or cuda:N"
)


def cuda_device_count() -> int:
    """The GPUs torch sees here (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def ranks_per_node(nproc_per_node: int) -> int:
    """The learner ranks on this machine: torchrun's ``LOCAL_WORLD_SIZE`` under it, else ours."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if "RANK" in os.environ and local is not None and local.isdigit():
        return int(local)
    return nproc_per_node


def _parse(value: str) -> torch.device:
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"learner_device must be 'cpu', 'cuda' or 'cuda:N', got {value!r:.60}")
    return device


def check_learner_device(value: str, ranks: int, cuda_devices: int) -> None:
    """Refuse a learner device this machine cannot give to each of its ``ranks``.

    Args:
        value: The ``--learner-device`` value.
        ranks: Learner ranks on this machine.
        cuda_devices: GPUs torch sees here (:func:`cuda_device_count`).

    Raises:
        ValueError: Naming the device (and the counts when there are fewer GPUs than ranks).
    """
    device = _parse(value)
    if device.type == "cpu":
        return
    if cuda_devices == 0:
        raise ValueError(
            f"learner_device {value!r}: no CUDA device here (torch.cuda.is_available() is "
            "False); use --learner-device cpu"
        )
    if device.index is None:
        if ranks > cuda_devices:
            raise ValueError(
                f"learner_device {value!r} gives each of the {ranks} ranks on this machine its "
                f"own GPU, but torch sees {cuda_devices} GPU(s) (NCCL refuses two ranks on one "
                "GPU): start at most that many ranks per machine"
            )
        return
    if ranks > 1:
        raise ValueError(
            f"learner_device {value!r} names one GPU for {ranks} ranks on this machine; "
            "use --learner-device cuda (each rank takes cuda:LOCAL_RANK)"
        )
    if device.index >= cuda_devices:
        raise ValueError(
            f"learner_device {value!r}: no such GPU (torch sees {cuda_devices} GPU(s))"
        )


def rank_device(value: str, local_rank: int) -> torch.device:
    """The device of the rank ``local_rank`` on its machine: ``cuda`` is ``cuda:local_rank``.

    ``cpu`` and ``cuda:N`` (checked to be one rank's) are taken as given.
    """
    device = _parse(value)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", local_rank)
    return device
