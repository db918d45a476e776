"""Two learner ranks over two vLLM-engine actors: each rank pushes the agreed versions to its own.

Rank 0 owns worker 0, rank 1 worker 1 (``worker_id % 2``); both push the same weights under
the same explicit versions, as ``rlfleet-grpo --nproc-per-node 2 --engine vllm`` does, and
each actor's engine then generates at that version. Both ranks are collectors in this
process (the agreement over torch.distributed is tested with gloo elsewhere). Each actor
starts its own vLLM engine (tens of seconds on a loaded CPU), so this is slow; ``make
test-vllm`` runs it with the other ``vllm`` tests.
"""

from __future__ import annotations

import contextlib

import pytest

from learner_client import GrpcLLMCollector, LocalFleet

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.usefixtures("loopback_only"),
]

#: Head size 64 (vLLM's CPU attention has no 16, the default tiny model's).
TINY = {"hidden": 128, "heads": 2, "layers": 1, "seed": 0}
SLOTS = 2
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def _versions_reach(collector: GrpcLLMCollector, version: int) -> list[int]:
    """The versions of this rank's batches until one was generated wholly at ``version``."""
    seen = []
    for _ in range(4):  # a batch decoded before the push may still come first
        batch = collector.next()
        assert batch is not None
        low, high = int(batch["policy_version"].min()), int(batch["policy_version"].max())
        assert high <= version
        seen.append(low)
        if low == version:
            return seen
    raise AssertionError(f"no batch at version {version} in 4: {seen}")


@pytest.mark.timeout(900)
def test_two_ranks_push_the_same_versions_and_each_vllm_actor_serves_them(monkeypatch) -> None:
    from common.llm import build_policy

    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    model, _ = build_policy("rlfleet:tiny-qwen2", **{**TINY, "seed": 9})
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(
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
            )
        )
        ranks = [
            stack.enter_context(
                GrpcLLMCollector(
                    fleet.addresses,
                    dialog_turns_per_batch=SLOTS,
                    sync=True,
                    layout="padded",
                    generation={"max_new_tokens": 4},
                    batch_timeout=120.0,
                    track_policy_version=True,
                    rank=rank,
                    world_size=2,
                    learner_id="job",
                )
            )
            for rank in (0, 1)
        ]
        base = max(rank.policy_version for rank in ranks)  # what the actors hold (agreed)
        for version in (base + 1, base + 2):
            pushed = [rank.update_policy_weights_(model, version=version) for rank in ranks]
            assert pushed == [{0: version}, {1: version}]  # each rank reaches its own actor
            for rank, worker in zip(ranks, (0, 1), strict=True):
                _versions_reach(rank, version)
                assert rank.policy_version == version
                assert rank.stats()["failures"] == 0
                assert [a.worker_id for a in rank.remote_collectors] == [worker]
