"""The wire contract keeps its numbers: a renumbered, retyped or dropped field fails here.

Every other test runs both peers on the same generated stubs, so a field renumbered in
``protos/`` (stubs regenerated) passes them all, while a peer of the previous build reads
that field as unset (a batch's seq as 0). ``wire_lock.json`` records, for the protocol
revision it names (``common.config.PROTOCOL_VERSION``), every message field's number, type
and label, every enum value's number, every method's messages and streaming, and the formats
of the bytes inside (a packet's magic and dtypes, the state file's). Within one revision a
field, value or method may be added (then write the lock again:
``PYTHONPATH=. python tests/common/test_wire_lock.py``), none changed; one may go only with
its number reserved. A change a peer of the previous revision would misread raises
``PROTOCOL_VERSION`` first (docs/wire.md), and the lock is written anew for it.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from common.actor_state import STATE_FORMAT
from common.config import PROTOCOL_VERSION
from common.packets._decode import DTYPES, MAGIC, STR
from common.rlfleet.v1 import actor_service_pb2 as pb

LOCK = pathlib.Path(__file__).with_name("wire_lock.json")
_WRITE = "write it again: PYTHONPATH=. python tests/common/test_wire_lock.py"


def _messages(messages: list[Descriptor]) -> list[Descriptor]:
    """``messages`` and their nested messages, parents first."""
    found = []
    for message in messages:
        found += [message, *_messages(list(message.nested_types))]
    return found


def _field(field: FieldDescriptor) -> list[Any]:
    kind = field.message_type or field.enum_type
    label = "repeated" if field.is_repeated else "single"
    type_name = descriptor_pb2.FieldDescriptorProto.Type.Name(field.type)
    return [
        field.name,
        type_name.removeprefix("TYPE_").lower(),
        kind.full_name if kind else "",
        label,
    ]


def contract() -> dict[str, Any]:
    """The wire contract of the generated stubs: what a peer of another build relies on."""
    messages = _messages(list(pb.DESCRIPTOR.message_types_by_name.values()))
    enums = list(pb.DESCRIPTOR.enum_types_by_name.values())
    enums += [enum for message in messages for enum in message.enum_types]
    service = pb.DESCRIPTOR.services_by_name["ActorService"]
    return {
        "protocol_version": PROTOCOL_VERSION,
        "messages": {m.full_name: {str(f.number): _field(f) for f in m.fields} for m in messages},
        "reserved": {m.full_name: _reserved(m) for m in messages if _reserved(m)},
        "enums": {e.full_name: {str(v.number): v.name for v in e.values} for e in enums},
        # What the bytes inside the messages are: a packet's magic and dtypes, a state's format.
        "formats": {
            "packet_magic": MAGIC.decode(),
            "packet_dtypes": sorted([*DTYPES, STR]),
            "actor_state": STATE_FORMAT,
        },
        "methods": {
            m.name: [
                m.input_type.full_name,
                m.output_type.full_name,
                m.client_streaming,
                m.server_streaming,
            ]
            for m in service.methods
        },
    }


def _reserved(message: Descriptor) -> list[int]:
    """The field numbers ``message`` reserves (protobuf keeps them as half-open ranges)."""
    described = descriptor_pb2.DescriptorProto()
    message.CopyToProto(described)
    return [n for r in described.reserved_range for n in range(r.start, r.end)]


def _changes(locked: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What ``now`` changed of ``locked``: every entry a peer of the lock's build relies on."""
    changed = []
    for message, fields in locked["messages"].items():
        current = now["messages"].get(message)
        if current is None:
            changed.append(f"message {message} is gone")
            continue
        reserved = set(now["reserved"].get(message, []))
        for number, field in fields.items():
            if number not in current and int(number) not in reserved:
                changed.append(f"{message}.{field[0]} (field {number}) is gone, unreserved")
            elif number in current and current[number][1:] != field[1:]:
                changed.append(f"{message} field {number}: {field} is now {current[number]}")
    for enum, values in locked["enums"].items():
        current = now["enums"].get(enum, {})
        changed += [
            f"{enum}.{name} ({n}) is gone" for n, name in values.items() if n not in current
        ]
    if now["formats"] != locked["formats"]:
        changed.append(f"the formats {locked['formats']} are now {now['formats']}")
    for method, shape in locked["methods"].items():
        if now["methods"].get(method) != shape:
            changed.append(f"ActorService/{method} {shape} is now {now['methods'].get(method)}")
    return changed


def _entries(tree: dict[str, Any]) -> set[str]:
    """Every message field, enum value and method of a contract, as one name each."""
    found = {f"{m}.{n}" for m, fields in tree["messages"].items() for n in fields}
    found |= {f"{e}={n}" for e, values in tree["enums"].items() for n in values}
    return found | {f"ActorService/{m}" for m in tree["methods"]}


def test_wire_lock_is_of_this_builds_protocol_revision() -> None:
    locked = json.loads(LOCK.read_text())["protocol_version"]
    assert locked == PROTOCOL_VERSION, (
        f"wire_lock.json is of protocol revision {locked}, this build speaks "
        f"{PROTOCOL_VERSION}: {_WRITE}"
    )


def test_wire_lock_no_field_of_this_revision_changed_its_number_or_type() -> None:
    locked = json.loads(LOCK.read_text())
    if locked["protocol_version"] != PROTOCOL_VERSION:
        return  # a new revision may change anything: the test above asks for a new lock
    changed = _changes(locked, contract())
    assert not changed, (
        f"protos/ changed what peers of protocol revision {PROTOCOL_VERSION} rely on: "
        f"{changed}; keep the numbers and types (reserve a removed field's number), or raise "
        f"PROTOCOL_VERSION and MIN_PEER_PROTOCOL in common/config.py and {_WRITE}"
    )


def test_wire_lock_lists_every_field_value_and_method() -> None:
    added = sorted(_entries(contract()) - _entries(json.loads(LOCK.read_text())))
    assert not added, f"protos/ added {added[:20]}: {_WRITE}"


if __name__ == "__main__":
    LOCK.write_text(json.dumps(contract(), indent=1, sort_keys=True) + "\n")
