"""``--loss torchrl``: the same GRPO update through TorchRL's ``GRPOLoss`` and ``MCAdvantage``.

Batches go, in TorchRL's LLM layout, into a TorchRL ``ReplayBuffer`` whose
``MCAdvantage`` transform (grouped by ``("collector", "group_id")``) writes the
group-normalised ``advantage``; the update samples the whole batch back and
evaluates ``GRPOLoss`` on a ``TransformersWrapper`` around the learner's model —
TorchRL code end to end, fed by rlfleet actors. TorchRL is not a dependency of
rlfleet: it is imported here only, on first use, and a missing install is a clear
:class:`ImportError`.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from apps.grpo._loss import GRPOConfig

__all__ = ["TorchRLGRPO", "import_torchrl"]


def import_torchrl() -> Any:
    """The ``torchrl`` module, or an ImportError that says how to get it."""
    try:
        import torchrl
    except ImportError as exc:
        raise ImportError(
            "--loss torchrl needs TorchRL, which is not installed: "
            "pip install 'rlfleet[torchrl]' (or use the built-in loss)"
        ) from exc
    return torchrl


class TorchRLGRPO:
    """GRPO updates with TorchRL's ``GRPOLoss``; batches pass through its ``MCAdvantage``.

    Args:
        model: The learner's copy of the actors' model.
        tokenizer: Its tokenizer (for TorchRL's wrapper).
        group_size: GRPO's G (``MCAdvantage(grpo_size=G)``).
        capacity: Most dialog turns held between two updates.
        config: The update knobs (``ent_coef`` is ``GRPOLoss``'s ``entropy_coeff``; the
            entropy floor of the built-in loss has no TorchRL equivalent).

    Example::

        update = TorchRLGRPO(model, tokenizer, group_size=8, capacity=256, config=config)
        collector = GrpcLLMCollector(..., replay_buffer=update.replay_buffer)
        for _ in collector:                 # batches land in the buffer
            stats = update.update()
    """

    def __init__(
        self, model: nn.Module, tokenizer: Any, group_size: int, capacity: int, config: GRPOConfig
    ) -> None:
        import_torchrl()
        from torchrl.data import LazyStackStorage, ReplayBuffer
        from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
        from torchrl.modules.llm import TransformersWrapper
        from torchrl.objectives.llm import GRPOLoss, MCAdvantage

        self.model, self.config = model, config
        advantage = MCAdvantage(grpo_size=group_size, prompt_key=("collector", "group_id"))
        self.replay_buffer = ReplayBuffer(
            storage=LazyStackStorage(capacity),
            sampler=SamplerWithoutReplacement(),
            transform=advantage,
        )
        actor = TransformersWrapper(
            model,
            tokenizer=tokenizer,
            input_mode="tokens",
            generate=False,
            pad_output=False,
            return_log_probs=True,
        )
        self.loss = GRPOLoss(
            actor,
            clip_epsilon=config.clip_eps,
            entropy_coeff=config.ent_coef,
            masking_strategy="sft",
        )
        self.optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)

    def update(self) -> dict[str, float]:
        """Take every turn out of the buffer and run ``epochs`` gradient steps on them.

        Returns:
            Means over the gradient steps of ``loss``, ``entropy``, ``clip_fraction`` and
            ``approx_kl``, and the batch's mean ``reward``; empty if the buffer held nothing.

        Raises:
            RuntimeError: More turns arrived than the buffer holds (some were overwritten).
        """
        size = len(self.replay_buffer)
        if not size:
            return {}
        if self.replay_buffer.write_count > size:  # turns were overwritten before this update
            raise RuntimeError(
                f"the buffer took {self.replay_buffer.write_count} dialog turns since the last "
                f"update but holds {size}: raise its capacity to the most turns one "
                "iteration brings"
            )
        batch = self.replay_buffer.sample(size)
        self.replay_buffer.empty()
        totals = {"reward": float(batch["next", "reward"].float().mean())}
        self.model.train()
        for _ in range(self.config.epochs):
            for key, value in self._step(batch).items():
                totals[key] = totals.get(key, 0.0) + value / self.config.epochs
        self.model.eval()
        return totals

    def _step(self, batch: TensorDictBase) -> dict[str, float]:
        with warnings.catch_warnings():
            # TorchRL warns about its own experimental LLM API on every call.
            warnings.simplefilter("ignore")
            out = self.loss(batch)
        loss = out.loss_objective + out.loss_entropy
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        return {
            "loss": float(loss.detach()),
            "entropy": float(out.entropy.detach()),
            "clip_fraction": float(out.clip_fraction.detach()),
            "approx_kl": float(out.kl_approx.detach()),
        }
