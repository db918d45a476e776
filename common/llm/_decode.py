"""The batched decode loop with a KV cache, and the log-probs a learner recomputes.

:func:`generate` runs one prefill over left-padded prompts and then one forward per
token for every row at once, through a caller-given ``forward`` (the actor wraps each
call in its model lock, so a weight push lands between two tokens, never inside a
forward, and reports the version each token was drawn at). Each token is drawn from
:func:`process_logits` and its log-prob under exactly that distribution is recorded.
The loop runs where the model is: its state and the sampling stay on that device, and
the host sees the responses once, at the end (``common.llm._device``).

:func:`response_log_probs` is the learner's side: one forward pass over right-padded
``prompt ‖ response`` tokens gives the same log-probs (to float rounding) at the same
weights and settings.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from common.llm._device import AllFinished, to_device
from common.llm._settings import GenerationSettings

__all__ = [
    "Forward",
    "Generation",
    "cache_keyword",
    "cached_forward",
    "chosen_log_probs",
    "generate",
    "process_logits",
    "response_distributions",
    "response_log_probs",
]

#: ``forward(input_ids, attention_mask, position_ids, past) -> (last_logits, past, version)``.
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], tuple[torch.Tensor, Any, int]]


def cached_forward(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, past: Any
) -> tuple[torch.Tensor, Any]:
    """One forward of a decode loop with a KV cache: ``(last position's logits, new cache)``.

    transformers 5.24 renamed the cache argument and output ``past_key_values`` to
    ``cache`` (the old name warns, and goes in 5.40); the name is read off the model's
    ``forward`` (through a ``peft`` wrapper to its base model), so both work.

    Args:
        model: A causal LM.
        ids: ``[B, T]`` input ids (the prompts at prefill, one token per row after).
        mask: ``[B, T + cached]`` attention mask.
        positions: ``[B, T]`` position ids.
        past: The cache of the previous call (None at prefill).
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    name = cache_keyword(base.__class__)
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
        **{name: past},
    )
    return out["logits"][:, -1], out[name]


@functools.cache
def cache_keyword(model_class: Any) -> str:
    """A model class's cache argument: ``cache`` (transformers 5.24+) or ``past_key_values``."""
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def process_logits(logits: torch.Tensor, settings: GenerationSettings) -> torch.Tensor:
    """Log-probabilities of the distribution tokens are drawn from (last dim: vocabulary).

    Greedy: ``log_softmax(logits)`` (the argmax is taken from it). Sampling:
    ``logits / temperature``, then the top-k cut, then the top-p cut (the smallest set
    of most likely tokens whose mass reaches ``top_p``), renormalised; cut tokens get
    ``-inf``.
    """
    logits = logits.float()
    if settings.greedy:
        return torch.log_softmax(logits, dim=-1)
    logits = logits / settings.temperature
    if 0 < settings.top_k < logits.shape[-1]:
        kth = torch.topk(logits, settings.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if settings.top_p < 1.0:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of the more likely tokens
        cut = before >= settings.top_p
        cut[..., 0] = False
        logits = logits.masked_fill(cut.scatter(-1, order, cut), float("-inf"))
    return torch.log_softmax(logits, dim=-1)


@dataclasses.dataclass(frozen=True)
class Generation:
    """What :func:`generate` produced, row by row (rows as in ``prompts``).

    Attributes:
        tokens: ``[B, S]`` int64 response tokens, right-padded with ``pad_id``.
        lengths: ``[B]`` int64 response lengths (a stop token is included).
        log_probs: ``[B, S]`` float32 behaviour log-probs (0 at padding).
        versions: ``[B, S]`` int64 policy version each token was drawn at (0 at padding).
        stopped: ``[B]`` bool: the response ended with a stop token (else it hit its budget).
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    log_probs: torch.Tensor
    versions: torch.Tensor
    stopped: torch.Tensor


def generate(
    forward: Forward,
    prompts: Sequence[Sequence[int]],
    settings: GenerationSettings,
    *,
    budgets: Sequence[int],
    stop_ids: Sequence[int],
    pad_id: int,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    finish_lag: int | None = None,
) -> Generation:
    """Generate a response for every prompt at once, with a KV cache, on ``device``.

    The prompts go to ``device`` once; tokens, log-probs, versions, lengths, the
    sampling and the stop checks stay there, with no host copy per token besides the
    "all rows finished" flag (read one step late on CUDA, so the GPU never waits:
    :class:`~common.llm._device.AllFinished`). The result comes back to the host
    once, at the end.

    Args:
        forward: One model call (see :data:`Forward`) on tensors on ``device``;
            prefill gets the whole padded prompts, then one token per row per call.
        prompts: Token ids per row (non-empty).
        settings: How tokens are drawn.
        budgets: Most new tokens per row (>= 1 each).
        stop_ids: Tokens that end a row's response (included in it).
        pad_id: Filler for left padding and finished rows.
        generator: The sampling generator, on ``device`` (reproducible batches; a CPU
            and a CUDA generator seeded alike draw different streams).
        device: Where the model runs, and so the loop.
        finish_lag: Steps the "all rows finished" check lags: None (1 on CUDA, 0
            elsewhere), 0 or 1.

    Raises:
        ValueError: No prompt, an empty one, or a budget below 1 (or not one per prompt).
    """
    _check_rows(prompts, budgets)
    loop = _Loop(prompts, budgets, stop_ids, pad_id, torch.device(device))
    all_finished = AllFinished(loop.device, finish_lag)
    logits, past, version = forward(loop.ids, loop.mask(0), loop.positions, None)
    position = loop.positions[:, -1:] + 1
    for step in range(loop.steps):
        token, chosen = _draw(logits, settings, generator)
        loop.record(step, token, chosen, version)
        if step + 1 == loop.steps or all_finished(loop.active):
            break
        ids = loop.out[:, step : step + 1]
        logits, past, version = forward(ids, loop.mask(step + 1), position, past)
        position = position + 1
    return loop.result()


def _check_rows(prompts: Sequence[Sequence[int]], budgets: Sequence[int]) -> None:
    """Refuse rows the loop cannot honour: none, an empty prompt, a budget below 1 token.

    Raises:
        ValueError: Naming the first bad row (a budget of 0 would still draw a token).
    """
    if not prompts or len(budgets) != len(prompts):
        raise ValueError(
            f"generate takes one budget per prompt and at least one prompt; got "
            f"{len(prompts)} prompts and {len(budgets)} budgets"
        )
    for row, (prompt, budget) in enumerate(zip(prompts, budgets, strict=True)):
        if not len(prompt) or int(budget) < 1:
            raise ValueError(
                f"row {row}: a prompt needs at least one token ({len(prompt)}) and a budget "
                f"at least one new token ({budget}); leave such rows out"
            )


class _Loop:
    """One decode loop's state, all on its device: inputs, outputs, lengths, budgets, stops."""

    def __init__(
        self,
        prompts: Sequence[Sequence[int]],
        budgets: Sequence[int],
        stop_ids: Sequence[int],
        pad_id: int,
        device: torch.device,
    ) -> None:
        rows, self.device, self.pad_id = len(prompts), device, pad_id
        budget = torch.as_tensor(list(budgets), dtype=torch.long)
        self.steps = int(budget.max())
        self.width = max(len(p) for p in prompts)
        # ids and the attention mask of every step to come, moved in one copy.
        packed = to_device(_left_padded(prompts, pad_id, self.steps), device)
        self.ids, self._mask = packed[0, :, : self.width], packed[1]
        self.positions = (self._mask[:, : self.width].cumsum(-1) - 1).clamp(min=0)
        self.budget = to_device(budget, device)
        self.stops = to_device(torch.as_tensor(sorted(set(stop_ids)), dtype=torch.long), device)
        self.out = torch.full((rows, self.steps), pad_id, dtype=torch.long, device=device)
        self.log_probs = torch.zeros((rows, self.steps), dtype=torch.float32, device=device)
        self.versions = torch.zeros((rows, self.steps), dtype=torch.long, device=device)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        self.stopped = torch.zeros(rows, dtype=torch.bool, device=device)
        self.active = torch.ones(rows, dtype=torch.bool, device=device)

    def mask(self, step: int) -> torch.Tensor:
        """The attention mask of the forward that feeds token ``step`` (0: the prefill)."""
        return self._mask[:, : self.width + step]

    def record(self, step: int, token: torch.Tensor, chosen: torch.Tensor, version: int) -> None:
        """Write step ``step``'s tokens into the active rows; stop rows at a stop or budget."""
        active = self.active
        self.out[:, step] = torch.where(active, token, self.pad_id)
        self.log_probs[:, step] = torch.where(active, chosen, 0.0)
        self.versions[:, step] = torch.where(active, version, 0)
        self.lengths += active.long()
        hit_stop = active & torch.isin(token, self.stops)
        self.stopped |= hit_stop
        active &= ~hit_stop & (self.lengths < self.budget)

    def result(self) -> Generation:
        """The responses, on the host, cut to the longest."""
        lengths = self.lengths.cpu()
        used = int(lengths.max())
        return Generation(
            tokens=self.out[:, :used].cpu().contiguous(),
            lengths=lengths,
            log_probs=self.log_probs[:, :used].cpu().contiguous(),
            versions=self.versions[:, :used].cpu().contiguous(),
            stopped=self.stopped.cpu(),
        )


def _draw(
    logits: torch.Tensor, settings: GenerationSettings, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its log-prob under the distribution it was drawn from."""
    log_probs = process_logits(logits, settings)
    token = logits.argmax(-1) if settings.greedy else _multinomial(log_probs.exp(), generator)
    return token, log_probs.gather(-1, token[:, None]).squeeze(-1)


def _multinomial(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row: ``torch.multinomial(probs, 1)``'s own algorithm, without its check.

    ``argmax(p / q)``, ``q ~ Exp(1)``, is what ``torch.multinomial`` computes for one
    sample (the same draws from the same generator: equal tokens on the CPU), but it
    first checks the probabilities with an ``.item()``, a host sync per token on CUDA.
    These probabilities come from a softmax, so the check has nothing to find.
    """
    return (probs / torch.empty_like(probs).exponential_(1, generator=generator)).argmax(-1)


def _left_padded(prompts: Sequence[Sequence[int]], pad_id: int, steps: int) -> torch.Tensor:
    """``[2, B, W + steps]``: prompts left-padded to ``W`` (then ``pad_id``), and the mask.

    The mask is 1 on prompt tokens and on the ``steps`` positions generation appends.
    """
    width = max(len(p) for p in prompts)
    packed = torch.full((2, len(prompts), width + steps), pad_id, dtype=torch.long)
    packed[1] = 1
    for row, prompt in enumerate(prompts):
        packed[0, row, width - len(prompt) : width] = torch.as_tensor(prompt, dtype=torch.long)
        packed[1, row, : width - len(prompt)] = 0
    return packed


def response_distributions(
    model: Any,
    tokens: torch.Tensor,
    prompt_len: torch.Tensor,
    response_len: torch.Tensor,
    settings: GenerationSettings,
) -> torch.Tensor:
    """The distributions response tokens were drawn from, by one forward pass (learner side).

    Args:
        model: A causal LM (``model(input_ids, attention_mask).logits``).
        tokens: ``[B, L]`` right-padded ``prompt ‖ response`` tokens (the padded wire form).
        prompt_len: ``[B]`` prompt lengths.
        response_len: ``[B]`` response lengths.
        settings: The generation settings the responses were drawn with.

    Returns:
        ``[B, R, V]`` float32 log-probabilities (:func:`process_logits`) at each response
        position, ``R = max(response_len)``; positions past a row's length hold
        whatever follows its end (mask them); differentiable.
    """
    rows, width = tokens.shape
    index = torch.arange(width, device=tokens.device)
    mask = (index[None, :] < (prompt_len + response_len)[:, None]).long()
    logits = model(input_ids=tokens, attention_mask=mask).logits
    span = int(response_len.max()) if rows else 0
    steps = torch.arange(span, device=tokens.device)
    offsets = (prompt_len[:, None] - 1 + steps[None, :]).clamp(0, width - 1)
    picked = logits.gather(1, offsets[..., None].expand(-1, -1, logits.shape[-1]))
    return process_logits(picked, settings)


def response_log_probs(
    model: Any,
    tokens: torch.Tensor,
    prompt_len: torch.Tensor,
    response_len: torch.Tensor,
    settings: GenerationSettings,
) -> torch.Tensor:
    """The behaviour log-probs of responses, recomputed by one forward pass (learner side).

    Args:
        model: A causal LM (``model(input_ids, attention_mask).logits``).
        tokens: ``[B, L]`` right-padded ``prompt ‖ response`` tokens (the padded wire form).
        prompt_len: ``[B]`` prompt lengths.
        response_len: ``[B]`` response lengths.
        settings: The generation settings the responses were drawn with.

    Returns:
        ``[B, R]`` float32 log-probs of each response token (0 past its length),
        ``R = max(response_len)``; differentiable.
    """
    log_probs = response_distributions(model, tokens, prompt_len, response_len, settings)
    return chosen_log_probs(log_probs, tokens, prompt_len, response_len)


def chosen_log_probs(
    log_probs: torch.Tensor,
    tokens: torch.Tensor,
    prompt_len: torch.Tensor,
    response_len: torch.Tensor,
) -> torch.Tensor:
    """Pick each response token's log-prob out of :func:`response_distributions`.

    Returns:
        ``[B, R]`` log-probs of the response tokens, 0 past each row's length.
    """
    width, span = tokens.shape[1], log_probs.shape[1]
    steps = torch.arange(span, device=tokens.device)
    offsets = (prompt_len[:, None] + steps[None, :]).clamp(max=width - 1)
    chosen = log_probs.gather(-1, tokens.gather(1, offsets)[..., None]).squeeze(-1)
    valid = steps[None, :] < response_len[:, None]
    return torch.where(valid, chosen, torch.zeros_like(chosen))
