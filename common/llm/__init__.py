"""Language-model collection, shared by actors and learners.

* :func:`build_policy` — the model registry: ``spec -> (model, tokenizer)``
  (``rlfleet:tiny-qwen2``, ``rlfleet:tiny-gpt2``, ``hf:DIR``), offline;
* :func:`build_task` — tasks: ``arith``, ``reverse``, ``countdown``, ``jsonl:PATH``,
  ``package.module:factory`` (the :class:`Task` protocol);
* :func:`generate` / :func:`response_log_probs` — the decode loop with exact behaviour
  log-probs, and the learner's recomputation of them;
* :class:`GenerationSettings`, :class:`LLMSettings` — what a session asks for;
* :func:`check_padded`, :func:`to_torchrl` — the dense wire form and TorchRL's layout.

Names load on first use: importing this package imports neither torch nor
``transformers``; building a model imports ``transformers``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "build_policy",
    "build_task",
    "GenerationSettings",
    "LLMSettings",
    "Generation",
    "generate",
    "process_logits",
    "response_log_probs",
    "check_padded",
    "to_torchrl",
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
]

_LAZY = {
    "build_policy": "_registry",
    "build_tokenizer": "_registry",
    "check_policy_spec": "_registry",
    "CHATML_TEMPLATE": "_registry",
    "MODEL_SPECS": "_registry",
    "PolicySpecError": "_registry",
    "build_task": "_tasks",
    "check_task_spec": "_tasks",
    "Task": "_tasks",
    "Problem": "_tasks",
    "Outcome": "_tasks",
    "TASK_NAMES": "_tasks",
    "TaskSpecError": "_tasks",
    "GenerationSettings": "_settings",
    "LLMSettings": "_settings",
    "Generation": "_decode",
    "generate": "_decode",
    "process_logits": "_decode",
    "response_log_probs": "_decode",
    "check_padded": "_layout",
    "to_torchrl": "_layout",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"common.llm.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'common.llm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
