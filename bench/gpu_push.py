"""A 0.5B language model's bf16 push from a CUDA learner to CUDA LLM actors that generate.

The learner holds a ``Qwen2ForCausalLM`` of the ``0.5b`` shape
(:mod:`bench.llm_shapes`, random weights) in bf16 on CUDA; ``--actors`` (2) LLM
actors on the same host load the same checkpoint with ``--device cuda`` in bf16
and generate all the while (``collector.start()``). Each push is
``update_policy_weights_(model)``: the CUDA module is written once into a
page-locked blob (one device→host copy per tensor) and sent to every actor,
which stages it on its device and swaps it in between two decode steps.

``raw`` is the same bytes per actor over plain sockets to one receiver process
per actor at once, measured right after each push; ``pause`` is the longest
decode pause an actor reported for the push.

Targets: push <= 3x raw; the longest decode pause <= 10% of the push.

Usage: ``python -m bench.gpu_push [--quick] [--reps 3] [--actors 2]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench._common import Report, base_parser, parse, reps_of
from bench.llm_push import _Sink, save_checkpoint

__all__ = ["main"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=4)
    parser.add_argument("--shape", default=None, help="a bench.llm_shapes shape (default 0.5b)")
    args = parse(parser, argv)
    args.shape = args.shape or ("25m" if args.quick else "0.5b")
    return args


def _collector(
    stack: contextlib.ExitStack, spec: str, args: argparse.Namespace, device: str
) -> Any:
    from learner_client import GrpcLLMCollector, LocalFleet

    kwargs = json.dumps({"dtype": "bfloat16"})
    extra = ["--device", device, "--policy-kwargs", kwargs, "--torch-threads", "2"]
    fleet = stack.enter_context(
        LocalFleet(
            args.actors,
            kind="llm",
            task="arith",
            policy=spec,
            num_envs=args.num_envs,
            seed=0,
            extra_args=extra,
            start_timeout=600.0,
        )
    )
    return stack.enter_context(
        GrpcLLMCollector(
            fleet.addresses,
            dialog_turns_per_batch=args.num_envs,
            sync=False,
            generation={"max_new_tokens": 16},
            replay_buffer=_Sink(),
            connect_timeout=300.0,
            call_timeout=900.0,
        )
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    from bench._loopback import LoopbackReceivers
    from bench.llm_shapes import build_llm

    args = parse_args(argv)
    report = Report("gpu_push", quick=args.quick)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        report.skip("gpu_push", "no CUDA device: the same pushes on the CPU, as a smoke run")
    model = build_llm(args.shape, dtype=torch.bfloat16)
    report.note(f"{args.shape}: {sum(p.numel() for p in model.parameters()):,} parameters, bf16")
    seconds, pauses, raw, sizes = [], [], [], []
    with (
        tempfile.TemporaryDirectory() as directory,
        LoopbackReceivers(args.actors) as rx,
        contextlib.ExitStack() as stack,
    ):
        spec = save_checkpoint(model, Path(directory))
        model = model.to(device)
        collector = _collector(stack, spec, args, device)
        collector.update_policy_weights_(model)  # warm-up: connections, buffers
        collector.start()
        time.sleep(2.0)
        for _ in range(reps_of(args)):
            with torch.no_grad():
                next(model.parameters()).add_(1e-3)
            start = time.perf_counter()
            collector.update_policy_weights_(model)
            seconds.append(time.perf_counter() - start)
            stats = collector.stats()
            pauses.append(float(stats["last_push_pause"]))
            sizes.append(int(stats["last_push_bytes"]) // args.actors)
            raw.append(rx.transfer(memoryview(bytearray(max(1, sizes[-1])))))
    report.figure("push", "s", seconds)
    report.figure("push pause", "s", pauses)
    report.figure("push bytes per actor", "B", sizes)
    report.figure("raw", "s", raw)
    ratio = report.ratio("push/raw", "push", "raw")
    share = report.ratio("pause/push", "push pause", "push")
    report.target("push <= 3x raw loopback", ratio, 3.0, higher_is_better=False)
    report.target("longest decode pause <= 10% of the push", share, 0.1, higher_is_better=False)
    return report.emit()


if __name__ == "__main__":
    main()
