"""The learner's weight bookkeeping: versions, the weights given, what each worker should hold."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from common.errors import SessionStateError
from common.weights import Part, decode_weights
from learner_client._weights import WeightBook


def test_weight_book_versions_start_at_the_highest_actor_version():
    book = WeightBook()
    book.observe(0, {"policy": 3})
    book.observe(1, {"policy": 7, "critic": 1})
    assert book.versions() == {"policy": 7, "critic": 1}
    enc = book.encode("policy", nn.Linear(2, 1))
    assert enc.version == 8
    state, meta = decode_weights(enc.blob)
    assert set(state) == {"weight", "bias"}
    assert meta["model_id"] == "policy"


def test_weight_book_reencodes_the_last_source_as_it_is_now():
    book = WeightBook()
    module = nn.Linear(1, 1)
    first = book.encode("policy", module)
    with torch.no_grad():
        module.weight.fill_(5.0)
    second = book.encode("policy", None)
    assert (first.version, second.version) == (1, 2)
    assert decode_weights(second.blob)[0]["weight"].item() == 5.0
    with pytest.raises(SessionStateError, match="critic"):
        book.encode("critic", None)


def test_weight_book_pending_returns_what_a_restarted_worker_lacks():
    book = WeightBook()
    enc = book.encode("policy", nn.Linear(1, 1))
    book.addressed([0, 1], enc)
    book.acknowledged(0, "policy", enc.version)
    assert book.pending(0, {"policy": enc.version}) == []
    assert book.pending(0, {"policy": 0}) == [enc]  # restarted: version back to 0
    assert book.pending(1, {"policy": 0}) == [enc]  # never applied


def test_weight_book_due_counts_batches_since_the_last_update():
    book = WeightBook()
    book.observe(0, {"policy": 0})
    assert book.due(0, 0)  # never updated by this learner
    book.acknowledged(0, "policy", 1)
    assert not book.due(0, 0)
    book.count_batch(0)
    assert book.due(0, 0)
    assert not book.due(0, 1)
    book.count_batch(0)
    assert book.due(0, 1)
    assert not book.due(0, None)


def test_weight_book_encodes_a_per_worker_push_under_one_version():
    book = WeightBook()
    shared = {"w": torch.zeros(2)}
    pushes = book.encode_for("policy", {0: {"w": torch.ones(2)}, 1: shared, 2: shared})
    assert {enc.version for enc in pushes.values()} == {1}
    assert pushes[1].blob == pushes[2].blob != pushes[0].blob
    # "The last weights given" is each worker's own.
    again = book.encode_for("policy", {0: None, 1: None})
    assert again[0].blob == pushes[0].blob
    assert again[1].blob == pushes[1].blob
    assert again[0].version == 2
    # Shared weights given later replace the per-worker ones.
    book.encode("policy", {"w": torch.full((2,), 3.0)})
    assert book.encode_for("policy", {0: None})[0].blob == book.encode("policy", None).blob


def test_weight_book_takes_an_explicit_version_and_never_falls_back():
    book = WeightBook()
    assert book.claim_version("policy", None) == 1
    assert book.claim_version("policy", None, 10) == 10
    assert book.claim_version("policy", None, 4) == 4  # as given; the actor judges it
    assert book.versions() == {"policy": 10}
    assert book.claim_version("policy", None) == 11


def test_weight_book_never_takes_a_part_for_the_model_s_last_weights():
    book = WeightBook()
    shard = {"w": torch.ones(1)}
    encoded = book.encode("policy", shard, version=5, part=Part(0, 2))
    assert (encoded.version, encoded.part) == (5, Part(0, 2))
    with pytest.raises(SessionStateError, match="no weights were given"):
        book.source("policy")
