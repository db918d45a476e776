"""The hostile actor harness of this folder: a real gRPC server speaking rlfleet.v1.

It answers Describe with a real actor's description (``real_description``; the fixture
``description`` in ``conftest.py``) and a ``Collect`` with ``opened`` and then the batches a
test builds, byte for byte as an actor frames them (``batch``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import torch
from tensordict import TensorDict

from actor_service import ActorConfig, create_server
from common.packets import encode_packet, packet_crc32c
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc

U64 = 2**64 - 1
U32 = 2**32 - 1
FRAMES = 8  # one env, 8 steps a batch
EPOCH = 41

Batch = Callable[[int], pb.CollectResponse]


def data_of_size(batch_size: list[int], *, empty: bool = False) -> TensorDict:
    """A CartPole-like batch of ``batch_size`` (no entries at all when ``empty``)."""
    if empty:
        return TensorDict({}, batch_size=batch_size)
    done = torch.zeros(*batch_size, 1, dtype=torch.bool)
    return TensorDict(
        {
            "observation": torch.zeros(*batch_size, 4),
            "action": torch.zeros(*batch_size, dtype=torch.int64),
            "done": done,
            "next": {"observation": torch.zeros(*batch_size, 4), "done": done.clone(),
                     "reward": torch.ones(*batch_size, 1)},
        },
        batch_size=batch_size,
    )  # fmt: skip


def batch(seq: int, td: TensorDict | None = None, **info: Any) -> pb.CollectResponse:
    """Batch ``seq`` as one chunk; ``info`` overrides what an honest actor would say."""
    packet = encode_packet(data_of_size([1, FRAMES]) if td is None else td)
    fields = {"worker_id": 0, "epoch": EPOCH, "seq": seq, "frames": FRAMES, "model_id": "policy"}
    fields |= info
    described = pb.BatchInfo(total_bytes=packet.nbytes, crc32c=packet_crc32c(packet), **fields)
    chunk = pb.BatchChunk(seq=seq, index=0, count=1, data=packet.tobytes(), info=described)
    return pb.CollectResponse(chunk=chunk)


class HostileActor(pb_grpc.ActorServiceServicer):
    """Describes itself as ``description`` says and sends ``batches(seq)`` for seq 1, 2..."""

    def __init__(self, description: pb.DescribeResponse, batches: Batch) -> None:
        self.description = description
        self.batches = batches
        self.sessions = 0
        self._lock = threading.Lock()

    def Describe(self, request: pb.DescribeRequest, context: Any) -> pb.DescribeResponse:
        return self.description

    def Collect(self, requests: Iterator[pb.CollectRequest], context: Any) -> Any:
        opening = next(requests).open
        with self._lock:
            self.sessions += 1
        worker_id = self.description.worker_id
        yield pb.CollectResponse(
            opened=pb.SessionOpened(worker_id=worker_id, epoch=EPOCH, next_seq=1)
        )
        seq = 1
        later = (r.credit.batches if r.HasField("credit") else 0 for r in requests)
        for granted in itertools.chain([opening.credits], later):  # a batch per credit
            for _ in range(granted):
                yield self.batches(seq)
                seq += 1


def real_description() -> pb.DescribeResponse:
    """A real CartPole actor's Describe, under the hostile actor's epoch."""
    config = ActorConfig(host="127.0.0.1", port=0, num_envs=1)  # CartPole-v1
    with create_server(config).run_in_thread() as actor:
        channel = grpc.insecure_channel(f"127.0.0.1:{actor.port}")
        reply = pb_grpc.ActorServiceStub(channel).Describe(pb.DescribeRequest(), timeout=10)
        channel.close()
    reply.epoch = EPOCH
    return reply


def serve(servicer: HostileActor) -> tuple[grpc.Server, str]:
    """``servicer`` on a loopback gRPC server: the server and its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_ActorServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"
