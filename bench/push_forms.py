"""Weight pushes by form and size against a raw loopback transfer of the same bytes.

Sizes: the ``"mlp"`` CartPole policy with two hidden layers of 5000 (25M
float32 parameters, 100 MB), 10000 (100M, 400 MB) or 22360 (500M, 2.0 GB; a
0.5B-parameter model, optional: ``--sizes 500M``, one actor, full pushes only, ~12 GB of RAM).
Forms, each ``update_policy_weights_`` to every actor until all applied it:

- ``full``: the float32 state (CRC-32C checksummed);
- ``full collecting``: the same while the actors collect (``collector.start()``);
- ``bf16``: ``dtype=torch.bfloat16`` on the wire (measured when the collector
  offers ``dtype=``; else recorded as not measured);
- ``adapter``: an adapter-only push (needs LoRA actors; recorded as not measured
  here, the MLP has no adapter);
- ``delta adam``: ``delta=True`` after one Adam step (lr 1e-4) on every parameter;
  in float32 such a step changes nearly every element, so the tracker sends the
  state whole (the delta would be larger);
- ``delta 1%``: ``delta=True`` after a step that changes 1% of each tensor's elements;
- ``delta bf16 adam 1e-5`` and ``delta bf16 adam 1e-4``: ``delta=True,
  dtype=torch.bfloat16`` after one Adam step of that lr: the delta holds the
  elements whose *bf16* value changed (most do not after one small step), and
  its bytes are compared with a bf16 full push's (``... bytes/bf16``).

``--llm 25m,100m`` adds, without actors, the same bf16 delta after one Adam step
(lr 1e-6, 1e-5, 1e-4) of a ``Qwen2ForCausalLM`` (``bench.llm_shapes``, random
init; one language-model loss on 2 x 64 random tokens): the bytes of the delta
the learner's tracker would encode (``wire_state`` then ``encode_delta``, as
``learner_client._pushes`` does; it sends the full push when larger) over
those of a bf16 full push (``encode_weights``, tied embedding once).

Each form's bytes are what the collector reports (``stats()["last_push_bytes"]``,
summed over actors) and its pause is the longest generation pause any actor
reported for it (``stats()["last_push_pause"]``). The anchor, measured in the same
run and repetition by repetition, is ``raw`` (:mod:`bench._loopback`): the same
bytes per actor sent over plain sockets to one receiver process per actor at once.

Targets: 25M full push <= 3x raw, idle and while collecting; delta bytes after one
optimizer step <= 5% of full; the generation pause <= 10% of the push's seconds.

Usage: ``python -m bench.push_forms [--quick] [--reps 3] [--sizes 25M,100M] [--llm 25m,100m]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from bench._common import Report, base_parser, choices, parse, reps_of, set_single_thread
from bench.llm_shapes import SHAPES

__all__ = ["SIZES", "main"]

BF16 = torch.bfloat16
#: Hidden widths of the two-layer MLP for each size (CartPole: 4 inputs, 2 actions).
SIZES = {"tiny": 16, "25M": 5000, "100M": 10000, "500M": 22360}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0], num_envs=2)
    parser.add_argument("--sizes", default=None, help=f"comma-separated, of {sorted(SIZES)}")
    parser.add_argument("--llm", default="", help="comma-separated llm_shapes, e.g. 25m,100m")
    args = parse(parser, argv)
    args.llm = choices(parser, "--llm", args.llm, SHAPES)
    default = "tiny" if args.quick else "25M,100M"
    sizes = default if args.sizes is None else args.sizes  # "": language models only
    args.sizes = choices(parser, "--sizes", sizes, SIZES)
    return args


class _Sink:
    """A replay buffer that drops what it gets (the collecting form's background thread)."""

    def extend(self, data: Any) -> None:
        del data


def _adam_step(policy: torch.nn.Module, lr: float = 1e-4) -> None:
    """One Adam step whose gradients (2p) dwarf Adam's eps: every element moves by ~lr.

    (A ``mean`` loss gives gradients of ~1e-10 on the 25M MLP, below eps = 1e-8, and
    steps of ~lr/100: far fewer bf16 values would change than in real training.)
    """
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    loss = sum((p.float() ** 2).sum() for p in policy.parameters())
    loss.backward()  # type: ignore[union-attr]
    optimizer.step()
    policy.zero_grad(set_to_none=True)


def _sparse_step(policy: torch.nn.Module, fraction: float = 0.01) -> None:
    with torch.no_grad():
        for param in policy.parameters():
            flat = param.view(-1)
            count = max(1, int(flat.numel() * fraction))
            flat[torch.randint(0, flat.numel(), (count,))] += 1e-3


class _Forms:
    """Times each push form on one collector; every timed push starts from a full push."""

    def __init__(self, coll: Any, policy: torch.nn.Module, actors: int) -> None:
        self.coll, self.policy, self.actors = coll, policy, actors
        self.has_dtype = "dtype" in inspect.signature(coll.update_policy_weights_).parameters

    def timed(self, push: Callable[[], Any]) -> tuple[float, int, float]:
        start = time.perf_counter()
        push()
        seconds = time.perf_counter() - start
        stats = self.coll.stats()
        return seconds, int(stats["last_push_bytes"]), float(stats["last_push_pause"])

    def full(self) -> tuple[float, int, float]:
        _sparse_step(self.policy, 1e-6)  # something changed: no push can be skipped
        return self.timed(lambda: self.coll.update_policy_weights_(self.policy))

    def bf16(self) -> tuple[float, int, float]:
        _sparse_step(self.policy, 1e-6)
        push = self.coll.update_policy_weights_
        return self.timed(lambda: push(self.policy, dtype=torch.bfloat16))

    def delta(
        self, step: Callable[[torch.nn.Module], None], dtype: torch.dtype | None = None
    ) -> tuple[float, int, float]:
        form = {} if dtype is None else {"dtype": dtype}
        push = self.coll.update_policy_weights_
        push(self.policy, delta=True, **form)  # the base
        push(self.policy)  # a full push the tracker did not send
        push(self.policy, delta=True, **form)  # full: the base again
        step(self.policy)
        return self.timed(lambda: push(self.policy, delta=True, **form))


def run_size(size: str, args: argparse.Namespace, report: Report) -> None:
    """Measure every form of one size, repetitions interleaved with the raw anchor."""
    from bench import _rlfleet
    from bench._loopback import LoopbackReceivers
    from bench.cartpole import mlp_policy

    actors = 1 if size == "500M" else args.actors
    hidden = (SIZES[size],) * 2
    policy = mlp_policy(hidden)
    params = sum(p.numel() for p in policy.parameters())
    cap = ["--max-weight-bytes", str(3 * 4 * params + (1 << 20))]
    report.note(f"{size}: {params:,} float32 parameters, {actors} actor(s)")
    rows: dict[str, list[tuple[float, int, float]]] = {}
    raw: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(
            _rlfleet.fleet(
                actors,
                num_envs=args.num_envs,
                policy_kwargs={"hidden": list(hidden)},
                extra_args=cap,
            )
        )
        coll = stack.enter_context(
            _rlfleet.collector(
                fleet.addresses, sync=False, frames_per_batch=64, replay_buffer=_Sink()
            )
        )
        rx = stack.enter_context(LoopbackReceivers(actors))
        forms = _Forms(coll, policy, actors)
        plan: dict[str, Callable[[], tuple[float, int, float]]] = {"full": forms.full}
        if forms.has_dtype:
            plan["bf16"] = forms.bf16
        else:
            report.skip(f"{size} bf16", "not measured: this collector has no dtype= pushes")
        report.skip(f"{size} adapter", "not measured: the MLP actors hold no LoRA adapter")
        if size == "500M":  # Adam state and delta snapshots would need ~10 GB more
            report.skip(f"{size} delta", "not measured: memory (full pushes only at 500M)")
        else:
            plan["delta adam"] = lambda: forms.delta(_adam_step)
            plan["delta 1%"] = lambda: forms.delta(_sparse_step)
            if forms.has_dtype:
                for lr in (1e-5, 1e-4):
                    step = functools.partial(_adam_step, lr=lr)
                    plan[f"delta bf16 adam {lr:g}"] = functools.partial(forms.delta, step, BF16)
        forms.full()  # warm-up: connections, receive buffers
        for _ in range(reps_of(args)):
            for name, push in plan.items():
                rows.setdefault(name, []).append(push())
                raw.setdefault(name, []).append(_raw(rx, rows[name][-1][1] // actors))
        if size in ("25M", "tiny"):
            coll.start()  # the actors collect while the pushes travel
            time.sleep(1.0)
            for _ in range(reps_of(args)):
                rows.setdefault("full collecting", []).append(forms.full())
                raw.setdefault("full collecting", []).append(_raw(rx, rows["full"][0][1] // actors))
    record(size, rows, raw, report)


def _raw(rx: Any, nbytes: int) -> float:
    return rx.transfer(memoryview(bytearray(max(1, nbytes))))


def record(
    size: str,
    rows: dict[str, list[tuple[float, int, float]]],
    raw: dict[str, list[float]],
    report: Report,
) -> None:
    """Record one size's figures, ratios and targets."""
    for form, samples in rows.items():
        name = f"{size} {form}"
        report.figure(name, "s", [s for s, _, _ in samples])
        report.figure(f"{name} bytes", "B", [b for _, b, _ in samples])
        report.figure(f"{name} pause", "s", [p for _, _, p in samples])
        report.figure(f"{name} raw", "s", raw[form])
        report.ratio(f"{name}/raw", name, f"{name} raw")
        pause = report.ratio(f"{name} pause/push", f"{name} pause", name)
        if form.startswith("full"):
            report.target(
                f"{name}: generation pause <= 10% of the push", pause, 0.1, higher_is_better=False
            )
    for form in ("bf16", "delta adam", "delta 1%"):
        if form in rows:
            report.ratio(f"{size} {form} bytes/full", f"{size} {form} bytes", f"{size} full bytes")
    for form in rows:
        if form.startswith("delta bf16") and "bf16" in rows:
            name = f"{size} {form}"
            report.ratio(f"{name} bytes/bf16", f"{name} bytes", f"{size} bf16 bytes")
            report.target(
                f"{size}: {form} bytes <= 5% of bf16 full bytes",
                report.ratios[f"{name} bytes/bf16"]["median"],
                0.05,
                higher_is_better=False,
            )
    if "delta adam" in rows:
        share = report.ratios[f"{size} delta adam bytes/full"]["median"]
        report.target(
            f"{size}: delta after one Adam step <= 5% of full bytes",
            share,
            0.05,
            higher_is_better=False,
        )
    if size in ("25M", "tiny"):
        for form in ("full", "full collecting"):
            ratio = report.ratios[f"{size} {form}/raw"]["median"]
            report.target(
                f"{size}: {form} push <= 3x raw transfer", ratio, 3.0, higher_is_better=False
            )


def run_llm(shape: str, report: Report) -> None:
    """The bf16 delta after one Adam step of a language model, as a share of a bf16 full push."""
    from bench.llm_shapes import build_llm
    from common.weights import encode_delta, encode_weights, wire_state

    for lr in (1e-6, 1e-5, 1e-4):  # 1e-6: a common lr of RL fine-tuning of language models
        model = build_llm(shape).train()
        params = sum(p.numel() for p in model.parameters())
        full = len(encode_weights(model, dtype=BF16))
        before = wire_state(model, dtype=BF16)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        tokens = torch.randint(0, model.config.vocab_size, (2, 64), generator=_seeded(0))
        model(input_ids=tokens, labels=tokens).loss.backward()
        optimizer.step()
        after = wire_state(model, dtype=BF16)
        delta = len(encode_delta(before, after, metadata={"rlfleet.dtype": "bfloat16"}))
        name = f"llm {shape} delta bf16 adam {lr:g}"
        report.figure(f"{name} bytes", "B", [delta])
        report.figure(f"llm {shape} bf16 full bytes {lr:g}", "B", [full])
        share = report.ratio(
            f"{name} bytes/bf16", f"{name} bytes", f"llm {shape} bf16 full bytes {lr:g}"
        )
        report.target(
            f"llm {shape}: bf16 delta lr {lr:g} <= 5% of bf16 full",
            share,
            0.05,
            higher_is_better=False,
        )
        report.note(f"llm {shape}: {params:,} parameters")
        del model, optimizer, before, after


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; prints the table and the final JSON line; returns the payload."""
    args = parse_args(argv)
    set_single_thread()
    report = Report("push_forms", quick=args.quick)
    for size in args.sizes:
        run_size(size, args, report)
    for shape in args.llm:
        run_llm(shape, report)
    return report.emit()


if __name__ == "__main__":
    main(sys.argv[1:])
