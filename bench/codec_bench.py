"""Throughput of the packet codec on the path a batch really takes, against a plain copy.

One round trip is what the transports do: ``encode_packet`` on the actor, ``chunks()``
(one copy into each chunk message), then ``PacketAssembler.add`` for every chunk (one
copy into the destination) and ``finish()`` on the learner, which decodes views. It is
timed with and without the CRC-32C the transports add, on (a) a ~64 MiB uint8 pixel
batch and (b) a 1,000-frame CartPole batch, each against ``tensor.clone()`` of a tensor
holding the same number of bytes. Run ``python -m bench.codec_bench [--quick] [--reps N]``;
the last line of stdout is one JSON object (``{"bench": "codec", ...}``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from tensordict import TensorDict

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


def measure(name: str, batch: TensorDict, reps: int, inner: int) -> dict[str, object]:
    """Times the codec (with and without crc32c) against copies of the same bytes.

    The candidates run back to back within each repetition and ratios are taken
    repetition by repetition, so the drift of a shared machine mostly cancels out.
    """
    nbytes = encode_packet(batch).nbytes
    flat = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    warm = torch.empty_like(flat)
    candidates: dict[str, Callable[[], object]] = {
        "codec": lambda: round_trip(batch, crc=False),
        "codec_crc32c": lambda: round_trip(batch, crc=True),
        "clone": flat.clone,  # fresh memory each time, like the assembler's buffer
        "copy_warm": lambda: warm.copy_(flat),  # memcpy bandwidth, no page faults
    }
    samples: dict[str, list[float]] = {key: [] for key in candidates}
    for fn in candidates.values():
        fn()  # warm-up: allocator, lazy imports
    for _ in range(reps):
        for key, fn in candidates.items():
            samples[key].append(per_call(fn, inner))
    result: dict[str, object] = {"frames": batch.numel(), "frame_bytes": nbytes, "reps": reps}
    for key, times in samples.items():
        result[f"{key}_gbps"] = nbytes / statistics.median(times) / 1e9
        result[f"{key}_ms"] = statistics.median(times) * 1e3
    for key in ("codec", "codec_crc32c"):
        ratios = [c / t for c, t in zip(samples["clone"], samples[key], strict=True)]
        result[f"{key}_vs_clone"] = statistics.median(ratios)
    lines = [f"{name}: {nbytes / 2**20:.2f} MiB, {batch.numel()} frames, median of {reps}"]
    labels = {
        "codec": "encode+chunks+assemble+decode",
        "codec_crc32c": "... with crc32c both sides",
        "clone": "tensor.clone() of same bytes",
        "copy_warm": "copy_ into a warm tensor",
    }
    for key, label in labels.items():
        lines.append(
            f"  {label:<31}{result[key + '_gbps']:7.2f} GB/s  ({result[key + '_ms']:.3f} ms)"
        )
    lines.append(f"  codec / clone {result['codec_vs_clone']:.3f}, "
                 f"with crc32c {result['codec_crc32c_vs_clone']:.3f}")  # fmt: skip
    print("\n".join(lines), flush=True)
    return result


def main(argv: list[str] | None = None) -> dict[str, object]:
    """Runs both cases and prints the figures, the target and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small batches, few repetitions")
    parser.add_argument("--reps", type=int, default=None, help="samples per figure (default 7)")
    args = parser.parse_args(argv)
    if args.reps is not None and args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    reps = args.reps or (2 if args.quick else 7)
    torch.set_num_threads(1)  # actors and learner decode on one thread each
    large = measure(
        "pixels", pixel_batch(16, 8 if args.quick else 74), reps, 1 if args.quick else 3
    )
    small = measure("cartpole", cartpole_batch(8, 125), reps, 20 if args.quick else 200)
    met = large["codec_vs_clone"] >= LARGE_TARGET
    print(
        f"target: large-batch codec >= {LARGE_TARGET:.0%} of clone throughput: "
        f"{large['codec_vs_clone']:.1%} {'MET' if met else 'NOT MET'}"
        f"{' (quick run: figures not meaningful)' if args.quick else ''}\n"
        "cartpole: no target (fixed per-batch cost dominates; see frames/s in the JSON)",
        flush=True,
    )
    small["frames_per_s"] = small["frames"] / (small["codec_ms"] / 1e3)
    payload = {
        "bench": "codec",
        "quick": args.quick,
        "threads": torch.get_num_threads(),
        "pixels": large,
        "cartpole": small,
        "targets": [
            {
                "name": "pixels codec/clone",
                "value": large["codec_vs_clone"],
                "threshold": LARGE_TARGET,
                "met": met,
            }
        ],
    }
    print(json.dumps(payload, sort_keys=True), flush=True)
    return payload


if __name__ == "__main__":
    main()
