"""Throughput of the packet codec on the path a batch really takes, against a plain copy.

One round trip is what the transports do: ``encode_packet`` on the actor, ``chunks()``
(one copy into each chunk message), then ``PacketAssembler.add`` for every chunk (one
copy into the destination) and ``finish()`` on the learner, which decodes views. It is
timed with and without the CRC-32C the transports add, on (a) a ~64 MiB uint8 pixel
batch and (b) a 1,000-frame CartPole batch, each against ``tensor.clone()`` of a tensor
holding the same number of bytes. Run ``python -m bench.codec_bench [--quick] [--reps N]``;
the table, then one JSON line (``{"bench": "codec", "figures": ..., "machine": ...}``),
as every script prints it (``bench._common.Report``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict

from bench._common import Report
from common.packets import PacketAssembler, encode_packet, packet_crc32c

#: Large batches: encode + decode at least this fraction of plain-copy throughput.
LARGE_TARGET = 0.25


def pixel_batch(envs: int, steps: int) -> TensorDict:
    """An Atari-like batch: stacked 4x84x84 uint8 frames, now and next (~64 MiB at 16x74)."""
    shape = (envs, steps)
    pixels = torch.randint(0, 256, (*shape, 4, 84, 84), dtype=torch.uint8)
    flags = torch.zeros(*shape, 1, dtype=torch.bool)
    return TensorDict(
        {
            "pixels": pixels,
            "action": torch.zeros(*shape, 6, dtype=torch.int64),
            "done": flags,
            "collector": {"traj_ids": torch.zeros(shape, dtype=torch.int64)},
            "next": {
                "pixels": pixels.roll(1, dims=1),
                "reward": torch.ones(*shape, 1),
                "done": flags,
            },
        },
        batch_size=shape,
        names=[None, "time"],
    )


def cartpole_batch(envs: int, steps: int) -> TensorDict:
    """A CartPole-v1 batch with TorchRL's keys, shapes and dtypes."""
    shape = (envs, steps)
    flags = {
        name: torch.zeros(*shape, 1, dtype=torch.bool)
        for name in ("done", "terminated", "truncated")
    }
    return TensorDict(
        {
            "action": torch.zeros(*shape, 2, dtype=torch.int64),
            "observation": torch.randn(*shape, 4),
            **flags,
            "collector": {"traj_ids": torch.zeros(shape, dtype=torch.int64)},
            "next": {
                "observation": torch.randn(*shape, 4),
                "reward": torch.ones(*shape, 1),
                **flags,
            },
        },
        batch_size=shape,
        names=[None, "time"],
    )


def round_trip(batch: TensorDict, crc: bool) -> TensorDict:
    """Actor side then learner side, as the transports run them."""
    packet = encode_packet(batch)
    checksum = packet_crc32c(packet) if crc else None
    assembler = PacketAssembler(packet.nbytes)
    for data in packet.chunks():
        assembler.add(data)
    return assembler.finish(expected_crc32c=checksum)


def per_call(fn: Callable[[], object], inner: int) -> float:
    """Mean wall time of ``inner`` calls of ``fn``."""
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


#: What each timed candidate is, as the table names it.
CANDIDATES = {
    "codec": "encode+chunks+assemble+decode",
    "codec crc32c": "... with crc32c both sides",
    "clone": "tensor.clone() of the same bytes",
    "copy warm": "copy_ into a warm tensor",
}


def measure(report: Report, case: str, batch: TensorDict, reps: int, inner: int) -> float:
    """Times the codec (with and without crc32c) against copies of the same bytes.

    Records one GB/s figure per candidate (``"<case> codec"``, ...) and the ratios
    ``"<case> codec/clone"`` and ``"<case> codec crc32c/clone"``; returns the first ratio.
    The candidates run back to back within each repetition and ratios are taken
    repetition by repetition, so the drift of a shared machine mostly cancels out.
    """
    nbytes = encode_packet(batch).nbytes
    flat = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    warm = torch.empty_like(flat)
    candidates: dict[str, Callable[[], object]] = {
        "codec": lambda: round_trip(batch, crc=False),
        "codec crc32c": lambda: round_trip(batch, crc=True),
        "clone": flat.clone,  # fresh memory each time, like the assembler's buffer
        "copy warm": lambda: warm.copy_(flat),  # memcpy bandwidth, no page faults
    }
    samples: dict[str, list[float]] = {key: [] for key in candidates}
    for fn in candidates.values():
        fn()  # warm-up: allocator, lazy imports
    for _ in range(reps):
        for key, fn in candidates.items():
            samples[key].append(nbytes / per_call(fn, inner) / 1e9)
    report.note(f"{case}: {nbytes / 2**20:.2f} MiB, {batch.numel()} frames a batch")
    for key, gbps in samples.items():
        report.figure(f"{case} {key}", "GB/s", gbps)
    report.figure(
        f"{case} codec frames/s",
        "frames/s",
        [g * 1e9 / nbytes * batch.numel() for g in samples["codec"]],
    )
    report.ratio(f"{case} codec crc32c/clone", f"{case} codec crc32c", f"{case} clone")
    return report.ratio(f"{case} codec/clone", f"{case} codec", f"{case} clone")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs both cases and prints the table, the target and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small batches, few repetitions")
    parser.add_argument("--reps", type=int, default=None, help="samples per figure (default 7)")
    args = parser.parse_args(argv)
    if args.reps is not None and args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    reps = args.reps or (2 if args.quick else 7)
    torch.set_num_threads(1)  # actors and learner decode on one thread each
    report = Report("codec", quick=args.quick)
    report.note("one thread; candidates: " + "; ".join(f"{k}: {v}" for k, v in CANDIDATES.items()))
    large = measure(
        report, "pixels", pixel_batch(16, 8 if args.quick else 74), reps, 1 if args.quick else 3
    )
    measure(report, "cartpole", cartpole_batch(8, 125), reps, 20 if args.quick else 200)
    report.target("pixels codec/clone", large, LARGE_TARGET)
    report.note("cartpole: no target (fixed per-batch cost dominates; see its frames/s)")
    return report.emit()


if __name__ == "__main__":
    main()
