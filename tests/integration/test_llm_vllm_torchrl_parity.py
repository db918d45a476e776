"""TorchRL parity on vLLM: LLMCollector(ChatEnv + vLLMWrapper) and a vLLM-engine actor, greedy.

The same tiny model (saved as a checkpoint for TorchRL's ``vllm.LLM``; built from the same
spec by the actor), tokenizer, prompts and greedy decoding: TorchRL 0.14.1 with vLLM 0.32 in
this process, rlfleet through an actor process with ``--engine vllm`` and
``GrpcLLMCollector``. The response tokens are identical turn by turn.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from common.llm import build_policy
from learner_client import GrpcLLMCollector, LocalFleet

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.usefixtures("loopback_only"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
]

TINY = {"hidden": 128, "heads": 2, "layers": 2, "seed": 11}
QUERIES = ["1+2=", "what is 7*8?", "reverse abc", "hello"]
NEW_TOKENS = 4
TURNS = 2
#: The task of the transformers parity test: the QUERIES in order, dialogs never end alone.
TASK = "tests.integration.test_llm_torchrl_parity:make_queries"


def _torchrl_batch(tmp_path):
    import vllm
    from torchrl.collectors.llm import LLMCollector
    from torchrl.envs import StepCounter
    from torchrl.envs.llm import ChatEnv
    from torchrl.modules.llm import vLLMWrapper

    model, tok = build_policy("rlfleet:tiny-qwen2", **TINY)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    llm = vllm.LLM(model=str(tmp_path / "ckpt"), dtype="float32", generation_config="vllm", seed=0)

    class Loader:
        def __iter__(self):
            while True:
                yield {"query": list(QUERIES)}

    env = ChatEnv.from_dataloader(
        dataloader=Loader(), tokenizer=tok, batch_size=len(QUERIES), input_mode="history"
    )
    env = env.append_transform(StepCounter(max_steps=TURNS))
    policy = vLLMWrapper(
        llm, tokenizer=tok, input_mode="history", generate=True, return_log_probs=True,
        generate_kwargs={"max_tokens": NEW_TOKENS, "temperature": 0.0},
    )  # fmt: skip
    turns = len(QUERIES) * TURNS
    collector = LLMCollector(
        env, policy=policy, dialog_turns_per_batch=turns, total_dialog_turns=turns,
        track_policy_version=True,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return next(iter(collector))
        finally:
            collector.shutdown()
            llm.llm_engine.engine_core.shutdown()


def _rlfleet_batch():
    with (
        LocalFleet(
            1,
            kind="llm",
            task=TASK,
            policy="rlfleet:tiny-qwen2",
            policy_kwargs={**TINY, "dtype": "float32"},
            num_envs=len(QUERIES),
            seed=0,
            grace_period=1.0,
            start_timeout=300.0,
            extra_args=["--engine", "vllm"],
        ) as fleet,
        GrpcLLMCollector(
            fleet.addresses,
            dialog_turns_per_batch=len(QUERIES) * TURNS,
            total_dialog_turns=len(QUERIES) * TURNS,
            sync=True,
            generation={"max_new_tokens": NEW_TOKENS, "temperature": 0.0},
            batch_timeout=120.0,
            track_policy_version=True,  # as TorchRL's collector above
        ) as collector,
    ):
        return next(iter(collector))


@pytest.mark.timeout(600)
def test_torchrl_vllm_wrapper_and_a_vllm_engine_actor_generate_the_same_tokens(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # TorchRL's engine in-process
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    ours = _rlfleet_batch()
    theirs = _torchrl_batch(tmp_path)
    assert ours.batch_size == theirs.batch_size
    responses = set()
    for index in (
        torch.cartesian_prod(*[torch.arange(s) for s in ours.batch_size])
        .reshape(-1, ours.ndim)
        .tolist()
    ):
        a, b = ours[tuple(index)], theirs[tuple(index)]
        assert a["tokens", "prompt"].tolist() == b["tokens", "prompt"].tolist()
        assert a["tokens", "response"].tolist() == b["tokens", "response"].tolist()
        responses.add(tuple(a["tokens", "response"].tolist()))
        assert a["query"] == b["query"]
    assert len(responses) > 1  # the model does not answer everything alike
