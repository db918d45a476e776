"""Folded batches: unfolding gives TorchRL's batch back bit for bit; hostile finals refused."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from common import checksum
from common.errors import DataLossError, ProtocolError
from common.packets import checksummed_pieces, encode_packet
from common.packets.assembly import BatchAssembler
from common.packets.folding import INDEX, FoldedBatch, fold, unfold

torchrl_envs = pytest.importorskip("torchrl.envs")
torchrl_collectors = pytest.importorskip("torchrl.collectors")


class DictObsEnv(gymnasium.Env):
    """Two observation keys; terminates at random, so episodes end mid-batch."""

    def __init__(self) -> None:
        self.observation_space = gymnasium.spaces.Dict(
            {
                "position": gymnasium.spaces.Box(-10, 10, (3,), dtype=np.float32),
                "count": gymnasium.spaces.Box(0, 1000, (), dtype=np.int64),
            }
        )
        self.action_space = gymnasium.spaces.Discrete(2)
        self._t = 0

    def _obs(self) -> dict[str, np.ndarray]:
        position = self.np_random.normal(size=3).astype(np.float32)
        return {"position": position, "count": np.asarray(self._t, dtype=np.int64)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        return self._obs(), 1.0, bool(self.np_random.random() < 0.15), False, {}


def _torchrl_batch(make_env, *, envs: int, frames: int, max_steps: int) -> TensorDict:
    torch.manual_seed(0)  # the random policy draws from torch's generator: fixed episodes
    env = torchrl_envs.SerialEnv(envs, make_env)
    env.set_seed(3)
    collector = torchrl_collectors.Collector(
        env, None, frames_per_batch=frames, total_frames=frames, max_frames_per_traj=max_steps
    )
    try:
        return next(iter(collector))
    finally:
        collector.shutdown()


def _equal_bitwise(a: TensorDict, b: TensorDict) -> None:
    keys = set(a.keys(True, True))
    assert keys == set(b.keys(True, True))
    assert a.batch_size == b.batch_size
    assert a.names == b.names
    for key in keys:
        x, y = a.get(key), b.get(key)
        assert (x.dtype, x.shape) == (y.dtype, y.shape), key
        assert torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)), key


def _through_the_wire(folded: FoldedBatch) -> TensorDict:
    packets = [encode_packet(folded.batch), encode_packet(folded.finals)]
    pieces, crc = checksummed_pieces(packets, chunk_bytes=1000)
    assembler = BatchAssembler(sum(p.nbytes for p in packets), finals_bytes=packets[1].nbytes)
    for piece in pieces:
        assembler.add(b"".join(piece))
    return assembler.finish(expected_crc32c=crc)


def test_fold_of_a_torchrl_cartpole_batch_unfolds_to_it_with_resets_and_truncations() -> None:
    full = _torchrl_batch(
        lambda: torchrl_envs.GymEnv("CartPole-v1"), envs=3, frames=300, max_steps=13
    )
    done = full["next", "done"]
    assert full["next", "terminated"].any()
    assert full["next", "truncated"].any()
    folded = fold(full, ["observation"])
    assert ("next", "observation") not in folded.batch.keys(True)
    # Each observation once: the finals are the ended steps and the last step of each env.
    assert folded.finals.batch_size[0] == int(done[:, :-1].sum()) + 3
    _equal_bitwise(_through_the_wire(folded), full.clone())
    _equal_bitwise(folded.unfold(), full.clone())


def test_fold_of_dict_observations_unfolds_exactly() -> None:
    full = _torchrl_batch(
        lambda: torchrl_envs.GymWrapper(DictObsEnv()), envs=2, frames=200, max_steps=9
    )
    keys = ["position", "count"]
    assert all(key in full for key in keys)
    assert full["next", "terminated"].any()
    assert full["next", "truncated"].any()
    folded = fold(full, keys)
    assert set(folded.finals.keys()) == {INDEX, *keys}
    _equal_bitwise(_through_the_wire(folded), full.clone())


def test_fold_of_nested_agent_observations_unfolds_exactly_with_their_batch_size() -> None:
    from torchrl.testing.mocking_classes import NestedCountingEnv

    full = _torchrl_batch(
        lambda: NestedCountingEnv(max_steps=7, nested_dim=5), envs=2, frames=40, max_steps=0
    )
    assert full.get(("next", "data")).batch_size == (2, 20, 5)
    folded = fold(full, [("data", "states")])
    assert ("next", "data", "states") not in folded.batch.keys(True)
    assert ("next", "data", "reward") in folded.batch.keys(True)
    for rebuilt in (_through_the_wire(folded), folded.unfold()):
        _equal_bitwise(rebuilt, full.clone())
        assert rebuilt.get(("next", "data")).batch_size == (2, 20, 5)


def test_fold_keeps_a_next_observation_that_differs_without_an_episode_end() -> None:
    obs = torch.arange(2 * 4 * 2, dtype=torch.float32).view(2, 4, 2)
    nxt = torch.roll(obs, -1, dims=1).clone()
    nxt[0, 1] = -0.0  # not what step 2 holds, though no episode ended
    nxt[1, 2, 0] = float("nan")
    full = TensorDict(
        {
            "observation": obs,
            "next": {"observation": nxt, "done": torch.zeros(2, 4, 1, dtype=bool)},
        },
        batch_size=[2, 4],
    )
    folded = fold(full, ["observation"])
    assert folded.finals[INDEX].tolist() == [1, 3, 6, 7]
    _equal_bitwise(folded.unfold(), full.clone())


def _folded(n: int = 2, t: int = 3) -> tuple[TensorDict, TensorDict]:
    obs = torch.arange(n * (t + 1), dtype=torch.float32).view(n, t + 1, 1)
    full = TensorDict(
        {"observation": obs[:, :-1], "next": {"observation": obs[:, 1:], "r": torch.ones(n, t)}},
        batch_size=[n, t],
    )
    folded = fold(full, ["observation"])
    return folded.batch, folded.finals


@pytest.mark.parametrize(
    ("index", "match"),
    [
        ([2, 6], "lie in"),  # 6 = n * t: out of range
        ([-1, 2, 5], "lie in"),
        ([5, 2], "ascending"),
        ([2, 2, 5], "ascending"),
        ([2, 4], "last step"),
        ([0, 1, 2, 3, 4, 5, 0], "final positions for a batch"),
        ([5], "final positions for a batch"),
        ([2**63 - 1, 2, 5], "ascending"),
    ],
)
def test_unfold_raises_if_the_final_positions_are_hostile(index: list[int], match: str) -> None:
    batch, _finals = _folded()
    bad = TensorDict(
        {INDEX: torch.tensor(index), "observation": torch.zeros(len(index), 1)},
        batch_size=[len(index)],
    )
    with pytest.raises(ProtocolError, match=match):
        unfold(batch, bad)
    assert ("next", "observation") not in batch.keys(True)  # nothing applied


def test_unfold_raises_if_the_finals_do_not_fit_the_batch() -> None:
    batch, finals = _folded()
    cases = {
        "dtype": finals.clone().set("observation", finals["observation"].double()),
        "index": finals.clone().set(INDEX, finals[INDEX].int()),
        "shape": TensorDict(
            {INDEX: finals[INDEX], "observation": torch.zeros(2, 5)}, batch_size=[2]
        ),
        "missing": finals.clone().set("reward", torch.zeros(2)),
        "no key": finals.clone().exclude("observation"),
    }
    for name, bad in cases.items():
        with pytest.raises(ProtocolError):
            unfold(batch.clone(), bad)
        assert ("next", "observation") not in batch.keys(True), name
    twice = batch.clone()
    twice.set(("next", "observation"), batch["observation"].clone())
    with pytest.raises(ProtocolError, match="also sent"):
        unfold(twice, finals)


def test_unfold_never_allocates_more_than_the_batch_holds() -> None:
    batch, finals = _folded()
    sizes: list[int] = []

    def allocate(nbytes: int) -> torch.Tensor:
        sizes.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    unfold(batch, finals, allocate)
    assert sizes == [batch["observation"].numel() * 4]


def test_batch_assembler_raises_on_hostile_sizes_and_bad_checksums() -> None:
    batch, finals = _folded()
    packets = [encode_packet(batch), encode_packet(finals)]
    total = sum(p.nbytes for p in packets)
    for finals_bytes in (total + 1, 2**64 - 1, total - 4):
        with pytest.raises(ProtocolError):
            BatchAssembler(total, finals_bytes=finals_bytes)
    pieces, crc = checksummed_pieces(packets)
    assembler = BatchAssembler(total, finals_bytes=packets[1].nbytes)
    assembler.add(b"".join(pieces[0]))
    with pytest.raises(ProtocolError, match="overflow"):
        assembler.add(b"x")
    with pytest.raises(DataLossError):
        assembler.finish(expected_crc32c=crc ^ 1)
    wrong_split = BatchAssembler(total, finals_bytes=packets[1].nbytes + 16)
    wrong_split.add(b"".join(pieces[0]))
    with pytest.raises(ProtocolError):
        wrong_split.finish(expected_crc32c=crc)


@pytest.mark.parametrize("piece", [7, 1000, 1 << 19])
def test_batch_assembler_reads_in_place_in_pieces_as_chunks_would_arrive(monkeypatch, piece):
    full = _torchrl_batch(
        lambda: torchrl_envs.GymEnv("CartPole-v1"), envs=3, frames=90, max_steps=13
    )
    folded = fold(full, ["observation"])
    packets = [encode_packet(folded.batch), encode_packet(folded.finals)]
    data = b"".join(bytes(part) for packet in packets for part in packet.parts())
    _, crc = checksummed_pieces(packets)
    monkeypatch.setattr(checksum, "READ_PIECE", piece)
    reads: list[tuple[int, int]] = []

    def read_at(into: memoryview, offset: int) -> None:
        reads.append((offset, into.nbytes))
        into[:] = data[offset : offset + into.nbytes]

    assembler = BatchAssembler(len(data), finals_bytes=packets[1].nbytes)
    assembler.add(data[:5])  # a batch may start as chunks: the reads go on from there
    assembler.add_rest(read_at)
    _equal_bitwise(assembler.finish(expected_crc32c=crc), full.clone())
    assert reads[0][0] == 5
    assert all(size <= piece for _, size in reads)
    assert sum(size for _, size in reads) == len(data) - 5

    def flipped(into: memoryview, offset: int) -> None:  # what another process could write
        read_at(into, offset)
        into[0] ^= 0xFF

    damaged = BatchAssembler(len(data), finals_bytes=packets[1].nbytes)
    damaged.add_rest(flipped)
    with pytest.raises(DataLossError):
        damaged.finish(expected_crc32c=crc)


def test_batch_assembler_refuses_bytes_past_a_plain_batch_as_a_protocol_error() -> None:
    """A plain (unfolded) batch has no finals packet to spill into: bytes past its length
    are the sender's fault (a ProtocolError, retried), never an error of the learner's."""
    packet = encode_packet(TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2]))
    assembler = BatchAssembler(packet.nbytes)
    with pytest.raises(ProtocolError, match="overflow"):
        assembler.add(packet.tobytes() + b"x")
    assert assembler.received == 0
