"""The settings only an LLM actor (``kind="llm"``) has: its task, engine, adapter and decode.

:class:`LLMActorSettings` is the ``llm`` section of
:class:`~actor_service._config.ActorConfig` (``config.llm``). Its fields keep their flat
flags and variables (``--task``, ``RLFLEET_ENGINE``) and their flat reads
(``config.task``). It imports nothing of ``actor_service`` (nor torch), so the config that
composes the sections sits over it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from common.llm import DEFAULT_MAX_NEW_TOKENS_CAP, LoraSpec

__all__ = ["LLMActorSettings"]


@dataclasses.dataclass(frozen=True)
class LLMActorSettings:
    """What an LLM actor decodes with, and for which task.

    The ranges and choices of these fields, and the rules across them (vLLM knobs need
    ``engine="vllm"``...), are checked by ``ActorConfig``, which the command line reads too.

    Attributes:
        task: The LLM task: ``arith``, ``reverse``, ``countdown``, ``jsonl:PATH`` or
            ``package.module:factory``.
        task_kwargs: Keyword arguments for the task.
        max_new_tokens_cap: Most new tokens per turn a learner may ask an LLM actor for.
        lora: A LoRA adapter the LLM actor wraps its model in (``common.llm.LoraSpec``,
            ``--lora r=16,targets=q_proj,v_proj``); its pushes may carry the adapter alone.
            None: the plain model. Needs ``peft`` (the ``lora`` extra).
        decode: How an LLM actor's decode loop runs its forwards: ``"eager"`` (a KV cache
            that grows by a token a step), ``"static"`` (a fixed-size cache:
            ``common.llm.StaticDecode``) or ``"compiled"`` (that, with the per-token step
            compiled by ``torch.compile``; CUDA graphs on CUDA).
        engine: What decodes on an LLM actor: ``"transformers"`` (rlfleet's own decode loop
            over a ``transformers`` model) or ``"vllm"`` (a vLLM engine in the actor's
            process; see docs/llm.md, "Choosing an engine").
        gpu_memory_utilization: vLLM: share of the GPU memory it may take; None: vLLM's default.
        max_model_len: vLLM: longest prompt + response (the actor's context); None: the model's.
        enable_prefix_caching: vLLM: reuse the KV cache of shared prompt prefixes.
    """

    task: str = "arith"
    task_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_new_tokens_cap: int = DEFAULT_MAX_NEW_TOKENS_CAP
    lora: LoraSpec | None = None
    decode: str = "eager"
    engine: str = "transformers"
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool = False
