"""Learner cost: CPU seconds per million frames and per GB received, and its ceiling in frames/s.

Two workloads, each with one ``GrpcCollector`` (sync) in this process, whose
CPU time (``time.process_time``: every thread of the learner process) is read
around timed windows:

- ``pixels``: 2 actors x 4 envs of :func:`bench.envs.make_fresh_pixel_env` (uint8
  ``(4, 84, 84)`` frames, every one fresh random data), the user-style policy
  ``bench.policies:pixel_policy``; actors and learner share the 2 cores.
- ``replay``: actors replaying one pre-collected batch (``bench._replay_actor``:
  no env, no policy; each batch encoded and sent), so the learner is the
  bottleneck: the most frames/s one learner process takes, pixels and CartPole
  (CartPole sync and async).

Bytes received are the batches' bytes as they cross the wire (each per-actor
batch encoded as its actor sends it: folded, or whole with ``--unfolded-wire``
for a version that does not fold).
``--profile FILE`` first runs one pixel session (fleet, collector, one window)
with cProfile on every learner thread, prints the top functions and saves the
pstats to ``FILE``; the measured sessions run without it.

Targets (the learner's receive path): >= 2 GB/s per core (<= 0.5 CPU s per GB).

Usage: ``python -m bench.learner_cost [--quick] [--reps 3] [--mode pixels,replay]``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from bench._common import Report, base_parser, choices, parse, reps_of, set_single_thread

__all__ = ["main"]

PIXELS = "bench.envs:make_fresh_pixel_env"
POLICY = "bench.policies:pixel_policy"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=4)
    parser.add_argument("--frames-per-actor", type=int, default=256, help="frames per actor batch")
    parser.add_argument("--window", type=float, default=None, help="seconds per timed window")
    parser.add_argument("--mode", default="pixels,replay", help="pixels, replay or both")
    parser.add_argument(
        "--unfolded-wire",
        action="store_true",
        help="count bytes as unfolded batches (to measure a version that does not fold)",
    )
    parser.add_argument("--profile", default="", help="write a cProfile of the learner here")
    args = parse(parser, argv)
    args.mode = choices(parser, "--mode", args.mode, ("pixels", "replay"))
    if args.window is None:
        args.window = 1.0 if args.quick else 5.0
    if args.quick:
        args.frames_per_actor = min(args.frames_per_actor, 16 * args.num_envs)
    return args


def wire_bytes(batch: Any, fold: bool, sync: bool = True) -> int:
    """Bytes a batch took on the wire: each actor's batch encoded as the actor sends it.

    A sync batch stacks one batch per actor on dim 0; an async batch is one actor's.
    """
    from common.packets import encode_packet

    total = 0
    for part in batch.unbind(0) if sync else [batch]:
        part = part.exclude(("collector", "worker_id")).contiguous()
        if fold:
            from common.packets.folding import fold as fold_batch

            folded = fold_batch(part, ["observation"])
            total += encode_packet(folded.batch).nbytes + encode_packet(folded.finals).nbytes
        else:
            total += encode_packet(part).nbytes
    return total


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each of this process's threads so far, summed by thread name."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        name = re.sub(r"[-_]?\d+$", "", name)  # pool threads share one name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def measure(
    iterator: Iterator[Any], seconds: float, fold: bool, sync: bool = True
) -> dict[str, float]:
    """One timed window: frames/s, learner CPU per Mframes and per GB, and GB/s per core.

    Also the CPU microseconds per frame of each kind of learner thread (by name).
    """
    per_frame = None
    for _ in range(2):
        batch = next(iterator)
        per_frame = wire_bytes(batch, fold, sync) / batch.numel()
    assert per_frame is not None
    frames = 0
    threads = thread_cpu()
    cpu, start = time.process_time(), time.perf_counter()
    while True:
        frames += next(iterator).numel()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    cpu = time.process_time() - cpu
    after = thread_cpu()
    gigabytes = frames * per_frame / 1e9
    by_thread = {
        f"us per frame in thread {name}": (after[name] - threads.get(name, 0.0)) / frames * 1e6
        for name in sorted(after)
        if after[name] - threads.get(name, 0.0) > 0
    }
    return {
        **by_thread,
        "frames/s": frames / elapsed,
        "cpu s per Mframes": cpu / frames * 1e6,
        "cpu s per GB": cpu / gigabytes,
        "GB/s per core": gigabytes / cpu,
        "learner cores busy": cpu / elapsed,
        "wire bytes per frame": per_frame,
    }


@contextlib.contextmanager
def profiled(path: str) -> Iterator[None]:
    """Profile every thread started inside (and this one); print and save the merged stats."""
    if not path:
        yield
        return
    profiles: list[cProfile.Profile] = []

    def start(*_: Any) -> None:
        profile = cProfile.Profile()
        profiles.append(profile)
        profile.enable()

    threading.setprofile(start)
    start()
    try:
        yield
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        for profile in profiles:
            profile.disable()
        stats = pstats.Stats(*profiles)
        stats.dump_stats(path)
        stats.sort_stats("tottime").print_stats(25)


@contextlib.contextmanager
def replay_actors(count: int, env_args: Sequence[str], num_envs: int) -> Iterator[list[str]]:
    """``count`` replaying actor processes; yields their addresses."""
    procs, addresses = [], []
    try:
        for worker_id in range(count):
            argv = [sys.executable, "-m", "bench._replay_actor", "--port", "0",
                    "--worker-id", str(worker_id), "--num-envs", str(num_envs),
                    "--torch-threads", "1", "--seed", str(worker_id + 1), *env_args]  # fmt: skip
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
            procs.append(proc)
            assert proc.stdout is not None
            line = proc.stdout.readline()
            found = re.search(r"port=(\d+)", line)
            if found is None:
                raise RuntimeError(f"replay actor {worker_id} did not start: {line!r}")
            addresses.append(f"127.0.0.1:{found.group(1)}")
        yield addresses
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_pixels(args: argparse.Namespace, report: Report) -> None:
    """Learner CPU while 2 actors collect fresh pixel frames with a user policy."""
    if args.profile:  # a session of its own: the profiler slows what it watches
        with profiled(args.profile):
            _pixel_session(args, 1)
    _record(report, _pixel_session(args, reps_of(args)))


def _pixel_session(args: argparse.Namespace, reps: int) -> dict[str, list[float]]:
    from bench import _rlfleet

    fold = not args.unfolded_wire
    samples: dict[str, list[float]] = {}
    with _rlfleet.fleet(
        args.actors, env_factory=PIXELS, num_envs=args.num_envs, policy=POLICY
    ) as fleet, _rlfleet.collector(
        fleet.addresses, sync=True, frames_per_batch=args.frames_per_actor * args.actors
    ) as coll:  # fmt: skip
        batches = iter(coll)
        for _ in range(reps):
            for name, value in measure(batches, args.window, fold).items():
                samples.setdefault(f"pixels {name}", []).append(value)
    return samples


def run_replay(args: argparse.Namespace, report: Report) -> None:
    """The most frames/s one learner takes from actors replaying a batch (pixels, CartPole).

    CartPole also async (``sync=False``: each actor's batch yielded as it comes, its ack
    and its next credit sent together), where the learner's cost per batch is all there is.
    """
    from bench import _rlfleet

    fold = not args.unfolded_wire
    cartpole = ["--env", "CartPole-v1", "--policy", "random"]
    workloads = {  # name: (actor flags, envs per actor, sync)
        "replay pixels": (["--env-factory", PIXELS, "--policy", "random"], args.num_envs, True),
        "replay cartpole": (cartpole, 8, True),
        "replay cartpole async": (cartpole, 8, False),
    }
    samples: dict[str, list[float]] = {}
    for name, (env_args, num_envs, sync) in workloads.items():
        frames = args.frames_per_actor if "pixels" in name else 1024
        with replay_actors(args.actors, env_args, num_envs) as addresses, _rlfleet.collector(
            addresses, sync=sync, frames_per_batch=frames * (args.actors if sync else 1)
        ) as coll:  # fmt: skip
            batches = iter(coll)
            for _ in range(reps_of(args)):
                for key, value in measure(batches, args.window, fold, sync).items():
                    samples.setdefault(f"{name} {key}", []).append(value)
    _record(report, samples)


#: The unit of each measured quantity, by the end of its figure's name.
_UNITS = {
    "frames/s": "frames/s",
    "cpu s per Mframes": "s/Mframes",
    "cpu s per GB": "s/GB",
    "GB/s per core": "GB/s",
    "learner cores busy": "cores",
    "wire bytes per frame": "bytes",
}


def _record(report: Report, samples: dict[str, list[float]]) -> None:
    for name, values in samples.items():
        unit = next((u for end, u in _UNITS.items() if name.endswith(end)), "us/frame")
        report.figure(name, unit, values)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    set_single_thread()
    report = Report("learner_cost", quick=args.quick)
    modes = set(args.mode)
    report.note(
        f"{args.actors} actors, sync (but 'replay cartpole async'), "
        f"{args.frames_per_actor} frames per actor batch (pixels), "
        f"{args.window:g} s windows, {'unfolded' if args.unfolded_wire else 'folded'} batches; "
        "CPU = time.process_time of the learner process (all its threads)"
    )
    if "pixels" in modes:
        run_pixels(args, report)
        per_core = report.payload()["figures"]["pixels GB/s per core"]["median"]
        report.target("learner receives >= 2 GB/s per core (pixels)", per_core, 2.0)
    if "replay" in modes:
        run_replay(args, report)
    return report.emit()


if __name__ == "__main__":
    main(sys.argv[1:])
