"""The padded LLM wire form: packet round trip, hostile batches, TorchRL's layout."""

from __future__ import annotations

import pytest
import torch
from llm_batches import padded
from tensordict import NonTensorStack, TensorDict

from common.errors import ProtocolError
from common.llm import check_padded, to_torchrl
from common.packets import decode_packet, encode_packet


def _wire(td: TensorDict) -> TensorDict:
    return decode_packet(bytearray(b"".join(encode_packet(td).chunks())))


def test_a_padded_batch_round_trips_through_a_packet_and_checks() -> None:
    td = _wire(padded())
    check_padded(td)
    out = to_torchrl(td)
    assert out.batch_size == (3,)
    assert out[1]["tokens", "full"].tolist() == list(range(1, 7))
    assert out[1]["tokens", "response"].tolist() == [6]
    assert out[1]["masks", "all_assistant_mask"].tolist() == [False] * 5 + [True]
    assert out[2]["log_probs", "response"].shape == (2,)
    assert list(out[0]["history", "full", "role"]) == ["user", "assistant"]
    assert list(out[0]["next", "history", "prompt", "content"]) == ["q0", "a0"]
    assert out[0]["text", "full"] == "p0r0"


def test_next_history_prompt_holds_the_tasks_reply_after_the_turn() -> None:
    """TorchRL's ChatEnv: the next prompt is the turn's history and the task's reply."""
    out = to_torchrl(_wire(padded(messages=3)))
    assert list(out[0]["history", "full", "content"]) == ["q0", "a0"]
    assert list(out[0]["history", "response", "role"]) == ["assistant"]
    assert list(out[0]["next", "history", "prompt", "content"]) == ["q0", "a0", "x"]
    assert list(out[0]["next", "history", "prompt", "role"]) == ["user", "assistant", "user"]


def _set(td: TensorDict, key, value) -> TensorDict:
    td.set(key, value)
    return td


HOSTILE = {
    "response beyond the padded width": lambda td: _set(
        td, "response_len", torch.tensor([0, 9, 2])
    ),
    "prompt + response beyond the width": lambda td: _set(
        td, "prompt_len", torch.tensor([5, 9, 9])
    ),
    "negative prompt_len": lambda td: _set(td, "prompt_len", torch.tensor([-1, 5, 5])),
    "negative response_len": lambda td: _set(td, "response_len", torch.tensor([0, -(2**63), 1])),
    "response longer than log_probs": lambda td: _set(td, "log_probs", torch.zeros(3, 1)),
    "history length beyond its messages": lambda td: _set(
        td, ("history", "length"), torch.tensor([2, 3, 2])
    ),
    "history length 0": lambda td: _set(td, ("history", "length"), torch.tensor([2, 0, 2])),
    "next history shorter than the turn's": lambda td: _set(
        td, ("history", "next_length"), torch.tensor([2, 1, 2])
    ),
    "next history beyond its messages": lambda td: _set(
        td, ("history", "next_length"), torch.tensor([2, 2**63 - 1, 2])
    ),
    "history without a prompt": lambda td: _set(td, ("history", "length"), torch.tensor([1, 2, 2])),
    "role and content counts disagree": lambda td: _set(
        td, ("history", "content"), NonTensorStack.from_list([["a"]] * 3)
    ),
    "fewer roles than contents, next history reaching the extra": lambda td: _set(
        _set(td, ("history", "content"), NonTensorStack.from_list([["q", "a", "x"]] * 3)),
        ("history", "next_length"),
        torch.full((3,), 3),
    ),
    "wrong dtype": lambda td: _set(td, "prompt_len", torch.full((3,), 5, dtype=torch.int32)),
    "negative version": lambda td: _set(td, "policy_version", torch.tensor([0, -1, 0])),
    "non-finite log-probs": lambda td: _set(td, "log_probs", torch.full((3, 4), float("nan"))),
    "missing key": lambda td: td.exclude("response_len"),
    "wrong reward shape": lambda td: _set(td, ("next", "reward"), torch.ones(3, 2)),
    "token versions of another width": lambda td: _set(
        td, ("collector", "token_policy_version"), torch.zeros(3, 7, dtype=torch.long)
    ),
    "token versions below the turn's": lambda td: _set(
        _set(td, "policy_version", torch.tensor([0, 2, 0])),
        ("collector", "token_policy_version"),
        torch.zeros(3, 4, dtype=torch.long),
    ),
    "token versions in the padding": lambda td: _set(
        td, ("collector", "token_policy_version"), torch.tensor([[5, 0, 0, 0]] * 3)
    ),
    "done unlike terminated or truncated": lambda td: _set(
        td, ("next", "done"), torch.tensor([[True], [False], [True]])
    ),
    "dialog_turns 0": lambda td: _set(td, ("collector", "dialog_turns"), torch.tensor([1, 0, 1])),
    "negative traj_ids": lambda td: _set(td, ("collector", "traj_ids"), torch.tensor([0, -1, 0])),
    "negative group_id": lambda td: _set(td, ("collector", "group_id"), torch.tensor([0, -1, 0])),
    "negative token versions": lambda td: _set(
        td,
        ("collector", "token_policy_version"),
        torch.tensor([[0, 0, 0, 0], [-7, 0, 0, 0]] * 2)[:3],
    ),
}


def test_check_padded_takes_token_versions_that_go_up_within_a_response() -> None:
    td = _set(padded(), "policy_version", torch.tensor([0, 1, 1]))  # responses of 0, 1, 2
    versions = torch.tensor([[0, 0, 0, 0], [1, 0, 0, 0], [1, 2, 0, 0]])
    check_padded(_wire(_set(td, ("collector", "token_policy_version"), versions)))


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_check_padded_raises_protocol_error_on_hostile_batches(name) -> None:
    td = HOSTILE[name](padded())
    with pytest.raises(ProtocolError):
        check_padded(_wire(td))


def test_check_padded_takes_token_ids_below_the_vocab_size_and_refuses_one_at_it() -> None:
    td = _wire(padded())
    top = int(td["tokens"].max())
    check_padded(td, vocab_size=top + 1)
    check_padded(td)  # 0: not checked
    with pytest.raises(ProtocolError, match=rf"beyond the learner's vocab_size={top} "):
        check_padded(td, vocab_size=top)


def test_check_padded_raises_if_the_batch_has_three_dims() -> None:
    check_padded(padded(4).reshape(2, 2))  # [slots, T] is fine
    with pytest.raises(ProtocolError, match=r"\[n\] or \[slots, T\]"):
        check_padded(padded(4).reshape(2, 2, 1))


def test_to_torchrl_counts_steps_from_0_and_cuts_token_versions_to_each_response() -> None:
    """TorchRL's step_count is the turns before this one (next: after it), and a turn's
    per-token versions are its response's, not the padded width's."""
    td = padded()  # responses of 0, 1 and 2 tokens in a span of 4
    td.set(("collector", "dialog_turns"), torch.tensor([1, 2, 3]))
    versions = torch.tensor([[0, 0, 0, 0], [3, 0, 0, 0], [4, 5, 0, 0]])
    td.set(("collector", "token_policy_version"), versions)
    td = _wire(td)
    check_padded(td)
    out = to_torchrl(td)
    assert [int(out[i]["step_count"]) for i in range(3)] == [0, 1, 2]
    assert [int(out[i]["next", "step_count"]) for i in range(3)] == [1, 2, 3]
    tokens = [out[i]["collector", "token_policy_version"].tolist() for i in range(3)]
    assert tokens == [[], [3], [4, 5]]
    assert out[0].get(("collector", "stopped"), None) is None  # wire-only: not in TorchRL's


def test_to_torchrl_of_a_steps_batch_is_slots_by_time() -> None:
    out = to_torchrl(padded(4).reshape(2, 2))
    assert out.batch_size == (2, 2)
    assert out[1, 0]["tokens", "full"].tolist() == list(range(1, 8))


def test_merge_padded_pads_widths_and_concatenates() -> None:
    from common.llm._merge import merge_padded

    small = padded(2, width=8, span=3, messages=2)
    big = padded(3, width=12, span=5, messages=3)
    merged = merge_padded([_wire(small), _wire(big)])
    check_padded(merged)
    assert merged.batch_size == (5,)
    assert merged["tokens"].shape == (5, 12)
    assert merged.get(("history", "role")).batch_size == (5, 3)
    assert list(merged.get(("history", "role")).tolist()[0]) == ["user", "assistant", ""]
    out = to_torchrl(merged)
    assert out[0]["tokens", "full"].tolist() == small[0]["tokens"][:5].tolist()
    steps = merge_padded([padded(4, width=8).reshape(2, 2), padded(4, width=10).reshape(2, 2)])
    check_padded(steps)
    assert steps.batch_size == (4, 2)


def test_merge_padded_pads_token_versions_to_the_log_probs_span() -> None:
    """Per-token versions are as wide as the log-probs, also after two actors' batches of
    other widths are merged (they are not checked again)."""
    from common.llm._merge import merge_padded

    small = padded(2, width=8, span=3)
    small.set(("collector", "token_policy_version"), torch.tensor([[0, 0, 0], [2, 0, 0]]))
    big = padded(3, width=12, span=5)
    big.set(("collector", "token_policy_version"), torch.zeros(3, 5, dtype=torch.long))
    merged = merge_padded([_wire(small), _wire(big)])
    assert merged["collector", "token_policy_version"].shape == merged["log_probs"].shape
    check_padded(merged)
    assert merged["collector", "token_policy_version"][1].tolist() == [2, 0, 0, 0, 0]
