"""BatchBounds: what one session's batches may claim, at the edges an honest actor reaches."""

from __future__ import annotations

import pytest
import torch
from llm_batches import padded
from tensordict import TensorDict

from common.config import MAX_POLICY_VERSION, CollectSettings
from common.errors import ProtocolError
from common.llm import LLMSettings
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.traj_ids import TrajIds
from learner_client._batch_bounds import BatchBounds

SETTINGS = CollectSettings(frames_per_batch=8)


def info(seq: int, **fields: int | str) -> pb.BatchInfo:
    values: dict = {"epoch": 3, "seq": seq, "frames": 8, "total_bytes": 1000} | fields
    return pb.BatchInfo(**values)


def bounds(settings: CollectSettings = SETTINGS, credits: int = 2, next_seq: int = 1):
    checked = BatchBounds("actor:1", settings, credits, num_envs=2, worker_id=5)
    checked.opened(3, next_seq)
    return checked


def test_seqs_follow_the_credits_granted() -> None:
    checked = bounds(credits=2)
    checked.check_info(info(1))
    checked.check_info(info(2))
    with pytest.raises(ProtocolError, match=r"batch seq 3 claims a seq outside 1\.\.2"):
        checked.check_info(info(3))
    checked.granted(1)
    checked.check_info(info(3))


def test_a_resumed_session_resends_older_seqs_and_continues_from_next_seq() -> None:
    checked = bounds(credits=1, next_seq=11)  # seqs 7..10 retained, re-sent first
    for seq in (7, 8, 9, 10, 11):
        checked.check_info(info(seq))
    with pytest.raises(ProtocolError, match=r"seq outside 1\.\.11"):
        checked.check_info(info(12))
    with pytest.raises(ProtocolError, match="seq outside"):
        checked.check_info(info(0))


def test_opened_must_start_at_one() -> None:
    with pytest.raises(ProtocolError, match="both start at 1"):
        BatchBounds("actor:1", SETTINGS, 1, 2, 5).opened(0, 1)
    with pytest.raises(ProtocolError, match="both start at 1"):
        BatchBounds("actor:1", SETTINGS, 1, 2, 5).opened(3, 0)


def test_versions_form_a_range_up_to_the_largest_version() -> None:
    checked = bounds()
    checked.check_info(info(1, policy_version_min=0, policy_version_max=MAX_POLICY_VERSION))
    checked.check_info(info(1, policy_version_min=4, policy_version_max=4))
    with pytest.raises(ProtocolError, match="not a range"):
        checked.check_info(info(1, policy_version_max=MAX_POLICY_VERSION + 1))


def test_an_empty_model_id_is_the_sessions() -> None:
    bounds().check_info(info(1, model_id=""))
    bounds().check_info(info(1, model_id="policy"))


def test_frames_are_at_most_the_rows_and_zero_counts_the_rows() -> None:
    batch = TensorDict({"done": torch.zeros(2, 4, dtype=torch.bool)}, batch_size=[2, 4])
    checked = bounds()
    assert checked.check_batch(info(1, frames=8), batch) == 8
    assert checked.check_batch(info(1, frames=5), batch) == 5  # split_trajs: the real frames
    assert checked.check_batch(info(1, frames=0), batch) == 8
    with pytest.raises(ProtocolError, match="9 frames for 8 rows"):
        checked.check_batch(info(1, frames=9), batch)
    with pytest.raises(ProtocolError, match="8 rows in 7 bytes"):
        checked.check_batch(info(1, total_bytes=7), batch)


def test_an_llm_batch_of_last_steps_counts_each_dialogs_turns() -> None:
    rows = padded(3, worker_id=5)
    last_steps = CollectSettings(
        frames_per_batch=3, llm=LLMSettings(yield_only_last_steps=True, max_turns=4)
    )
    checked = bounds(last_steps)
    assert checked.check_batch(info(1, frames=12), rows) == 12
    with pytest.raises(ProtocolError, match="13 frames for 3 rows"):
        checked.check_batch(info(1, frames=13), rows)
    unlimited = CollectSettings(frames_per_batch=3, llm=LLMSettings(yield_only_last_steps=True))
    assert bounds(unlimited).check_batch(info(1, frames=3000), rows) == 3000
    with pytest.raises(ProtocolError, match="frames for 3 rows"):
        bounds(unlimited).check_batch(info(1, frames=2**64 - 1), rows)


def test_an_llm_batch_is_in_the_padded_form_with_ids_below_the_vocab_size() -> None:
    """``common.llm.check_padded`` as the batch arrives, with the session's ``vocab_size``."""
    dialogs = LLMSettings(yield_completed_trajectories=True, vocab_size=11)
    llm = CollectSettings(frames_per_batch=4, llm=dialogs)
    assert bounds(llm).check_batch(info(1, frames=4), padded(4, worker_id=5)) == 4
    beyond = padded(4, worker_id=5)
    beyond["tokens"][0, 0] = 11
    with pytest.raises(ProtocolError, match=r"actor:1: batch seq 1: .*vocab_size=11"):
        bounds(llm).check_batch(info(1, frames=4), beyond)
    steps = padded(4, worker_id=5).exclude("log_probs")
    with pytest.raises(ProtocolError, match=r"batch seq 2: LLM batch .*log_probs"):
        bounds(llm).check_batch(info(2, frames=4), steps)


def test_a_batch_of_steps_has_the_sessions_shape() -> None:
    def rows(*shape: int) -> TensorDict:
        return TensorDict({"done": torch.zeros(*shape, dtype=torch.bool)}, batch_size=shape)

    checked = bounds()  # 8 frames from 2 envs: [2, 4]
    assert checked.check_batch(info(1), rows(2, 4)) == 8
    assert checked.check_batch(info(1), rows(1, 2, 4)) == 8  # an env pool of more dims
    for shape in [(4, 2), (1, 8), (2, 3), (8,)]:
        with pytest.raises(ProtocolError, match=r"8 frames, 4 steps of each env"):
            checked.check_batch(info(1, frames=0), rows(*shape))
    split = bounds(CollectSettings(frames_per_batch=8, split_trajs=True))
    trajectories = rows(3, 4)  # padded
    trajectories["collector", "mask"] = torch.ones(3, 4, dtype=torch.bool)
    assert split.check_batch(info(1, frames=7), trajectories) == 7


def test_the_versions_frames_carry_lie_in_the_range_the_info_claims() -> None:
    def acted(versions: list[int], nxt: list[int] | None = None) -> TensorDict:
        steps = {"policy_version": torch.tensor(versions).reshape(2, 4)}
        if nxt is not None:
            steps["next"] = {"policy_version": torch.tensor(nxt).reshape(2, 4)}
        return TensorDict(steps, batch_size=[2, 4])

    claimed = {"policy_version_min": 3, "policy_version_max": 4}
    checked = bounds()
    assert checked.check_batch(info(1, **claimed), acted([3] * 4 + [4] * 4)) == 8
    with pytest.raises(ProtocolError, match=r"versions 3\.\.4, but .*'policy_version' hold 0\.\.4"):
        checked.check_batch(info(1, **claimed), acted([0] + [4] * 7))  # the lag would read 0
    with pytest.raises(ProtocolError, match=r"\('next', 'policy_version'\) hold 3\.\.9"):
        checked.check_batch(info(1, **claimed), acted([3] * 8, [3] * 7 + [9]))
    split = bounds(CollectSettings(frames_per_batch=8, split_trajs=True))
    padded = acted([3] * 7 + [0])
    padded["collector", "mask"] = torch.tensor([True] * 7 + [False]).reshape(2, 4)
    assert split.check_batch(info(1, frames=7, **claimed), padded) == 7  # padding holds 0
    padded["collector", "mask"][1, 3] = True  # the 0 counts as a real frame's version
    with pytest.raises(ProtocolError, match=r"'policy_version' hold 0\.\.3"):
        split.check_batch(info(1, frames=8, **claimed), padded)
    with pytest.raises(ProtocolError, match="split trajectories without a boolean"):
        split.check_batch(info(1, frames=7, **claimed), acted([3] * 7 + [0]))


def test_trajectory_and_group_ids_name_the_actor() -> None:
    own = TrajIds(5, epoch=9).take(8)
    other = TrajIds(6, epoch=9).take(8)

    def with_ids(key: tuple[str, str], ids) -> TensorDict:
        return TensorDict({key: torch.as_tensor(ids).reshape(2, 4)}, batch_size=[2, 4])

    checked = bounds()
    for key in [("collector", "traj_ids"), ("collector", "group_id")]:
        assert checked.check_batch(info(1), with_ids(key, own)) == 8
        mixed = [*own[:7], other[0]]  # one frame poured into worker_id 6's trajectory
        with pytest.raises(ProtocolError, match=rf"{key[1]}'\) of worker_id 6; it is worker_id 5"):
            checked.check_batch(info(1), with_ids(key, mixed))
        with pytest.raises(ProtocolError, match="of worker_id -1"):
            checked.check_batch(info(1), with_ids(key, [-1, *own[1:]]))
    split = bounds(CollectSettings(frames_per_batch=8, split_trajs=True))
    padded = with_ids(("collector", "traj_ids"), [*own[:7], 0])  # padding holds 0
    padded["collector", "mask"] = torch.tensor([True] * 7 + [False]).reshape(2, 4)
    assert split.check_batch(info(1, frames=7), padded) == 7
    padded["collector", "traj_ids"][0, 0] = int(other[0])  # a real frame of worker_id 6
    with pytest.raises(ProtocolError, match="of worker_id 6"):
        split.check_batch(info(1, frames=7), padded)


def test_a_split_batchs_values_must_have_the_masks_shape() -> None:
    """A hostile actor's values beside a mask of another shape: ProtocolError, not IndexError."""
    checked = BatchBounds("a:1", CollectSettings(frames_per_batch=8, split_trajs=True), 2, 2, 5)
    checked.opened(3, 1)
    batch = TensorDict(
        {"collector": {"mask": torch.ones(2, 4, dtype=torch.bool)}}, batch_size=[2, 4]
    )
    batch.batch_size = [2]
    batch["policy_version"] = torch.zeros(2, 3, dtype=torch.int64)  # not under the mask
    with pytest.raises(ProtocolError, match="beside a mask"):
        checked.check_batch(pb.BatchInfo(epoch=3, seq=1, frames=2, total_bytes=1000), batch)


def test_a_split_batchs_mask_must_be_boolean() -> None:
    """An int64 mask would gather frames 0 and 1 instead of masking: ids checked elsewhere."""
    checked = BatchBounds("a:1", CollectSettings(frames_per_batch=8, split_trajs=True), 2, 2, 5)
    checked.opened(3, 1)
    batch = TensorDict(
        {"collector": {"mask": torch.ones(2, 4, dtype=torch.int64)}}, batch_size=[2, 4]
    )
    with pytest.raises(ProtocolError, match="boolean"):
        checked.check_batch(pb.BatchInfo(epoch=3, seq=1, frames=2, total_bytes=1000), batch)


def test_a_version_range_whose_min_is_above_its_max_is_refused() -> None:
    with pytest.raises(ProtocolError, match="not a range"):
        bounds().check_info(info(1, policy_version_min=5, policy_version_max=3))
