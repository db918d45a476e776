"""``rlfleet-train``: the reference PPO learner, training against a fleet of rlfleet actors.

CleanRL style: :class:`TrainSettings` is the command line, :func:`train` is
the rollout/update loop, and :func:`main` is the entry point that
``python -m apps.ppo`` and the ``rlfleet-train`` script run. By
default it starts a :class:`~learner_client._local_fleet.LocalFleet` of
actor subprocesses on loopback; ``--actors host:port,...`` trains against an
existing fleet instead. Usage::

    rlfleet-train                                  # CartPole-v1, 2 actors x 8 envs
    rlfleet-train --env Pendulum-v1 --async --total-frames 1000000
    rlfleet-train --actors actor-0:50051,actor-1:50051 --out runs/k8s
"""

from __future__ import annotations

from apps.ppo._cli import main
from apps.ppo._loop import train
from apps.ppo._report import TrainSummary
from apps.ppo._settings import TrainSettings, parse_args

__all__ = ["TrainSettings", "TrainSummary", "main", "parse_args", "train"]
