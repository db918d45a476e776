"""``rlfleet-grpo``: the reference GRPO learner, training a language model against LLM actors.

In the style of ``rlfleet-train``: :class:`GRPOSettings` is the command line,
:func:`train` is the collect/update/push loop and :func:`main` the entry point that
``python -m apps.grpo`` and the ``rlfleet-grpo`` script run. It starts a
local fleet of LLM actors (:class:`~learner_client.LocalFleet` with ``kind="llm"``)
serving the built-in tiny Qwen2, trains it with GRPO on a built-in task and stops
when greedy accuracy on the task's held-out problems reaches the target. Usage::

    rlfleet-grpo --task arith                     # one-digit sums, to 0.9 accuracy
    rlfleet-grpo --task arith --loss torchrl      # TorchRL's GRPOLoss + MCAdvantage
    rlfleet-grpo --async --out runs/grpo-async
"""

from __future__ import annotations

from apps.grpo._cli import main
from apps.grpo._loop import train
from apps.grpo._report import GRPOSummary
from apps.grpo._settings import GRPOSettings, parse_args

__all__ = ["GRPOSettings", "GRPOSummary", "main", "parse_args", "train"]
