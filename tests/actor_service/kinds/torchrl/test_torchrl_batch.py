"""The TorchRL core's frame stacker: into the last batch's layout when frames fit, else densely."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

import pytest
import torch
from tensordict import NonTensorData, TensorDict, TensorDictBase

from actor_service._core._frames import FOLD_MIN_FRAME_BYTES
from actor_service._kinds.torchrl.batch import FrameStacker, fold_observations, stack_frames
from common.packets.folding import FoldedBatch

DONE_KEYS = ["done", "terminated", "truncated"]  # as `env.done_keys` names them


def _frame(step: int, envs: int = 2, obs: int = 3) -> TensorDict:
    """One step of ``envs`` envs as the core stores it (root, ``"next"``, ``"collector"``)."""
    flags = {k: torch.zeros(envs, 1, dtype=torch.bool) for k in ("done", "terminated", "truncated")}
    return TensorDict(
        {
            "observation": torch.full((envs, obs), float(step)),
            "action": torch.randn(envs, 1),
            "collector": {"traj_ids": torch.arange(envs)},
            "next": {
                "observation": torch.full((envs, obs), step + 1.0),
                "reward": torch.randn(envs, 1),
                **flags,
            },
            **flags,
        },
        batch_size=[envs],
    )


def _frames(steps: int, start: int = 0, **kw: int) -> list[TensorDict]:
    return [_frame(start + t, **kw) for t in range(steps)]


def _laid_out() -> FrameStacker:
    """A stacker that has stacked one batch of 4 frames: the next fitting batch uses its layout."""
    stacker = FrameStacker()
    stacker.stack(_frames(4))
    return stacker


def _dense(frames: list[TensorDict]) -> TensorDictBase:
    return torch.stack(frames, dim=frames[0].batch_dims).contiguous()


def test_batches_stacked_into_the_last_layout_equal_dense_stacks_in_fresh_tensors() -> None:
    stacker = FrameStacker()
    first_frames, second_frames = _frames(5), _frames(5, start=5)
    first = stacker.stack(first_frames)
    kept = first.clone()
    second = stacker.stack(second_frames)
    assert (second == _dense(second_frames)).all()
    assert second.batch_size == (2, 5)
    # The first batch, already handed on, is not written over by the second.
    assert (first == kept).all()
    first_ptrs = {v.data_ptr() for v in first.values(True, True)}
    assert not first_ptrs & {v.data_ptr() for v in second.values(True, True)}


def test_no_batch_is_held_between_two_batches() -> None:
    stacker = FrameStacker()
    for start in (0, 5):  # the dense first batch, then one stacked into the layout
        batch = stacker.stack(_frames(5, start=start))
        observation = weakref.ref(batch["next", "observation"])
        del batch
        gc.collect()
        assert observation() is None, "the stacker keeps a batch handed on alive"


_CHANGES = {
    "nested-entry": lambda f: f.set(("next", "extra"), torch.ones(2, 1)),
    "root-entry": lambda f: f.set("extra", torch.ones(2, 1)),
    "nested-level": lambda f: f.get("next").set("deeper", TensorDict({"x": torch.ones(2)}, [2])),
}


@pytest.mark.parametrize("change", list(_CHANGES.values()), ids=list(_CHANGES))
def test_frames_with_an_entry_the_layout_lacks_are_stacked_whole(
    change: Callable[[TensorDict], object],
) -> None:
    stacker = _laid_out()
    frames = _frames(4, start=4)
    for frame in frames:
        change(frame)
    batch = stacker.stack(frames)
    assert set(batch.keys(True, True)) == set(frames[0].keys(True, True))
    assert (batch == _dense(frames)).all()


@pytest.mark.parametrize("change", list(_CHANGES.values()), ids=list(_CHANGES))
def test_one_later_frame_with_an_entry_more_is_refused_as_a_dense_stack_refuses_it(
    change: Callable[[TensorDict], object],
) -> None:
    # Stacked into the layout, the entry would be dropped without a word.
    stacker = _laid_out()
    frames = _frames(4, start=4)
    change(frames[2])
    with pytest.raises(RuntimeError, match="keys"):
        _dense(frames)
    with pytest.raises(RuntimeError, match="keys"):
        stacker.stack(frames)


def test_a_later_frame_missing_an_entry_or_of_another_shape_raises_as_a_dense_stack() -> None:
    stacker = _laid_out()
    missing = _frames(4, start=4)
    del missing[2]["next", "reward"]
    with pytest.raises(RuntimeError, match="keys"):
        _dense(missing)
    with pytest.raises(RuntimeError, match="keys"):
        stacker.stack(missing)
    wider = _frames(4, start=4)
    wider[3]["next", "observation"] = torch.zeros(2, 4)
    with pytest.raises(RuntimeError):
        stacker.stack(wider)
    # The stacker is still usable, and a new layout is taken up whole.
    again = _frames(6, start=8, envs=3, obs=5)
    assert (stacker.stack(again) == _dense(again)).all()
    more = _frames(6, start=14, envs=3, obs=5)
    assert (stacker.stack(more) == _dense(more)).all()


def test_unbatched_frames_and_non_tensor_entries_stack_as_before() -> None:
    stacker = FrameStacker()
    for start in (0, 3):
        frames = [_frame(start + t)[0] for t in range(3)]  # one env stepped as it is: batch []
        batch = stack_frames(frames, DONE_KEYS, set_truncated=True, stacker=stacker)
        assert batch.batch_size == (1, 3)
        assert batch.names == [None, "time"]
        assert batch["next", "truncated"][0, -1].item()
        assert batch["next", "done"][0, -1].item()
        assert (
            batch.exclude(("next", "truncated"), ("next", "done"))[0]
            == _dense(frames).exclude(("next", "truncated"), ("next", "done"))
        ).all()
    texts = FrameStacker()
    for start in (0, 3):
        frames = _frames(3, start=start)
        for t, frame in enumerate(frames):
            frame.set("text", NonTensorData(f"step {start + t}", batch_size=[2]))
        batch = texts.stack(frames)
        assert [list(row) for row in batch["text"]] == [[f"step {start + t}" for t in range(3)]] * 2


def test_private_entries_are_left_out_at_every_level_as_torchrls_collector_leaves_them() -> None:
    frames = [frame.to("cpu") for frame in _frames(3)]  # as the pool's, on its device
    for frame in frames:
        frame.set("_hidden", torch.ones(2, 1))
        frame.set(("next", "_hidden"), torch.ones(2, 1))
        frame.set(("next", "agents", "_mask"), torch.ones(2, 1, dtype=torch.bool))
        frame.set(("next", "agents", "reward"), torch.ones(2, 1))
    batch = stack_frames(frames, DONE_KEYS, set_truncated=False)
    private = {"_hidden", ("next", "_hidden"), ("next", "agents", "_mask")}
    assert set(batch.keys(True, True)) == set(frames[0].keys(True, True)) - private
    assert frames[0].device == torch.device("cpu")
    assert batch.device is None  # as a batch decoded from the wire: no device


def test_set_truncated_marks_a_nested_truncated_key_and_its_own_done_at_the_last_step() -> None:
    frames = _frames(3)
    for frame in frames:
        for flag in ("done", "terminated", "truncated"):
            frame.set(("next", "agents", flag), torch.zeros(2, 4, 1, dtype=torch.bool))
    nested_keys = [("agents", "done"), ("agents", "terminated"), ("agents", "truncated")]
    done_keys: list[str | tuple[str, ...]] = [*DONE_KEYS, *nested_keys]
    batch = stack_frames(frames, done_keys, set_truncated=True)
    for nested in ((), ("agents",)):
        truncated, done = batch["next", *nested, "truncated"], batch["next", *nested, "done"]
        assert truncated[:, -1].all(), nested
        assert done[:, -1].all(), nested
        assert not truncated[:, :-1].any(), nested
        assert not done[:, :-1].any(), nested
    assert not batch["next", "agents", "terminated"].any()


def test_observations_without_their_next_entry_are_not_folded() -> None:
    frames = _frames(4, obs=32)  # 128 bytes of observation a frame: worth folding
    for frame in frames:
        frame.set("pixels", torch.zeros(2, 32))  # an observation only the root holds
    batch = stack_frames(frames, DONE_KEYS, set_truncated=False)
    assert fold_observations(batch, ["pixels"]) is batch
    folded = fold_observations(batch, ["observation", "pixels"])
    assert isinstance(folded, FoldedBatch)
    assert ("next", "pixels") not in folded.finals.keys(True, True)
    assert "pixels" not in folded.finals.keys(True, True)
    assert (folded.unfold() == batch).all()


def test_observations_are_folded_from_fold_min_frame_bytes_a_frame_on() -> None:
    assert FOLD_MIN_FRAME_BYTES == 64  # 16 float32 values
    for values, folded in ((15, False), (16, True)):
        batch = stack_frames(_frames(4, obs=values), DONE_KEYS, set_truncated=False)
        assert isinstance(fold_observations(batch, ["observation"]), FoldedBatch) is folded
