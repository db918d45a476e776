"""What every benchmark script shares: arguments, medians, pairwise ratios, targets, output.

A script builds a :class:`Report`, adds the figures it measured (every figure
is a list of samples, one per repetition), the ratios between figures and the
targets those ratios must meet, then calls :meth:`Report.emit`, which prints a
table and, as the very last line of stdout, one JSON object (the contract the
smoke test and ``bench.run_all`` rely on). Ratios are computed pair by pair:
repetition ``i`` of one system against repetition ``i`` of the other, measured
back to back, so the drift of a shared, noisy machine cancels out; the median
of those per-repetition ratios is reported. The loopback TCP probe and RSS
sampling live in :mod:`bench._loopback` and :mod:`bench._rss`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

__all__ = [
    "Report",
    "base_parser",
    "check_budget",
    "choices",
    "frames_of",
    "init_local_ray",
    "median",
    "pairwise_ratios",
    "parse",
    "reps_of",
    "set_single_thread",
    "slope",
    "time_batches",
]


def base_parser(description: str, *, num_envs: int = 8) -> argparse.ArgumentParser:
    """The flags every script takes.

    ``--quick`` (a seconds-long smoke budget: 1 repetition, 1 actor with 2 envs
    unless given), ``--reps``, ``--actors`` and ``--num-envs``; call
    :func:`parse` to apply the defaults.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="tiny budget: checks the harness runs")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 3, quick 1)")
    parser.add_argument("--actors", type=int, default=None, help="actors / workers (default 2)")
    parser.add_argument(
        "--num-envs", type=int, default=None, help=f"envs per actor / worker (default {num_envs})"
    )
    parser.set_defaults(full_num_envs=num_envs)
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv`` and fill the defaults that depend on ``--quick``.

    Exits with argparse's usage error (status 2) when ``--actors``, ``--num-envs`` or
    ``--reps`` is below 1, or a script's ``--window`` is not above 0 seconds.
    """
    args = parser.parse_args(argv)
    if args.actors is None:
        args.actors = 1 if args.quick else 2
    if args.num_envs is None:
        args.num_envs = 2 if args.quick else args.full_num_envs
    if args.actors < 1 or args.num_envs < 1:
        parser.error(f"--actors and --num-envs must be >= 1, got {args.actors}, {args.num_envs}")
    check_budget(parser, args)
    return args


def check_budget(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Argparse's usage error (status 2) for ``--reps`` below 1 or a ``--window`` of 0 s or less.

    A window of no time measures nothing: 0 frames/s, whose ratios are infinite.
    """
    if args.reps is not None and args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    if getattr(args, "window", None) is not None and not args.window > 0:
        parser.error(f"--window must be > 0 seconds, got {args.window:g}")


def choices(
    parser: argparse.ArgumentParser, flag: str, text: str, known: Iterable[str]
) -> list[str]:
    """The comma-separated names of ``text``, each checked against ``known``.

    An unknown name is argparse's usage error (status 2), naming ``flag`` and the known
    names, before anything is measured.
    """
    known = set(known)
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown {flag} {unknown}; known: {sorted(known)}")
    return names


def reps_of(args: argparse.Namespace) -> int:
    """Repetitions to run: ``--reps`` if given, else 1 in quick mode and 3 otherwise."""
    if args.reps is not None:
        if args.reps < 1:
            raise SystemExit(f"--reps must be >= 1, got {args.reps}")
        return args.reps
    return 1 if args.quick else 3


def set_single_thread() -> None:
    """One torch thread in this process, as every actor and TorchRL worker runs."""
    import torch

    torch.set_num_threads(1)


def init_local_ray(ray: Any, **config: Any) -> None:
    """``ray.init(**config)``, once more if Ray's local start missed one of its fixed limits.

    On this loaded 2-core machine Ray's local start has failed that way ("The current node
    timed out during startup") in about one run of three under load, and once with "Timed out
    waiting for file .../gcs_server_port_..."; any other error is raised.
    """
    try:
        ray.init(**config)
    except Exception as error:
        if not any(w in str(error) for w in ("timed out during startup", "Timed out waiting")):
            raise
        ray.shutdown()
        ray.init(**config)


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (NaN when empty)."""
    return statistics.median(values) if values else math.nan


def pairwise_ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """``num[i] / den[i]`` for each repetition; ratios of medians when the counts differ."""
    if len(num) == len(den) and num:
        return [a / b if b else math.inf for a, b in zip(num, den, strict=True)]
    bottom = median(den)
    return [median(num) / bottom] if bottom else [math.inf]


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` over ``xs`` (0 with fewer than two distinct x)."""
    if len(xs) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def frames_of(batch: Any) -> int:
    """Frames in a TensorDict batch (the product of its batch dims)."""
    return int(batch.numel())


def time_batches(
    iterator: Iterator[Any],
    *,
    seconds: float,
    min_batches: int = 2,
    warmup: int = 1,
    measure: Callable[[Any], int] = frames_of,
    extra: Callable[[Any], int] | None = None,
) -> tuple[float, float]:
    """Pull ``warmup`` untimed batches, then time batches for about ``seconds``.

    The window ends at the first batch that completes after ``seconds`` (and
    not before ``min_batches`` batches), so every batch timed is whole.

    Args:
        iterator: A collector iterator.
        seconds: Length of the timed window.
        min_batches: Fewest batches in the window, however long they take.
        warmup: Batches pulled first and not timed (buffered batches, caches).
        measure: Counts the frames of a batch.
        extra: Counts something else per batch (e.g. payload bytes), summed.

    Returns:
        ``(frames per second, extra per second)`` over the window.
    """
    for _ in range(warmup):
        next(iterator)
    frames = counted = batches = 0
    start = time.perf_counter()
    while True:
        batch = next(iterator)
        batches += 1
        frames += measure(batch)
        if extra is not None:
            counted += extra(batch)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and batches >= min_batches:
            return frames / elapsed, counted / elapsed


@dataclasses.dataclass
class _Target:
    name: str
    value: float
    threshold: float
    higher_is_better: bool

    @property
    def met(self) -> bool:
        if math.isnan(self.value):
            return False
        if self.higher_is_better:
            return self.value >= self.threshold
        return self.value <= self.threshold


class Report:
    """The figures, ratios and targets of one script, printed as a table and a JSON line.

    Args:
        bench: The script's name (``"cartpole"``).
        quick: Whether the run used the smoke budget (its figures mean little).

    Example::

        report = Report("cartpole", quick=False)
        report.figure("rlfleet sync", "frames/s", [41e3, 40e3, 42e3])
        report.figure("torchrl sync", "frames/s", [1.2e3, 1.1e3, 1.3e3])
        r = report.ratio("rlfleet/torchrl sync", "rlfleet sync", "torchrl sync")
        report.target("sync >= 10x TorchRL", r, 10.0)
        report.emit()
    """

    def __init__(self, bench: str, *, quick: bool) -> None:
        self.bench = bench
        self.quick = quick
        self.figures: dict[str, dict[str, Any]] = {}
        self.ratios: dict[str, dict[str, Any]] = {}
        self.targets: list[_Target] = []
        self.skipped: dict[str, str] = {}
        self.notes: list[str] = []
        self._start = time.perf_counter()

    def figure(self, name: str, unit: str, samples: Iterable[float]) -> float:
        """Record a figure's samples; returns their median."""
        values = [float(v) for v in samples]
        self.figures[name] = {"unit": unit, "median": median(values), "samples": values}
        return median(values)

    def ratio(self, name: str, num: str, den: str) -> float:
        """Record ``num / den`` pair by pair over repetitions; returns the median ratio."""
        values = pairwise_ratios(self.figures[num]["samples"], self.figures[den]["samples"])
        self.ratios[name] = {"num": num, "den": den, "median": median(values), "samples": values}
        return median(values)

    def target(
        self, name: str, value: float, threshold: float, *, higher_is_better: bool = True
    ) -> bool:
        """Record a target (``value >= threshold``, or ``<=``); returns whether it is met."""
        target = _Target(name, float(value), float(threshold), higher_is_better)
        self.targets.append(target)
        return target.met

    def skip(self, name: str, reason: str) -> None:
        """Record a figure that was not measured and why (printed as ``skipped: <reason>``)."""
        self.skipped[name] = reason
        print(f"{name}: skipped: {reason}", flush=True)

    def note(self, text: str) -> None:
        """Record a free-form fact about the run (the configuration chosen, a caveat)."""
        self.notes.append(text)

    def payload(self) -> dict[str, Any]:
        """Everything recorded, as the JSON-serialisable object :meth:`emit` prints."""
        return {
            "bench": self.bench,
            "quick": self.quick,
            "elapsed_s": round(time.perf_counter() - self._start, 2),
            "machine": machine_facts(),
            "figures": self.figures,
            "ratios": self.ratios,
            "targets": [{**dataclasses.asdict(t), "met": t.met} for t in self.targets],
            "skipped": self.skipped,
            "notes": self.notes,
        }

    def emit(self) -> dict[str, Any]:
        """Print the table, then the JSON line (last on stdout); returns the payload."""
        payload = self.payload()
        print(format_table(payload), flush=True)
        print(json.dumps(payload, sort_keys=True, allow_nan=True), flush=True)
        return payload


def format_table(payload: dict[str, Any]) -> str:
    """The human-readable table of one script's payload."""
    lines = [f"== {payload['bench']}{' (quick)' if payload['quick'] else ''} =="]
    width = max([len(n) for n in [*payload["figures"], *payload["ratios"]]] + [10])
    for name, fig in payload["figures"].items():
        samples = ", ".join(_num(v) for v in fig["samples"])
        lines.append(f"  {name:<{width}}  {_num(fig['median']):>12} {fig['unit']:<10} [{samples}]")
    for name, rat in payload["ratios"].items():
        samples = ", ".join(f"{v:.3g}" for v in rat["samples"])
        lines.append(f"  {name:<{width}}  {rat['median']:>12.3g} x          [{samples}]")
    for t in payload["targets"]:
        sign = ">=" if t["higher_is_better"] else "<="
        verdict = "MET" if t["met"] else "NOT MET"
        lines.append(f"  target {t['name']}: {t['value']:.4g} {sign} {t['threshold']:g}  {verdict}")
    for name, reason in payload["skipped"].items():
        lines.append(f"  {name}: skipped: {reason}")
    lines.extend(f"  note: {n}" for n in payload["notes"])
    return "\n".join(lines)


def _num(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4g}"


def machine_facts() -> dict[str, Any]:
    """CPU count and model, memory and the versions that shape the figures."""
    facts: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "mem_gib": _mem_gib(),
        "python": platform.python_version(),
    }
    for module in ("torch", "torchrl", "grpc", "gymnasium", "tensordict", "numpy"):
        loaded = sys.modules.get(module)
        if loaded is not None:
            facts[module] = getattr(loaded, "__version__", "?")
    return facts


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            kib = int(f.readline().split()[1])
        return round(kib / 2**20, 1)
    except (OSError, ValueError, IndexError):
        return math.nan
