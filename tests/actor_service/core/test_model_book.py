"""ModelBook: an actor's models by model_id, each registered once, a wrong id refused by name."""

from __future__ import annotations

import types

import pytest

from actor_service._core._model_book import ModelBook
from common.errors import UnknownModelError


def _model(version: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(module=None, version=version)


def test_a_model_id_is_registered_once_and_the_first_model_is_kept() -> None:
    book = ModelBook({"policy": _model(1)})
    book.add("critic", _model(2))
    with pytest.raises(ValueError, match="'policy' is registered already"):
        book.add("policy", _model(3))
    assert book.model_ids == ("policy", "critic")
    assert (book.policy_version("policy"), book.policy_version("critic")) == (1, 2)


@pytest.mark.parametrize("model_id", ["value", ["policy"], None])
def test_an_unknown_or_unhashable_model_id_is_refused_naming_the_known_ones(model_id) -> None:
    book = ModelBook({"policy": _model(0)})
    with pytest.raises(UnknownModelError, match=r"known model_ids: \['policy'\]"):
        book.policy_version(model_id)
