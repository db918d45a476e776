"""The rollout/update loop of ``rlfleet-train``: collect a batch, update PPO, push the weights.

Read :func:`train` top to bottom: seed, build the policy and the critic, start
(or join) the fleet, push the initial weights so every actor acts with the
learner's policy, then for every batch track episode returns, run a PPO update
and push the new weights to every actor, until the target return or the frame
budget is reached. The policy and critic are built by the same factories the
actors use (``common.policies``), so the pushed state dicts fit the actors'
policies key for key. Under torchrun the same loop runs on every rank, data-parallel
(:mod:`apps._job.ranks`): each rank on its own actors, pushing agreed versions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import time
from typing import Any

import grpc
import gymnasium as gym
import torch

from apps._job.cli import FleetMismatchError, SignalsHeld, learner_token, seed_everything
from apps._job.ranks import DataParallel
from apps._job.report import Progress
from apps.ppo._episodes import EpisodeTracker
from apps.ppo._ppo import PPOConfig, PPOLearner
from apps.ppo._report import TrainSummary, save_run
from apps.ppo._settings import PROG, RETURN_WINDOW, TrainSettings
from common.errors import ProtocolError
from common.policies import make_policy, make_value_mlp
from common.replies import parsing_channel
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from learner_client import GrpcCollector, LocalFleet, serve_metrics

__all__ = ["train"]


def train(settings: TrainSettings) -> TrainSummary:
    """Train a PPO policy with a fleet of actors and write the run's outputs.

    Args:
        settings: The run's settings.

    Returns:
        The summary also written to ``summary.json``.
    """
    seed_everything(settings.seed)  # the same on every rank (DDP starts from rank 0's)
    tracker = EpisodeTracker(window=RETURN_WINDOW)
    with DataParallel(settings.learner_device) as ranks:  # left together, after the outputs
        policy, loop, summary = _train(settings, ranks, tracker)
        if ranks.rank == 0:  # rank 0 writes the outputs; the weights are the same everywhere
            save_run(
                pathlib.Path(settings.out_dir),
                policy,
                summary,
                settings.as_record(),
                (tracker.end_frames, tracker.returns),
                RETURN_WINDOW,
            )
    if loop.interrupted:  # exit 130, the outputs of the updates made written
        raise KeyboardInterrupt(f"outputs of {summary.batches} updates in {settings.out_dir}")
    return summary


def _train(
    settings: TrainSettings, ranks: DataParallel, tracker: EpisodeTracker
) -> tuple[torch.nn.Module, _Loop, TrainSummary]:
    """Train on this rank's share of the fleet; the policy, the loop and its summary."""
    with contextlib.ExitStack() as stack:
        policy, learner = _build_learner(settings, ranks)
        collector = _open_collector(stack, settings, ranks)
        progress = stack.enter_context(
            contextlib.closing(
                Progress(settings.total_frames, enabled=settings.progress and ranks.rank == 0)
            )
        )
        if settings.actors:
            # A local fleet is seeded at start; an existing one is seeded here, per rank.
            collector.set_seed(settings.seed + 100_000 * ranks.rank)
        start = time.monotonic()
        # Actors start with their own random weights: make them act with ours, under a
        # version above any an actor holds, agreed by every rank.
        base = ranks.agreed_max(collector.policy_version)
        collector.update_policy_weights_(policy, version=base + 1)
        loop = _Loop(settings, collector, learner, tracker, progress, ranks, base + 1)
        loop.run()
        wall = time.monotonic() - start
        return policy, loop, loop.summary(wall, collector.policy_version)


def _build_learner(
    settings: TrainSettings, ranks: DataParallel
) -> tuple[torch.nn.Module, PPOLearner]:
    """The policy (built as the actors build theirs) and its PPO learner with a critic.

    Both live on the rank's device; DDP (several ranks) averages their gradients.
    """
    observation_space, action_space = _spaces(settings.env)
    try:  # the actors' factory: an env whose spaces it refuses would not start them either
        policy = make_policy("mlp", observation_space, action_space, hidden=settings.hidden)
        value = make_value_mlp(observation_space, hidden=settings.hidden)
    except ValueError as exc:
        raise FleetMismatchError(f"--env {settings.env}: {exc}") from None
    policy.to(ranks.device)
    value.to(ranks.device)
    learner = PPOLearner(
        policy,
        value,
        PPOConfig(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(PPOConfig)}),
        wrap=ranks.wrap,
    )
    return policy, learner


def _open_collector(
    stack: contextlib.ExitStack, settings: TrainSettings, ranks: DataParallel
) -> GrpcCollector:
    """A collector on the given fleet, or on a local fleet started (and stopped) by ``stack``.

    Each rank owns its share of the fleet; without ``--actors`` it starts that share itself.
    """
    addresses = list(settings.actors)
    token = learner_token()
    if addresses:
        _check_fleet(addresses, settings, token)
    else:
        addresses = stack.enter_context(_local_fleet(settings, ranks)).addresses
    try:
        collector = GrpcCollector(
            addresses,
            frames_per_batch=settings.frames_per_batch,
            # Whole batches, as the loop stops once past --total-frames (no rounding warning).
            total_frames=settings.budget_frames,
            sync=settings.sync,
            # From the environment only: a flag would show in `ps` and in summary.json.
            token=token,
            rank=ranks.rank,
            world_size=ranks.world_size,
            # Batches land where the learner's model is (None: as received, on the host).
            device=None if ranks.device.type == "cpu" else ranks.device,
            learner_id=ranks.learner_id,
            take_over=settings.take_over,
        )
    except ValueError as exc:  # the fleet the actors make does not fit (the flags were checked)
        raise FleetMismatchError(f"the fleet at --actors: {exc}") from None
    stack.enter_context(collector)
    if settings.metrics_port is not None:  # on all interfaces, until the collector shuts down
        port = settings.metrics_port and settings.metrics_port + ranks.local_rank
        serve_metrics(collector, port)
    return collector


class _Loop:
    """Update PPO on every batch and push the weights, until the target or the budget.

    On several ranks every decision to stop is taken together (a rank leaving the loop
    alone would leave the others waiting in DDP's next all-reduce).
    """

    def __init__(
        self,
        settings: TrainSettings,
        collector: GrpcCollector,
        learner: PPOLearner,
        tracker: EpisodeTracker,
        progress: Progress,
        ranks: DataParallel,
        version: int,
    ) -> None:
        self.settings, self.collector, self.learner = settings, collector, learner
        self.tracker, self.progress, self.ranks = tracker, progress, ranks
        self.version = version
        self.reached = self.interrupted = False
        self.frames = self.batches = 0  # this rank's
        self.final_return: float | None = None  # the mean over ranks

    def run(self) -> None:
        """Train until the target return (over every rank), the frame budget or a signal.

        SIGINT or SIGTERM ends the loop between two updates, ``interrupted`` set: the
        learner's weights are then the last every actor took, and ``train`` saves them.
        """
        try:
            with SignalsHeld(PROG) as signals:
                self.ranks.run_together(self.collector, self._step, signals)
        except KeyboardInterrupt:
            self.interrupted = True

    def _step(self, batch: Any) -> bool:
        """One update on ``batch`` and its push; whether the loop should stop."""
        settings, learner, collector = self.settings, self.learner, self.collector
        assert batch is not None  # batches are yielded: there is no replay buffer
        if settings.anneal_lr:  # by the frames before this batch: the first at lr, none at 0
            learner.set_lr(settings.lr * max(0.0, 1.0 - self.frames / settings.total_frames))
        self.frames += batch.numel()
        self.batches += 1
        self.tracker.add(batch, self.frames)
        learner.update(batch)
        self.version += 1  # every rank took the same step: the same version
        collector.update_policy_weights_(learner.policy, version=self.version)
        self.final_return, self.reached = self._reached()
        last = self.reached or self.frames >= settings.total_frames
        if self.ranks.rank == 0 and (last or self.batches % settings.log_every == 0):
            fields = _fields(self.final_return, len(self.tracker.returns), collector.stats())
            self.progress.update(self.frames, fields)
        return last

    def summary(self, wall: float, version: int) -> TrainSummary:
        """The run's summary, as this rank saw it (``frames`` counts every rank's)."""
        settings, ranks = self.settings, self.ranks
        frames = self.frames * ranks.world_size  # every rank trained on as many
        return TrainSummary(
            env=settings.env,
            sync=settings.sync,
            seed=settings.seed,
            frames=frames,
            batches=self.batches,
            episodes=len(self.tracker.returns),
            wall_time_s=wall,
            fps=frames / max(wall, 1e-9),
            final_return=self.final_return,
            target_return=settings.effective_target_return,
            reached_target=self.reached,
            policy_version=version,
            out_dir=settings.out_dir,
            ranks=ranks.world_size,
            rank=ranks.rank,
            interrupted=self.interrupted,
        )

    def _reached(self) -> tuple[float | None, bool]:
        """The mean over ranks of their recent returns, and whether it reached the target."""
        target = self.settings.effective_target_return
        tracker = self.tracker
        mean, full = self.ranks.mean_and_all(tracker.recent_mean, tracker.recent_full)
        return mean, target is not None and full and mean is not None and mean >= target


def _check_fleet(addresses: list[str], settings: TrainSettings, token: str | None) -> None:
    """Every actor at ``addresses`` that answers runs ``--env`` and a policy of ``--hidden``.

    The others fail later, in the collector (unreachable) or at the first push.

    Raises:
        FleetMismatchError: Naming the actors running another env or policy shapes.
    """
    env = settings.env
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    other: dict[str, str] = {}
    shapes = {name: list(p.shape) for name, p in _policy_of(settings).state_dict().items()}
    for address in addresses:
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.ActorServiceStub(parsing_channel(channel, address))
            try:
                reply = stub.Describe(pb.DescribeRequest(), timeout=10, metadata=metadata)
            except (grpc.RpcError, ProtocolError):
                continue  # the collector says why it cannot reach it, or read its reply
        if reply.kind != "llm" and reply.env_id != env:
            other[address] = reply.env_id
        elif reply.kind != "llm" and (theirs := _policy_shapes(reply)) != shapes:
            name = min(n for n in shapes.keys() | theirs.keys() if shapes.get(n) != theirs.get(n))
            raise FleetMismatchError(
                f"--hidden {','.join(map(str, settings.hidden))} builds a policy whose {name} is "
                f"{shapes.get(name)}, but the actor at {address} holds {theirs.get(name)}; start "
                "the actors with these --hidden sizes, or pass theirs"
            )
    if other:
        raise FleetMismatchError(
            f"--env {env}, but the actors at {other} (address: env) run another env; start "
            f"them with --env {env}, or train on theirs"
        )


def _policy_of(settings: TrainSettings) -> torch.nn.Module:
    return make_policy("mlp", *_spaces(settings.env), hidden=settings.hidden)


def _policy_shapes(reply: pb.DescribeResponse) -> dict[str, list[int]]:
    """The actor's ``policy`` model's parameter shapes, by name (empty if it has none)."""
    models = {model.model_id: model for model in reply.models}
    policy = models.get("policy")
    return {} if policy is None else {p.name: list(p.shape) for p in policy.parameters}


def _local_fleet(settings: TrainSettings, ranks: DataParallel) -> LocalFleet:
    worker_ids = ranks.worker_ids(settings.num_actors)
    return LocalFleet(
        len(worker_ids),
        settings.env,
        settings.num_envs,
        "mlp",
        policy_kwargs={"hidden": list(settings.hidden)},
        seed=settings.seed,
        worker_ids=worker_ids,
    )


def _spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    # The learner only needs the spaces to build networks that fit the actors'.
    env = gym.make(env_id)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def _fields(mean: float | None, episodes: int, stats: dict[str, Any]) -> dict[str, str]:
    return {
        "return": "n/a" if mean is None else f"{mean:.1f}",
        "episodes": str(episodes),
        # Versions between the learner's latest push and the oldest frame of the last batch.
        "lag": str(stats.get("policy_lag", "n/a")),
    }
