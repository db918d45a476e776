"""PPO with GAE on collector batches, in plain torch: advantages, the clipped loss, minibatching.

The batch layout is TorchRL's (``[..., time]`` with ``("next", ...)`` entries),
so the math reads the same keys TorchRL's ``GAE`` and ``ClipPPOLoss`` read. The
importance ratio uses the log-probabilities the actors recorded when they acted
(``action_log_prob``), which keeps the update correct when a batch comes from a
slightly older policy, as in async collection. Truncation is handled the way
TorchRL does it: a truncated step bootstraps from the value of
``("next", "observation")``, a terminated one does not, and neither lets the
advantage leak into the next trajectory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import ProbabilisticTensorDictSequential
from torch import nn

__all__ = ["ActorCritic", "PPOConfig", "PPOLearner", "compute_gae"]


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """The knobs of one PPO update (a subset of the training settings).

    Attributes:
        lr: Adam learning rate at the start.
        gamma: Discount factor.
        gae_lambda: GAE's lambda.
        clip_eps: Clipping range of the probability ratio.
        epochs: Passes over each batch.
        minibatch_size: Frames per gradient step.
        ent_coef: Weight of the entropy bonus.
        vf_coef: Weight of the value loss.
        max_grad_norm: Gradient-norm clip.
    """

    lr: float = 2.5e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    epochs: int = 4
    minibatch_size: int = 256
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5


def compute_gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    *,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates along the last (time) dimension.

    All inputs share one shape ``[..., T]``; step ``t`` is the transition from
    ``observation[t]`` to ``("next", "observation")[t]``.

    Args:
        reward: ``("next", "reward")`` without its trailing 1.
        value: V(observation[t]).
        next_value: V(("next", "observation")[t]); used unless the step terminated.
        terminated: ``("next", "terminated")``: no bootstrap (the episode really ended).
        done: ``("next", "done")``: the trajectory ends here, terminated or truncated.
        gamma: Discount factor.
        lam: GAE's lambda.

    Returns:
        ``(advantage, value_target)``, both shaped like ``reward``.
    """
    not_terminated = (~terminated).to(value.dtype)
    not_done = (~done).to(value.dtype)
    delta = reward + gamma * next_value * not_terminated - value
    advantage = torch.empty_like(delta)
    running = torch.zeros_like(delta[..., 0])
    for t in range(delta.shape[-1] - 1, -1, -1):
        running = delta[..., t] + gamma * lam * not_done[..., t] * running
        advantage[..., t] = running
    return advantage, advantage + value


def _per_sample(log_prob: torch.Tensor, batch_ndim: int) -> torch.Tensor:
    # Continuous policies may report one log-prob per action dimension; PPO needs the joint one.
    if log_prob.ndim > batch_ndim:
        return log_prob.flatten(batch_ndim).sum(-1)
    return log_prob


class ActorCritic(nn.Module):
    """The policy and the value network as one module: what a gradient step runs.

    One module, so that DDP can wrap both and average every gradient across ranks.

    Args:
        policy: Reads ``"observation"`` and offers ``get_dist``.
        value: Maps an observation tensor to a ``[..., 1]`` value.
    """

    def __init__(self, policy: ProbabilisticTensorDictSequential, value: nn.Module) -> None:
        super().__init__()
        self.policy = policy
        self.value = value

    def forward(
        self, observation: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_prob of action, entropy, value)`` per sample of a ``[minibatch]`` input."""
        obs = TensorDict({"observation": observation}, batch_size=observation.shape[:1])
        dist = self.policy.get_dist(obs)
        log_prob = _per_sample(dist.log_prob(action), 1)
        entropy = _per_sample(dist.entropy(), 1)
        return log_prob, entropy, self.value(observation).squeeze(-1)


class PPOLearner:
    """Clipped-objective PPO on a policy module and a value network.

    Args:
        policy: A tensordict ``ProbabilisticTensorDictSequential`` that reads
            ``"observation"`` and offers ``get_dist`` (``common.policies.make_policy``).
        value: An ``nn.Module`` mapping an observation tensor to a ``[..., 1]`` value.
        config: The update knobs.
        wrap: Wraps the policy and value as one module for the gradient steps, on their
            device: ``DataParallel.wrap`` (DDP, torch.distributed initialised) makes every
            rank step with the gradients averaged over all; None steps on them as they are.

    Example::

        learner = PPOLearner(policy, value, PPOConfig(lr=3e-4))
        for batch in collector:
            stats = learner.update(batch)
            collector.update_policy_weights_(policy)
    """

    def __init__(
        self,
        policy: ProbabilisticTensorDictSequential,
        value: nn.Module,
        config: PPOConfig,
        *,
        wrap: Callable[[nn.Module], nn.Module] | None = None,
    ) -> None:
        self.policy = policy
        self.value = value
        self.config = config
        model = ActorCritic(policy, value)
        self.model: nn.Module = model if wrap is None else wrap(model)
        params = list(dict.fromkeys([*policy.parameters(), *value.parameters()]))
        self.optimizer = torch.optim.Adam(params, lr=config.lr, eps=1e-5)
        self._params = params

    def set_lr(self, lr: float) -> None:
        """Set the learning rate of the next gradient steps (for annealing)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def update(self, batch: TensorDictBase) -> dict[str, float]:
        """Run ``epochs`` passes of minibatch PPO over one collector batch.

        Args:
            batch: A batch shaped ``[..., T]`` (sync ``[workers, envs, T]``, async
                ``[envs, T]``) with the collector's keys.

        Returns:
            Means over the gradient steps of ``loss_policy``, ``loss_value``, ``entropy``,
            ``approx_kl`` and ``clip_fraction``.
        """
        data = self.prepare(batch)
        size = data.shape[0]
        minibatch = min(self.config.minibatch_size, size)
        totals: dict[str, float] = {}
        steps = 0
        for _ in range(self.config.epochs):
            order = torch.randperm(size, device=data.device)
            for start in range(0, size - minibatch + 1, minibatch):
                stats = self._step(data[order[start : start + minibatch]])
                for key, val in stats.items():
                    totals[key] = totals.get(key, 0.0) + val
                steps += 1
        return {key: val / steps for key, val in totals.items()}

    @torch.no_grad()
    def prepare(self, batch: TensorDictBase) -> TensorDict:
        """Compute advantages and value targets and flatten a batch to one dimension.

        Args:
            batch: A collector batch shaped ``[..., T]``.

        Returns:
            A ``[frames]`` TensorDict with ``observation``, ``action``, ``old_log_prob``,
            ``advantage`` and ``value_target``.
        """
        rows = batch.reshape(-1, batch.shape[-1])
        observation = rows["observation"]
        value = self.value(observation).squeeze(-1)
        next_value = self.value(rows["next", "observation"]).squeeze(-1)
        advantage, target = compute_gae(
            rows["next", "reward"].squeeze(-1).to(value.dtype),
            value,
            next_value,
            rows["next", "terminated"].squeeze(-1),
            rows["next", "done"].squeeze(-1),
            gamma=self.config.gamma,
            lam=self.config.gae_lambda,
        )
        flat = TensorDict(
            {
                "observation": observation,
                "action": rows["action"],
                "old_log_prob": _per_sample(rows["action_log_prob"], 2),
                "advantage": advantage,
                "value_target": target,
            },
            batch_size=rows.shape,
        )
        return flat.reshape(-1)

    def _step(self, mb: TensorDict) -> dict[str, float]:
        cfg = self.config
        log_prob, entropies, value = self.model(mb["observation"], mb["action"])
        entropy = entropies.mean()
        log_ratio = log_prob - mb["old_log_prob"]
        ratio = log_ratio.exp()
        adv = mb["advantage"]
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        loss_policy = -torch.min(
            ratio * adv, ratio.clamp(1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps) * adv
        ).mean()
        loss_value = 0.5 * (value - mb["value_target"]).pow(2).mean()
        loss = loss_policy + cfg.vf_coef * loss_value - cfg.ent_coef * entropy
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self._params, cfg.max_grad_norm)
        self.optimizer.step()
        with torch.no_grad():
            approx_kl = ((ratio - 1.0) - log_ratio).mean()
            clip_fraction = ((ratio - 1.0).abs() > cfg.clip_eps).float().mean()
        return {
            "loss_policy": loss_policy.item(),
            "loss_value": loss_value.item(),
            "entropy": entropy.item(),
            "approx_kl": approx_kl.item(),
            "clip_fraction": clip_fraction.item(),
        }
