"""TorchRL's GRPOLoss consumes rlfleet LLM batches unchanged, at the generating weights."""

from __future__ import annotations

import warnings

import pytest
import torch

from actor_service import ActorConfig, ModelSpec
from actor_service._kinds.llm.core import LLMCore
from actor_service._kinds.llm.settings import LLMActorSettings
from common.config import CollectSettings
from common.llm import GenerationSettings, LLMSettings, build_policy, to_torchrl

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("loopback_only")

TINY = {"hidden": 32, "layers": 2, "seed": 11}


def test_grpo_loss_consumes_a_batch_unchanged() -> None:
    """Sampled at temperature 1 (TorchRL's wrapper scores raw logits): ratio 1, KL 0."""
    from torchrl.modules.llm import TransformersWrapper
    from torchrl.objectives.llm import GRPOLoss

    config = ActorConfig(
        kind="llm",
        # dialogs of 1 or 2 turns: ragged tokens
        llm=LLMActorSettings(task="arith", task_kwargs={"retries": 1}),
        models=(ModelSpec("policy", "rlfleet:tiny-qwen2", TINY),),
        num_envs=4,
        seed=0,
    )
    llm = LLMSettings(
        generation=GenerationSettings(max_new_tokens=5, temperature=1.0),
        group_size=4,
        yield_completed_trajectories=True,
    )
    with LLMCore(config) as worker:
        worker.configure(CollectSettings(frames_per_batch=8, llm=llm))
        batch = to_torchrl(worker.collect_batch())
    model, tok = build_policy("rlfleet:tiny-qwen2", **TINY)  # the learner's identical copy
    actor = TransformersWrapper(
        model, tokenizer=tok, input_mode="tokens", generate=False, pad_output=False,
        return_log_probs=True,
    )  # fmt: skip
    batch.set("advantage", torch.randn(batch.shape[0], 1, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = GRPOLoss(actor, masking_strategy="sft")(batch)
    assert abs(float(out.kl_approx)) < 1e-5
    assert float(out.clip_fraction) == 0.0
    assert abs(float(out.ESS) - 1.0) < 1e-4
    (out.loss_objective + out.loss_entropy).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads
    assert all(torch.isfinite(g).all() for g in grads)
