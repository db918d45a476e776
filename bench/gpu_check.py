"""The GPU checks, in one run that fits a short lease on a CUDA machine (about 8 minutes).

Steps, each in its own process with its own time limit, in order of value;
a step that fails or runs out of time is reported and the next one runs:

1. ``pytest -m cuda``: every test that needs a CUDA device (CPU/CUDA parity of an
   env actor's batches, pinned staging, CUDA learner delivery, CUDA pushes, LLM
   decoding on the device, ``rlfleet-train`` and ``rlfleet-grpo`` with ``--learner-device
   cuda``);
2. :mod:`bench.gpu_pixels`: Nature-CNN pixel actors on CUDA vs on the CPU vs the
   in-process limit, and the learner's delivery into device memory;
3. :mod:`bench.gpu_push`: a 0.5B model's bf16 push from a CUDA learner to 2 CUDA
   LLM actors that generate, against a raw loopback transfer;
4. :mod:`bench.gpu_llm`: LLM actor tokens/s on CUDA against HF ``generate`` with a
   static cache and TorchRL's ``LLMCollector``.

Each step's output goes to ``--out DIR/<step>.log`` and a summary (exit codes,
seconds, each benchmark's JSON line) to ``DIR/summary.json``. Without CUDA the
script says so and exits 2.

Usage: ``python -m bench.gpu_check [--out DIR] [--only pytest,pixels,push,llm]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["STEPS", "main"]

#: name -> (command, seconds allowed)
STEPS: dict[str, tuple[list[str], int]] = {
    "pytest": (
        [
            sys.executable,
            "-m",
            "pytest",
            "tests",
            "-m",
            "cuda",
            "-q",
            "-p",
            "no:cacheprovider",
            "--continue-on-collection-errors",
        ],
        160,  # the two reference learners' runs on the GPU take about a minute of it
    ),
    "pixels": (
        [sys.executable, "-m", "bench.gpu_pixels", "--actors", "4", "--reps", "2", "--window", "6"],
        100,
    ),
    "push": ([sys.executable, "-m", "bench.gpu_push", "--reps", "3"], 90),
    # the compiled decode first (actor, then in-process), HF's anchors, TorchRL's last: what a
    # step prints before its limit is in its log
    "llm": ([sys.executable, "-m", "bench.gpu_llm"], 190),
}


def run_step(name: str, out: Path) -> dict[str, object]:
    """Run one step under its time limit; its output in ``out/<name>.log``."""
    command, limit = STEPS[name]
    start = time.perf_counter()
    log = out / f"{name}.log"
    with log.open("w") as sink:
        try:
            code: int | str = subprocess.run(
                command, stdout=sink, stderr=subprocess.STDOUT, timeout=limit, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            code = f"timed out after {limit} s"
    lines = log.read_text(errors="replace").splitlines()
    last = next((ln for ln in reversed(lines) if ln.startswith("{")), None)
    result = {"exit": code, "seconds": round(time.perf_counter() - start, 1)}
    if last is not None:
        result["bench"] = json.loads(last)
    print(f"== {name}: {result['exit']} in {result['seconds']} s", flush=True)
    print("\n".join(ln for ln in lines[-40:] if not ln.startswith("{")), flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Run the steps; returns 0 when every step exited 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-check"))
    parser.add_argument("--only", default=",".join(STEPS), help="comma-separated steps")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device here; run it on a CUDA machine", flush=True)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for name in [s for s in args.only.split(",") if s]:
        summary[name] = run_step(name, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return 0 if all(v.get("exit") == 0 for v in summary.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
