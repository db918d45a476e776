"""Smoke tests of ``rlfleet-grpo``: the real entry point, 2 real LLM actors, a few updates."""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys

import pytest

from apps.grpo import parse_args
from common.llm import build_policy
from common.weights import decode_weights

pytestmark = pytest.mark.long

pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[2]
# A few updates of a small model: enough to prove the loop, not to learn.
TINY = ["--hidden", "32", "--prompts-per-step", "4", "--eval-problems", "20"]


def _grpo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apps.grpo", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_grpo_entry_point_runs_a_few_updates_and_writes_its_outputs(tmp_path):
    out = tmp_path / "run"
    result = _grpo(*TINY, "--max-steps", "3", "--seed", "5", "--out", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "GRPO on arith (builtin loss, seed 5)" in result.stdout
    # Progress lines without a terminal: accuracy, reward, tokens/s and lag per update.
    lines = [line for line in result.stderr.splitlines() if line.startswith("steps=")]
    assert len(lines) == 3
    assert all(f" {k}=" in lines[-1] for k in ("acc", "reward", "tok/s", "lag"))

    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3
    assert summary["dialog_turns"] == 3 * 4 * 8  # every update: 4 problems x a group of 8
    assert summary["tokens"] >= summary["dialog_turns"]  # at least one token per answer
    assert 0.0 <= summary["accuracy"] <= 1.0
    assert summary["reached_target"] is (summary["accuracy"] >= 0.9)
    assert summary["tokens_per_s"] > 0
    assert summary["policy_lag_max"] == 0  # sync: every batch comes from the latest push
    # One push before the first update, then one after each: every actor applied all four.
    assert summary["policy_version"] == 4
    assert summary["wall_time_s"] > 0
    assert summary["settings"]["group_size"] == 8
    assert len(summary["curve"]["steps"]) == 4
    assert all(a is not None for a in summary["curve"]["accuracies"])

    state, metadata = decode_weights((out / "policy.safetensors").read_bytes())
    assert metadata["task"] == "arith"
    assert summary["settings"]["vocab"] == "auto"  # the arith task: the arith vocabulary
    fresh, _ = build_policy(
        "rlfleet:tiny-qwen2", hidden=32, layers=2, heads=4, vocab="arith", seed=5
    )
    assert {k: v.shape for k, v in state.items()} == {
        k: v.shape for k, v in fresh.state_dict().items()
    }
    assert (out / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_grpo_with_rlfleet_token_sends_the_token_its_own_actors_inherit(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its local actors inherit ``$RLFLEET_TOKEN`` and require it; its collector sends it
    (it once sent none: UNAUTHENTICATED). One no header carries is named, exit 1."""
    monkeypatch.setenv("RLFLEET_TOKEN", "grpo-s3cret")
    out = tmp_path / "run"
    result = _grpo(*TINY, "--max-steps", "1", "--out", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr[-4000:]
    assert (out / "summary.json").exists()
    monkeypatch.setenv("RLFLEET_TOKEN", "grpo-s3cret\n")
    result = _grpo(*TINY, "--max-steps", "1", "--out", str(tmp_path / "bad"), "--no-progress")
    assert result.returncode == 1
    assert "rlfleet-grpo: error: RLFLEET_TOKEN: token must hold printable ASCII" in result.stderr
    assert "Traceback" not in result.stderr


def test_grpo_multi_turn_dialogs_run_every_step_asked(tmp_path):
    # Three retries: a batch of whole dialogs holds more turns than prompts x group, and a
    # turn budget of steps x that product ended the run after fewer updates than asked.
    out = tmp_path / "run"
    retries = ["--task-kwargs", '{"retries": 3}', "--group-size", "2"]
    result = _grpo(*TINY, *retries, "--max-steps", "5", "--out", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 5
    assert summary["dialog_turns"] > 5 * 4 * 2  # retries took extra turns
    assert summary["policy_version"] == 6


def test_grpo_stopped_on_time_evaluates_the_weights_it_saves(tmp_path):
    out = tmp_path / "run"
    flags = ["--max-seconds", "0.001", "--eval-every", "50", "--max-steps", "50"]
    result = _grpo(*TINY, *flags, "--out", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1  # the clock ran out at the first update
    # Not the accuracy before the update: the saved weights' own, evaluated after the loop.
    assert summary["curve"]["accuracies"][-1] is not None
    assert summary["accuracy"] == summary["curve"]["accuracies"][-1]


def test_grpo_ctrl_c_stops_between_updates_and_writes_the_outputs(tmp_path):
    out = tmp_path / "run"
    # Evaluated before the first update only: none after the signal either.
    flags = [*TINY, "--eval-every", "1000", "--no-progress", "--out", str(out)]
    job = subprocess.Popen(
        [sys.executable, "-m", "apps.grpo", *flags],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while not job.stderr.readline().startswith("steps="):  # the first update is done
            assert job.poll() is None, job.stderr.read()
        job.send_signal(signal.SIGINT)
        _, err = job.communicate(timeout=60)
    finally:
        job.kill()
    assert job.returncode == 130, err[-4000:]
    assert "rlfleet-grpo: interrupted (outputs of " in err
    assert "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert summary["steps"] >= 1
    assert summary["curve"]["accuracies"][1:] == [None] * summary["steps"]
    assert summary["accuracy"] == summary["curve"]["accuracies"][0]
    assert (out / "policy.safetensors").exists()


@pytest.mark.slow  # a second fleet start-up and TorchRL's import: kept out of the fast suite
def test_grpo_torchrl_loss_runs_a_few_updates(tmp_path):
    pytest.importorskip("torchrl")
    out = tmp_path / "run"
    result = _grpo(
        *TINY,
        "--num-actors",
        "1",
        "--loss",
        "torchrl",
        # Multi-turn groups: every turn of a batch must reach the update (none overwritten).
        "--task-kwargs",
        '{"retries": 2}',
        "--max-steps",
        "2",
        "--out",
        str(out),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "UserWarning" not in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["loss"] == "torchrl"
    assert summary["steps"] == 2
    assert summary["dialog_turns"] > 2 * 4 * 8
    assert summary["policy_version"] == 3
    # MCAdvantage wrote advantages and GRPOLoss produced an entropy for every update.
    assert all(e is not None and e > 0 for e in summary["curve"]["entropies"][1:])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--group-size", "0"], "group_size must be a positive int"),
        (["--group-size", "1"], "group_size must be >= 2"),
        (["--loss", "ppo"], "loss must be one of"),
        (["--task-kwargs", "[1]"], "task_kwargs must be a JSON object"),
        (["--task", "nope"], "unknown task 'nope'; expected one of arith"),
        (["--prompts-per-step", "3"], "must be a multiple of num_actors"),
        (["--loss", "torchrl", "--temperature", "0.7"], "temperature 1"),
        (["--max-seconds", "nan"], "--max-seconds: expected a number, got nan"),
        (["--max-seconds", "inf"], "max_seconds must be finite"),
        (["--temperature", "0"], "temperature must be finite and > 0, got 0.0"),
        (["--vocab", "words"], "vocab must be auto or one of"),
        (["--init-std", "-0.1"], "init_std must be finite and >= 0"),
    ],
)
def test_grpo_parse_args_refuses_bad_flags_with_exit_2(flags, message, capsys):
    with pytest.raises(SystemExit) as raised:
        parse_args(flags)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_grpo_fits_the_model_context_to_the_tasks_prompts():
    """countdown's prompts pass the tiny model's 512 positions: every dialog ended truncated
    with an empty answer and the run trained on nothing. The context now holds them."""
    import random

    from apps.grpo._evaluate import prompt_ids
    from apps.grpo._loop import fit_context
    from common.llm import build_task, build_tokenizer

    settings = fit_context(parse_args(["--task", "countdown", "--max-new-tokens", "8"]))
    tokenizer = build_tokenizer(settings.model_vocab)
    task, rng = build_task("countdown"), random.Random(1)
    longest = max(len(prompt_ids(tokenizer, task.sample(rng))) for _ in range(64))
    assert longest > 512
    assert settings.model_kwargs["max_positions"] >= longest + 8
    assert fit_context(parse_args([])).model_kwargs["max_positions"] == 512  # arith: as before
    given = fit_context(parse_args(["--task", "countdown", "--max-positions", "256"]))
    assert given.model_kwargs["max_positions"] == 256  # the user's, as given


def test_grpo_vocab_auto_is_arith_for_the_arith_task_and_compact_for_the_others():
    assert parse_args([]).model_kwargs["vocab"] == "arith"
    assert parse_args(["--task", "reverse"]).model_kwargs["vocab"] == "compact"
    assert parse_args(["--vocab", "bytes"]).model_kwargs["vocab"] == "bytes"


def test_grpo_init_std_redraws_every_weight_matrix_and_zeroes_the_biases():
    from apps.grpo._loop import _init_weights

    model, _ = build_policy("rlfleet:tiny-qwen2", hidden=64, layers=2, heads=4, vocab="arith")
    _init_weights(model, 0.1)
    for name, tensor in model.state_dict().items():
        if name.endswith("bias"):
            assert (tensor == 0).all(), name
        elif "norm" in name:
            assert (tensor == 1).all(), name  # the norms keep their weights
        elif tensor.numel() >= 1024:
            assert 0.09 < float(tensor.std()) < 0.11, name
