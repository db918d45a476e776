"""TorchRL's scripts on TorchRL's collector and on a fleet: final return and wall time.

Each script of :data:`~bench.torchrl_scripts._specs.SPECS` runs twice at its comparison
budget (``ScriptSpec.bench``: the same overrides, frames and seeds on both sides), first as
TorchRL ships it, then ported (its collector a ``GrpcCollector`` over ``ScriptSpec.actors``
local actors, or ``--actors``), each in its own process and folder; ``--runs N`` repeats
both, alternating (run ``i`` with seed ``i``: torch's, numpy's and random's before the
script runs, and a seeded script's own), and compares medians.
The criterion (:func:`within_criterion`): the fleet's final return is within 20% of
TorchRL's, or both reach the task's threshold.

Usage: ``python -m bench.torchrl_scripts [--only dqn_cartpole,sac] [--runs 3] [--workdir DIR]
[--first-seed 3] [--override env.name=Pendulum-v1 ...]``;
prints a table and, last, one JSON line (``bench/RESULTS.md`` records the table).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile
from collections.abc import Sequence

from bench.torchrl_scripts._run import RunResult, missing_needs, originals_root, run_script
from bench.torchrl_scripts._specs import SPECS, ScriptSpec

__all__ = ["compare", "main", "within_criterion"]

#: How far (relative to TorchRL's) the fleet's final return may be.
TOLERANCE = 0.2


def within_criterion(spec: ScriptSpec, ours: float | None, theirs: float | None) -> bool:
    """Whether the fleet's final return ``ours`` matches TorchRL's ``theirs``."""
    if ours is None or theirs is None:
        return False
    if spec.threshold is not None and min(ours, theirs) >= spec.threshold:
        return True
    return abs(ours - theirs) <= TOLERANCE * abs(theirs)


def _median(values: list[float | None]) -> float | None:
    """The median of the runs' returns (None if a run gave none)."""
    if not values or any(v is None for v in values):
        return None
    return float(statistics.median(v for v in values if v is not None))


def _row(spec: ScriptSpec, runs: dict[str, list[RunResult]], actors: int) -> dict[str, object]:
    fleet, torchrl = runs["fleet"], runs["torchrl"]
    ours = _median([r.final_return for r in fleet])
    theirs = _median([r.final_return for r in torchrl])
    return {
        "script": spec.name,
        "frames": spec.frames,
        "rlfleet_return": ours,
        "rlfleet_wall_s": _median_wall(fleet),
        "rlfleet_collect_s": _median_collection(fleet),
        "torchrl_return": theirs,
        "torchrl_wall_s": _median_wall(torchrl),
        "torchrl_collect_s": _median_collection(torchrl),
        "actors": actors,
        "rlfleet_runs": [r.final_return for r in fleet],
        "torchrl_runs": [r.final_return for r in torchrl],
        "ok": bool(fleet and torchrl)
        and all(r.returncode == 0 for r in fleet + torchrl)
        and within_criterion(spec, ours, theirs),
    }


def _median_wall(runs: list[RunResult]) -> float | None:
    return round(statistics.median(r.wall_s for r in runs), 1) if runs else None


def _median_collection(runs: list[RunResult]) -> str | None:
    """The median of the runs' seconds waiting on the collector, then (bracketed) the first's.

    The first batch's wait holds, on a fleet, the actors' start-up. None if a run has none.
    """
    waits = [r.collection_s for r in runs]
    firsts = [r.first_batch_s for r in runs]
    if not waits or any(v is None for v in waits + firsts):
        return None
    wait = statistics.median(v for v in waits if v is not None)
    first = statistics.median(v for v in firsts if v is not None)
    return f"{wait:.1f} ({first:.1f})"


def _fmt(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def compare(
    spec: ScriptSpec,
    workdir: pathlib.Path,
    *,
    runs: int = 1,
    timeout: float = 3600.0,
    actors: int = 0,
    sides: Sequence[str] = ("torchrl", "fleet"),
    first_seed: int = 0,
    extra: Sequence[str] = (),
) -> dict[str, object]:
    """``runs`` runs of each side, alternating, and their row (``"ok"``: the criterion).

    Run ``i`` has seed ``first_seed + i``; ``extra`` hydra overrides follow the spec's
    budget on both sides (another env or budget for the same comparison).
    """
    results: dict[str, list[RunResult]] = {"torchrl": [], "fleet": []}
    for index in range(first_seed, first_seed + runs):
        for variant in sides:
            dest = workdir / spec.name / f"{variant}{index}"
            seed = (f"{spec.seed_key}={index}",) if spec.seed_key else ()
            overrides = (*spec.bench, *extra, *seed)
            run = run_script(
                spec, variant, overrides, dest, timeout=timeout, actors=actors, seed=index
            )
            results[variant].append(run)
            if run.returncode != 0:
                print(f"{spec.name} {variant} failed ({run.returncode}):\n{run.log_tail}")
    return _row(spec, results, actors or spec.actors)


def main(argv: list[str] | None = None) -> None:
    """Run the comparison and print its table and JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated script names")
    parser.add_argument("--workdir", default="", help="where the runs' folders go")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument("--runs", type=int, default=1, help="runs of each side (medians)")
    parser.add_argument("--actors", type=int, default=0, help="the fleet's actors (0: spec's)")
    parser.add_argument("--sides", default="torchrl,fleet", help="which sides run: torchrl,fleet")
    parser.add_argument("--first-seed", type=int, default=0, help="run i has seed first-seed + i")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        help="a hydra override for both sides, after the spec's budget (repeatable)",
    )
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(SPECS)
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="torchrl-scripts-"))
    rows = []
    print(
        "| script | frames | rlfleet return | rlfleet wall s | rlfleet collect s (first batch) "
        "| torchrl return | torchrl wall s | torchrl collect s (first batch) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        spec = SPECS[name]
        why = "not on this machine" if originals_root(spec) is None else missing_needs(spec)
        why = why or ("" if spec.compared else "no comparison budget (smoke runs only)")
        if why:
            print(f"| {name} | {why} | | | | | | |")
            continue
        sides = args.sides.split(",")
        row = compare(
            spec,
            workdir,
            runs=args.runs,
            timeout=args.timeout,
            actors=args.actors,
            sides=sides,
            first_seed=args.first_seed,
            extra=args.override,
        )
        rows.append(row)
        cells = [_fmt(row[k]) for k in list(row)[:8]]
        print("| " + " | ".join(cells) + " |", flush=True)
    print(json.dumps({"workdir": str(workdir), "rows": rows}))


if __name__ == "__main__":
    main()
