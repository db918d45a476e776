"""GPU LLM tokens/s: an LLM actor on CUDA vs HF ``generate`` (static cache) vs TorchRL.

Workload: a Qwen2.5-0.5B-shaped ``Qwen2ForCausalLM`` (hidden 896, 24 layers, 14 heads,
2 KV heads, intermediate 4864, vocabulary 151,936, tied embeddings; 494M parameters)
with random weights from a config, in bf16, saved with a tokenizer built in code
(``common.llm.build_tokenizer``, 260 byte-level tokens: ids beyond it decode to
nothing) into a temporary directory and served as ``hf:DIR``; one-digit ``arith``
prompts (~23 tokens), ``--slots`` (64) answers decoded as one batch, ``--new-tokens``
(128) new tokens each, sampling at temperature 1 from the full softmax. Nothing is
downloaded (``HF_HUB_OFFLINE=1``). Systems, one after the other on the same GPU:

- rlfleet: one LLM actor subprocess with ``--device cuda`` (bf16, its default there),
  ``--decode`` (``compiled`` on CUDA: a static KV cache and the token step compiled into
  a CUDA graph; ``eager`` in the CPU smoke run) and ``--num-envs`` = slots, read through
  ``GrpcLLMCollector`` (async);
- rlfleet's decode loop in this process (``common.llm.generate``, the same ``--decode``,
  no transport);
- the anchor: HF ``model.generate(..., cache_implementation="static")`` as
  transformers runs it by default on CUDA (it compiles the forward, CUDA graphs:
  the first call takes tens of seconds and is not timed), and the same without
  compiling (``disable_compile=True``);
- TorchRL 0.14's ``LLMCollector(ChatEnv + TransformersWrapper(generate=True))``, or
  "unavailable: <reason>" when it cannot be imported or run.

Tokens are response tokens (up to and including a stop token; random weights rarely
draw one). Targets: rlfleet >= 0.9x the anchor, >= 2x TorchRL. Without CUDA (or with
``--quick``) it is a CPU smoke run of a tiny model of the same family, seconds long.

Usage: ``python -m bench.gpu_llm [--quick] [--out FILE]`` (about 2 minutes on an H100).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from bench._common import Report
from bench.llm_shapes import SHAPES

__all__ = ["Workload", "main", "measure"]

#: Qwen2.5-0.5B's shape (494M parameters).
QWEN_05B = SHAPES["0.5b"]
#: The CPU smoke run's model: same family, tiny.
SMOKE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 1024,
}


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one run measures.

    Attributes:
        device: ``"cuda"`` (the benchmark) or ``"cpu"`` (the smoke run).
        shape: ``Qwen2Config`` sizes.
        slots: Answers decoded as one batch (an actor's chat slots).
        new_tokens: New tokens per answer.
        window: Seconds each timed system runs (at least two batches).
        decode: The LLM actor's ``--decode`` (``eager``, ``static`` or ``compiled``).
    """

    device: str
    shape: dict[str, int]
    slots: int
    new_tokens: int
    window: float
    decode: str = "eager"

    @property
    def dtype_name(self) -> str:
        """bf16 on CUDA, float32 on the CPU (``common.llm.default_dtype``)."""
        return "bfloat16" if self.device == "cuda" else "float32"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the CPU smoke run, even with CUDA")
    parser.add_argument("--slots", type=int, default=None, help="batch (64; smoke 4)")
    parser.add_argument("--new-tokens", type=int, default=None, help="new tokens (128; smoke 8)")
    parser.add_argument("--window", type=float, default=None, help="seconds per system (4)")
    parser.add_argument("--no-torchrl", action="store_true", help="skip TorchRL's collector")
    parser.add_argument(
        "--decode", default=None, help="the actor's --decode (compiled on CUDA, eager on CPU)"
    )
    parser.add_argument("--out", default=None, help="also write the JSON payload to this file")
    return parser.parse_args(argv)


def workload_of(args: argparse.Namespace) -> Workload:
    """The workload the flags and the machine ask for."""
    import torch

    gpu = torch.cuda.is_available() and not args.quick
    return Workload(
        device="cuda" if gpu else "cpu",
        shape=QWEN_05B if gpu else SMOKE,
        slots=args.slots or (64 if gpu else 4),
        new_tokens=args.new_tokens or (128 if gpu else 8),
        window=args.window if args.window is not None else (4.0 if gpu else 0.5),
        decode=args.decode or ("compiled" if gpu else "eager"),
    )


def build_checkpoint(work: Workload, directory: str) -> tuple[Any, Any]:
    """A random Qwen2 of ``work.shape`` and the byte tokenizer, saved into ``directory``.

    Returns:
        ``(model on the device in the workload's dtype, tokenizer)``.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from common.llm import build_tokenizer

    tok = build_tokenizer("bytes")
    config = Qwen2Config(
        **work.shape,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
    )
    torch.manual_seed(0)
    with torch.device(work.device):  # initialising 0.5B parameters on the GPU takes no time
        model = Qwen2ForCausalLM(config)
    model = model.to(getattr(torch, work.dtype_name)).eval()
    for key in ("top_k", "top_p", "temperature"):
        setattr(model.generation_config, key, None)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return model, tok


def arith_prompts(tok: Any, count: int) -> list[list[int]]:
    """``count`` one-digit ``arith`` chat prompts, tokenised (as an actor builds them)."""
    import random

    from common.llm import build_task

    task, rng = build_task("arith"), random.Random(0)
    messages = ([{"role": "user", "content": task.sample(rng).query}] for _ in range(count))
    chat = {"add_generation_prompt": True, "tokenize": True, "return_dict": True}
    return [list(tok.apply_chat_template(m, **chat)["input_ids"]) for m in messages]


def _rate(one_batch: Callable[[], int], window: float, warmup: int = 1) -> float:
    """Tokens/s over batches run for about ``window`` s (at least two), after ``warmup``."""
    _sync()
    for _ in range(warmup):
        one_batch()
    tokens, batches, start = 0, 0, time.perf_counter()
    while True:
        tokens += one_batch()
        batches += 1
        elapsed = time.perf_counter() - start
        if elapsed >= window and batches >= 2:
            return tokens / elapsed


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _response_tokens(responses: Any, eos: int) -> int:
    """Response tokens of ``[B, S]`` generated ids: up to and including the first EOS."""
    import torch

    hit = responses == eos
    first = torch.where(hit.any(1), hit.int().argmax(1) + 1, responses.shape[1])
    return int(first.sum())


def hf_generate(
    model: Any, tok: Any, prompts: list[list[int]], work: Workload, **extra: Any
) -> float:
    """Tokens/s of HF ``generate`` with a static cache (``extra``: e.g. ``disable_compile``)."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.as_tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    ids, mask = ids.to(work.device), mask.to(work.device)

    @torch.no_grad()
    def one_batch() -> int:
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
            top_p=1.0, max_new_tokens=work.new_tokens, cache_implementation="static",
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, **extra,
        )  # fmt: skip
        return _response_tokens(out[:, width:], tok.eos_token_id)

    return _rate(one_batch, work.window)


def in_process(model: Any, tok: Any, prompts: list[list[int]], work: Workload) -> float:
    """Tokens/s of rlfleet's decode loop (``common.llm.generate``) in this process."""
    import torch

    from common.llm import GenerationSettings, StaticDecode, cached_forward, generate

    settings = GenerationSettings(max_new_tokens=work.new_tokens, temperature=1.0)
    generator = torch.Generator(device=work.device).manual_seed(0)
    decode: Any = functools.partial(cached_forward, model)
    if work.decode != "eager":
        decode = StaticDecode(model, work.new_tokens, compiled=work.decode == "compiled")

    @torch.no_grad()
    def forward(ids: Any, mask: Any, positions: Any, past: Any) -> tuple[Any, Any, int]:
        return (*decode(ids, mask, positions, past), 0)

    def one_batch() -> int:
        result = generate(
            forward, prompts, settings, budgets=[work.new_tokens] * len(prompts),
            stop_ids=(tok.eos_token_id,), pad_id=tok.pad_token_id, generator=generator,
            device=work.device,
        )  # fmt: skip
        return int(result.lengths.sum())

    return _rate(one_batch, work.window)


def rlfleet(addresses: list[str], work: Workload) -> float:
    """Tokens/s of one LLM actor through ``GrpcLLMCollector`` (async)."""
    from learner_client import GrpcLLMCollector

    with GrpcLLMCollector(
        addresses,
        dialog_turns_per_batch=work.slots,
        sync=False,
        generation={"max_new_tokens": work.new_tokens, "temperature": 1.0},
        layout="padded",
    ) as collector:
        batches = iter(collector)
        return _rate(lambda: int(next(batches)["response_len"].sum()), work.window)


def torchrl_rate(model: Any, tok: Any, work: Workload) -> float:
    """Tokens/s of TorchRL's ``LLMCollector`` (``ChatEnv`` + ``TransformersWrapper``)."""
    from torchrl.collectors.llm import LLMCollector
    from torchrl.envs.llm import ChatEnv
    from torchrl.modules.llm import TransformersWrapper

    from common.llm import build_task

    task = build_task("arith")

    class Loader:
        def __iter__(self) -> Iterator[dict[str, list[str]]]:
            import random

            rng = random.Random(0)
            while True:
                yield {"query": [task.sample(rng).query for _ in range(work.slots)]}

    env = ChatEnv.from_dataloader(
        dataloader=Loader(), tokenizer=tok, batch_size=work.slots, input_mode="history"
    )
    policy = TransformersWrapper(
        model, tokenizer=tok, input_mode="history", generate=True, return_log_probs=True,
        device=work.device,
        generate_kwargs={  # top_k = the model's vocabulary: the full softmax, as the others
            "max_new_tokens": work.new_tokens, "do_sample": True, "temperature": 1.0,
            "top_k": work.shape["vocab_size"],
        },
    )  # fmt: skip
    collector = LLMCollector(
        env, policy=policy, dialog_turns_per_batch=work.slots, reset_at_each_iter=True
    )
    batches = iter(collector)

    def one_batch() -> int:
        responses = next(batches).reshape(-1).get(("tokens", "response"), as_list=True)
        return sum(int(t.numel()) for t in responses)

    try:
        return _rate(one_batch, work.window)
    finally:
        collector.shutdown()


def _timed(report: Report, name: str, run: Callable[[], float]) -> None:
    """Measure one system into ``report``; a failure is recorded as unavailable."""
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rate = run()
    except Exception as exc:  # any failure of a system is reported, not raised
        report.skip(name, f"unavailable: {type(exc).__name__}: {str(exc)[:300]}")
        return
    report.figure(name, "tokens/s", [rate])
    print(f"{name}: {rate:,.0f} tokens/s ({time.perf_counter() - start:.0f} s)", flush=True)


def measure(work: Workload, *, torchrl: bool = True) -> Report:
    """Run every system on ``work`` and return the report (figures, ratios, targets)."""
    from learner_client import LocalFleet

    report = Report("gpu_llm", quick=work.device != "cuda")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="rlfleet-gpu-llm-") as directory:
        start = time.perf_counter()
        model, tok = build_checkpoint(work, directory)
        prompts = arith_prompts(tok, work.slots)
        print(f"model built and saved ({time.perf_counter() - start:.0f} s)", flush=True)
        fleet = LocalFleet(
            1, kind="llm", task="arith", policy=f"hf:{directory}", num_envs=work.slots, seed=0,
            extra_args=["--device", work.device, "--decode", work.decode], start_timeout=180.0,
        )  # fmt: skip
        with fleet:
            _timed(report, "rlfleet actor", lambda: rlfleet(fleet.addresses, work))
    _timed(report, "rlfleet decode loop in-process", lambda: in_process(model, tok, prompts, work))
    _timed(report, "HF generate static cache", lambda: hf_generate(model, tok, prompts, work))
    eager = {"disable_compile": True}
    _timed(
        report, "HF generate static, eager", lambda: hf_generate(model, tok, prompts, work, **eager)
    )
    if torchrl:
        _timed(report, "torchrl LLMCollector", lambda: torchrl_rate(model, tok, work))
    else:
        report.skip("torchrl LLMCollector", "not asked for (--no-torchrl)")
    _ratios(report)
    params = sum(p.numel() for p in model.parameters())
    report.note(
        f"Qwen2 {work.shape} ({params / 1e6:.0f}M parameters), {work.dtype_name} on "
        f"{_device_name(work.device)}; {work.slots} slots x {work.new_tokens} new tokens, "
        f"temperature 1, full softmax; rlfleet --decode {work.decode}"
    )
    return report


def _ratios(report: Report) -> None:
    pairs = [
        ("rlfleet / HF static", "HF generate static cache", 0.9),
        ("rlfleet / HF static eager", "HF generate static, eager", None),
        ("rlfleet / in-process loop", "rlfleet decode loop in-process", None),
        ("rlfleet / torchrl", "torchrl LLMCollector", 2.0),
    ]
    for name, den, target in pairs:
        if "rlfleet actor" not in report.figures or den not in report.figures:
            continue
        value = report.ratio(name, "rlfleet actor", den)
        if target is not None:
            report.target(f"rlfleet actor >= {target}x {den}", value, target)


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" else "CPU"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    work = workload_of(args)
    if work.device == "cpu":
        import torch

        torch.set_num_threads(1)
    report = measure(work, torchrl=not args.no_torchrl)
    payload = report.emit()
    if args.out:
        with open(args.out, "w", encoding="utf-8") as file:
            json.dump(payload, file, indent=1, sort_keys=True, allow_nan=True)
    return 0


if __name__ == "__main__":
    import sys

    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))
