"""What a push sends: ``update_policy_weights_``'s arguments normalised into one request, its
targets checked, and the learner's weight bookkeeping (versions, the weights given, what each
worker should hold)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torch import nn

from common.config import MAX_POLICY_VERSION
from common.errors import SessionStateError, UnknownWorkerError
from common.weights import Part, decode_weights
from learner_client._update_args import normalize_update_args, resolve_worker_ids
from learner_client._weights import PushOptions, WeightBook


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


def test_weight_book_takes_a_reply_only_from_the_process_it_last_observed():
    book = WeightBook()
    book.observe(0, {"policy": 3}, epoch=11)
    assert book.acknowledged(0, "policy", 4, epoch=11)
    book.observe(0, {"policy": 0}, epoch=12)  # restarted with its initial weights
    assert not book.acknowledged(0, "policy", 5, epoch=11)  # its predecessor's late reply
    assert book.applied(0) == {"policy": 0}
    assert book.versions() == {"policy": 4}
    assert book.acknowledged(0, "policy", 5, epoch=12)
    assert book.acknowledged(0, "policy", 6)  # an actor that predates reply epochs
    assert book.applied(0) == {"policy": 6}


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


def test_weight_book_keeps_weights_restored_on_several_actors_once():
    book = WeightBook()
    weights = {"weight": torch.arange(6.0).reshape(2, 3), "bias": torch.zeros(2)}
    copy = {name: tensor.clone() for name, tensor in weights.items()}
    other = {"weight": torch.ones(2, 3), "bias": torch.zeros(2)}
    book.restored(0, {"policy": 3}, {"policy": (3, weights)})
    book.restored(1, {"policy": 3}, {"policy": (3, copy)})
    book.restored(2, {"policy": 3}, {"policy": (3, other)})
    book.restored(3, {"policy": 2}, {"policy": (2, weights)})
    (first,), (second,), (third,), (older,) = (book.pending(w, {"policy": 0}) for w in range(4))
    assert second is first  # one blob for the same bytes at the same version
    assert third is not first
    assert older is not first
    assert torch.equal(decode_weights(third.blob)[0]["weight"], other["weight"])
    assert torch.equal(decode_weights(first.blob)[0]["weight"], weights["weight"])
    assert older.version == 2


def _encode_then_fail(book, *model_ids, beside=None):
    """Encode each model under one take-back, run ``beside`` (another thread), then raise."""
    with book.taken_back_on_error(model_ids):
        for model_id in model_ids:
            book.encode(model_id, nn.Linear(1, 1))
        if beside is not None:
            other = threading.Thread(target=beside)
            other.start()
            other.join()
        raise RuntimeError("the next model failed to encode")


def test_weight_book_takes_back_what_a_call_that_raised_claimed_unless_claimed_since():
    book = WeightBook()
    first = nn.Linear(1, 1)
    book.encode("policy", first)
    with pytest.raises(RuntimeError, match="failed to encode"):
        _encode_then_fail(book, "policy", "critic")
    assert book.versions() == {"policy": 1}
    assert book.source("policy") is first
    # Another thread's push took version 3 meanwhile (and may have been sent): it stays.
    since = nn.Linear(1, 1)
    with pytest.raises(RuntimeError, match="failed to encode"):
        _encode_then_fail(book, "policy", beside=lambda: book.encode("policy", since))
    assert book.versions() == {"policy": 3}
    assert book.source("policy") is since


def test_weight_book_keeps_the_newer_push_when_an_older_ones_verdict_comes_last():
    """Two threads' pushes to one worker: the older one's verdict, recorded last (applied,
    failed on a cut, or refused on re-admission), leaves the newer as held and to re-send."""
    book = WeightBook()
    book.observe(0, {"policy": 0})
    older = book.encode("policy", nn.Linear(1, 1))
    newer = book.encode("policy", nn.Linear(1, 1))
    book.addressed([0], newer)
    book.acknowledged(0, "policy", newer.version)
    book.addressed([0], older)  # applied before the newer, or failed transiently
    book.acknowledged(0, "policy", older.version)
    assert book.applied(0) == {"policy": newer.version}
    assert book.addressed_to(0, "policy") is newer
    assert book.should_hold(0, "policy") == newer.version
    book.forget(0, "policy", older.version)  # the older one refused on re-admission
    assert book.addressed_to(0, "policy") is newer
    assert book.pending(0, {"policy": 0}) == [newer]  # restarted: given the newer
    book.forget(0, "policy", newer.version)
    assert book.addressed_to(0, "policy") is None


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


def test_weight_book_counters_never_fall_behind_a_restarted_actor_or_an_older_ack():
    book = WeightBook()
    book.observe(0, {"policy": 7})
    book.observe(1, {"policy": 0})  # restarted afresh: its report is not the learner's counter
    book.acknowledged(1, "policy", 2)  # an older push re-sent to it on re-admission
    assert book.versions() == {"policy": 7}
    assert book.encode("policy", nn.Linear(1, 1)).version == 8  # never a version spent


def test_weight_book_refuses_a_version_past_the_int64_range_and_spends_none():
    book = WeightBook()
    book.restore_versions({"policy": MAX_POLICY_VERSION})
    with pytest.raises(ValueError, match="no later version exists"):
        book.encode("policy", nn.Linear(1, 1))
    assert book.versions() == {"policy": MAX_POLICY_VERSION}


def test_weight_book_never_takes_a_part_for_the_model_s_last_weights():
    book = WeightBook()
    shard = {"w": torch.ones(1)}
    encoded = book.encode("policy", shard, version=5, part=Part(0, 2))
    assert (encoded.version, encoded.part) == (5, Part(0, 2))
    with pytest.raises(SessionStateError, match="no weights were given"):
        book.source("policy")


def test_normalize_update_args_accepts_every_torchrl_form():
    module = nn.Linear(2, 2)
    td = TensorDict.from_module(module)
    assert normalize_update_args(module).sources == {"policy": module}
    assert normalize_update_args(weights=td).sources == {"policy": td}
    assert normalize_update_args(policy=module, model_id="critic").sources == {"critic": module}
    assert normalize_update_args().sources == {"policy": None}
    request = normalize_update_args(weights_dict={"policy": td, "critic": {"w": torch.ones(1)}})
    assert request.nested
    assert set(request.sources) == {"policy", "critic"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"policy_or_weights": {"w": torch.ones(1)}, "weights": {"w": torch.ones(1)}},
            "policy_or_weights and weights",
        ),
        ({"weights": {"w": torch.ones(1)}, "policy": nn.Linear(1, 1)}, "weights and policy"),
        ({"weights_dict": {"policy": {}}, "model_id": "policy"}, "model_id"),
        ({"weights_dict": {"policy": {}}, "policy": nn.Linear(1, 1)}, "policy"),
        ({"weights_dict": {}}, "empty"),
        ({"worker_ids": []}, "empty"),
        ({"model_id": ""}, "model_id"),
    ],
)
def test_normalize_update_args_raises_if_arguments_conflict(kwargs, message):
    with pytest.raises(ValueError, match=message):
        normalize_update_args(**kwargs)


def test_normalize_update_args_raises_if_types_are_wrong():
    with pytest.raises(TypeError, match=r"nn\.Module"):
        normalize_update_args(policy={"w": torch.ones(1)})
    with pytest.raises(TypeError, match="dict of tensors, got int"):
        normalize_update_args(42)
    with pytest.raises(TypeError, match="ints"):
        normalize_update_args(worker_ids=[0, "1"])
    with pytest.raises(TypeError, match="ints"):
        normalize_update_args(worker_ids=True)


def test_normalize_update_args_dedupes_worker_ids_in_order():
    assert normalize_update_args(worker_ids=3).worker_ids == (3,)
    assert normalize_update_args(worker_ids=[2, 0, 2]).worker_ids == (2, 0)


def test_resolve_worker_ids_raises_if_an_id_is_unknown_naming_the_known_ones():
    assert resolve_worker_ids(None, [4, 1]) == [1, 4]
    with pytest.raises(UnknownWorkerError, match=r"\[7\].*\[1, 4\]") as info:
        resolve_worker_ids((1, 7), [4, 1])
    assert isinstance(info.value, LookupError)


def test_resolve_worker_ids_says_when_an_unknown_id_is_another_ranks_actor():
    with pytest.raises(UnknownWorkerError, match=r"\[5\] are other learner ranks' actors"):
        resolve_worker_ids((1, 5), [4, 1], members=[1, 4, 5])
    with pytest.raises(UnknownWorkerError) as info:
        resolve_worker_ids((7,), [4, 1], members=[1, 4, 5])
    assert "other learner ranks" not in str(info.value)


def test_normalize_update_args_refuses_a_delta_of_per_worker_weights_or_a_non_bool_delta():
    w = {"w": torch.zeros(1)}
    with pytest.raises(ValueError, match="per-worker weights go in full"):
        normalize_update_args({0: w, 1: w}, delta=True)
    with pytest.raises(TypeError, match="delta must be a bool"):
        normalize_update_args(w, delta=1)
    assert normalize_update_args(w, delta=True).delta


def test_normalize_update_args_accepts_torchrl_per_worker_mapping():
    w0, w1 = {"w": torch.zeros(1)}, TensorDict({"w": torch.ones(1)}, [])
    request = normalize_update_args({0: w0, 1: w1})
    assert request.per_worker == {0: w0, 1: w1}
    assert request.worker_ids == (0, 1)
    assert request.sources == {"policy": None}
    assert normalize_update_args(weights={2: w1}, model_id="critic").sources == {"critic": None}
    # A state dict keyed by parameter names is not a per-worker mapping.
    assert normalize_update_args({"w": torch.zeros(1)}).per_worker is None
    # Worker ids as TorchRL takes them: numpy's and one-element tensors, as Python ints.
    request = normalize_update_args({np.int64(0): w0, torch.tensor(1): w1})
    assert request.per_worker == {0: w0, 1: w1}
    assert [type(w) for w in request.worker_ids] == [int, int]


def test_normalize_update_args_raises_if_per_worker_mapping_is_malformed():
    w = {"w": torch.zeros(1)}
    with pytest.raises(ValueError, match="not both"):
        normalize_update_args({0: w}, worker_ids=[0])
    with pytest.raises(ValueError, match="empty"):
        normalize_update_args({})
    with pytest.raises(TypeError, match="worker_ids"):
        normalize_update_args({0: w, "w": torch.zeros(1)})
    with pytest.raises(TypeError, match=r"\[1\]"):
        normalize_update_args({1: "weights"})
    with pytest.raises(ValueError, match="weights_dict"):
        normalize_update_args({0: w}, weights_dict={"policy": w})
    with pytest.raises(ValueError, match="worker_id 0 twice"):
        normalize_update_args({0: w, torch.tensor(0): w})


def test_normalize_update_args_refuses_a_mapping_of_many_ids_and_one_key_at_once():
    """The mapping's other keys were found pairwise (66 s here, hours for 10^6 ids)."""
    w = {"w": torch.zeros(1)}
    started = time.monotonic()
    with pytest.raises(TypeError, match=r"also has \['w'\]"):
        normalize_update_args({**dict.fromkeys(range(10**5), w), "w": torch.zeros(1)})
    assert time.monotonic() - started < 5


def test_normalize_update_args_takes_a_version_and_a_part():
    shard = {"w": torch.ones(1)}
    request = normalize_update_args(shard, version=7, part=(1, 2))
    assert (request.version, request.part) == (7, Part(1, 2))
    assert normalize_update_args(shard, version=7, part=Part(0, 1)).part == Part(0, 1)
    assert normalize_update_args(shard, version=2**63 - 1).part is None


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"version": 0}, ValueError, r"version must be in \[1"),
        ({"version": 2**63}, ValueError, "version must be in"),
        ({"version": True}, TypeError, "version must be an int"),
        ({"version": 1.0}, TypeError, "version must be an int"),
        ({"part": (0, 2)}, ValueError, "part= needs version="),
        ({"version": 1, "part": (2, 2)}, ValueError, "index 2"),
        ({"version": 1, "part": (0, 0)}, ValueError, "count 0"),
        ({"version": 1, "part": (0, 2**32 - 1)}, ValueError, "4294967295"),
        ({"version": 1, "part": 2}, TypeError, r"\(index, count\)"),
        ({"version": 1, "part": (0, 1, 2)}, TypeError, r"\(index, count\)"),
        ({"version": 1, "part": ("0", 2)}, ValueError, "must be an int"),
    ],
)
def test_normalize_update_args_raises_if_version_or_part_is_bad(kwargs, error, message):
    with pytest.raises(error, match=message):
        normalize_update_args({"w": torch.ones(1)}, **kwargs)


def test_normalize_update_args_takes_a_part_without_a_tensor_and_nothing_else_empty():
    """A rank may hold no key of the model (more ranks than keys): its part is empty, and
    the actor still counts it. A whole push of no tensor would change nothing: refused."""
    for empty in ({}, TensorDict(), {"layer": {}}, {"layer": TensorDict()}):
        assert normalize_update_args(empty, version=3, part=(1, 2)).part == Part(1, 2)
        with pytest.raises(ValueError, match="given for model_id 'policy' hold no tensor"):
            normalize_update_args(empty)
    with pytest.raises(ValueError, match="given for model_id 'critic' hold no tensor"):
        normalize_update_args(weights_dict={"policy": None, "critic": TensorDict()})
    with pytest.raises(ValueError, match="given for worker_id 1 hold no tensor"):
        normalize_update_args({0: {"w": torch.zeros(1)}, 1: TensorDict()})


def test_normalize_update_args_raises_if_a_part_lacks_its_weights():
    with pytest.raises(ValueError, match="this rank's weights"):
        normalize_update_args(version=3, part=(0, 2))  # "the last weights given"
    with pytest.raises(ValueError, match="this rank's weights"):
        normalize_update_args({0: {"w": torch.ones(1)}}, version=3, part=(0, 2))
    trainable = PushOptions(only_trainable=True)
    with pytest.raises(ValueError, match="only_trainable"):
        normalize_update_args(nn.Linear(1, 1), version=3, part=(0, 2), options=trainable)
