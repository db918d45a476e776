"""GRPO in plain torch on the padded wire form: group advantages, the clipped loss, one update.

A batch (``GrpcLLMCollector(layout="padded")``) holds ``tokens`` (prompt ‖ response,
right-padded), ``prompt_len``, ``response_len``, the actors' behaviour ``log_probs``
of every response token, ``("next", "reward")`` and ``("collector", "group_id")``.
The advantage of an answer is its reward normalised within its group (the G answers
to one problem): ``(r - mean) / (std + eps)``. The importance ratio is taken against
the recorded log-probs, so an answer generated one push ago (async collection) is
still weighed correctly; the objective is PPO's clipped one, averaged over response
tokens. An entropy bonus below ``entropy_floor`` nats per token keeps the policy from
collapsing onto one answer before it has learnt to read the question.
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDictBase
from torch import nn

from common.llm import GenerationSettings, chosen_log_probs, response_distributions

__all__ = ["GRPOConfig", "GRPOLearner", "group_advantages"]


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """The knobs of one GRPO update (a subset of the run's settings).

    Attributes:
        lr: Adam learning rate.
        epochs: Gradient steps on each batch.
        clip_eps: Clipping range of the probability ratio.
        ent_coef: Weight of the entropy bonus.
        entropy_floor: Nats per token below which the bonus acts (above it, none).
        max_grad_norm: Gradient-norm clip.
    """

    lr: float = 5e-4
    epochs: int = 1
    clip_eps: float = 0.2
    ent_coef: float = 0.05
    entropy_floor: float = 0.5
    max_grad_norm: float = 1.0


def group_advantages(reward: torch.Tensor, group_id: torch.Tensor) -> torch.Tensor:
    """Each reward normalised within its group: ``(r - mean) / (std + 1e-4)``.

    Args:
        reward: ``[N]`` rewards.
        group_id: ``[N]`` group ids (answers to one problem share one).

    Returns:
        ``[N]`` advantages; 0 for every member of a group whose rewards are all equal.
    """
    reward = reward.double()
    _, inverse = torch.unique(group_id, return_inverse=True)
    groups = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(groups, dtype=torch.float64).index_add_(0, inverse, torch.ones_like(reward))
    mean = torch.zeros(groups, dtype=torch.float64).index_add_(0, inverse, reward) / count
    centred = reward - mean[inverse]
    var = torch.zeros(groups, dtype=torch.float64).index_add_(0, inverse, centred**2)
    std = (var / (count - 1).clamp(min=1)).sqrt()
    return (centred / (std[inverse] + 1e-4)).float()


class GRPOLearner:
    """GRPO updates of a causal LM on padded LLM batches.

    Args:
        model: The learner's copy of the actors' model (``rlfleet:tiny-qwen2``).
        generation: The settings the actors sample with (temperature and cuts), so
            the learner's log-probs are those of the same distribution.
        config: The update knobs.

    Example::

        learner = GRPOLearner(model, GenerationSettings(max_new_tokens=1), GRPOConfig())
        for batch in collector:                  # layout="padded"
            stats = learner.update(batch)
            collector.update_policy_weights_(model)
    """

    def __init__(
        self, model: nn.Module, generation: GenerationSettings, config: GRPOConfig
    ) -> None:
        self.model = model
        self.generation = generation
        self.config = config
        self.optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)

    def update(self, batch: TensorDictBase) -> dict[str, float]:
        """Run ``epochs`` gradient steps on one batch.

        Args:
            batch: A flat padded batch (see the module docstring).

        Returns:
            Means over the gradient steps of ``loss``, ``entropy`` (nats per response
            token), ``clip_fraction`` and ``approx_kl`` (against the actors' policy).
        """
        batch = batch.reshape(-1)
        advantage = group_advantages(
            batch["next", "reward"].reshape(-1).cpu(),
            batch["collector", "group_id"].reshape(-1).cpu(),
        )
        device = next(self.model.parameters()).device  # the update runs where the model is
        batch, advantage = batch.to(device), advantage.to(device)
        totals: dict[str, float] = {}
        self.model.train()
        for _ in range(self.config.epochs):
            for key, value in self._step(batch, advantage).items():
                totals[key] = totals.get(key, 0.0) + value / self.config.epochs
        self.model.eval()
        return totals

    def _step(self, batch: TensorDictBase, advantage: torch.Tensor) -> dict[str, float]:
        cfg = self.config
        tokens, prompt_len, response_len = (
            batch["tokens"].long(),
            batch["prompt_len"].long(),
            batch["response_len"].long(),
        )
        dists = response_distributions(
            self.model, tokens, prompt_len, response_len, self.generation
        )
        log_prob = chosen_log_probs(dists, tokens, prompt_len, response_len)
        span = log_prob.shape[1]
        mask = (torch.arange(span, device=tokens.device)[None, :] < response_len[:, None]).float()
        old = batch["log_probs"][:, :span].float()
        log_ratio = (log_prob - old) * mask
        ratio = log_ratio.exp()
        adv = advantage[:, None]
        objective = torch.min(ratio * adv, ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv)
        tokens_n = mask.sum().clamp(min=1)
        entropy = -(dists.exp() * dists.nan_to_num(neginf=0.0)).sum(-1)
        bonus = (entropy.clamp(max=cfg.entropy_floor) * mask).sum() / tokens_n
        loss = -(objective * mask).sum() / tokens_n - cfg.ent_coef * bonus
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        with torch.no_grad():
            clipped = ((ratio - 1).abs() > cfg.clip_eps).float()
            return {
                "loss": loss.item(),
                "entropy": float((entropy * mask).sum() / tokens_n),
                "clip_fraction": float((clipped * mask).sum() / tokens_n),
                "approx_kl": float((((ratio - 1) - log_ratio) * mask).sum() / tokens_n),
            }
