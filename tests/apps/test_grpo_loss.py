"""The GRPO math of ``rlfleet-grpo``: group advantages, the clipped update, the entropy floor."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tensordict import TensorDict

from apps.grpo._evaluate import Evaluator, held_out_problems
from apps.grpo._loss import GRPOConfig, GRPOLearner, group_advantages
from common.llm import (
    GenerationSettings,
    build_policy,
    build_task,
    cached_forward,
    generate,
    response_log_probs,
)

pytest.importorskip("transformers")

TINY = {"hidden": 32, "layers": 1, "heads": 2, "seed": 3}


def test_group_advantages_normalise_within_each_group():
    reward = torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0, 5.0, 2.0, 4.0])
    group = torch.tensor([7, 7, 7, 7, 2, 2, 9, 9])  # unordered, non-contiguous ids
    adv = group_advantages(reward, group)
    std = torch.tensor([1.0, 0.0, 0.0, 0.0]).std()  # unbiased, as torch's default
    torch.testing.assert_close(adv[:4], (torch.tensor([1.0, 0, 0, 0]) - 0.25) / (std + 1e-4))
    assert adv[4:6].tolist() == [0.0, 0.0]  # a group that agrees teaches nothing
    torch.testing.assert_close(adv[6:], torch.tensor([-1.0, 1.0]) / (2**0.5 + 1e-4))
    # Interleaved members of a group get the same result as contiguous ones.
    order = torch.tensor([4, 0, 6, 1, 5, 2, 7, 3])
    torch.testing.assert_close(group_advantages(reward[order], group[order]), adv[order])


def _batch(model, tok, rewards: list[float], settings: GenerationSettings) -> TensorDict:
    """A padded batch as the actors send it: 4 answers to one prompt, their log-probs."""
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "3+4="}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    rows = len(rewards)

    def forward(ids, mask, positions, past):
        return (*cached_forward(model, ids, mask, positions, past), 0)

    with torch.no_grad():
        gen = generate(
            forward,
            [prompt] * rows,
            settings,
            budgets=[settings.max_new_tokens] * rows,
            stop_ids=(tok.eos_token_id,),
            pad_id=tok.pad_token_id,
            generator=torch.Generator().manual_seed(0),
        )
    width = len(prompt) + gen.tokens.shape[1]
    tokens = torch.full((rows, width), tok.pad_token_id)
    tokens[:, : len(prompt)] = torch.tensor(prompt)
    tokens[:, len(prompt) :] = gen.tokens
    return TensorDict(
        {
            "tokens": tokens,
            "prompt_len": torch.full((rows,), len(prompt)),
            "response_len": gen.lengths,
            "log_probs": gen.log_probs,
            "next": {"reward": torch.tensor(rewards)[:, None]},
            "collector": {"group_id": torch.zeros(rows, dtype=torch.long)},
        },
        batch_size=[rows],
    )


def test_update_at_the_generating_weights_has_ratio_one_and_moves_towards_the_rewarded():
    model, tok = build_policy("rlfleet:tiny-qwen2", **TINY)
    settings = GenerationSettings(max_new_tokens=3, temperature=1.0)
    batch = _batch(model, tok, [1.0, 0.0, 0.0, 0.0], settings)
    args = (batch["tokens"], batch["prompt_len"], batch["response_len"], settings)
    with torch.no_grad():
        before = response_log_probs(model, *args).sum(-1)
    learner = GRPOLearner(model, settings, GRPOConfig(lr=1e-2, ent_coef=0.0))
    stats = learner.update(batch)
    # The actors' log-probs are the learner's at the same weights: nothing clipped, no KL.
    assert stats["clip_fraction"] == 0.0
    assert abs(stats["approx_kl"]) < 1e-6
    assert stats["entropy"] > 0
    with torch.no_grad():
        after = response_log_probs(model, *args).sum(-1)
    assert after[0] > before[0]  # the rewarded answer became more likely
    assert (after[1:] < before[1:]).all()  # the others less


def test_entropy_bonus_acts_only_below_the_floor():
    settings = GenerationSettings(max_new_tokens=2, temperature=1.0)
    model, tok = build_policy("rlfleet:tiny-qwen2", **TINY)
    batch = _batch(model, tok, [0.0, 0.0, 0.0, 0.0], settings)  # no advantage at all
    initial = {k: v.clone() for k, v in model.state_dict().items()}

    # The random model's entropy (a few nats) is above a 0.5 floor: no gradient, no change.
    GRPOLearner(model, settings, GRPOConfig(ent_coef=1.0, entropy_floor=0.5)).update(batch)
    assert all(torch.equal(initial[k], v) for k, v in model.state_dict().items())

    # Below a floor of 100 nats the bonus raises the entropy.
    learner = GRPOLearner(model, settings, GRPOConfig(lr=1e-2, ent_coef=1.0, entropy_floor=100))
    first = learner.update(batch)["entropy"]
    for _ in range(3):
        last = learner.update(batch)["entropy"]
    assert last > first


def test_held_out_problems_are_distinct_and_cover_one_digit_sums():
    task = build_task("arith")
    problems = held_out_problems(task, 1000, seed=1)
    assert len(problems) == 100  # a+b for a, b in 0..9: the whole space, no more
    assert len({p.query for p in problems}) == 100
    assert len(held_out_problems(task, 10, seed=1)) == 10  # as many as asked, when there are
    assert held_out_problems(task, 10, seed=1) == held_out_problems(task, 10, seed=1)


def test_evaluator_scores_greedy_answers_with_the_task():
    model, tok = build_policy("rlfleet:tiny-qwen2", **TINY)
    task = build_task("arith")
    problems = held_out_problems(task, 100, seed=0)
    # A model whose every answer is the digit "7": right on the 10 sums that end in 7.
    bias = torch.full((len(tok),), -1e4)
    bias[tok.convert_tokens_to_ids("7")] = 1e4
    model.register_forward_hook(lambda m, i, out: out.__setitem__("logits", out.logits + bias))
    assert Evaluator(task, problems, tok, max_new_tokens=1).accuracy(model) == 0.1
    # With room for two tokens it answers "77": never right.
    assert Evaluator(task, problems, tok, max_new_tokens=2).accuracy(model) == 0.0


def test_grpo_config_defaults_are_the_command_lines() -> None:
    from apps.grpo._settings import GRPOSettings

    settings = GRPOSettings()
    for field in dataclasses.fields(GRPOConfig):
        assert field.default == getattr(settings, field.name), field.name


def test_update_past_the_clip_range_leaves_the_weights_and_reports_the_clipped_loss():
    """Answers whose ratio already passed the clip on their advantage's side teach nothing.

    The rewarded answer's recorded log-probs are 1 nat below the learner's (ratio e > 1.2),
    the others' 1 nat above (ratio 1/e < 0.8): every token is clipped, so the loss is
    ``-(1 + eps) A`` or ``-(1 - eps) A`` per token and the weights do not move.
    """
    model, tok = build_policy("rlfleet:tiny-qwen2", **TINY)
    settings = GenerationSettings(max_new_tokens=3, temperature=1.0)
    batch = _batch(model, tok, [1.0, 0.0, 0.0, 0.0], settings)
    # One answer cut to 1 token: its last 2 positions are padding, whose recorded log-probs
    # are garbage and must count nowhere (not in the ratio, the loss, nor the figures).
    batch["response_len"][1] = 1
    mask = torch.arange(3)[None, :] < batch["response_len"][:, None]
    shift = torch.tensor([-1.0, 1.0, 1.0, 1.0])[:, None] * mask - 1e3 * ~mask
    batch["log_probs"] = batch["log_probs"] + shift[:, : batch["log_probs"].shape[1]]
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    config = GRPOConfig(lr=1e-2, ent_coef=0.0, clip_eps=0.2, epochs=1)
    stats = GRPOLearner(model, settings, config).update(batch)
    assert stats["clip_fraction"] == 1.0
    assert all(torch.equal(initial[k], v) for k, v in model.state_dict().items())
    adv = group_advantages(batch["next", "reward"].reshape(-1), batch["collector", "group_id"])
    per_token = torch.where(adv > 0, 1.2 * adv, 0.8 * adv)[:, None] * mask
    assert stats["loss"] == pytest.approx(float(-per_token.sum() / mask.sum()), rel=1e-4)


def test_update_takes_epochs_gradient_steps_on_each_batch():
    """``--epochs`` gradient steps per batch; the later ones see ratios away from 1."""
    model, tok = build_policy("rlfleet:tiny-qwen2", **TINY)
    settings = GenerationSettings(max_new_tokens=2, temperature=1.0)
    batch = _batch(model, tok, [1.0, 0.0, 0.0, 0.0], settings)
    learner = GRPOLearner(model, settings, GRPOConfig(lr=1e-2, ent_coef=0.0, epochs=3))
    taken = []
    learner.optimizer.register_step_post_hook(lambda *_: taken.append(1))
    stats = learner.update(batch)
    assert len(taken) == 3
    assert stats["approx_kl"] > 1e-6  # the second and third steps are off the actors' policy


@pytest.mark.parametrize(("lr", "max_grad_norm"), [(1e-3, float("inf")), (1.0, 1e-3)])
def test_update_steps_follow_their_own_clipped_gradient_only(lr, max_grad_norm):
    """Each of ``epochs`` plain SGD steps moves by its own gradient, clipped to
    ``max_grad_norm``: the second step of two is as long as the first (the first's gradient
    is not added to it), and a clipped step is exactly ``lr * max_grad_norm`` long."""
    model, tok = build_policy("rlfleet:tiny-qwen2", **TINY)
    settings = GenerationSettings(max_new_tokens=2, temperature=1.0)
    batch = _batch(model, tok, [1.0, 0.0, 0.0, 0.0], settings)
    config = GRPOConfig(ent_coef=0.0, epochs=2, max_grad_norm=max_grad_norm)
    learner = GRPOLearner(model, settings, config)
    learner.optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    lengths = []
    before = [p.detach().clone() for p in model.parameters()]

    def record(*_):
        now = [p.detach().clone() for p in model.parameters()]
        moved = torch.cat([(n - b).flatten() for n, b in zip(now, before, strict=True)])
        lengths.append(float(moved.norm()))
        before[:] = now

    learner.optimizer.register_step_post_hook(record)
    learner.update(batch)
    assert len(lengths) == 2
    assert lengths[1] == pytest.approx(lengths[0], rel=0.1)
    if max_grad_norm < 1:
        assert lengths[0] == pytest.approx(lr * max_grad_norm, rel=1e-3)


def test_update_reports_the_mean_over_its_epochs():
    """At lr 0 the ``epochs`` steps are alike: the figures are one step's, not their sum."""
    model, tok = build_policy("rlfleet:tiny-qwen2", **TINY)
    settings = GenerationSettings(max_new_tokens=2, temperature=1.0)
    batch = _batch(model, tok, [1.0, 0.0, 0.0, 0.0], settings)
    once = GRPOLearner(model, settings, GRPOConfig(lr=0.0, epochs=1)).update(batch)
    thrice = GRPOLearner(model, settings, GRPOConfig(lr=0.0, epochs=3)).update(batch)
    assert once["loss"] != 0.0
    for key, value in once.items():
        assert thrice[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_evaluator_answers_greedily_not_by_sampling():
    """A model that says "7" with probability 0.62 and "x" otherwise: greedy, it always
    says "7" (right on the 10 sums ending in 7); sampling would say "x" now and then."""
    model, tok = build_policy("rlfleet:tiny-qwen2", **TINY)
    task = build_task("arith")
    problems = held_out_problems(task, 100, seed=0)
    logits = torch.full((len(tok),), -1e4)
    logits[tok.convert_tokens_to_ids("7")] = 0.5
    logits[tok.convert_tokens_to_ids("x")] = 0.0
    model.register_forward_hook(
        lambda m, i, out: out.__setitem__("logits", torch.zeros_like(out.logits) + logits)
    )
    torch.manual_seed(0)
    assert Evaluator(task, problems, tok, max_new_tokens=1).accuracy(model) == 0.1
