"""Protocol-buffer wire encoding for the few messages we serialise by hand.

Large chunk messages (Collect responses on the actor, PushWeights requests on
the learner) are composed from bytes so their payload is copied once, off the
event loop; a length-delimited field is its tag, the payload length as a
varint, then the payload. Tests compare every composition with protobuf's own
``SerializeToString``. :func:`length_delimited` reads such a field back without
copying its payload (the actor's PushWeights chunks).
"""

from __future__ import annotations

__all__ = ["length_delimited", "varint"]


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


def length_delimited(data: bytes, tag: int) -> memoryview | None:
    """The payload of ``data`` if it is exactly one length-delimited field with ``tag``.

    Returns a zero-copy view of the payload, or None when ``data`` is anything
    else (another tag, a truncated or overlong varint, trailing bytes), which the
    caller then hands to protobuf's own parser.
    """
    if not data or data[0] != tag:
        return None
    length, shift, pos = 0, 0, 1
    while pos < len(data) and shift < 64:
        byte = data[pos]
        length |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return memoryview(data)[pos:] if len(data) - pos == length else None
        shift += 7
    return None
