"""TorchRL's scripts on TorchRL's collector and on a fleet: final return and wall time.

Each script of :data:`~bench.torchrl_scripts._specs.SPECS` runs twice at its comparison
budget (``ScriptSpec.bench``: the same overrides, frames and seeds on both sides), first as
TorchRL ships it, then ported (its collector a ``GrpcCollector`` over two local actors), each
in its own process and folder. The criterion (:func:`within_criterion`): the fleet's final
return is within 20% of TorchRL's, or both reach the task's threshold.

Usage: ``python -m bench.torchrl_scripts [--only dqn_cartpole,sac] [--workdir DIR]``;
prints a table and, last, one JSON line (``bench/RESULTS.md`` records the table).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile

from bench.torchrl_scripts._run import RunResult, missing_needs, originals_root, run_script
from bench.torchrl_scripts._specs import SPECS, ScriptSpec

__all__ = ["main", "within_criterion"]

#: How far (relative to TorchRL's) the fleet's final return may be.
TOLERANCE = 0.2


def within_criterion(spec: ScriptSpec, ours: float | None, theirs: float | None) -> bool:
    """Whether the fleet's final return ``ours`` matches TorchRL's ``theirs``."""
    if ours is None or theirs is None:
        return False
    if spec.threshold is not None and min(ours, theirs) >= spec.threshold:
        return True
    return abs(ours - theirs) <= TOLERANCE * abs(theirs)


def _row(spec: ScriptSpec, fleet: RunResult, torchrl: RunResult) -> dict[str, object]:
    return {
        "script": spec.name,
        "frames": spec.frames,
        "rlfleet_return": fleet.final_return,
        "rlfleet_wall_s": round(fleet.wall_s, 1),
        "torchrl_return": torchrl.final_return,
        "torchrl_wall_s": round(torchrl.wall_s, 1),
        "ok": fleet.returncode == 0
        and torchrl.returncode == 0
        and within_criterion(spec, fleet.final_return, torchrl.final_return),
    }


def _fmt(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> None:
    """Run the comparison and print its table and JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated script names")
    parser.add_argument("--workdir", default="", help="where the runs' folders go")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(SPECS)
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="torchrl-scripts-"))
    rows = []
    print("| script | frames | rlfleet return | rlfleet wall s | torchrl return | torchrl wall s |")
    print("|---|---|---|---|---|---|")
    for name in names:
        spec = SPECS[name]
        why = "not on this machine" if originals_root(spec) is None else missing_needs(spec)
        if why:
            print(f"| {name} | {why} | | | | |")
            continue
        runs = {
            variant: run_script(
                spec, variant, spec.bench, workdir / name / variant, timeout=args.timeout
            )
            for variant in ("torchrl", "fleet")
        }
        row = _row(spec, runs["fleet"], runs["torchrl"])
        rows.append(row)
        cells = [_fmt(row[k]) for k in list(row)[:6]]
        print("| " + " | ".join(cells) + " |", flush=True)
        for run in runs.values():
            if run.returncode != 0:
                print(f"{name} {run.variant} failed ({run.returncode}):\n{run.log_tail}")
    print(json.dumps({"workdir": str(workdir), "rows": rows}))


if __name__ == "__main__":
    main()
