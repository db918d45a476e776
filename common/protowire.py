"""Protocol-buffer wire encoding for the few messages we serialise by hand.

Large chunk messages (Collect responses on the actor, PushWeights requests on
the learner) are composed from bytes so their payload is copied once, off the
event loop; a length-delimited field is its tag, the payload length as a
varint, then the payload. Tests compare every composition with protobuf's own
``SerializeToString``.
"""

from __future__ import annotations

__all__ = ["varint"]


def varint(value: int) -> bytes:
    """Encode a non-negative int as a protobuf base-128 varint."""
    if value < 0:
        raise ValueError(f"varint takes a non-negative int, got {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
