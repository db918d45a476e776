"""What the collector yields: the batch layout (tagging, stacking) and the storing device."""

from __future__ import annotations

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from learner_client import GrpcCollector
from learner_client._rounds import WORKER_ID_KEY, Placement, combine, name_time_dim, tag_worker
from learner_client._slabs import PacketSlabs


def addresses(fleet, *worker_ids):
    return [fleet[w].address for w in worker_ids]


def test_placement_prefers_storing_device_over_device():
    assert Placement().device is None
    assert Placement(device="cpu").device == torch.device("cpu")
    assert Placement(device="meta", storing_device="cpu").device == torch.device("cpu")
    assert not Placement("cpu").pin_memory


def test_placement_on_the_host_names_the_device_without_copying():
    batch = TensorDict({"x": torch.arange(4)}, batch_size=[4])
    assert Placement().place(batch) is batch  # no device asked: as received
    placed = Placement("cpu").place(batch)  # TorchRL's batches name a device given
    assert placed.device == torch.device("cpu")
    assert placed["x"] is batch["x"]
    assert Placement(storing_device="cpu").place(placed) is placed


def test_placement_moves_to_another_device():
    batch = TensorDict({"x": torch.arange(4)}, batch_size=[4])
    placement = Placement()
    placement.device = torch.device("meta")  # another device on a CPU machine
    placed = placement.place(batch)
    assert placed.device == torch.device("meta")
    assert placed["x"].shape == (4,)
    with pytest.raises(ValueError, match="meta device holds no data"):  # not a user's choice
        Placement(storing_device="meta")


@pytest.mark.parametrize("value", ["gpu", 3.5, "cuda:x"])
def test_placement_refuses_what_is_not_a_device(value):
    with pytest.raises(ValueError, match="must be a torch device"):
        Placement(device=value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU machine")
def test_collector_refuses_cuda_without_cuda_before_connecting():
    # Nothing listens on this address: the device is checked first, with an actionable message.
    with pytest.raises(ValueError, match=r"storing_device='cuda'.*does not have"):
        GrpcCollector(["127.0.0.1:1"], frames_per_batch=4, storing_device="cuda")


def test_collector_delivers_on_the_cpu_device_as_received(fleet):
    with GrpcCollector(
        addresses(fleet, 0, 2), frames_per_batch=8, total_frames=16, sync=True, device="cpu"
    ) as collector:
        batches = list(collector)
    assert len(batches) == 2
    assert all(b.device is None or b.device == torch.device("cpu") for b in batches)
    assert all(b["observation"].device == torch.device("cpu") for b in batches)


@pytest.mark.cuda
def test_slabs_are_pinned_for_a_cuda_target():
    buffer = PacketSlabs(pin_memory=True).buffer(0, 1, 1000)
    assert buffer.is_pinned()
    assert not PacketSlabs().buffer(0, 1, 1000).is_pinned()


def collect(fleet, sync, **device):
    with GrpcCollector(
        addresses(fleet, 0, 2), frames_per_batch=8, total_frames=24, sync=sync, **device
    ) as collector:
        collector.set_seed(7)
        # Trajectory ids are fleet-unique, so they differ from one collection to the next.
        return [b.exclude(("collector", "traj_ids")).clone() for b in collector]


@pytest.mark.cuda
def test_collector_delivers_on_cuda_the_same_sync_batches(fleet):
    on_host, on_cuda = collect(fleet, True), collect(fleet, True, device="cuda")
    for host, cuda in zip(on_host, on_cuda, strict=True):
        assert cuda["observation"].is_cuda
        assert cuda["next", "reward"].is_cuda
        assert (cuda.cpu() == host).all()


@pytest.mark.cuda
def test_collector_delivers_async_batches_on_the_storing_device(fleet):
    batches = collect(fleet, False, device="cpu", storing_device="cuda:0")
    assert len(batches) == 3
    assert all(b["observation"].device == torch.device("cuda", 0) for b in batches)


def test_collector_sync_batches_repeat_after_the_same_seed_on_the_host(fleet):
    # What the CUDA comparison above relies on: the same seed, the same batches.
    first, second = collect(fleet, True, device="cpu"), collect(fleet, True, storing_device="cpu")
    for a, b in zip(first, second, strict=True):
        assert (a == b).all()


def batch(envs: int, steps: int, fill: float = 0.0) -> TensorDict:
    td = TensorDict(
        {
            "observation": torch.full((envs, steps, 4), fill),
            ("collector", "traj_ids"): torch.zeros(envs, steps, dtype=torch.int64),
        },
        batch_size=[envs, steps],
    )
    return name_time_dim(td)


def test_tag_worker_adds_an_int64_id_shaped_like_traj_ids():
    td = tag_worker(batch(2, 3), 7)
    ids = td[WORKER_ID_KEY]
    assert ids.dtype == torch.int64
    assert ids.shape == td["collector", "traj_ids"].shape
    assert bool((ids == 7).all())
    assert td.names == [None, "time"]


def test_combine_stacks_in_order_with_named_time():
    out = combine(
        [tag_worker(batch(2, 4, i), i) for i in range(3)], cat_results="stack", split_trajs=False
    )
    assert out.batch_size == torch.Size([3, 2, 4])
    assert out.names == [None, None, "time"]
    assert out[WORKER_ID_KEY][:, 0, 0].tolist() == [0, 1, 2]


def test_combine_concatenates_on_dim_zero_with_cat_results_0():
    out = combine([batch(2, 4), batch(2, 4)], cat_results=0, split_trajs=False)
    assert out.batch_size == torch.Size([4, 4])
    assert out.names == [None, "time"]


def test_combine_lazy_stacks_actors_of_different_shapes():
    out = combine([batch(2, 4), batch(4, 2)], cat_results="stack", split_trajs=False)
    assert isinstance(out, LazyStackedTensorDict)
    assert out[0].batch_size == torch.Size([2, 4])
    assert out[1].batch_size == torch.Size([4, 2])


def test_combine_pads_split_trajectories_to_the_longest():
    out = combine([batch(3, 5, 1.0), batch(2, 7, 2.0)], cat_results="stack", split_trajs=True)
    assert out.batch_size == torch.Size([5, 7])
    assert bool((out["observation"][:3, 5:] == 0).all())


def test_combine_raises_if_given_nothing():
    with pytest.raises(ValueError, match="zero"):
        combine([], cat_results="stack", split_trajs=False)


def test_placement_takes_a_per_worker_list_of_none_as_no_device_as_torchrl_does():
    """TorchRL's multi-worker collectors make ``[None] * num_workers`` of a None device and
    give each worker its entry: a list of Nones asks no device, as None itself."""
    assert Placement(device=[None, None]).device is None
    assert Placement(device="cpu", storing_device=[None, None]).device == torch.device("cpu")
