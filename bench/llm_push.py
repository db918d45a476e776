"""Language-model weight pushes to LLM actors, by form, against a raw loopback transfer.

A ``Qwen2ForCausalLM`` of a :mod:`bench.llm_shapes` shape (random weights, tied
embedding) is saved once as a local checkpoint with the built-in tokenizer; LLM
actors (real ``python -m actor_service --kind llm`` processes) load it with
``--model hf:DIR``. The learner holds the same model. Forms, each
``GrpcLLMCollector.update_policy_weights_`` to every actor until all applied it:

- ``full``: the float32 state (the tied embedding once);
- ``full generating``: the same while the actors generate (``collector.start()``);
  its ``pause`` is the longest generation pause an actor reported for the push;
- ``bf16``: ``dtype=torch.bfloat16`` on the wire;
- ``delta bf16 adam 1e-6``: ``delta=True, dtype=torch.bfloat16`` after one Adam
  step (lr 1e-6, a usual RL fine-tuning rate) on a language-model loss;
- ``adapter``: to actors started with ``--lora r=16,targets=q_proj,v_proj``, an
  adapter-only push (``only_trainable=True``) of the learner's LoRA model.

``raw`` is the same bytes per actor over plain sockets to one receiver process per
actor at once, measured right after each push. Shapes: ``100m`` (default) and
``0.5b`` (``--shapes 100m,0.5b``; one actor, no delta form: about 15 GB of RAM).

Targets: full pushes <= 3x raw; delta and adapter pushes <= 5% of the full
(float32) push's bytes; the generation pause <= 10% of the push's seconds.

Usage: ``python -m bench.llm_push [--quick] [--reps 3] [--actors 2] [--shapes 100m,0.5b]``.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench._common import Report, base_parser, choices, parse, reps_of, set_single_thread
from bench.llm_shapes import SHAPES

__all__ = ["main"]

BF16 = torch.bfloat16
LORA = "r=16,targets=q_proj,v_proj"
#: A usual learning rate of RL fine-tuning of language models.
LR = 1e-6
Sample = tuple[float, int, float]  # seconds, bytes (all actors), longest pause


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=2)
    parser.add_argument("--shapes", default=None, help="comma-separated: 25m, 100m, 0.5b")
    args = parse(parser, argv)
    shapes = args.shapes or ("25m" if args.quick else "100m")
    args.shapes = choices(parser, "--shapes", shapes, SHAPES)
    return args


class _Sink:
    """A replay buffer that drops what it gets (the generating form's background thread)."""

    def extend(self, data: Any) -> None:
        del data


def save_checkpoint(model: Any, directory: Path) -> str:
    """Save ``model`` with the built-in tokenizer; returns the actors' ``hf:DIR`` spec."""
    from common.llm import build_policy

    _, tokenizer = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return f"hf:{directory}"


def _lm_step(model: Any, lr: float) -> None:
    """One Adam step of a language-model loss on 2 x 64 random tokens."""
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.config.vocab_size, (2, 64), generator=generator)
    model(input_ids=tokens, labels=tokens).loss.backward()
    optimizer.step()
    model.zero_grad(set_to_none=True)
    del optimizer


def _nudge(model: Any) -> None:
    """Change one element of every trainable tensor: no push can be skipped as a repeat."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.view(-1)[0] += 1e-3


class _Pushes:
    """Times pushes of one model through one collector."""

    def __init__(self, collector: Any, model: Any) -> None:
        self.collector, self.model = collector, model

    def timed(self, **form: Any) -> Sample:
        start = time.perf_counter()
        self.collector.update_policy_weights_(self.model, **form)
        seconds = time.perf_counter() - start
        stats = self.collector.stats()
        return seconds, int(stats["last_push_bytes"]), float(stats["last_push_pause"])

    def full(self) -> Sample:
        _nudge(self.model)
        return self.timed()

    def bf16(self) -> Sample:
        _nudge(self.model)
        return self.timed(dtype=BF16)

    def delta(self) -> Sample:
        push = self.collector.update_policy_weights_
        push(self.model, delta=True, dtype=BF16)  # the base (full the first time)
        push(self.model)  # a full push the tracker did not send: the next delta is full
        push(self.model, delta=True, dtype=BF16)  # the base again
        _lm_step(self.model, LR)
        return self.timed(delta=True, dtype=BF16)

    def adapter(self) -> Sample:
        _nudge(self.model)
        return self.timed(only_trainable=True)


def _fleet_and_collector(
    stack: contextlib.ExitStack, spec: str, actors: int, lora: bool, num_envs: int
) -> Any:
    from learner_client import GrpcLLMCollector, LocalFleet

    extra = ["--torch-threads", "1", *(["--lora", LORA] if lora else [])]
    fleet = stack.enter_context(
        LocalFleet(
            actors,
            kind="llm",
            task="arith",
            policy=spec,
            num_envs=num_envs,
            seed=0,
            extra_args=extra,
            start_timeout=600.0,
        )
    )
    return stack.enter_context(
        GrpcLLMCollector(
            fleet.addresses,
            dialog_turns_per_batch=num_envs,
            sync=False,
            generation={"max_new_tokens": 8},
            replay_buffer=_Sink(),
            connect_timeout=120.0,
            call_timeout=900.0,
        )
    )


def _measure(
    plan: dict[str, Callable[[], Sample]],
    rx: Any,
    actors: int,
    reps: int,
    rows: dict[str, list[Sample]],
    raw: dict[str, list[float]],
) -> None:
    for _ in range(reps):
        for name, push in plan.items():
            rows.setdefault(name, []).append(push())
            nbytes = rows[name][-1][1] // actors
            raw.setdefault(name, []).append(rx.transfer(memoryview(bytearray(max(1, nbytes)))))


def run_shape(shape: str, args: argparse.Namespace, report: Report) -> None:
    """Every form of one shape: plain actors first, then LoRA actors."""
    from bench._loopback import LoopbackReceivers
    from bench.llm_shapes import build_llm, lora_model

    actors = 1 if shape == "0.5b" else args.actors
    reps = reps_of(args)
    rows: dict[str, list[Sample]] = {}
    raw: dict[str, list[float]] = {}
    model = build_llm(shape).train()
    report.note(f"llm {shape}: {sum(p.numel() for p in model.parameters()):,} parameters")
    with tempfile.TemporaryDirectory() as directory, LoopbackReceivers(actors) as rx:
        spec = save_checkpoint(model, Path(directory))
        with contextlib.ExitStack() as stack:
            collector = _fleet_and_collector(stack, spec, actors, False, args.num_envs)
            pushes = _Pushes(collector, model)
            pushes.full()  # warm-up: connections, receive buffers
            plan = {"full": pushes.full, "bf16": pushes.bf16, "delta bf16 adam 1e-6": pushes.delta}
            if shape == "0.5b":  # Adam's state and the gradients: ~6 GB more on the learner
                del plan["delta bf16 adam 1e-6"]
                report.skip(f"llm {shape} delta", "not measured: memory (with actors, ~21 GB)")
            _measure(plan, rx, actors, reps, rows, raw)
            pushes.collector.start()  # the actors generate while the pushes travel
            time.sleep(1.0)
            _measure({"full generating": pushes.full}, rx, actors, reps, rows, raw)
        with contextlib.ExitStack() as stack:
            learner = lora_model(build_llm(shape), LORA).train()
            collector = _fleet_and_collector(stack, spec, actors, True, args.num_envs)
            pushes = _Pushes(collector, learner)
            pushes.timed()  # the adapter's first values: a full push of the LoRA model
            _measure({"adapter": pushes.adapter}, rx, actors, reps, rows, raw)
    record(f"llm {shape}", rows, raw, report)


def record(
    shape: str, rows: dict[str, list[Sample]], raw: dict[str, list[float]], report: Report
) -> None:
    """Record one shape's figures, ratios and targets."""
    for form, samples in rows.items():
        name = f"{shape} {form}"
        report.figure(name, "s", [s for s, _, _ in samples])
        report.figure(f"{name} bytes", "B", [b for _, b, _ in samples])
        report.figure(f"{name} pause", "s", [p for _, _, p in samples])
        report.figure(f"{name} raw", "s", raw[form])
        report.ratio(f"{name}/raw", name, f"{name} raw")
        report.ratio(f"{name} pause/push", f"{name} pause", name)
    for form in ("full", "full generating"):
        ratio = report.ratios[f"{shape} {form}/raw"]["median"]
        report.target(f"{shape}: {form} push <= 3x raw", ratio, 3.0, higher_is_better=False)
    pause = report.ratios[f"{shape} full generating pause/push"]["median"]
    report.target(
        f"{shape}: generation pause <= 10% of the push", pause, 0.1, higher_is_better=False
    )
    for form in ("bf16", "delta bf16 adam 1e-6", "adapter"):
        if form not in rows:
            continue
        share = report.ratio(
            f"{shape} {form} bytes/full", f"{shape} {form} bytes", f"{shape} full bytes"
        )
        if form != "bf16":
            report.target(
                f"{shape}: {form} bytes <= 5% of full", share, 0.05, higher_is_better=False
            )
    if "delta bf16 adam 1e-6" in rows:
        report.ratio(
            f"{shape} delta bf16 adam 1e-6 bytes/bf16",
            f"{shape} delta bf16 adam 1e-6 bytes",
            f"{shape} bf16 bytes",
        )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    set_single_thread()
    report = Report("llm_push", quick=args.quick)
    for shape in args.shapes:
        run_shape(shape, args, report)
    return report.emit()


if __name__ == "__main__":
    main()
