"""The settings of one ``rlfleet-train`` run, which are also its command line.

:class:`TrainSettings` is a frozen dataclass with one documented field per
flag; :func:`parse_args` builds the ``argparse`` parser from its fields
(:mod:`apps._job.settings`: the field name with dashes is the flag, the
field's ``help`` metadata its help), so the command line and the settings cannot
drift apart. Values are validated in
``__post_init__``, whether they come from the command line or from code.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence

from apps._job.device import (
    LEARNER_DEVICE_HELP,
    check_learner_device,
    cuda_device_count,
    ranks_per_node,
)
from apps._job.settings import check_positive_ints, check_rank_shares, opt, parse_settings
from common.config import check_actor_address
from learner_client import check_metrics_port

__all__ = ["CARTPOLE_TARGET_RETURN", "PROG", "RETURN_WINDOW", "TrainSettings", "parse_args"]

#: The program's name, which prefixes its messages.
PROG = "rlfleet-train"

#: Mean return over the last RETURN_WINDOW episodes that counts as solving CartPole-v1.
CARTPOLE_TARGET_RETURN = 475.0
#: Finished episodes averaged for the reported (and target-checked) return.
RETURN_WINDOW = 20
# The collector counts frames in int64 (its settings' proto fields).
_MAX_FRAMES = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """Everything a PPO run needs; each field is one command-line flag.

    The defaults solve CartPole-v1 (mean return of the last 20 episodes >= 475)
    with 2 actors x 8 envs on 2 CPU cores in about a minute. With several learner
    ranks (``nproc_per_node``, or under torchrun) ``num_actors`` counts every rank's,
    and ``frames_per_batch`` and ``total_frames`` are each rank's.

    Attributes:
        env: Gymnasium id the actors run (CartPole-v1: discrete; Pendulum-v1: continuous).
        num_actors: Actor servers to start on loopback (refused with ``actors``).
        num_envs: Envs in each actor's env pool (refused with ``actors``).
        frames_per_batch: Frames per PPO update: the whole fleet's in sync mode, one
            actor's in async mode (TorchRL's meaning for each).
        total_frames: Frame budget of the run; training stops there if the target is not met.
        sync: Collect one batch from every actor per update (``--sync``) or take the first
            ready actor's batch (``--async``; batches may come from an older policy).
        seed: Seeds torch and numpy in the learner; actor ``i`` gets ``seed + i``.
        lr: Adam learning rate.
        anneal_lr: Decay the learning rate linearly to 0 over ``total_frames``.
        gamma: Discount factor.
        gae_lambda: GAE's lambda.
        clip_eps: PPO's clipping range for the probability ratio.
        epochs: Passes over each batch.
        minibatch_size: Frames per gradient step.
        ent_coef: Weight of the entropy bonus.
        vf_coef: Weight of the value loss.
        max_grad_norm: Gradient-norm clip.
        hidden: Hidden layer sizes of the policy and value MLPs.
        actors: ``host:port`` addresses (or one ``dns:///name:port``) of an existing fleet to
            train against instead of starting one (the fleet must run ``env`` with an ``mlp``
            policy of ``hidden``). Actors that require a token get ``$RLFLEET_TOKEN``.
        take_over: End another learner's sessions on the ``actors`` (else an actor that
            serves another learner is retried until ``batch_timeout``, then the run fails).
        out: Directory for the weights, learning curve and summary (default
            ``runs/<env>-seed<seed>``).
        target_return: Stop once the mean return of the last 20 episodes reaches it; None
            means 475 for CartPole-v1 and no target otherwise; ``inf`` disables it.
        log_every: Batches between progress updates (and log lines without tqdm).
        progress: Show a tqdm progress bar (log lines instead when off or not installed).
        metrics_port: Serve the collector's Prometheus metrics on this port (all
            interfaces; 0 picks a free one); None serves none. The ranks on one machine
            serve on ``metrics_port + LOCAL_RANK``.
        nproc_per_node: Learner ranks to start on this machine (data-parallel PPO through
            ``torch.distributed.run``); under torchrun, torchrun's own flag decides.
        learner_device: Where the policy, the critic, the optimiser and the delivered
            batches live: ``cpu``, ``cuda`` (each rank on ``cuda:LOCAL_RANK``, NCCL between
            ranks: one GPU per rank) or ``cuda:N`` (one rank); checked before anything starts.
    """

    env: str = opt("CartPole-v1", "gymnasium env id")
    num_actors: int = opt(2, "actor servers to start on loopback")
    num_envs: int = opt(8, "envs per actor")
    frames_per_batch: int = opt(1024, "frames per PPO update")
    total_frames: int = opt(500_000, "frame budget of the run")
    sync: bool = opt(
        True, "sync (one batch from every actor) or async collection", negative="async"
    )
    seed: int = opt(1, "seed of the learner; actor i gets seed + i")
    lr: float = opt(2.5e-3, "Adam learning rate")
    anneal_lr: bool = opt(True, "decay the learning rate linearly to 0 over total_frames")
    gamma: float = opt(0.99, "discount factor")
    gae_lambda: float = opt(0.95, "GAE lambda")
    clip_eps: float = opt(0.2, "PPO clipping range")
    epochs: int = opt(4, "passes over each batch")
    minibatch_size: int = opt(256, "frames per gradient step")
    ent_coef: float = opt(0.0, "entropy bonus weight")
    vf_coef: float = opt(0.5, "value loss weight")
    max_grad_norm: float = opt(0.5, "gradient norm clip")
    hidden: tuple[int, ...] = opt((64, 64), "hidden layer sizes, comma-separated")
    actors: tuple[str, ...] = opt((), "host:port,... of an existing fleet (none: start one)")
    take_over: bool = opt(False, "end another learner's sessions on the --actors fleet")
    out: str = opt("", "output directory (default runs/<env>-seed<seed>)")
    target_return: float | None = opt(
        None,
        "stop at this mean return of the last 20 episodes (default 475 for "
        "CartPole-v1, none otherwise; inf disables)",
    )
    log_every: int = opt(1, "batches between progress updates")
    progress: bool = opt(True, "show a tqdm progress bar")
    metrics_port: int | None = opt(None, "serve the learner's Prometheus /metrics on this port")
    nproc_per_node: int = opt(1, "learner ranks (DDP) to start on this machine")
    learner_device: str = opt("cpu", LEARNER_DEVICE_HELP)

    def __post_init__(self) -> None:
        check_positive_ints(
            self,
            (
                "num_actors",
                "num_envs",
                "frames_per_batch",
                "total_frames",
                "epochs",
                "minibatch_size",
                "log_every",
                "nproc_per_node",
            ),
        )
        # clip_eps and max_grad_norm may be inf (no clipping); a step size or weight may not.
        for name in ("clip_eps", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be finite and > 0, got {self.lr!r}")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        for name in ("ent_coef", "vf_coef"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {getattr(self, name)!r}")
        if self.minibatch_size < 2:  # advantages are normalised over a minibatch
            raise ValueError(f"minibatch_size must be >= 2, got {self.minibatch_size}")
        if self.take_over and not self.actors:
            raise ValueError("take_over applies to an --actors fleet; a fleet it starts is its own")
        if not self.hidden or any(h <= 0 for h in self.hidden):
            raise ValueError(f"hidden must be positive layer sizes, got {self.hidden!r}")
        if self.budget_frames > _MAX_FRAMES:  # else refused by the collector, blaming --actors
            raise ValueError(
                f"total_frames ({self.total_frames}) in whole batches of frames_per_batch "
                f"({self.frames_per_batch}) must be at most 2**63 - 1"
            )
        if self.minibatch_size > self.frames_per_batch:
            raise ValueError(
                f"minibatch_size ({self.minibatch_size}) exceeds "
                f"frames_per_batch ({self.frames_per_batch})"
            )
        for address in self.actors:
            if address[:4].lower() != "dns:":  # a fleet's name, resolved when it starts
                check_actor_address(address)
        if len(set(self.actors)) < len(self.actors):
            raise ValueError(f"an actor address is listed twice in {','.join(self.actors)}")
        if not 0 <= self.seed < 2**32:  # numpy's seeds
            raise ValueError(f"seed must be in [0, 2**32), got {self.seed}")
        if not self.actors:
            self._check_local_batch_shape()
        check_metrics_port(self.metrics_port)
        if self.learner_device != "cpu":  # the CPU needs no look at the GPUs
            ranks = ranks_per_node(self.nproc_per_node)
            check_learner_device(self.learner_device, ranks, cuda_device_count())

    def _check_local_batch_shape(self) -> None:
        ranks = self.nproc_per_node
        check_rank_shares(self.num_actors, ranks)
        # An actor's batch is num_envs x T, so its share of frames must divide evenly.
        actors = self.num_actors // ranks
        per_actor = self.frames_per_batch // actors if self.sync else self.frames_per_batch
        if (self.sync and self.frames_per_batch % actors) or per_actor % self.num_envs:
            per_rank = "num_actors" if ranks == 1 else "(num_actors / nproc_per_node)"
            mode = f"{per_rank} * num_envs" if self.sync else "num_envs"
            raise ValueError(
                f"frames_per_batch ({self.frames_per_batch}) must be a multiple of {mode} "
                f"(num_actors={self.num_actors} over {ranks} rank(s), num_envs={self.num_envs})"
            )

    @property
    def effective_target_return(self) -> float | None:
        """The target return in force: ``target_return``, or 475 for CartPole-v1, or None."""
        if self.target_return is not None:
            return None if math.isinf(self.target_return) else self.target_return
        return CARTPOLE_TARGET_RETURN if self.env == "CartPole-v1" else None

    @property
    def budget_frames(self) -> int:
        """``total_frames`` rounded up to whole batches: the loop stops once past it."""
        return -(-self.total_frames // self.frames_per_batch) * self.frames_per_batch

    @property
    def out_dir(self) -> str:
        """The output directory: ``out``, or ``runs/<env>-seed<seed>``."""
        return self.out or f"runs/{self.env}-seed{self.seed}"

    def as_record(self) -> dict[str, object]:
        """The settings as ``summary.json`` records them.

        With ``actors`` the fleet's size is its own: ``num_actors`` and ``num_envs``, which
        size only a fleet the job starts, are left out rather than recorded as defaults.
        """
        record = dataclasses.asdict(self)
        if self.actors:
            del record["num_actors"], record["num_envs"]
        return record


#: Flags that size the fleet the job starts; with --actors the fleet's own size holds.
_FLEET_SIZE_FLAGS = ("--num-actors", "--num-envs")


def parse_args(argv: Sequence[str] | None = None) -> TrainSettings:
    """Parse a command line into validated settings (SystemExit, from argparse, if invalid).

    Args:
        argv: The arguments without the program name; None reads ``sys.argv``.
    """
    settings = parse_settings(
        TrainSettings,
        PROG,
        "PPO against a fleet of rlfleet actors (started locally unless --actors).",
        argv,
    )
    given = sys.argv[1:] if argv is None else list(argv)
    sizing = [f for f in _FLEET_SIZE_FLAGS if any(a == f or a.startswith(f"{f}=") for a in given)]
    if settings.actors and sizing:
        sys.stderr.write(
            f"rlfleet-train: error: {' and '.join(sizing)}: these size the fleet rlfleet-train "
            "starts; with --actors the actors' own --num-envs holds: drop them\n"
        )
        raise SystemExit(2)
    return settings
