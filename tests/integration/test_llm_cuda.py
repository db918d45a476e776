"""An LLM actor on CUDA end to end (a real subprocess): bf16 decoding, pushes, learner check.

Skipped where torch sees no CUDA device.
"""

from __future__ import annotations

import pytest
import torch

from common.llm import GenerationSettings, build_policy, response_log_probs
from learner_client import GrpcLLMCollector, LocalFleet

pytest.importorskip("transformers")
pytestmark = [pytest.mark.usefixtures("loopback_only"), pytest.mark.cuda]

TINY = {"hidden": 256, "layers": 4, "seed": 0}


def test_a_cuda_llm_actor_decodes_in_bf16_and_a_bf16_learner_agrees() -> None:
    generation = {"max_new_tokens": 16, "temperature": 1.0}
    learner, _ = build_policy("rlfleet:tiny-qwen2", **TINY, dtype="bfloat16")
    learner = learner.cuda()
    with (
        LocalFleet(1, kind="llm", policy_kwargs=TINY, num_envs=4, seed=0,
                   extra_args=["--device", "cuda"]) as fleet,
        GrpcLLMCollector(fleet.addresses, dialog_turns_per_batch=4, total_dialog_turns=8,
                         sync=True, generation=generation, layout="padded",
                         track_policy_version=True) as collector,
    ):  # fmt: skip
        batches = iter(collector)
        first = next(batches).reshape(-1)
        pushed = {k: v + 0.01 for k, v in learner.state_dict().items()}
        learner.load_state_dict(pushed)
        collector.update_policy_weights_(learner)  # bf16 in, bf16 held: no cast
        second = next(batches).reshape(-1)
    assert int(second["policy_version"].min()) == 1
    for batch in (second,):
        tokens, prompt_len, response_len = (
            batch[k].cuda() for k in ("tokens", "prompt_len", "response_len")
        )
        settings = GenerationSettings(**generation)
        with torch.no_grad():
            recomputed = response_log_probs(learner, tokens, prompt_len, response_len, settings)
        valid = torch.arange(recomputed.shape[1], device="cuda")[None] < response_len[:, None]
        gap = (recomputed - batch["log_probs"].cuda()).abs()[valid]
        assert gap.mean() < 0.1
        assert gap.max() < 0.75
    assert first["log_probs"].isfinite().all()
