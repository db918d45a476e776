"""vLLM-engine actors as separate processes: SIGKILL mid-batch, and ``rlfleet-grpo --engine vllm``.

Each actor starts its own vLLM engine (tens of seconds on a loaded CPU), so these are slow;
``make test-vllm`` runs them with the other ``vllm`` tests.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from learner_client import GrpcLLMCollector, LocalFleet

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.usefixtures("loopback_only"),
]

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: Head size 64 (vLLM's CPU attention has no 16, the default tiny model's).
TINY = {"hidden": 128, "heads": 2, "layers": 1, "seed": 0}
SLOTS = 4
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def _groups_whole(batch, size: int) -> bool:
    done = batch["next", "done"].reshape(-1)
    groups = batch["collector", "group_id"].reshape(-1)[done].tolist()
    return all(groups.count(g) == size for g in groups)


@pytest.mark.timeout(900)
def test_kill_9_mid_batch_loses_whole_groups_and_the_restarted_actor_gets_current_weights(
    monkeypatch,
) -> None:
    from common.llm import build_policy

    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    model, _ = build_policy("rlfleet:tiny-qwen2", **{**TINY, "seed": 9})
    with (
        LocalFleet(
            2,
            kind="llm",
            task="arith",
            policy="rlfleet:tiny-qwen2",
            policy_kwargs=TINY,
            num_envs=SLOTS,
            seed=0,
            grace_period=1.0,
            start_timeout=300.0,
            extra_args=["--engine", "vllm"],
        ) as fleet,
        GrpcLLMCollector(
            fleet.addresses,
            dialog_turns_per_batch=4,
            total_dialog_turns=-1,
            yield_completed_trajectories=True,
            group_size=2,
            track_policy_version=True,
            generation={"max_new_tokens": 16},
            batch_timeout=120.0,
        ) as collector,
    ):
        version = max(collector.update_policy_weights_(model).values())
        iterator = iter(collector)
        for _ in range(2):
            assert _groups_whole(next(iterator), 2)
        fleet.kill(1)  # SIGKILL, while it decodes its next batch
        for _ in range(4):  # async keeps flowing from the survivor
            assert _groups_whole(next(iterator), 2)
        fleet.restart(1)
        seen: set[int] = set()
        while 1 not in seen:
            batch = next(iterator)
            assert _groups_whole(batch, 2)
            workers = set(batch["collector", "worker_id"].tolist())
            if 1 in workers:
                assert (batch["policy_version"] == version).all()
            seen |= workers
        stats = collector.stats()
    assert stats["restarts"] == 1
    assert stats["dropped_dialogs"] == SLOTS  # its in-progress dialogs: whole groups


def test_prefix_caching_never_serves_kv_computed_with_older_weights(monkeypatch) -> None:
    from common.llm import GenerationSettings, build_policy, cached_forward, generate

    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    long_context = {**TINY, "max_positions": 2048}  # countdown's system prompt is long
    new, _ = build_policy("rlfleet:tiny-qwen2", **{**long_context, "seed": 21})
    with (
        LocalFleet(
            1, kind="llm", task="countdown", policy="rlfleet:tiny-qwen2",
            policy_kwargs=long_context, num_envs=SLOTS, seed=0, grace_period=1.0,
            start_timeout=300.0, extra_args=["--engine", "vllm", "--enable-prefix-caching", "true"],
        ) as fleet,
        GrpcLLMCollector(
            fleet.addresses, dialog_turns_per_batch=SLOTS, total_dialog_turns=-1, sync=True,
            layout="padded", generation={"max_new_tokens": 6, "temperature": 0.0},
            batch_timeout=120.0, track_policy_version=True,
        ) as collector,
    ):  # fmt: skip
        batches = iter(collector)
        next(batches)  # the cache now holds the shared system prompt's KV under version 0
        version = max(collector.update_policy_weights_(new).values())
        td = next(batches).reshape(-1)
    assert (td["policy_version"] == version).all()
    assert int(td["prompt_len"].min()) > 64  # whole KV blocks of a shared prefix
    for row in range(td.shape[0]):
        prompt = td["tokens"][row, : int(td["prompt_len"][row])].tolist()
        expected = generate(
            lambda i, m, p, past: (*cached_forward(new, i, m, p, past), 0),
            [prompt],
            GenerationSettings(max_new_tokens=6, temperature=0.0),
            budgets=[6],
            stop_ids=[int(new.config.eos_token_id)],
            pad_id=0,
        )
        length = int(td["response_len"][row])
        assert length == int(expected.lengths[0])
        got = td["tokens"][row, len(prompt) : len(prompt) + length].tolist()
        assert got == expected.tokens[0, :length].tolist()


BUDGET_S = 420


@pytest.mark.timeout(BUDGET_S + 420)
def test_grpo_with_the_vllm_engine_learns_arith(tmp_path) -> None:
    out = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable, "-m", "apps.grpo", "--task", "arith", "--engine", "vllm",
            "--max-seconds", str(BUDGET_S), "--out", str(out), "--no-progress",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=BUDGET_S + 360,
        env={**os.environ, **ENV},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    curve = [a for a in summary["curve"]["accuracies"] if a is not None]
    assert curve[-1] >= curve[0] + 0.3, curve  # greedy accuracy rises
    assert summary["policy_lag_max"] == 0
