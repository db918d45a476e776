"""The exception tree: every error is also the builtin one would catch; codes map both ways."""

from __future__ import annotations

import struct
from collections.abc import Callable

import grpc
import pytest

import common.errors as errors
import learner_client
from common.errors import RlfleetError, from_status, to_status
from common.packets import PacketLimits, decode_packet
from common.weights import decode_weights

_TREE = [getattr(errors, name) for name in errors.__all__] + [
    getattr(learner_client, name) for name in learner_client.__all__
]
_ERRORS = [cls for cls in _TREE if isinstance(cls, type) and issubclass(cls, RlfleetError)]


@pytest.mark.parametrize("cls", [c for c in _ERRORS if c is not RlfleetError], ids=repr)
def test_every_error_is_also_a_builtin_one_would_catch(cls: type[RlfleetError]) -> None:
    builtins = [base for base in cls.__mro__ if base.__module__ == "builtins"]
    assert builtins[0] is not Exception, f"{cls.__name__} subclasses no builtin but Exception"


@pytest.mark.parametrize(
    "cls",
    # EnvError travels as the end of a stream with its fields, not as a status
    [
        c
        for c in _ERRORS
        if c.__module__ == "common.errors" and c not in (RlfleetError, errors.EnvError)
    ],
    ids=repr,
)
def test_a_status_sent_for_an_error_comes_back_as_its_class_or_a_base(
    cls: type[RlfleetError],
) -> None:
    code, details = to_status(cls("weights seq: what went wrong"))
    assert code == cls.status_code
    back = from_status(code, details, peer="10.0.0.7:50051")
    assert isinstance(back, RlfleetError)
    assert cls.status_code == type(back).status_code or isinstance(back, cls)
    assert str(back).startswith(f"10.0.0.7:50051: {code.name}: ")


def test_permission_denied_comes_back_as_permission_denied() -> None:
    back = from_status(grpc.StatusCode.PERMISSION_DENIED, "relay ticket unknown")
    assert isinstance(back, errors.PermissionDeniedError)
    assert isinstance(back, errors.AuthenticationError)  # as before: a narrower class


def _raised(call: Callable[[], object]) -> RlfleetError:
    try:
        call()
    except RlfleetError as exc:
        return exc
    raise AssertionError("nothing raised")


def test_a_cap_refusal_comes_back_as_its_class_not_as_a_busy_actor() -> None:
    # RESOURCE_EXHAUSTED is a busy actor, a blob over its cap or a packet over its cap: each
    # came back as ActorBusyError (a push over --max-weight-bytes: not a WeightsError).
    too_large = struct.pack("<Q", 1 << 62) + b"\xff" * 1024
    refused = [
        _raised(lambda: decode_weights(too_large, max_bytes=1000)),
        _raised(lambda: decode_packet(bytes(100), PacketLimits(max_packet_bytes=10))),
        errors.ActorBusyError.held(0, "a", "resumes only its own session"),
        errors.ActorBusyError.held(0, "a", "resumes only its own session", where="h:1"),
        errors.ActorBusyError("actor 3 is serving 64 calls already"),
    ]
    for exc in refused:
        code, details = to_status(exc)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert type(from_status(code, details)) is type(exc), details
    grpc_cap = "Received message larger than max (5242885 vs. 4194304)"
    back = from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, grpc_cap)
    assert isinstance(back, errors.PacketTooLargeError)
