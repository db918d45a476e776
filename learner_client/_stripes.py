"""Pushes striped over parallel streams: one push's parts, each on a connection of its own.

One gRPC connection from Python moves about 1 GB/s (and one TCP connection's window bounds
it further on a long link), so one stream can leave a 25 or 100 Gbit link mostly idle for a
large push. With ``WeightPushSettings(streams=K)``, a full push of at least
``K x`` :data:`MIN_STRIPE_BYTES` to an actor reached over the network is cut by keys into up
to K parts of about equal bytes (``common.weights.split_blob``: each part a header of its own
before a run of the one encoded blob, a view, never a copy), and part ``i`` travels as part
``(i, K)`` of the push's version on connection ``i`` to that actor, all at once. The actor
checks each part as any push (CRC-32C or sha256 of the part, keys, shapes, dtypes, values)
and swaps the version in whole, under the model's lock, when the last part arrives
(``actor_service._serve._parts``); until then the version before stays in force, and parts
that never complete expire after the actor's part deadline. The learner reads the parts'
replies as the actor's one verdict on the push: applied when one part completed it, failed
with the first part's error otherwise.

What goes as one stream: actors on this host (shared memory), relayed pushes (one upload
down a chain), a delta, a subset push (``only_trainable``, a mapping of some keys: parts
must hold every key between them), a part of a multi-part push from several ranks, a blob
too small to give two parts of :data:`MIN_STRIPE_BYTES`, a model of one large tensor
(a tensor is never cut), an actor that takes no multi-part pushes, and a version sent to
the same actor process striped before (a re-send after a failure: the parts that reached
it may be staged there, and the same parts again would be refused as replays).
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading

from common.rlfleet.v1 import actor_service_pb2 as pb
from common.weights import crc32c, split_blob
from learner_client._transport import PushMessages, encode_header
from learner_client._weights import EncodedWeights

__all__ = ["MIN_STRIPE_BYTES", "StripeRoute", "Striped"]

#: The smallest part of a striped push: below it the extra stream's round trips cost more
#: than it saves.
MIN_STRIPE_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class Striped:
    """The messages of one striped push: per part, its header and chunks.

    Attributes:
        parts: Part ``i``'s messages, sent on connection ``i``.
    """

    parts: list[PushMessages]


@dataclasses.dataclass(eq=False)
class StripeRoute:
    """Which pushes are striped, their parts' messages, and how many went so.

    Attributes:
        streams: The most parallel streams per push (``WeightPushSettings.streams``);
            1 stripes nothing.
    """

    streams: int = 1
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False)
    _striped: int = dataclasses.field(default=0, init=False)
    # Per (worker_id, model_id): the (epoch, version) last offered striped.
    _offered: dict[tuple[int, str], tuple[int, int]] = dataclasses.field(
        default_factory=dict, init=False
    )

    def first_offer(self, worker_id: int, epoch: int, enc: EncodedWeights) -> bool:
        """Whether ``enc``'s version was never offered striped to this actor process; noted.

        A version striped to an actor once goes whole after: the parts that reached it
        may be staging, and the same parts again would be refused as replays.
        """
        key, offer = (worker_id, enc.model_id), (epoch, enc.version)
        with self._lock:
            first = self._offered.get(key) != offer
            self._offered[key] = offer
        return first

    def striped(self, enc: EncodedWeights, chunk_bytes: int) -> Striped | None:
        """``enc``'s parts' messages when it is striped; None when it goes as one stream.

        The caller has ruled out what the push's target decides (an actor on this host, a
        relayed push, an actor that takes no parts); this rules on the push itself.
        """
        size = memoryview(enc.blob).nbytes
        count = min(self.streams, size // MIN_STRIPE_BYTES)
        if count < 2 or enc.base_version is not None or enc.part is not None:
            return None
        try:
            parts = split_blob(enc.blob, count)
        except ValueError:  # a subset push: parts must hold every key between them
            return None
        if len(parts) < 2:  # one tensor holds most of the model
            return None
        messages = []
        for piece in parts:
            sha, crc = _digests(piece.header, piece.data, enc)
            header = pb.WeightsHeader(
                model_id=enc.model_id,
                version=enc.version,
                total_bytes=piece.nbytes,
                sha256=sha,
                crc32c=crc,
                part=pb.PartOf(index=piece.part.index, count=piece.part.count),
            )
            messages.append(
                PushMessages(encode_header(header), piece.data, chunk_bytes, piece.header)
            )
        return Striped(messages)

    def count(self, pushes: int) -> None:
        """Count actor pushes sent striped."""
        with self._lock:
            self._striped += pushes

    def stats(self) -> dict[str, int]:
        """The counter of ``GrpcCollector.stats()``: ``striped_pushes``, actor pushes striped."""
        with self._lock:
            return {"striped_pushes": self._striped}


def _digests(header: bytes, data: memoryview, enc: EncodedWeights) -> tuple[str, int | None]:
    """A part's digests, of the kinds the whole push carries (its sha256, its CRC-32C)."""
    sha = ""
    if enc.sha256:
        digest = hashlib.sha256(header)
        digest.update(data)
        sha = digest.hexdigest()
    crc = None if enc.crc32c is None else crc32c(data, crc32c(header))
    return sha, crc
