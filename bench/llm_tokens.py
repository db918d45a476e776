"""LLM tokens/s: a 2-actor rlfleet fleet vs in-process decoding (the limit) vs TorchRL.

Workload: the built-in tiny Qwen2 (``rlfleet:tiny-qwen2``, hidden 256, 4 layers, 4.0M
parameters, byte-level tokenizer, ChatML), one-digit ``arith`` prompts (~23 tokens),
sampling at temperature 1 from the full softmax, ``--new-tokens`` (32) new tokens per
answer, ``--slots`` (16) answers decoded as one batch, 1 torch thread everywhere.
Systems, all in this one run, interleaved repetition by repetition:

- the limit: :func:`common.llm.generate` on the model in this process, batch of
  ``slots`` — what one core does with no transport at all;
- the fleet's ceiling: ``actors`` such in-process decoders in their own processes, their
  timed windows started together (what the machine's cores give that many decoders
  at once, with no transport and no learner);
- rlfleet: ``GrpcLLMCollector`` (async) over a ``LocalFleet`` of 2 LLM actors with
  ``slots`` chat slots each; tokens/s of the fleet and per actor; with the default
  ``prefetch`` (TorchRL's ``MultiAsyncCollector``: an actor starts its next batch once its
  last one is taken, so it idles for the round trip of a credit), and with ``prefetch=2``
  (rlfleet's opt-in: one batch more ahead, up to one batch older weights), which takes that
  round trip off the actors;
- TorchRL: ``LLMCollector(ChatEnv + TransformersWrapper(generate=True))``, one
  process, the same model, batch and sampling (``do_sample=True``, ``top_k`` = the
  vocabulary, the same new-token budget).

Tokens are response tokens (an answer that hits EOS early counts only its tokens;
every system counts them the same way). Targets: each rlfleet actor >= 0.9x the
in-process rate, or, where the decoders' contention for the cores is the limit, the fleet
>= 0.95x its ceiling; the fleet >= 2x TorchRL's ``LLMCollector``.

Usage: ``python -m bench.llm_tokens [--quick] [--reps 3] [--window 6]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

from bench._common import Report, base_parser, parse, reps_of, set_single_thread

__all__ = ["main"]

MODEL = {"hidden": 256, "layers": 4, "heads": 4, "seed": 0}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=16)
    parser.add_argument("--new-tokens", type=int, default=32, help="new tokens per answer")
    parser.add_argument("--window", type=float, default=None, help="seconds per timed window")
    parser.add_argument(
        "--decoder", action="store_true", help=argparse.SUPPRESS
    )  # one ceiling decoder: ready, wait for a line on stdin, print tokens/s
    args = parse(parser, argv)
    if args.window is None:
        args.window = 1.0 if args.quick else 6.0
    return args


def _prompts(tokenizer: Any, count: int) -> list[list[int]]:
    import random

    from common.llm import build_task

    task, rng = build_task("arith"), random.Random(0)
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": task.sample(rng).query}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        )
        for _ in range(count)
    ]


def in_process(args: argparse.Namespace, start: Any = None) -> float:
    """Response tokens/s of :func:`common.llm.generate` in this process.

    ``start``, when given, is called after a warm-up batch, before the timed window.
    """
    import torch

    from common.llm import GenerationSettings, build_policy, cached_forward, generate

    model, tok = build_policy("rlfleet:tiny-qwen2", **MODEL)
    settings = GenerationSettings(max_new_tokens=args.new_tokens, temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    prompts = _prompts(tok, args.num_envs)

    @torch.no_grad()
    def forward(ids: Any, mask: Any, positions: Any, past: Any) -> tuple[Any, Any, int]:
        return (*cached_forward(model, ids, mask, positions, past), 0)

    def one_batch() -> int:
        result = generate(
            forward,
            prompts,
            settings,
            budgets=[args.new_tokens] * args.num_envs,
            stop_ids=(tok.eos_token_id,),
            pad_id=tok.pad_token_id,
            generator=generator,
        )
        return int(result.lengths.sum())

    if start is not None:
        one_batch()
        start()
    return _rate(one_batch, args.window)


def ceiling(args: argparse.Namespace) -> float:
    """Tokens/s of ``actors`` in-process decoders in their own processes, timed together."""
    argv = [sys.executable, "-m", "bench.llm_tokens", "--decoder", "--window", str(args.window)]
    argv += ["--new-tokens", str(args.new_tokens), "--num-envs", str(args.num_envs)]
    procs = [
        subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(args.actors)
    ]
    try:
        for proc in procs:  # every decoder built and warmed up
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a ceiling decoder failed to start")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate()[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    if any(proc.returncode for proc in procs):
        raise RuntimeError(f"a ceiling decoder failed: exit codes {[p.returncode for p in procs]}")
    return sum(float(out.strip().splitlines()[-1]) for out in outputs)


def _decoder(args: argparse.Namespace) -> None:
    """One ceiling decoder (``--decoder``): warm up, say ready, wait for go, print tokens/s."""

    def start() -> None:
        print("ready", flush=True)
        sys.stdin.readline()

    print(in_process(args, start), flush=True)


def rlfleet(args: argparse.Namespace, addresses: list[str], prefetch: int | None = None) -> float:
    """Response tokens/s of the whole fleet through ``GrpcLLMCollector`` (async)."""
    from learner_client import GrpcLLMCollector

    with GrpcLLMCollector(
        addresses,
        dialog_turns_per_batch=args.num_envs,
        sync=False,
        generation={"max_new_tokens": args.new_tokens, "temperature": 1.0},
        layout="padded",
        prefetch=prefetch,
    ) as collector:
        batches = iter(collector)
        for _ in range(2 * len(addresses)):  # warm-up: every actor's first batch
            next(batches)
        return _rate(lambda: int(next(batches)["response_len"].sum()), args.window)


def torchrl_collector(args: argparse.Namespace) -> Any:
    """TorchRL's ``LLMCollector`` over ``ChatEnv`` + ``TransformersWrapper``, same model."""
    from torchrl.collectors.llm import LLMCollector
    from torchrl.envs.llm import ChatEnv
    from torchrl.modules.llm import TransformersWrapper

    from common.llm import build_policy, build_task

    model, tok = build_policy("rlfleet:tiny-qwen2", **MODEL)
    task = build_task("arith")

    class Loader:
        def __iter__(self) -> Any:
            import random

            rng = random.Random(0)
            while True:
                yield {"query": [task.sample(rng).query for _ in range(args.num_envs)]}

    env = ChatEnv.from_dataloader(
        dataloader=Loader(), tokenizer=tok, batch_size=args.num_envs, input_mode="history"
    )
    policy = TransformersWrapper(
        model,
        tokenizer=tok,
        input_mode="history",
        generate=True,
        return_log_probs=True,
        # top_k = the vocabulary: the full softmax (TorchRL refuses top_k=0), as the actors.
        generate_kwargs={
            "max_new_tokens": args.new_tokens,
            "do_sample": True,
            "temperature": 1.0,
            "top_k": len(tok),
        },
    )
    return LLMCollector(
        env, policy=policy, dialog_turns_per_batch=args.num_envs, reset_at_each_iter=True
    )


def torchrl_rate(args: argparse.Namespace, collector: Any) -> float:
    """Response tokens/s of TorchRL's collector."""
    batches = iter(collector)
    next(batches)  # warm-up

    def one_batch() -> int:
        responses = next(batches).reshape(-1).get(("tokens", "response"), as_list=True)
        return sum(t.numel() for t in responses)

    return _rate(one_batch, args.window)


def _rate(one_batch: Any, window: float) -> float:
    tokens, start = 0, time.perf_counter()
    while True:
        tokens += one_batch()
        elapsed = time.perf_counter() - start
        if elapsed >= window:
            return tokens / elapsed


def run(args: argparse.Namespace, report: Report) -> None:
    from learner_client import LocalFleet

    reps = reps_of(args)
    samples: dict[str, list[float]] = {
        "in-process": [],
        "ceiling": [],
        "rlfleet": [],
        "rlfleet prefetch=2": [],
        "torchrl": [],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchRL's experimental-API warnings
        theirs = torchrl_collector(args)
        fleet = LocalFleet(
            args.actors,
            kind="llm",
            task="arith",
            policy="rlfleet:tiny-qwen2",
            policy_kwargs=MODEL,
            num_envs=args.num_envs,
            seed=0,
        )
        with fleet:
            for rep in range(reps):
                samples["in-process"].append(in_process(args))
                samples["ceiling"].append(ceiling(args))
                samples["rlfleet"].append(rlfleet(args, fleet.addresses))
                samples["rlfleet prefetch=2"].append(rlfleet(args, fleet.addresses, prefetch=2))
                samples["torchrl"].append(torchrl_rate(args, theirs))
                print(
                    f"rep {rep + 1}/{reps}: "
                    + ", ".join(f"{k} {v[-1]:,.0f} tok/s" for k, v in samples.items()),
                    flush=True,
                )
        theirs.shutdown()
    _record(args, report, samples)


def _record(args: argparse.Namespace, report: Report, samples: dict[str, list[float]]) -> None:
    """The figures, ratios and targets of :func:`run`'s samples."""
    per_actor = [v / args.actors for v in samples["rlfleet"]]
    per_actor_ahead = [v / args.actors for v in samples["rlfleet prefetch=2"]]
    report.figure("in-process generate (1 core)", "tokens/s", samples["in-process"])
    report.figure(f"ceiling: {args.actors} decoders at once", "tokens/s", samples["ceiling"])
    report.figure("rlfleet fleet", "tokens/s", samples["rlfleet"])
    report.figure("rlfleet per actor", "tokens/s", per_actor)
    report.figure("rlfleet prefetch=2 per actor", "tokens/s", per_actor_ahead)
    report.figure("torchrl LLMCollector", "tokens/s", samples["torchrl"])
    per = report.ratio(
        "per actor / in-process", "rlfleet per actor", "in-process generate (1 core)"
    )
    share = report.ratio(
        "fleet / its ceiling", "rlfleet fleet", f"ceiling: {args.actors} decoders at once"
    )
    report.ratio(
        "per actor / in-process, prefetch=2",
        "rlfleet prefetch=2 per actor",
        "in-process generate (1 core)",
    )
    vs = report.ratio("fleet / torchrl", "rlfleet fleet", "torchrl LLMCollector")
    report.target("each actor >= 0.9x in-process decoding", per, 0.9)
    report.target("fleet >= 0.95x its ceiling (decoders at once)", share, 0.95)
    report.target("fleet >= 2x TorchRL LLMCollector", vs, 2.0)
    report.note(
        f"tiny-qwen2 {MODEL}, {args.actors} actors x {args.num_envs} slots, "
        f"{args.new_tokens} new tokens, "
        "temperature 1, 1 torch thread per process"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    set_single_thread()
    if args.decoder:
        _decoder(args)
        return 0
    report = Report("llm_tokens", quick=args.quick)
    run(args, report)
    report.emit()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
