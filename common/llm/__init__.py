"""Language-model collection, shared by actors and learners.

* :func:`build_policy` — the model registry: ``spec -> (model, tokenizer)``
  (``rlfleet:tiny-qwen2``, ``rlfleet:tiny-gpt2``, ``hf:DIR``), offline;
* :func:`build_task` — tasks: ``arith``, ``reverse``, ``countdown``, ``jsonl:PATH``,
  ``package.module:factory`` (the :class:`Task` protocol);
* :func:`generate` / :func:`response_log_probs` — the decode loop with exact behaviour
  log-probs, and the learner's recomputation of them (:func:`response_distributions`
  gives the whole distributions, e.g. for an entropy bonus);
* :func:`default_dtype` — the dtype a model is held in on a device (bf16 on CUDA);
* :class:`GenerationSettings`, :class:`LLMSettings` — what a session asks for;
* :class:`LoraSpec`, :func:`parse_lora`, :func:`apply_lora` — a LoRA adapter (``--lora``),
  applied the same way by actors and learners (``peft``, the ``lora`` extra);
* :func:`check_padded`, :func:`to_torchrl`, :func:`merge_padded` — the dense wire form,
  TorchRL's layout, and several actors' batches merged.

Importing this package imports neither torch nor ``transformers`` (the names that need
torch load on first use); building a model imports ``transformers``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from common.llm._lora import LoraSpec, apply_lora, check_peft, parse_lora
from common.llm._registry import (
    CHATML_TEMPLATE,
    MODEL_SPECS,
    PolicySpecError,
    build_policy,
    build_tokenizer,
    check_policy_spec,
    end_token_ids,
)
from common.llm._settings import (
    DEFAULT_MAX_NEW_TOKENS_CAP,
    MAX_TURNS,
    GenerationSettings,
    LLMSettings,
)
from common.llm._tasks import (
    TASK_NAMES,
    Outcome,
    Problem,
    Task,
    TaskSpecError,
    build_task,
    check_task_spec,
)
from common.llm._vocab import ARITH_CHARS, COMPACT_CHARS, LLM_EXTRA, VOCABS, check_transformers

if TYPE_CHECKING:
    from common.llm._decode import (
        Generation,
        cached_forward,
        chosen_log_probs,
        generate,
        process_logits,
        response_distributions,
        response_log_probs,
    )
    from common.llm._device import default_dtype
    from common.llm._layout import check_padded, to_torchrl
    from common.llm._merge import merge_padded
    from common.llm._static import StaticDecode

__all__ = [
    "build_policy",
    "build_task",
    "GenerationSettings",
    "LLMSettings",
    "DEFAULT_MAX_NEW_TOKENS_CAP",
    "MAX_TURNS",
    "LoraSpec",
    "apply_lora",
    "check_peft",
    "parse_lora",
    "Generation",
    "cached_forward",
    "generate",
    "default_dtype",
    "process_logits",
    "response_log_probs",
    "response_distributions",
    "chosen_log_probs",
    "check_padded",
    "to_torchrl",
    "merge_padded",
    "StaticDecode",
    "Task",
    "Problem",
    "Outcome",
    "TASK_NAMES",
    "TaskSpecError",
    "check_task_spec",
    "CHATML_TEMPLATE",
    "MODEL_SPECS",
    "PolicySpecError",
    "build_tokenizer",
    "check_policy_spec",
    "end_token_ids",
    "ARITH_CHARS",
    "COMPACT_CHARS",
    "VOCABS",
    "LLM_EXTRA",
    "check_transformers",
]

# These use torch; they load on first use so that the command line can parse without it.
_LAZY = {
    "Generation": "_decode",
    "cached_forward": "_decode",
    "generate": "_decode",
    "default_dtype": "_device",
    "process_logits": "_decode",
    "response_log_probs": "_decode",
    "response_distributions": "_decode",
    "chosen_log_probs": "_decode",
    "check_padded": "_layout",
    "to_torchrl": "_layout",
    "merge_padded": "_merge",
    "StaticDecode": "_static",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"common.llm.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'common.llm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
