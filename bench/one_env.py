"""One env on one actor: a ported TorchRL script's collection against TorchRL's ``Collector``.

Workload: ``crossq``'s own env and actor (``sota-implementations/crossq/utils.py`` of the
installed torchrl, with the config and overrides ``bench.torchrl_scripts`` compares it
at: Pendulum-v1, critics of 256x256), one env, ``--frames`` frames per batch. Systems,
interleaved, each timed over a window per repetition:

- torchrl: TorchRL's ``Collector`` on the script's ``make_environment`` env and
  ``make_crossQ_agent`` actor, in this process (what the script builds);
- torchrl pooled: TorchRL's ``Collector`` on the fleet's factories
  (``bench.torchrl_scripts.fleets.crossq``), the env as an actor steps it (its one env as it
  is), in this process;
- rlfleet: ``LocalFleet(1, kind="torchrl")`` on those factories under a sync
  ``GrpcCollector`` (what the ported script collects with).

Figures: frames/s of each (medians of ``--reps``); ratios rlfleet/torchrl (target >= 1.0x:
a script on a same-host fleet is not slower), torchrl pooled/torchrl (what the factories'
layout costs) and rlfleet/torchrl pooled (what the actor's loop and the transport cost
beyond TorchRL's loop on the same env and policy).

Usage: ``python -m bench.one_env [--quick] [--reps 5] [--frames 1000] [--window 6]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from bench._common import Report, check_budget, reps_of, set_single_thread, time_batches
from bench.torchrl_scripts._run import CONFIGS, ROOT, originals_root
from bench.torchrl_scripts._specs import SPECS

__all__ = ["main"]

_FLEET = "bench.torchrl_scripts.fleets.crossq"


def _config(quick: bool) -> Any:
    """The crossq config with the comparison's overrides (smaller critics in quick mode)."""
    from omegaconf import OmegaConf

    spec = SPECS["crossq"]
    overrides = [o for o in spec.bench if "=" in o and not o.startswith("+")]
    if quick:
        overrides += ["network.critic_hidden_sizes=[32,32]", "network.actor_hidden_sizes=[32,32]"]
    cfg = OmegaConf.load(CONFIGS / "crossq" / "config.yaml")
    return OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))


def _script_folder() -> None:
    """The crossq folder in the installed torchrl, put on this process's and the actors' path."""
    folder = originals_root(SPECS["crossq"])
    if folder is None:
        raise SystemExit("bench.one_env: crossq's sources are not in the installed torchrl")
    paths = [str(folder), str(ROOT), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    sys.path[:0] = [str(folder)]


def _torchrl(cfg: Any, frames: int, stack: contextlib.ExitStack) -> Iterator[Any]:
    """TorchRL's ``Collector`` as crossq builds it, on its own env and actor."""
    from torchrl.collectors import Collector
    from utils import make_crossQ_agent, make_environment  # crossq's, from its folder

    env, eval_env = make_environment(cfg)
    eval_env.close(raise_if_closed=False)  # never started
    policy = make_crossQ_agent(cfg, env, "cpu")[1].eval()
    collector = Collector(env, policy, frames_per_batch=frames, total_frames=-1, device="cpu")
    stack.callback(collector.shutdown)
    return iter(collector)


def _torchrl_pooled(cfg: Any, frames: int, stack: contextlib.ExitStack) -> Iterator[Any]:
    """TorchRL's ``Collector`` on the fleet's factories, the env as an actor steps it.

    The actor steps its one env as it is: the factory's, the script's batch of one under its
    transforms. This system tells the factories' share from the actor's own.
    """
    from torchrl.collectors import Collector

    from bench.torchrl_scripts.fleets.crossq import make_env, make_policy

    env = make_env(cfg)
    policy = make_policy(env, cfg)
    collector = Collector(env, policy, frames_per_batch=frames, total_frames=-1, device="cpu")
    stack.callback(collector.shutdown)
    return iter(collector)


def _fleet(cfg: Any, frames: int, stack: contextlib.ExitStack) -> Iterator[Any]:
    """One actor on this host, collected by a sync ``GrpcCollector``.

    ``LocalFleet`` sends the OmegaConf ``cfg`` as plain data; the actor rebuilds it.
    """
    from bench import _rlfleet

    fleet = stack.enter_context(
        _rlfleet.LocalFleet(
            1,
            num_envs=1,
            kind="torchrl",
            env_factory=f"{_FLEET}:make_env",
            env_kwargs={"cfg": cfg},
            policy=f"{_FLEET}:make_policy",
            policy_kwargs={"cfg": cfg},
            seed=0,
            extra_args=["--torch-threads", "1"],
            start_timeout=180.0,
        )
    )
    collector = stack.enter_context(
        _rlfleet.collector(fleet.addresses, sync=True, frames_per_batch=frames)
    )
    return iter(collector)


def run(args: argparse.Namespace, report: Report) -> None:
    """Measure the three systems, interleaved; record their figures and ratios."""
    _script_folder()
    cfg = _config(args.quick)
    samples: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        systems = {
            "torchrl": _torchrl(cfg, args.frames, stack),
            "torchrl pooled": _torchrl_pooled(cfg, args.frames, stack),
            "rlfleet": _fleet(cfg, args.frames, stack),
        }
        for _ in range(reps_of(args)):
            for name, iterator in systems.items():
                fps, _ = time_batches(iterator, seconds=args.window, warmup=1)
                samples.setdefault(name, []).append(fps)
    for name, values in samples.items():
        report.figure(name, "frames/s", values)
    ratio = report.ratio("rlfleet/torchrl", "rlfleet", "torchrl")
    report.ratio("torchrl pooled/torchrl", "torchrl pooled", "torchrl")
    report.ratio("rlfleet/torchrl pooled", "rlfleet", "torchrl pooled")
    report.target("one env, sync: rlfleet >= 1.0x TorchRL's Collector", ratio, 1.0)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny budget: checks the harness runs")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 3, quick 1)")
    parser.add_argument("--frames", type=int, default=1000, help="frames per batch")
    parser.add_argument("--window", type=float, default=None, help="seconds per timed window")
    args = parser.parse_args(argv)
    check_budget(parser, args)
    if args.window is None:
        args.window = 0.5 if args.quick else 6.0
    if args.quick:
        args.frames = min(args.frames, 50)
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    set_single_thread()
    report = Report("one_env", quick=args.quick)
    report.note(f"crossq on Pendulum-v1, one env, {args.frames} frames per batch")
    run(args, report)
    return report.emit()


if __name__ == "__main__":
    main(sys.argv[1:])
