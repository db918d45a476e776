"""Run every benchmark, one subprocess each, then print every target and one JSON line.

``python -m bench.run_all [--quick] [--reps N] [--only a,b] [--skip a,b] [--out DIR]``
(``make bench ARGS=...``). Each script runs in its own process (so one's
actors, workers and memory never disturb the next), its table streams through
as it is printed, its stderr goes to a temporary file quoted only when it
fails. The last stdout line is ``{"bench": "run_all", "results": {name:
payload}, "targets": [...], "failed": [...]}``. The exit code is 1 when a script
failed or printed no JSON line; missed targets are reported, not failures.
The full run takes about 12 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["BENCHES", "main", "run_one"]

#: Script name -> module, in the order they run.
BENCHES = {
    "cartpole": "bench.cartpole",
    "torchrl_envs": "bench.torchrl_envs",
    "one_env": "bench.one_env",
    "large_obs": "bench.large_obs",
    "learner_cost": "bench.learner_cost",
    "weight_push": "bench.weight_push",
    "push_forms": "bench.push_forms",
    "sharded_push": "bench.sharded_push",
    "push_streams": "bench.push_streams",
    "llm_push": "bench.llm_push",
    "startup": "bench.startup",
    "sync_round": "bench.sync_round",
    "memory": "bench.memory",
    "codec": "bench.codec_bench",
    "metrics": "bench.metrics_overhead",
    "llm_tokens": "bench.llm_tokens",
}
# Scripts that take no --reps: the memory benchmark is one long run.
_ONE_RUN = {"memory"}
_STDERR_TAIL = 3000


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny budgets (seconds per script)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per figure")
    parser.add_argument("--only", default="", help="comma-separated scripts to run")
    parser.add_argument("--skip", default="", help="comma-separated scripts to leave out")
    parser.add_argument("--out", default="", help="directory for one <script>.json per script")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per script")
    args = parser.parse_args(argv)
    chosen = [n for n in args.only.split(",") if n] or list(BENCHES)
    skipped = {n for n in args.skip.split(",") if n}
    unknown = sorted((set(chosen) | skipped) - set(BENCHES))
    if unknown:
        parser.error(f"unknown scripts {unknown}; known: {list(BENCHES)}")
    args.names = [n for n in chosen if n not in skipped]
    if args.reps is not None and args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    if args.timeout is not None and not args.timeout > 0:
        parser.error(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    if args.timeout is None:
        args.timeout = 240.0 if args.quick else 420.0
    return args


def run_one(name: str, flags: Sequence[str], timeout: float) -> dict[str, Any]:
    """Run one script; returns its JSON payload, or ``{"error": ...}`` when it failed.

    A script still running after ``timeout`` seconds is killed (with its process group,
    so its actors and workers go too); on Ctrl-C or SIGTERM the script's group is interrupted
    (killed if still running 10 s later) before run_all stops.
    """
    cmd = [sys.executable, "-m", BENCHES[name], *flags]
    print(f"\n$ {' '.join(cmd[1:])}", flush=True)
    last_json: dict[str, Any] | None = None
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True
        )
        timed_out = threading.Event()
        watchdog = threading.Timer(timeout, _kill_group, args=(proc, timed_out))
        watchdog.start()
        try:
            for line in proc.stdout or ():
                parsed = _json_line(line)
                if parsed is None:
                    print(line, end="", flush=True)
                else:
                    last_json = parsed
            code = proc.wait()
        except BaseException:  # Ctrl-C: the script has its own session, so pass it on
            _stop_group(proc)
            raise
        finally:
            watchdog.cancel()
        stderr.seek(0, os.SEEK_END)
        stderr.seek(max(0, stderr.tell() - _STDERR_TAIL))
        tail = stderr.read().decode(errors="replace")
    if code == 0 and last_json is not None:
        return last_json
    reason = f"exit code {code}" if code else "no JSON line on stdout"
    if timed_out.is_set():
        reason = f"timed out after {timeout:g} s"
    print(f"{name}: FAILED ({reason})\n{tail}", flush=True)
    return {"bench": name, "error": reason, "stderr_tail": tail}


def _json_line(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _stop_group(proc: subprocess.Popen[str], grace: float = 10.0) -> None:
    """Interrupt a script's process group, then kill it if still running after ``grace`` s.

    The interrupt lets the script stop its actors and workers itself.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _kill_group(proc: subprocess.Popen[str], timed_out: threading.Event) -> None:
    timed_out.set()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def flags_for(name: str, args: argparse.Namespace) -> list[str]:
    """The command-line flags a script gets from run_all's."""
    flags = ["--quick"] if args.quick else []
    if args.reps is not None and name not in _ONE_RUN:
        flags += ["--reps", str(args.reps)]
    return flags


def summary(results: dict[str, dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every target of every script (with its script's name), and the scripts that failed."""
    targets = [
        {"bench": name, "higher_is_better": True, **t}
        for name, payload in results.items()
        for t in payload.get("targets", [])
    ]
    failed = [name for name, payload in results.items() if "error" in payload]
    return targets, failed


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen scripts; prints the summary and the final JSON line; returns the exit code."""
    args = parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (``timeout``, a cancelled CI job) stops the running script as Ctrl-C does.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    start = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        results[name] = run_one(name, flags_for(name, args), args.timeout)
        if out is not None:
            (out / f"{name}.json").write_text(json.dumps(results[name], sort_keys=True))
    targets, failed = summary(results)
    print("\n== all targets ==")
    for t in targets:
        sign = ">=" if t["higher_is_better"] else "<="
        verdict = "MET" if t["met"] else "NOT MET"
        print(
            f"  [{t['bench']}] {t['name']}: {t['value']:.4g} {sign} {t['threshold']:g}  {verdict}"
        )
    for name in failed:
        print(f"  [{name}] FAILED: {results[name]['error']}")
    elapsed = round(time.perf_counter() - start, 1)
    print(f"  {sum(t['met'] for t in targets)}/{len(targets)} targets met in {elapsed} s")
    payload = {
        "bench": "run_all",
        "quick": args.quick,
        "elapsed_s": elapsed,
        "results": results,
        "targets": targets,
        "failed": failed,
    }
    print(json.dumps(payload, sort_keys=True), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
