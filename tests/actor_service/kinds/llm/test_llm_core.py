"""The LLM collection core without gRPC: versions mid-generation, context limits, seeds, resets."""

from __future__ import annotations

import collections

import pytest
import torch

from actor_service import ActorConfig, ModelSpec
from actor_service._kinds.llm import core as llm_core
from actor_service._kinds.llm.core import LLMCore
from actor_service._kinds.llm.settings import LLMActorSettings
from common.config import MAX_FRAMES_PER_BATCH, CollectSettings
from common.errors import EnvError, PacketTooLargeError, StaleVersionError, WeightsError
from common.llm import GenerationSettings, LLMSettings, build_policy, check_padded
from common.llm._settings import MIN_TEMPERATURE
from common.packets import PacketLimits

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("loopback_only")

TINY = {"hidden": 32, "layers": 1, "seed": 0}


def _worker(**overrides) -> LLMCore:
    base = {
        "kind": "llm",
        "llm": LLMActorSettings(task="arith"),
        "models": (ModelSpec("policy", "rlfleet:tiny-qwen2", TINY),),
        "num_envs": 2,
        "seed": 0,
    }
    return LLMCore(ActorConfig(**(base | overrides)))


def _settings(fpb: int = 2, **llm) -> CollectSettings:
    generation = GenerationSettings(**llm.pop("generation", {"max_new_tokens": 3}))
    return CollectSettings(frames_per_batch=fpb, llm=LLMSettings(generation=generation, **llm))


def test_a_push_during_a_long_generation_shows_in_the_token_versions() -> None:
    new, _ = build_policy("rlfleet:tiny-qwen2", **{**TINY, "seed": 1})
    with _worker() as worker:
        greedy = {"max_new_tokens": 12, "temperature": 0.0}
        worker.configure(_settings(generation=greedy, token_versions=True))
        inner, calls = worker.models.forward, []

        def forward(*args):  # runs between decode steps, outside the model lock
            calls.append(1)
            if len(calls) == 5:  # prefill, then 3 tokens: the push lands before token 5
                worker.models.load_weights("policy", 1, new.state_dict())
            return inner(*args)

        worker.models.forward = forward  # type: ignore[method-assign]
        td = worker.collect_batch()
    check_padded(td)
    lengths = td["response_len"][:, 0]
    assert (lengths > 5).any(), "every response stopped before the push"
    for row, length in enumerate(lengths.tolist()):
        seen = td["collector", "token_policy_version"][row, 0, :length].tolist()
        assert seen == [0] * min(length, 4) + [1] * max(length - 4, 0)
    assert (td["policy_version"] == 0).all()  # the version each turn started at


def test_a_prompt_longer_than_the_context_ends_the_dialog_truncated() -> None:
    tiny_context = {**TINY, "max_positions": 24}
    with _worker(
        llm=LLMActorSettings(task="reverse", task_kwargs={"length": 40}),
        models=(ModelSpec("policy", "rlfleet:tiny-qwen2", tiny_context),),
    ) as worker:
        worker.configure(_settings())
        td = worker.collect_batch()
    check_padded(td)
    assert (td["response_len"] == 0).all()
    assert td["next", "truncated"].all()
    assert not td["next", "terminated"].any()


def test_a_response_stops_at_any_end_id_the_checkpoint_lists(tmp_path) -> None:
    """A chat model's second end id (Gemma's ``<end_of_turn>``) ends a turn, as in generate."""
    model, tok = build_policy("rlfleet:tiny-gpt2", **TINY)
    other = tok.convert_tokens_to_ids("<|endoftext|>")
    with torch.no_grad():  # the model answers <|endoftext|> to anything
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(1.0)
        model.lm_head.weight.zero_()
        model.lm_head.weight[other] = 1.0
    model.generation_config.eos_token_id = [tok.eos_token_id, other]
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    hf_model = (ModelSpec("policy", f"hf:{tmp_path}", {"dtype": "float32"}),)
    with _worker(models=hf_model) as worker:
        worker.configure(_settings(generation={"max_new_tokens": 8, "temperature": 0.0}))
        td = worker.collect_batch()
    check_padded(td)
    assert td["response_len"].flatten().tolist() == [1, 1]
    tokens, starts = td["tokens"].flatten(0, 1), td["prompt_len"].flatten()
    assert [tokens[row, start].item() for row, start in enumerate(starts)] == [other, other]
    assert td["collector", "stopped"].all()


def test_a_padded_vocabulary_is_what_a_learner_vocab_size_is_checked_against(tmp_path) -> None:
    """A checkpoint whose output rows pass its tokenizer (a padded vocabulary: nothing masks
    the extra rows, so they are drawn): a learner's ``vocab_size`` of the tokenizer's size is
    refused, naming the rows; one of the rows is taken."""
    model, tok = build_policy("rlfleet:tiny-qwen2", **TINY)
    model.resize_token_embeddings(len(tok) + 64, mean_resizing=False)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    padded = (ModelSpec("policy", f"hf:{tmp_path}", {"dtype": "float32"}),)
    with _worker(models=padded) as worker:
        assert worker.models.token_ids == len(tok) + 64
        with pytest.raises(ValueError, match=rf"draws from {len(tok) + 64} token ids, more than "):
            worker.configure(_settings(vocab_size=len(tok)))
        worker.configure(_settings(vocab_size=len(tok) + 64))


@pytest.mark.parametrize(
    ("mode", "kind", "text"),
    [
        ("raise", "RuntimeError", "score(): user reward function bug"),
        ("text_reward", "TypeError", "score(): reward 'high' is not a number"),
        ("tuple", "TypeError", "score(): returned tuple, not an Outcome"),
        ("sample", "KeyError", "sample(): 'no such problem'"),
        ("system_exit", "SystemExit", "score(): reward server gone"),  # the actor lives on
        ("surrogates", "RuntimeError", "score(): bad byte \\udcff"),  # sendable
        # Text no tokenizer takes failed in the prompt's building, as an internal error.
        (
            "query_surrogate",
            "ValueError",
            "sample(): query is not valid UTF-8: surrogates "
            "not allowed at character 6 ('solve ' before it)",
        ),
        (
            "reply_surrogate",
            "ValueError",
            "score(): reply is not valid UTF-8: surrogates "
            "not allowed at character 10 ('try again ' before it)",
        ),
    ],
)
def test_a_task_that_fails_raises_an_env_error_naming_it(mode, kind, text) -> None:
    """A user's task is the LLM actor's env: its failure is the learner's EnvError (with its
    type and text), not an internal error retried until ``batch_timeout``."""
    with _worker(
        llm=LLMActorSettings(task="rlfleet_test_tasks:buggy", task_kwargs={"mode": mode})
    ) as worker:
        worker.configure(_settings())
        with pytest.raises(EnvError) as info:
            worker.collect_batch()
    error = info.value
    assert (error.env, error.exception_type) == ("rlfleet_test_tasks:buggy", kind)
    assert error.exception_message == text


def test_the_same_seed_gives_the_same_first_batches() -> None:
    batches = []
    for _ in range(2):
        with _worker() as worker:
            worker.set_seed(123)
            worker.configure(_settings(4, generation={"max_new_tokens": 4, "temperature": 1.0}))
            batches.append([worker.collect_batch() for _ in range(2)])
    for a, b in zip(*batches, strict=True):
        assert torch.equal(a["tokens"], b["tokens"])
        assert torch.equal(a["log_probs"], b["log_probs"])
        assert a["query"] == b["query"] or list(a["query"]) == list(b["query"])


def test_reset_at_each_iter_counts_dropped_dialogs() -> None:
    with _worker(llm=LLMActorSettings(task="arith", task_kwargs={"retries": 5})) as worker:
        settings = _settings(2)
        worker.configure(
            CollectSettings(frames_per_batch=2, reset_at_each_iter=True, llm=settings.llm)
        )
        worker.collect_batch()
        dropped = worker.dropped_dialogs
        worker.collect_batch()
        assert worker.dropped_dialogs >= dropped  # unfinished dialogs of batch 1 were dropped


def test_state_dict_round_trip_restores_weights_and_counters() -> None:
    with _worker() as worker:
        worker.configure(_settings())
        worker.collect_batch()
        state = worker.state_dict()
        new, _ = build_policy("rlfleet:tiny-qwen2", **{**TINY, "seed": 4})
        worker.models.load_weights("policy", 2, new.state_dict())
        with pytest.raises(StaleVersionError):
            worker.load_state_dict(state)  # version 2 -> 0 is a rollback
        assert worker.load_state_dict(state, allow_rollback=True) == {"policy": (2, 0)}
        assert worker.models.version == 0
        assert worker.frames == 2
        restored = worker.models.model.state_dict()
        assert all(
            torch.equal(restored[k], v) for k, v in state["models"]["policy"]["weights"].items()
        )


@pytest.mark.parametrize("mode", [{}, {"yield_completed_trajectories": True}])
def test_a_batch_past_the_packet_cap_ends_with_a_clear_error_and_frees_its_turns(
    monkeypatch: pytest.MonkeyPatch, mode: dict
) -> None:
    """A batch grows turn by turn; one the packet cap would refuse is stopped as it passes
    the cap (here lowered to 8 KiB), not after filling the actor's memory: its dialogs
    restart, and a batch that fits is collected next."""
    monkeypatch.setattr(llm_core, "DEFAULT_LIMITS", PacketLimits(max_packet_bytes=8192))
    with _worker() as worker:
        worker.configure(_settings(2 * 10_000, **mode))
        with pytest.raises(PacketTooLargeError, match="dialog_turns_per_batch=20000 holds more"):
            worker.collect_batch()
        assert worker.frames == 0
        assert worker._ready == collections.deque()  # what it held is dropped
        assert all(not turns for turns in worker._partial)
        worker.configure(_settings(2))
        check_padded(worker.collect_batch())


def test_turns_per_batch_above_the_frames_cap_are_refused_at_configure() -> None:
    with _worker() as worker:
        for turns in (MAX_FRAMES_PER_BATCH + 2, 2**64 - 2):
            with pytest.raises(ValueError, match="dialog turns a batch may hold"):
                worker.configure(_settings(turns))
        worker.configure(_settings(MAX_FRAMES_PER_BATCH))  # the bound itself is accepted


@pytest.mark.parametrize("temperature", [1e-300, 1e-38, 0.0099])
def test_a_temperature_between_0_and_its_floor_is_refused(temperature: float) -> None:
    """T in (0, 0.01): vLLM would sample at 0.01; float32 logits / 1e-38 gave NaN log-probs."""
    with pytest.raises(ValueError, match=r"temperature must be 0 \(greedy\) or at least 0\.01"):
        _settings(generation={"max_new_tokens": 3, "temperature": temperature})
    assert _settings(generation={"temperature": MIN_TEMPERATURE}).llm.generation.temperature


@pytest.mark.parametrize("extra", [{"env": {"worker0": {}}}, {"junk": {"a": {"b": 1}}}])
def test_a_state_with_keys_this_actor_lacks_is_refused_with_nothing_applied(extra) -> None:
    """A TorchRL actor's state (its "env" section) or a junk key was ignored: a state of
    another kind of actor was restored in part. Now refused, naming the keys."""
    with _worker() as worker:
        worker.configure(_settings())
        worker.collect_batch()
        state = worker.state_dict() | {"frames": 1000} | extra
        with pytest.raises(WeightsError, match=f"keys \\['{next(iter(extra))}'\\] are not"):
            worker.load_state_dict(state)
        assert worker.frames == 2
