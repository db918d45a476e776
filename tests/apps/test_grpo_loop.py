"""``rlfleet-grpo``'s loop decisions and outputs: when it stops, what its summary says.

The stops (the step budget, the target accuracy, the clock) and the figures of
``summary.json`` are those of :mod:`apps.grpo._loop` and :mod:`apps.grpo._report`, taken
here on a learning curve built as the loop builds it; the end-to-end runs are in
``tests/integration/test_grpo_smoke.py``.
"""

from __future__ import annotations

import json
import pathlib

import torch
from tensordict import TensorDict
from torch import nn

from apps.grpo import GRPOSettings
from apps.grpo._evaluate import Evaluator, held_out_problems
from apps.grpo._loop import _finished, _mean_reward
from apps.grpo._report import Curve, GRPOSummary, save_run
from common.llm import build_policy, build_task
from common.weights import decode_weights

STATS = {"yielded_turns": 96, "tokens": 300, "tokens_per_s": 50.0}


def _curve(*accuracies: float | None, lags: tuple[int, ...] = ()) -> Curve:
    """Step 0 (evaluated, no reward), then an update per further accuracy, as the loop adds."""
    curve = Curve()
    curve.add(0, accuracies[0], None, 0.0)
    for step, accuracy in enumerate(accuracies[1:], start=1):
        lag = lags[step - 1] if lags else 0
        stats = {"entropy": float(step)}
        curve.add(step, accuracy, 0.5, float(step), stats, {"policy_lag": lag})
    return curve


def test_the_target_accuracy_counts_as_reached_when_the_last_evaluation_equals_it() -> None:
    assert _curve(0.1, 0.9).reached(0.9)  # 90 of the 100 problems: the default target
    assert not _curve(0.1, 0.89).reached(0.9)
    # An update not evaluated keeps the last evaluation, not the one before the first.
    assert _curve(0.1, 0.9, None).last_accuracy == 0.9
    assert not _curve(0.95, None).reached(1.0)
    assert _curve(None).last_accuracy == 0.0


def test_the_loop_stops_at_the_step_budget_the_target_or_the_clock_when_one_is_set() -> None:
    settings = GRPOSettings(max_steps=3, target_accuracy=0.9, max_seconds=0.0)
    curve = _curve(0.0, 0.5)
    assert not _finished(settings, curve, 2, elapsed=1e6)  # no clock: max_seconds 0
    assert _finished(settings, curve, 3, elapsed=0.0)
    assert _finished(settings, _curve(0.0, 0.9), 1, elapsed=0.0)
    timed = GRPOSettings(max_steps=3, max_seconds=10.0)
    assert not _finished(timed, curve, 1, elapsed=9.9)
    assert _finished(timed, curve, 1, elapsed=10.0)


def test_the_reward_of_an_update_is_its_batchs_mean_or_the_torchrl_updates_own() -> None:
    reward = torch.tensor([[1.0], [0.0], [0.0], [1.0]])
    batch = TensorDict({("next", "reward"): reward}, batch_size=[4])
    assert _mean_reward(batch, {"reward": 0.25}) == 0.5
    assert _mean_reward(None, {"reward": 0.25}) == 0.25  # the buffer's batch: the update's
    assert _mean_reward(None, {}) == 0.0


def test_the_summary_takes_the_last_evaluation_and_the_lags_of_the_updates_only() -> None:
    curve = _curve(0.2, 0.5, None, lags=(2, 4))
    settings = GRPOSettings(target_accuracy=0.5)
    summary = GRPOSummary.from_run(settings, curve, STATS, 4.0, version=3, interrupted=True)
    assert (summary.accuracy, summary.reached_target, summary.steps) == (0.5, True, 2)
    assert (summary.policy_lag_max, summary.policy_lag_mean) == (4, 3.0)  # not step 0's
    assert (summary.dialog_turns, summary.tokens, summary.tokens_per_s) == (96, 300, 50.0)
    assert (summary.policy_version, summary.final_entropy, summary.interrupted) == (3, 2.0, True)
    assert "target 0.5 reached" in summary.to_text()
    before = GRPOSummary.from_run(GRPOSettings(), _curve(0.0), {}, 0.0, version=1)
    assert (before.policy_lag_mean, before.final_entropy, before.dialog_turns) == (0.0, None, 0)
    assert "target 0.9 not reached" in before.to_text()


def test_save_run_writes_the_weights_with_their_step_and_version_and_the_curve(
    tmp_path: pathlib.Path,
) -> None:
    model = nn.Linear(3, 2)
    curve = _curve(0.2, 0.5, lags=(1,))
    summary = GRPOSummary.from_run(GRPOSettings(), curve, STATS, 1.0, version=2)
    save_run(tmp_path, model, summary, {"group_size": 8}, curve)
    state, metadata = decode_weights((tmp_path / "policy.safetensors").read_bytes())
    assert torch.equal(state["weight"], model.weight.detach())
    assert metadata == {"task": "arith", "steps": "1", "policy_version": "2"}
    record = json.loads((tmp_path / "summary.json").read_text())
    assert record["settings"] == {"group_size": 8}
    assert record["curve"]["accuracies"] == [0.2, 0.5]
    assert record["curve"]["lags"] == [0, 1]
    assert (record["accuracy"], record["policy_version"]) == (0.5, 2)
    assert (tmp_path / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_the_evaluation_answers_greedily_even_where_sampling_would_differ() -> None:
    model, tok = build_policy("rlfleet:tiny-qwen2", hidden=32, layers=1, heads=2, vocab="arith")
    task = build_task("arith")
    # Its own logits replaced: "7" a little likelier than "0" (sampled, 4 answers in 10: "0").
    bias = torch.full((len(tok),), -1e4)
    bias[tok.convert_tokens_to_ids("7")] = 1e4
    bias[tok.convert_tokens_to_ids("0")] = 1e4 - 0.5
    model.register_forward_hook(lambda m, i, out: out.__setitem__("logits", 0 * out.logits + bias))
    evaluator = Evaluator(task, held_out_problems(task, 100, seed=0), tok, max_new_tokens=1)
    assert [evaluator.accuracy(model) for _ in range(3)] == [0.1] * 3  # always "7"
