"""LLM tokens/s of an actor: the vLLM engine against rlfleet's decode loop, same model, CPU.

Workload (as ``bench/llm_tokens.py``): the built-in tiny Qwen2 (``rlfleet:tiny-qwen2``,
hidden 256, 4 layers, 4 heads, so head size 64, which vLLM's CPU attention takes; 4.0M
parameters, byte-level tokenizer, ChatML), float32, one-digit ``arith`` prompts (~23
tokens), sampling at temperature 1 from the full softmax, ``--new-tokens`` (32) new tokens
per answer, ``--num-envs`` (16) chat slots answered as one turn. Two one-actor fleets
(``LocalFleet``), each read by a sync ``GrpcLLMCollector`` (``layout="padded"``):
``--engine transformers`` (our loop, 1 torch thread, as an actor runs by default) and
``--engine vllm`` (an in-process vLLM engine; ``--vllm-bind`` sets its OpenMP binding:
one core by default, so both actors decode on one thread), timed in windows interleaved
repetition by repetition. Tokens are response tokens.

Needs vLLM (``.venv-vllm``, made by ``scripts/vllm_venv.sh``). On the CPU this is
vLLM's correctness path, not its speed path: no GPU figure comes from this script.

Usage: ``python -m bench.vllm_tokens [--quick] [--reps 3] [--window 6]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from bench._common import Report, base_parser, parse, reps_of

__all__ = ["main"]

MODEL = {"hidden": 256, "layers": 4, "heads": 4, "seed": 0, "dtype": "float32"}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=16)
    parser.add_argument("--new-tokens", type=int, default=32, help="new tokens per answer")
    parser.add_argument("--window", type=float, default=None, help="seconds per timed window")
    parser.add_argument(
        "--vllm-bind",
        default="0",
        help="VLLM_CPU_OMP_THREADS_BIND of the vLLM actor: 0 (one core, one thread, as the "
        "loop's actor), auto (vLLM's default: every core it sees), or a core list",
    )
    args = parse(parser, argv)
    if args.window is None:
        args.window = 1.0 if args.quick else 6.0
    return args


def _fleet(engine: str, args: argparse.Namespace) -> Any:
    from learner_client import LocalFleet

    return LocalFleet(
        1,
        kind="llm",
        task="arith",
        policy="rlfleet:tiny-qwen2",
        policy_kwargs=MODEL,
        num_envs=args.num_envs,
        seed=0,
        start_timeout=300.0,
        extra_args=["--engine", engine],
    )


def _collector(fleet: Any, args: argparse.Namespace) -> Any:
    from learner_client import GrpcLLMCollector

    return GrpcLLMCollector(
        fleet.addresses,
        dialog_turns_per_batch=args.num_envs,
        total_dialog_turns=-1,
        sync=True,
        layout="padded",
        generation={"max_new_tokens": args.new_tokens, "temperature": 1.0},
        batch_timeout=300.0,
    )


def _window(batches: Iterator[Any], seconds: float) -> float:
    """Tokens/s of whole batches over at least ``seconds``."""
    tokens, start = 0, time.perf_counter()
    while True:
        tokens += int(next(batches)["response_len"].sum())
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return tokens / elapsed


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.vllm_bind
    engines = ("transformers", "vllm")
    samples: dict[str, list[float]] = {engine: [] for engine in engines}
    with contextlib.ExitStack() as stack:
        batches = {}
        for engine in engines:
            fleet = stack.enter_context(_fleet(engine, args))
            collector = stack.enter_context(_collector(fleet, args))
            batches[engine] = iter(collector)
            next(batches[engine])  # warm-up
        for _ in range(reps_of(args)):
            for engine in engines:
                samples[engine].append(_window(batches[engine], args.window))
    report = Report("vllm_tokens", quick=args.quick)
    report.figure("our decode loop actor", "tokens/s", samples["transformers"])
    report.figure("vLLM engine actor", "tokens/s", samples["vllm"])
    report.ratio("vLLM / our loop", "vLLM engine actor", "our decode loop actor")
    report.note(f"vLLM actor's VLLM_CPU_OMP_THREADS_BIND={args.vllm_bind}; loop actor: 1 thread")
    report.note("CPU only: vLLM's correctness path; no GPU figure (needs a GPU run)")
    return report.emit()


if __name__ == "__main__":
    main()
