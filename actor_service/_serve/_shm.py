"""The actor's side of weight pushes through shared memory (``common.shm``).

A learner on this host proves it at Describe: it names a probe segment, which the actor
reads back (:func:`probe_ok`), and the actor reports its host identity. A push whose
header names a segment (``WeightsHeader.shm``) is read with :func:`read_push_segment`:
the control is checked (name pattern, owner, mode, size, CRC-32C) before a byte is
trusted, and any doubt raises :class:`~common.shm.ShmError`, which the push answers with
``shm_refused`` and no apply. What was read then goes through the same checks and swap as
a chunked push's bytes.
"""

from __future__ import annotations

import functools

from common.rlfleet.v1 import actor_service_pb2 as pb
from common.shm import Segment, ShmError, host_identity, read_segment, read_segment_into
from common.weights import BlobAssembler

__all__ = ["identity", "probe_ok", "read_push_segment"]


@functools.cache
def identity() -> str:
    """This host's identity, as Describe reports it (read once per process)."""
    return host_identity()


def probe_ok(request: pb.DescribeRequest, enabled: bool) -> bool:
    """Whether the Describe's probe segment was read back and matched its control."""
    if not enabled or not request.HasField("shm_probe"):
        return False
    try:
        read_segment(_control(request.shm_probe))
    except ShmError:
        return False
    return True


def read_push_segment(header: pb.WeightsHeader, enabled: bool, assembler: BlobAssembler) -> None:
    """Read a push's segment straight into its assembler, checked against the header's control.

    The assembler digests the private copy; :meth:`BlobAssembler.finish` checks it.

    Raises:
        ShmError: Shared memory is off here, or the segment cannot be trusted or read.
    """
    if not enabled:
        raise ShmError("this actor takes no pushes through shared memory (--shared-memory false)")
    control = _control(header.shm)
    if control.size != int(header.total_bytes):
        raise ShmError(
            f"segment size {control.size} differs from the push's total_bytes {header.total_bytes}"
        )
    if header.HasField("crc32c") and control.crc32c != header.crc32c:
        raise ShmError("segment crc32c differs from the push's crc32c")
    assembler.add_rest(lambda into: read_segment_into(control, into))


def _control(message: pb.ShmSegment) -> Segment:
    return Segment(name=message.name, size=int(message.size), crc32c=int(message.crc32c))
