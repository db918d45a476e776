"""The exception tree: every error is also the builtin one would catch; codes map both ways."""

from __future__ import annotations

import grpc
import pytest

import common.errors as errors
import learner_client
from common.errors import RlfleetError, from_status, to_status

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
