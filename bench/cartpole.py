"""CartPole-v1 frames/s: rlfleet vs TorchRL's multi-process collectors and the in-process limit.

Workload: CartPole-v1, the ``"mlp"`` policy (64x64, tanh, one-hot categorical),
2 actors x 8 envs, sync and async; and, sync, a user-style policy given by factory
(``bench.policies:sequential_policy``: a ``TensorDictModule`` around an
``nn.Sequential``, 64x64 tanh), run by rlfleet and TorchRL alike. Systems, all in
this one run:

- rlfleet: ``GrpcCollector`` over a ``LocalFleet`` of actor subprocesses, in three
  modes: sync by default (on-policy: an actor collects only the batch requested, as
  TorchRL's sync collectors do), sync with ``prefetch=1`` (each actor collects one batch
  ahead: off-policy by one batch; its next credit comes when its batch is taken, so
  with a learner that trains nothing it gains nothing), ``prefetch=2`` (user policy:
  off-policy by up to two, each actor keeps collecting while the last batch travels)
  and async (one batch ahead per actor, as ``MultiAsyncCollector``);
- TorchRL: ``MultiSyncCollector`` / ``MultiAsyncCollector``, 2 workers x 8 envs,
  same policy module, with the env layout that was fastest in a probe of
  ``--torchrl-layouts`` (see :mod:`bench._torchrl`);
- the in-process limit: ``SyncVectorEnv(16)`` + the batched policy, one process;
- the machine's ceiling for this fleet: one such loop of 8 envs (user policy) per
  actor, all running at once in their own processes, with no transport and no
  learner (``parallel in-process loops``): the most 2 actors x 8 envs can reach here.

Batches are 1024 frames per actor (2048 per sync batch, 1024 per async
batch) in every system. Repetitions interleave the systems so each ratio is
taken between windows measured back to back.

Targets: rlfleet >= 10x TorchRL's best multi-process collector (default sync vs
sync, async vs async) and >= 60% of the in-process limit. The prefetching mode is
reported beside them, without a target: the headline compares like with like. With
the user policy: sync >= 4x TorchRL with the same policy and >= 1.2x the in-process
limit; sync with prefetching (``prefetch=1`` and ``prefetch=2`` each) >= 1.5x the
in-process limit. Each user-policy mode is also printed as a share of the ceiling.

Usage: ``python -m bench.cartpole [--quick] [--reps 3] [--window 4]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium

from bench._common import Report, base_parser, parse, reps_of, set_single_thread, time_batches

__all__ = ["main"]

ENV_ID = "CartPole-v1"
USER_POLICY = "bench.policies:sequential_policy"
# Figure: one in-process loop per actor (user policy, 8 envs each), all at once.
CEILING = "parallel in-process loops"
#: The single-process loop of the built-in MLP (the mlp fleet's limit) and of the user policy.
LIMIT = "in-process limit"
USER_LIMIT = "in-process limit (user policy)"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=8)
    parser.add_argument("--frames-per-actor", type=int, default=1024, help="frames per actor batch")
    parser.add_argument("--window", type=float, default=None, help="seconds per timed window")
    parser.add_argument(
        "--torchrl-layouts",
        default="gym,gym_sync,serial",
        help="TorchRL env layouts to probe, comma-separated, or 'all' (adds 'parallel': one "
        "process per env, over a minute to start on 2 cores)",
    )
    args = parse(parser, argv)
    if args.window is None:
        args.window = 0.5 if args.quick else 4.0
    if args.quick:
        args.frames_per_actor = min(args.frames_per_actor, 16 * args.num_envs)
    return args


def _layouts(text: str, quick: bool) -> list[str]:
    from bench._torchrl import CARTPOLE_LAYOUTS

    if quick:
        return ["gym_sync"]
    layouts = list(CARTPOLE_LAYOUTS) if text == "all" else text.split(",")
    unknown = [lay for lay in layouts if lay not in CARTPOLE_LAYOUTS]
    if unknown:
        raise SystemExit(f"unknown --torchrl-layouts {unknown}; known: {CARTPOLE_LAYOUTS}")
    return layouts


def mlp_policy(hidden: tuple[int, ...] = (64, 64)) -> Any:
    """The ``"mlp"`` policy for CartPole, the very module the actors build."""
    from common.policies import make_policy

    env = gymnasium.make(ENV_ID)
    return make_policy("mlp", env.observation_space, env.action_space, hidden=hidden)


def pick_layout(args: argparse.Namespace, policy: Any, report: Report) -> str:
    """Probe each TorchRL env layout with a MultiSyncCollector; return the fastest."""
    from bench import _torchrl

    layouts = _layouts(args.torchrl_layouts, args.quick)
    if len(layouts) == 1:
        report.note(f"torchrl env layout: {layouts[0]} (not probed)")
        return layouts[0]
    best, best_fps = layouts[0], -1.0
    for layout in layouts:
        env_fn = _torchrl.cartpole_env(layout, args.num_envs)
        coll = _torchrl.make_collector(
            True,
            env_fn,
            policy,
            workers=args.actors,
            frames_per_batch=args.frames_per_actor * args.actors,
        )
        try:
            fps, _ = time_batches(iter(coll), seconds=args.window, min_batches=2, warmup=1)
        finally:
            coll.shutdown()
        report.figure(f"probe torchrl sync layout={layout}", "frames/s", [fps])
        print(f"probe torchrl layout={layout}: {fps:,.0f} frames/s", flush=True)
        if fps > best_fps:
            best, best_fps = layout, fps
    report.note(f"torchrl env layout: {best} (fastest of {layouts})")
    return best


# rlfleet's modes: (figure name, sync, extra GrpcCollector arguments).
# (figure suffix, fleet, sync, collector kwargs, TorchRL counterpart or None): one
# repetition's windows, in order. Figures are "rlfleet <suffix>" and "torchrl <counterpart>".
WINDOWS: tuple[tuple[str, str, bool, dict[str, Any], str | None], ...] = (
    ("sync", "mlp", True, {}, "sync"),
    ("sync prefetch=1", "mlp", True, {"prefetch": 1}, None),
    ("async", "mlp", False, {}, "async"),
    ("user sync", "user", True, {}, "user sync"),
    ("user sync prefetch=1", "user", True, {"prefetch": 1}, None),
    ("user sync prefetch=2", "user", True, {"prefetch": 2}, None),
)


def _rlfleet_window(
    addresses: list[str], sync: bool, args: argparse.Namespace, extra: dict[str, Any]
) -> float:
    from bench import _rlfleet

    fpb = args.frames_per_actor * (args.actors if sync else 1)
    with _rlfleet.collector(addresses, sync=sync, frames_per_batch=fpb, **extra) as coll:
        fps, _ = time_batches(iter(coll), seconds=args.window, min_batches=2, warmup=2)
    return fps


def user_policy() -> Any:
    """The user-style policy (:func:`bench.policies.sequential_policy`) for CartPole."""
    from bench.policies import sequential_policy

    env = gymnasium.make(ENV_ID)
    return sequential_policy(env.observation_space, env.action_space)


def run(args: argparse.Namespace, report: Report) -> None:
    """Measure every system, interleaved, and record figures, ratios and targets."""
    from bench import _rlfleet, _torchrl

    reps = reps_of(args)
    policy = mlp_policy()
    layout = pick_layout(args, policy, report)
    env_fn = _torchrl.cartpole_env(layout, args.num_envs)
    samples: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        fleets = {
            name: stack.enter_context(
                _rlfleet.fleet(args.actors, env=ENV_ID, num_envs=args.num_envs, policy=factory)
            )
            for name, factory in (("mlp", "mlp"), ("user", USER_POLICY))
        }
        makers = {
            counterpart: functools.partial(
                _torchrl.make_collector,
                sync,
                env_fn,
                user_policy() if fleet == "user" else policy,
                workers=args.actors,
                frames_per_batch=args.frames_per_actor * (args.actors if sync else 1),
            )
            for _, fleet, sync, _, counterpart in WINDOWS
            if counterpart is not None
        }
        for _ in range(reps):
            _repetition(args, fleets, makers, samples)
    for name, values in samples.items():
        report.figure(name, "frames/s", values)
    _ratios_and_targets(report, layout)


def _repetition(
    args: argparse.Namespace,
    fleets: dict[str, Any],
    torchrl_makers: dict[str, Callable[[], Any]],
    samples: dict[str, list[float]],
) -> None:
    """One window of every system, back to back; appends a sample to each figure.

    Each TorchRL collector is built for its own window and shut down after it: an idle
    multi-process collector's workers poll their pipes, which would take CPU from every
    other window of the repetition.
    """
    from bench._inprocess import in_process_fps, parallel_in_process_fps

    for name, fleet, sync, extra, counterpart in WINDOWS:
        fps = _rlfleet_window(fleets[fleet].addresses, sync, args, extra)
        samples.setdefault(f"rlfleet {name}", []).append(fps)
        if counterpart is not None:
            fps = _torchrl_window(torchrl_makers[counterpart], args)
            samples.setdefault(f"torchrl {counterpart}", []).append(fps)
    for limit, policy in ((LIMIT, "mlp"), (USER_LIMIT, user_policy())):
        samples.setdefault(limit, []).append(
            in_process_fps(
                functools.partial(gymnasium.make, ENV_ID),
                num_envs=args.actors * args.num_envs,
                steps_per_batch=args.frames_per_actor // args.num_envs,
                seconds=args.window,
                policy=policy,
            )
        )
    samples.setdefault(CEILING, []).append(
        parallel_in_process_fps(
            args.actors,
            num_envs=args.num_envs,
            steps_per_batch=args.frames_per_actor // args.num_envs,
            seconds=args.window,
        )
    )


def _torchrl_window(make: Callable[[], Any], args: argparse.Namespace) -> float:
    coll = make()
    try:
        fps, _ = time_batches(iter(coll), seconds=args.window, warmup=1)
    finally:
        coll.shutdown()
    return fps


def _ratios_and_targets(report: Report, layout: str) -> None:
    for mode in ("sync", "async"):
        ratio = report.ratio(f"rlfleet/torchrl {mode}", f"rlfleet {mode}", f"torchrl {mode}")
        report.target(f"{mode}: rlfleet >= 10x TorchRL ({layout})", ratio, 10.0)
        limit = report.ratio(f"rlfleet {mode}/{LIMIT}", f"rlfleet {mode}", LIMIT)
        report.target(f"{mode}: rlfleet >= 60% of the in-process limit", limit, 0.6)
    report.ratio("rlfleet sync prefetch=1/torchrl sync", "rlfleet sync prefetch=1", "torchrl sync")
    user = "rlfleet user sync"
    ratio = report.ratio("rlfleet/torchrl user sync", user, "torchrl user sync")
    report.target(f"user policy, sync: rlfleet >= 4x TorchRL ({layout})", ratio, 4.0)
    # The user policy's fleet against the in-process loop of the same policy.
    for mode, bound in (("sync", 1.2), ("sync prefetch=1", 1.5), ("sync prefetch=2", 1.5)):
        limit = report.ratio(
            f"rlfleet user {mode}/{USER_LIMIT}", f"rlfleet user {mode}", USER_LIMIT
        )
        report.target(f"user policy, {mode}: rlfleet >= {bound}x {USER_LIMIT}", limit, bound)
    report.ratio(f"rlfleet user sync/{LIMIT}", user, LIMIT)
    report.ratio("rlfleet user sync/rlfleet sync", user, "rlfleet sync")
    # The ceiling of a 2x8 fleet on this machine, and how much of it each mode reaches.
    report.ratio(f"{CEILING}/{USER_LIMIT}", CEILING, USER_LIMIT)
    for mode in ("user sync", "user sync prefetch=1", "user sync prefetch=2"):
        report.ratio(f"rlfleet {mode}/{CEILING}", f"rlfleet {mode}", CEILING)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    set_single_thread()
    report = Report("cartpole", quick=args.quick)
    report.note(
        f"{args.actors} actors/workers x {args.num_envs} envs, {args.frames_per_actor} frames per "
        f"actor batch, {args.window:g} s windows"
    )
    run(args, report)
    return report.emit()


if __name__ == "__main__":
    main(sys.argv[1:])
