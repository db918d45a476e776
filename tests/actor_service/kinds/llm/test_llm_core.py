"""The LLM collection core without gRPC: versions mid-generation, context limits, seeds, resets."""

from __future__ import annotations

import collections
import re
import threading

import pytest
import torch

from actor_service import ActorConfig, ModelSpec
from actor_service._kinds.llm import core as llm_core
from actor_service._kinds.llm.core import LLMCore
from actor_service._kinds.llm.settings import LLMActorSettings
from common.config import MAX_FRAMES_PER_BATCH, CollectSettings
from common.errors import (
    EnvError,
    PacketTooLargeError,
    SessionStateError,
    StaleVersionError,
    WeightsError,
)
from common.llm import (
    CHATML_TEMPLATE,
    GenerationSettings,
    LLMSettings,
    Problem,
    build_policy,
    check_padded,
)
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
        for smaller in (len(tok), len(tok) + 63):  # the tokenizer's, and one row short
            with pytest.raises(ValueError, match=rf"draws from {len(tok) + 64} token ids, more "):
                worker.configure(_settings(vocab_size=smaller))
        worker.configure(_settings(vocab_size=len(tok) + 64))


@pytest.mark.parametrize(
    ("mode", "kind", "text"),
    [
        ("raise", "RuntimeError", "score(): user reward function bug"),
        ("text_reward", "TypeError", "score(): reward 'high' is not a number"),
        ("tuple", "TypeError", "score(): returned tuple, not an Outcome"),
        (
            "flag_tensor",
            "RuntimeError",
            "score(): Boolean value of Tensor with more than one value is ambiguous",
        ),
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


@pytest.mark.parametrize(
    ("template", "kind", "text"),
    [
        (  # Gemma's: no system role, and countdown opens with a system prompt
            "{% if messages[0]['role'] == 'system' %}"
            "{{ raise_exception('System role not supported') }}{% endif %}" + CHATML_TEMPLATE,
            "TemplateError",
            "System role not supported",
        ),
        ("{{ '' }}", "ValueError", "rendered no token"),
    ],
    ids=["refuses_a_system_prompt", "renders_nothing"],
)
def test_a_chat_template_that_refuses_the_tasks_messages_raises_an_env_error(
    tmp_path, template, kind, text
) -> None:
    """A model whose chat template refuses the task's messages (or renders no token) is the
    learner's EnvError naming the task, the template and the roles, not an internal error
    retried until ``batch_timeout``; the actor serves the next batch's error the same way."""
    model, tok = build_policy("rlfleet:tiny-qwen2", **TINY)
    tok.chat_template = template
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    spec = (ModelSpec("policy", f"hf:{tmp_path}", {"dtype": "float32"}),)
    with _worker(models=spec, llm=LLMActorSettings(task="countdown")) as worker:
        worker.configure(_settings())
        for _ in range(2):
            with pytest.raises(EnvError) as info:
                worker.collect_batch()
            error = info.value
            assert (error.env, error.exception_type) == ("countdown", kind)
            assert error.exception_message == (
                f"the model's chat template over the roles [system, user]: {text}"
            )


@pytest.mark.parametrize("trajectories", [True, False], ids=["trajectories", "steps"])
def test_a_task_error_restarts_the_dialogs_under_way(trajectories: bool) -> None:
    """A turn that failed part-way (the task raised on one slot after another slot's dialog
    had advanced) is not the start of the next batch: dialogs under way restart, as an env
    actor resets its envs after a failed batch (a trajectory lacked its failed turn)."""
    task = LLMActorSettings(task="rlfleet_test_tasks:buggy", task_kwargs={"mode": "flaky"})
    with _worker(llm=task) as worker:
        worker.configure(_settings(2, yield_completed_trajectories=trajectories))
        with pytest.raises(EnvError, match="reward server hiccup"):
            _ = [worker.collect_batch() for _ in range(4)]  # the 4th turn scored raises
        dropped = worker.dropped_dialogs
        td = worker.collect_batch()
        assert worker.dropped_dialogs == dropped  # counted when they restarted
    turns, lengths = td["collector", "dialog_turns"], td["history", "length"]
    if trajectories:  # each trajectory's turns 1, 2, ..., its history two messages a turn
        for traj in td["collector", "traj_ids"].unique():
            mine = td["collector", "traj_ids"] == traj
            assert turns[mine].tolist() == list(range(1, int(mine.sum()) + 1))
        assert torch.equal(lengths, 2 * turns)
    else:  # first turns of new dialogs
        assert (turns == 1).all()
        assert (lengths == 2).all()
    assert dropped >= 1


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
        first = worker.collect_batch()
        assert worker.dropped_dialogs == 0
        second = worker.collect_batch()
    going = int((~first["next", "done"]).sum())
    assert going, "every dialog of batch 1 ended: nothing to drop"
    assert worker.dropped_dialogs == going  # unfinished dialogs of batch 1 were dropped
    # ... and batch 2 starts every slot on a new dialog at its first turn
    assert (second["collector", "dialog_turns"] == 1).all()
    old = set(first["collector", "traj_ids"].flatten().tolist())
    assert old.isdisjoint(second["collector", "traj_ids"].flatten().tolist())


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
        with pytest.raises(
            PacketTooLargeError, match="dialog_turns_per_batch=20000 holds more"
        ) as excinfo:
            worker.collect_batch()
        stopped_at = re.search(r"about (\d+) bytes", str(excinfo.value))
        assert stopped_at is not None
        assert int(stopped_at[1]) < 2 * 8192  # stopped at the step that passed the cap
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
        with pytest.raises(ValueError, match="dialog turns a batch may hold"):  # any count
            worker.configure(_settings(MAX_FRAMES_PER_BATCH + 1, yield_completed_trajectories=True))
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


def _reverse(retries: int, **kwargs) -> LLMActorSettings:
    """A task the tiny random model never solves: its dialogs run to their turn limit."""
    return LLMActorSettings(task="reverse", task_kwargs={"retries": retries}, **kwargs)


def test_a_learners_max_turns_truncates_the_dialog_and_the_slot_starts_a_new_one() -> None:
    with _worker(llm=_reverse(5)) as worker:
        worker.configure(_settings(6, max_turns=2))
        td = worker.collect_batch()
    check_padded(td)
    assert td["collector", "dialog_turns"].tolist() == [[1, 2, 1]] * 2
    assert td["next", "truncated"].squeeze(-1).tolist() == [[False, True, False]] * 2
    assert not td["next", "terminated"].any()
    assert ("collector", "token_policy_version") not in td.keys(include_nested=True)
    traj = td["collector", "traj_ids"]
    assert (traj[:, 0] == traj[:, 1]).all()
    assert (traj[:, 1] != traj[:, 2]).all()
    # prompts grow turn by turn: the shorter rows are right-padded with the pad id
    padding = (
        torch.arange(td["tokens"].shape[-1]) >= (td["prompt_len"] + td["response_len"])[..., None]
    )
    assert padding.any()
    assert (td["tokens"][padding] == worker.engine.pad_id).all()


def test_completed_trajectories_end_at_a_learners_max_turns(monkeypatch) -> None:
    """A truncated dialog is complete: its group is yielded (the batch stays small)."""
    monkeypatch.setattr(llm_core, "DEFAULT_LIMITS", PacketLimits(max_packet_bytes=8192))
    with _worker(llm=_reverse(5)) as worker:
        worker.configure(_settings(2, max_turns=2, yield_completed_trajectories=True))
        td = worker.collect_batch()
    check_padded(td)
    assert td["collector", "dialog_turns"].tolist() == [1, 2]
    assert td["next", "truncated"].squeeze(-1).tolist() == [False, True]


def test_the_task_ends_its_last_turn_terminated_not_truncated_and_judges_success() -> None:
    """``turn`` counts from 1 for the task; a dialog the task ends at its last turn is
    terminated only; ``success`` is the task's, not ``terminated``."""
    with _worker(llm=_reverse(1)) as worker:
        worker.configure(_settings(4))
        td = worker.collect_batch()
    check_padded(td)
    assert td["next", "terminated"].squeeze(-1).tolist() == [[False, True]] * 2
    assert not td["next", "truncated"].any()
    assert not td["next", "success"].any()  # the tiny model never reverses a word
    with _worker() as worker:  # arith: one turn, always ended by the task
        worker.configure(_settings(4))
        td = worker.collect_batch()
    assert td["next", "terminated"].all()
    assert not td["next", "truncated"].any()
    assert torch.equal(td["next", "success"], td["next", "reward"] == 1.0)


@pytest.mark.parametrize("room", [0, 1, 2])
def test_a_response_that_fills_the_context_is_cut_there_and_truncates_the_dialog(room) -> None:
    """A prompt of P tokens in a context of P + room: the response takes the room left
    (none for a prompt that fills the context exactly: no token past it)."""
    prompt_len = 32  # the ChatML prompt of "reverse: abcd"
    context = {**TINY, "max_positions": prompt_len + room}
    with _worker(
        llm=_reverse(3), models=(ModelSpec("policy", "rlfleet:tiny-qwen2", context),)
    ) as worker:
        worker.configure(_settings(generation={"max_new_tokens": 8, "temperature": 0.0}))
        td = worker.collect_batch()
    check_padded(td)
    assert (td["prompt_len"] == prompt_len).all()
    assert (td["response_len"] == room).all()
    assert td["next", "truncated"].all()
    assert not td["next", "terminated"].any()


def _echo_model(tmp_path, token: str) -> tuple[ModelSpec, int]:
    """A tiny GPT-2 checkpoint that answers ``token`` (an ordinary one) to anything."""
    model, tok = build_policy("rlfleet:tiny-gpt2", **TINY)
    token_id = tok.convert_tokens_to_ids(token)
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(1.0)
        model.lm_head.weight.zero_()
        model.lm_head.weight[token_id] = 1.0
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    return ModelSpec("policy", f"hf:{tmp_path}", {"dtype": "float32"}), token_id


def test_a_stop_token_id_ends_the_response_and_stays_out_of_the_history(tmp_path) -> None:
    spec, seven = _echo_model(tmp_path, "7")
    with _worker(models=(spec,)) as worker:
        greedy = {"max_new_tokens": 4, "temperature": 0.0}
        worker.configure(_settings(generation=greedy))
        running = worker.collect_batch()
        worker.configure(_settings(generation={**greedy, "stop_token_ids": (seven,)}))
        stopped = worker.collect_batch()
    for td in (running, stopped):
        check_padded(td)
    assert (running["response_len"] == 4).all()
    assert not running["collector", "stopped"].any()
    assert running["history", "content"][0][0][1] == "7777"
    assert (stopped["response_len"] == 1).all()
    assert stopped["collector", "stopped"].all()
    assert stopped["history", "content"][0][0][1] == ""  # the stop token is no content
    assert stopped["text", "response"][0][0] == "7"  # the text is the response's tokens


def test_set_seed_restarts_dialogs_in_progress_as_a_new_worker_with_that_seed() -> None:
    sampled = {"max_new_tokens": 4, "temperature": 1.0}
    with _worker(llm=_reverse(5)) as worker:
        worker.configure(_settings(generation=sampled))
        worker.collect_batch()  # dialogs in progress: their next turn would be the second
        worker.set_seed(7)
        reseeded = worker.collect_batch()
    with _worker(llm=_reverse(5)) as worker:
        worker.set_seed(7)
        worker.configure(_settings(generation=sampled))
        fresh = worker.collect_batch()
    assert (reseeded["collector", "dialog_turns"] == 1).all()
    assert torch.equal(reseeded["tokens"], fresh["tokens"])
    assert list(reseeded["query"]) == list(fresh["query"])


def test_different_seeds_draw_different_problems_and_different_tokens(tmp_path) -> None:
    def first_batch(seed: int, llm: LLMActorSettings):
        with _worker(llm=llm) as worker:
            worker.set_seed(seed)
            worker.configure(_settings(generation={"max_new_tokens": 8, "temperature": 1.0}))
            return worker.collect_batch()

    a, b = first_batch(1, _reverse(0)), first_batch(2, _reverse(0))
    assert list(a["query"]) != list(b["query"])
    (tmp_path / "one.jsonl").write_text('{"prompt": "say hi", "answer": "hi"}\n')
    one = LLMActorSettings(task=f"jsonl:{tmp_path / 'one.jsonl'}")
    a, b = first_batch(1, one), first_batch(2, one)
    assert list(a["query"]) == list(b["query"])  # one prompt: only the tokens drawn differ
    assert not torch.equal(a["tokens"], b["tokens"])


def test_new_settings_drop_the_groups_held_for_the_next_batch() -> None:
    """Trajectory mode holds groups past a batch; settings that change restart them too."""
    with _worker(num_envs=4) as worker:
        sampled = {"max_new_tokens": 6, "temperature": 1.0}
        worker.configure(_settings(1, generation=sampled, yield_completed_trajectories=True))
        worker.collect_batch()
        held = {dialog[0].traj_id for group in worker._ready for dialog in group}
        assert held, "the first step's other groups are held"
        worker.configure(_settings(1, yield_completed_trajectories=True))
        td = worker.collect_batch()
    assert held.isdisjoint(td["collector", "traj_ids"].tolist())
    assert (td["response_len"] <= 3).all()


def test_last_steps_count_every_turn_of_their_dialogs_in_the_frames() -> None:
    with _worker(llm=_reverse(1)) as worker:
        worker.configure(_settings(4, yield_only_last_steps=True))
        td = worker.collect_batch()  # 4 rows: the last turns of 4 dialogs of 2 turns
        assert td["collector", "dialog_turns"].tolist() == [2, 2, 2, 2]
        assert worker.last_batch_frames == worker.frames == 8


@pytest.mark.parametrize("mode", [{}, {"yield_completed_trajectories": True}])
def test_the_slots_of_a_group_share_one_problem_and_groups_draw_their_own(mode) -> None:
    with _worker(llm=_reverse(0), num_envs=4) as worker:
        worker.configure(_settings(4, group_size=2, **mode))
        td = worker.collect_batch().reshape(-1)
    queries, groups = list(td["query"]), td["collector", "group_id"].tolist()
    by_group: dict[int, set[str]] = collections.defaultdict(set)
    for group, query in zip(groups, queries, strict=True):
        by_group[group].add(query)
    assert len(by_group) == 2
    assert all(len(group_queries) == 1 for group_queries in by_group.values())
    assert len(set(queries)) == 2


def test_a_group_whose_dialogs_end_apart_is_yielded_only_once_all_have_ended() -> None:
    """Trajectory mode, a group of a 1-turn and a 2-turn dialog: the group waits for its
    last dialog; a batch holds every dialog of its groups whole (turns 1..n, the last
    done), never the turns of a dialog still under way."""
    task = LLMActorSettings(task="rlfleet_test_tasks:uneven")
    lengths = []
    with _worker(llm=task) as worker:
        worker.configure(_settings(1, group_size=2, yield_completed_trajectories=True))
        for _ in range(3):  # batches of one group each
            td = worker.collect_batch()
            check_padded(td)
            lengths += _whole_dialogs_of_whole_groups(td, group_size=2)
    assert sorted(set(lengths)) == [1, 2]  # the groups' dialogs did end apart


def _whole_dialogs_of_whole_groups(td, group_size: int) -> list[int]:
    """Check every group of ``td`` holds ``group_size`` whole dialogs; their turn counts."""
    groups, trajs = td["collector", "group_id"], td["collector", "traj_ids"]
    turns, done = td["collector", "dialog_turns"], td["next", "done"].squeeze(-1)
    lengths = []
    for group in groups.unique():
        mine = trajs[groups == group].unique()
        assert len(mine) == group_size, "every dialog of the group"
        for traj in mine:
            rows = trajs == traj
            lengths.append(int(rows.sum()))
            assert turns[rows].tolist() == list(range(1, lengths[-1] + 1))
            assert done[rows].tolist() == [False] * (lengths[-1] - 1) + [True]
    return lengths


def test_a_tasks_system_prompt_opens_the_history_and_the_prompt() -> None:
    with _worker(llm=LLMActorSettings(task="countdown")) as worker:
        worker.configure(_settings())
        td = worker.collect_batch()
    check_padded(td)
    assert td["history", "role"][0][0][:2] == ["system", "user"]
    assert td["history", "content"][0][0][0].startswith("A conversation between User and")
    assert "A conversation between User and" in td["text", "prompt"][0][0]


def test_a_turn_with_no_room_to_respond_carries_the_version_in_force() -> None:
    tiny_context = {**TINY, "max_positions": 24}
    with _worker(
        llm=LLMActorSettings(task="reverse", task_kwargs={"length": 40}),
        models=(ModelSpec("policy", "rlfleet:tiny-qwen2", tiny_context),),
    ) as worker:
        new, _ = build_policy("rlfleet:tiny-qwen2", **tiny_context)
        worker.models.load_weights("policy", 3, new.state_dict())
        worker.configure(_settings())
        td = worker.collect_batch()
    assert (td["response_len"] == 0).all()
    assert (td["policy_version"] == 3).all()


def test_a_slot_with_no_room_left_does_not_shift_the_responses_of_the_others(tmp_path) -> None:
    """Slot 0's prompt fills the context, slot 1's fits: slot 1 gets its own response."""
    problems = tmp_path / "problems.jsonl"
    problems.write_text(
        '{"prompt": "' + "x" * 60 + '", "answer": "y"}\n{"prompt": "hi", "answer": "y"}\n'
    )
    context = {**TINY, "max_positions": 40}
    with _worker(
        llm=LLMActorSettings(task=f"jsonl:{problems}"),
        models=(ModelSpec("policy", "rlfleet:tiny-qwen2", context),),
    ) as worker:
        worker.configure(_settings(generation={"max_new_tokens": 3, "temperature": 0.0}))
        td = worker.collect_batch()
    check_padded(td)
    assert td["response_len"][:, 0].tolist()[0] == 0
    assert td["response_len"][:, 0].tolist()[1] > 0
    assert td["next", "truncated"][:, 0].squeeze(-1).tolist() == [True, False]


def test_a_reseed_after_an_abandoned_batch_drops_the_turns_it_held() -> None:
    """Completed-trajectory mode holds turns of dialogs in progress across calls; a batch
    abandoned after a turn, then a new seed: the next trajectories start from turn 1."""
    with _worker(llm=_reverse(5)) as worker:
        worker.configure(_settings(2, max_turns=3, yield_completed_trajectories=True))
        abandon = threading.Event()
        inner = worker.models.forward

        def forward(*args):
            abandon.set()  # the batch is given up before its next turn
            return inner(*args)

        worker.models.forward = forward  # type: ignore[method-assign]
        with pytest.raises(SessionStateError, match="abandoned"):
            worker.collect_batch(abandon)
        worker.models.forward = inner  # type: ignore[method-assign]
        worker.set_seed(5)
        td = worker.collect_batch()
    check_padded(td)
    assert td["collector", "dialog_turns"].tolist() == [1, 2, 3]


def test_a_batch_abandoned_after_a_step_never_leaves_a_trajectory_lacking_that_turn() -> None:
    """Steps mode (not completed trajectories): a batch abandoned after its first step holds
    that step's turns nowhere; the dialogs they advanced must not go on in the next batch
    without them (dialog_turns 2, 3 with turn 1 never delivered), as docs/llm.md promises."""
    with _worker(llm=_reverse(5)) as worker:
        worker.configure(_settings(4, max_turns=4))  # 2 steps of 2 slots a batch
        abandon = threading.Event()
        inner = worker.models.forward

        def forward(*args):
            abandon.set()  # given up before its next (second) step
            return inner(*args)

        worker.models.forward = forward  # type: ignore[method-assign]
        with pytest.raises(SessionStateError, match="abandoned"):
            worker.collect_batch(abandon)
        worker.models.forward = inner  # type: ignore[method-assign]
        td = worker.collect_batch()  # the resumed session's batch
    check_padded(td)
    turns, lengths = td["collector", "dialog_turns"], td["history", "length"]
    assert turns[:, 0].tolist() == [1, 1]  # each row starts a trajectory the learner sees
    assert torch.equal(lengths, 2 * turns)  # no history turn the learner never got


def test_a_batch_of_steps_given_up_before_its_first_turn_keeps_the_dialogs() -> None:
    with _worker(llm=_reverse(5)) as worker:
        worker.configure(_settings(4, max_turns=4))  # 2 steps of 2 slots a batch
        worker.collect_batch()  # dialog_turns 1, 2 delivered: the dialogs go on
        abandon = threading.Event()
        abandon.set()  # the session ended before this batch stepped anything
        with pytest.raises(SessionStateError, match="abandoned"):
            worker.collect_batch(abandon)
        assert worker.dropped_dialogs == 0
        td = worker.collect_batch()
    assert td["collector", "dialog_turns"][:, 0].tolist() == [3, 3]


def test_a_prompt_that_fills_the_context_gets_no_token_beside_one_with_room() -> None:
    """One decode of two dialogs: the one whose prompt fills the context is left out of it (a
    row of budget 0 would still draw one token past the context), the other answers."""
    context = {**TINY, "max_positions": 32}  # the ChatML prompt of "reverse: abcd" is 32
    with _worker(
        llm=_reverse(0), models=(ModelSpec("policy", "rlfleet:tiny-qwen2", context),)
    ) as worker:
        engine = worker.engine
        full = engine.new_dialog(Problem(query="reverse: abcd", answer="dcba"), 0, 0)
        roomy = engine.new_dialog(Problem(query="a", answer="a"), 1, 1)
        greedy = GenerationSettings(max_new_tokens=4, temperature=0.0)
        turns = engine.run([full, roomy], greedy, 1, torch.Generator().manual_seed(0))
    assert len(turns[0].prompt) == 32
    assert turns[0].response == []
    assert turns[0].truncated
    assert len(turns[1].prompt) < 32
    assert 1 <= len(turns[1].response) <= 4
