"""Sync rounds stacked by viewing: packet slabs, and combine over packets received into them."""

from __future__ import annotations

import re
import subprocess
import sys
import weakref

import pytest
import torch
from tensordict import TensorDict

from common.packets import PacketAssembler, encode_packet
from learner_client._rounds import WORKER_ID_KEY, combine, name_time_dim, tag_worker
from learner_client._slabs import _MAX_FILLED, _MAX_OPEN, BlobBuffers, PacketSlabs, host_memory

MIB = 1 << 20


def actor_batch(fill: int, envs: int = 2, steps: int = 5) -> TensorDict:
    td = TensorDict(
        {
            "observation": torch.full((envs, steps, 3, 4), fill, dtype=torch.uint8),
            "next": TensorDict(
                {
                    "observation": torch.full((envs, steps, 3, 4), fill + 100, dtype=torch.uint8),
                    "done": torch.zeros(envs, steps, 1, dtype=torch.bool),
                },
                batch_size=[envs, steps],
            ),
            ("collector", "traj_ids"): torch.full((envs, steps), fill, dtype=torch.int64),
        },
        batch_size=[envs, steps],
    )
    return name_time_dim(td)


def received(td: TensorDict, allocate=None) -> TensorDict:
    packet = encode_packet(td)
    assembler = PacketAssembler(packet.nbytes, allocate=allocate)
    for chunk in packet.chunks(64):
        assembler.add(chunk)
    return assembler.finish()


def test_packet_slabs_put_the_nth_packet_of_each_position_in_one_slab():
    slabs = PacketSlabs()
    first, second = slabs.allocator(0, 2), slabs.allocator(1, 2)
    a1, a2 = first(100), first(100)  # position 0 runs a round ahead
    b1, b2 = second(100), second(100)
    assert b1.untyped_storage().data_ptr() == a1.untyped_storage().data_ptr()
    assert b2.untyped_storage().data_ptr() == a2.untyped_storage().data_ptr()
    assert a1.untyped_storage().data_ptr() != a2.untyped_storage().data_ptr()
    assert b1.data_ptr() - a1.data_ptr() == 112  # 100 rounded up to 16
    assert not slabs._open  # no slab has a slot still free


def test_packet_slabs_raise_if_the_position_is_outside_the_width():
    with pytest.raises(ValueError, match="range"):
        PacketSlabs().allocator(2, 2)


def test_combine_views_packets_received_into_one_slab():
    slabs = PacketSlabs()
    batches = [
        tag_worker(name_time_dim(received(actor_batch(i), slabs.allocator(i, 3))), i)
        for i in range(3)
    ]
    expected = name_time_dim(torch.stack([b.clone() for b in batches], 0))
    out = combine(batches, cat_results="stack", split_trajs=False)
    assert out.batch_size == torch.Size([3, 2, 5])
    assert out.names == expected.names == [None, None, "time"]
    assert out["next"].names == expected["next"].names
    assert set(out.keys(True, True)) == set(expected.keys(True, True))
    assert bool((out == expected).all())
    # No copy: the stacked entry is a view of the slab the packets were received into.
    slab = batches[0]["observation"].untyped_storage().data_ptr()
    assert out["observation"].untyped_storage().data_ptr() == slab
    assert out["next", "observation"].untyped_storage().data_ptr() == slab
    assert out[WORKER_ID_KEY][:, 0, 0].tolist() == [0, 1, 2]


def test_combine_views_the_batch_of_one_actor():
    slabs = PacketSlabs()
    (only,) = [tag_worker(name_time_dim(received(actor_batch(0), slabs.allocator(0, 1))), 0)]
    expected = name_time_dim(torch.stack([only.clone()], 0))
    out = combine([only], cat_results="stack", split_trajs=False)
    assert out.batch_size == torch.Size([1, 2, 5])
    assert out.names == expected.names
    assert bool((out == expected).all())
    for key in (("observation",), ("next", "observation"), WORKER_ID_KEY):
        assert out[key].data_ptr() == only[key].data_ptr()  # a view, not a copy


def test_combine_copies_packets_received_into_separate_buffers():
    batches = [tag_worker(name_time_dim(received(actor_batch(i))), i) for i in range(2)]
    out = combine(batches, cat_results="stack", split_trajs=False)
    expected = torch.stack([b.clone() for b in batches], 0)
    assert bool((out == expected).all())
    assert out["observation"].is_contiguous()
    assert out["observation"].data_ptr() != batches[0]["observation"].data_ptr()


def test_combine_copies_overlapping_views_rather_than_aliasing_them():
    base = torch.arange(40, dtype=torch.float32)
    batches = [
        TensorDict({"x": base[i : i + 20].view(2, 10)}, batch_size=[2, 10]) for i in range(2)
    ]  # the second starts 4 bytes after the first: they overlap
    out = combine(batches, cat_results="stack", split_trajs=False)
    assert out["x"].is_contiguous()
    assert out["x"][1, 0, 0].item() == 1.0


def test_collector_sync_batches_view_their_round_slab_and_stay_intact(fleet):
    from learner_client import GrpcCollector

    addresses = [fleet[0].address, fleet[1].address]
    with GrpcCollector(addresses, frames_per_batch=16, total_frames=64, sync=True) as collector:
        batches = iter(collector)
        first = next(batches)
        kept = first.clone()
        later = list(batches)
    assert len(later) == 3
    for batch in (first, *later):
        assert batch.names == [None, None, "time"]
        # Both entries are views of one slab holding both actors' packets: nothing was stacked
        # (CartPole's small observations are not folded, see test_folded_batches_of_one_round).
        storage = batch["observation"].untyped_storage()
        assert batch["next", "observation"].untyped_storage().data_ptr() == storage.data_ptr()
        assert storage.nbytes() >= batch["observation"].nbytes * 2
    assert bool((first == kept).all())  # later rounds went to other slabs


def test_folded_batches_of_one_round_rebuild_next_entries_into_one_slab():
    from common.packets import checksummed_pieces, encode_packet
    from common.packets.assembly import BatchAssembler
    from common.packets.folding import fold

    slabs = PacketSlabs()
    batches = []
    for position in range(2):
        obs = torch.rand(3, 5, 4)
        full = TensorDict(
            {"observation": obs[:, :4], "next": {"observation": obs[:, 1:]}}, batch_size=[3, 4]
        )
        folded = fold(full, ["observation"])
        packets = [encode_packet(folded.batch), encode_packet(folded.finals)]
        pieces, crc = checksummed_pieces(packets)
        assembler = BatchAssembler(
            sum(p.nbytes for p in packets),
            finals_bytes=packets[1].nbytes,
            allocate=slabs.allocator(position, 2),
        )
        for piece in pieces:
            assembler.add(b"".join(piece))
        batches.append((assembler.finish(expected_crc32c=crc), full))
    out = combine([b for b, _ in batches], cat_results="stack", split_trajs=False)
    for key in ("observation", ("next", "observation")):
        # One strided view per entry: the two actors' tensors lie in one slab.
        assert out[key].data_ptr() == batches[0][0][key].data_ptr()
        assert torch.equal(out[key], torch.stack([full[key] for _, full in batches]))


@pytest.mark.parametrize("nbytes", [100, 3 * MIB], ids=["small", "huge-pages"])
def test_slabs_reuse_a_round_only_once_nothing_views_it(nbytes):
    slabs = PacketSlabs()

    def storage(buffers: list[torch.Tensor]) -> int:
        return buffers[0].untyped_storage().data_ptr()

    first = [slabs.buffer(p, 2, nbytes) for p in range(2)]
    first_slab = storage(first)
    kept = first[1][8:16].view(torch.int64)  # a view of a view keeps the slab too
    del first
    second = [slabs.buffer(p, 2, nbytes) for p in range(2)]
    second_slab = storage(second)
    assert second_slab != first_slab  # `kept` still views the first round
    del kept, second
    third = [slabs.buffer(p, 2, nbytes) for p in range(2)]
    assert storage(third) in {first_slab, second_slab}  # memory of a dropped round
    assert third[1].untyped_storage().data_ptr() == storage(third)


def test_slabs_never_hand_out_memory_a_kept_batch_views():
    slabs = PacketSlabs()
    allocate = slabs.for_worker(7)  # outside any layout: one-slot slabs
    kept = [allocate(64) for _ in range(20)]
    for i, buffer in enumerate(kept):
        buffer.fill_(i)
    for _ in range(20):
        allocate(64).fill_(255)  # dropped at once: these may share memory
    assert [int(b[0]) for b in kept] == list(range(20))
    assert len({b.data_ptr() for b in kept}) == 20


def _slab_of(buffer: torch.Tensor) -> weakref.ref[torch.Tensor]:
    """A weak reference to the slab memory ``buffer`` views (alive while a slab keeps it)."""
    assert buffer._base is not None
    return weakref.ref(buffer._base)


def test_slabs_let_go_of_open_slabs_past_the_cap_as_packet_sizes_change():
    # An actor whose every packet has a new size opens a slab per packet, never filled
    # (its partner never sends that size): the oldest past _MAX_OPEN are let go.
    slabs = PacketSlabs()
    first = _slab_of(slabs.buffer(0, 2, 16))
    for size in range(1, _MAX_OPEN):
        slabs.buffer(0, 2, 16 + 16 * size)
    assert first() is not None  # still open, among the latest _MAX_OPEN
    slabs.buffer(0, 2, 16 + 16 * _MAX_OPEN)
    assert first() is None


def test_slabs_let_go_of_filled_slabs_past_the_cap_as_packet_sizes_change():
    slabs = PacketSlabs()
    first = _slab_of(slabs.buffer(0, 1, 16))  # a one-slot slab: filled at once
    for size in range(1, _MAX_FILLED):
        slabs.buffer(0, 1, 16 + 16 * size)
    assert first() is not None  # kept for reuse, among the latest _MAX_FILLED
    slabs.buffer(0, 1, 16 + 16 * _MAX_FILLED)
    assert first() is None


def _mapping_of(address: int) -> str | None:
    """The ``/proc/self/smaps`` block of the mapping holding ``address``; None if unmapped."""
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line)]
    for first, end in zip(starts, [*starts[1:], len(lines)], strict=True):
        low, high = (int(x, 16) for x in lines[first].split(" ", 1)[0].split("-"))
        if low <= address < high:
            return "\n".join(lines[first:end])
    return None


def _huge_pages_madvisable() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            enabled = f.read()
        with open("/sys/kernel/mm/transparent_hugepage/defrag") as f:
            defrag = f.read()
    except OSError:
        return False
    return "[never]" not in enabled and "[never]" not in defrag and "[defer]" not in defrag


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE")
def test_host_memory_starts_on_a_huge_page_and_goes_with_its_last_view():
    memory = host_memory(5 * MIB)
    assert memory.dtype == torch.uint8
    assert memory.shape == (5 * MIB,)
    assert memory.data_ptr() % (2 * MIB) == 0
    memory.fill_(7)
    tail = memory[-16:]
    address = memory.data_ptr()
    if _huge_pages_madvisable():  # the kernel backs the two whole huge pages inside
        block = _mapping_of(address)
        assert block is not None
        huge_kb = int(block.split("AnonHugePages:")[1].split()[0])
        assert huge_kb >= 2048, block
    del memory
    assert _mapping_of(address) is not None  # `tail` still views it
    assert int(tail.sum()) == 7 * 16
    del tail
    assert _mapping_of(address) is None


def test_host_memory_below_a_huge_page_is_plain_memory():
    memory = host_memory(MIB)
    assert memory.shape == (MIB,)
    assert memory.is_contiguous()
    memory.fill_(1)
    assert int(memory.sum()) == MIB


_REFUSED = """
import resource, torch
from learner_client._slabs import host_memory
with open("/proc/self/status") as f:
    size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20), resource.RLIM_INFINITY))
try:
    host_memory(1 << 30)
except RuntimeError as exc:
    print("RuntimeError", exc)
else:
    print("allocated")
"""


def test_host_memory_refused_by_a_memory_limit_raises_as_torch_does():
    """Past ``RLIMIT_AS`` the mapping is refused: torch's allocator raises its own error."""
    out = subprocess.run(
        [sys.executable, "-c", _REFUSED], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.startswith("RuntimeError"), out
    assert "allocate" in out, out


def test_blob_buffers_keep_two_buffers_a_model_and_let_older_ones_go():
    buffers = BlobBuffers()
    first = weakref.ref(buffers.take("policy", 4096))
    second = weakref.ref(buffers.take("policy", 8192))  # larger: the first cannot serve it
    assert first() is not None
    buffers.take("policy", 12288)
    assert first() is None  # a model whose size grows keeps two buffers, not every one
    assert second() is not None
    buffers.take("value", 4096)  # another model's buffers are its own
    assert second() is not None


def test_a_worker_outside_the_layout_takes_no_slot_of_a_round():
    slabs = PacketSlabs()
    slabs.set_layout([1, 2])
    stray = slabs.for_worker(9)(64)  # not yet in a round: a one-slot slab of its own
    first, second = slabs.for_worker(1)(64), slabs.for_worker(2)(64)
    assert second.data_ptr() - first.data_ptr() == 64  # the round's slab, evenly spaced
    assert stray.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
