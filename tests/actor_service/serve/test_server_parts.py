"""Multi-part pushes on an in-process actor: parts staged, the version applied whole; every refusal.

Parts are sent through the generated stubs, as a hostile or buggy learner rank could send
them; each refusal is checked for its status code and message, and after it the actor
still serves, holds its old weights and version, and takes the next good version.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch
from actor_harness import Actor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import poll_until

from actor_service._serve._logging import configure_logging, get_logger
from actor_service._serve._parts import PartStaging
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.weights import crc32c, encode_delta, encode_weights, iter_blob_chunks

STAGED, COMPLETED = pb.PUSH_OUTCOME_STAGED, pb.PUSH_OUTCOME_COMPLETED
INVALID, ABORTED = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ABORTED


def _requests(
    blob: bytes | memoryview,
    version: int,
    index: int,
    count: int,
    *,
    base_version: int | None = None,
    crc: int | None = None,
) -> Iterator[pb.PushWeightsRequest]:
    header = pb.WeightsHeader(
        model_id="policy",
        version=version,
        total_bytes=len(blob),
        crc32c=crc32c(blob) if crc is None else crc,
        base_version=base_version,
        part=pb.PartOf(index=index, count=count),
    )
    yield pb.PushWeightsRequest(header=header)
    for piece in iter_blob_chunks(blob, 4096):
        yield pb.PushWeightsRequest(chunk=bytes(piece))


def _part(actor: Actor, state: dict, version: int, index: int, count: int, **kw: object) -> object:
    blob = encode_weights(state, subset=True, dtype=kw.pop("dtype", None))  # type: ignore[arg-type]
    return actor.stub.PushWeights(_requests(blob, version, index, count, **kw), timeout=30)


def _refused(actor: Actor, state: dict, version: int, index: int, count: int, **kw: object):
    with pytest.raises(grpc.RpcError) as error:
        _part(actor, state, version, index, count, **kw)
    return error.value


def _live(actor: Actor) -> dict[str, torch.Tensor]:
    module = actor.worker.models.module("policy")
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _version(actor: Actor) -> int:
    described = actor.stub.Describe(pb.DescribeRequest(), timeout=10)
    return next(m.version for m in described.models if m.model_id == "policy")


def _halves(actor: Actor, seed: int) -> tuple[dict, dict]:
    """A random state of the actor's policy, split in two halves of its keys."""
    torch.manual_seed(seed)
    state = {k: torch.randn_like(v) for k, v in _live(actor).items()}
    keys = sorted(state)
    return {k: state[k] for k in keys[::2]}, {k: state[k] for k in keys[1::2]}


def _assert_holds(actor: Actor, state: dict, version: int) -> None:
    live = _live(actor)
    assert live.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(live[key], value.to(live[key].dtype)), key
    assert _version(actor) == version
    health = health_pb2_grpc.HealthStub(actor.channel)
    reply = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture
def parts_actor(make_actor) -> Actor:
    return make_actor(part_deadline_s=1.5)


def test_parts_are_staged_then_applied_whole_with_the_last_one(parts_actor: Actor) -> None:
    actor = parts_actor
    before = _live(actor)
    first, second = _halves(actor, 1)
    staged = _part(actor, first, 1, 0, 2)
    assert (staged.outcome, staged.version, staged.parts_staged) == (STAGED, 0, 1)
    assert staged.pause_seconds == 0.0
    _assert_holds(actor, before, 0)  # nothing of version 1 yet
    done = _part(actor, second, 1, 1, 2)
    assert (done.outcome, done.version, done.parts_staged) == (COMPLETED, 1, 2)
    assert done.pause_seconds > 0.0
    _assert_holds(actor, first | second, 1)


def test_parts_arrive_in_any_order_and_a_single_part_is_a_whole_version(make_actor) -> None:
    actor = make_actor()
    first, second = _halves(actor, 2)
    assert _part(actor, second, 3, 1, 2).outcome == STAGED
    assert _part(actor, first, 3, 0, 2).outcome == COMPLETED
    _assert_holds(actor, first | second, 3)
    third, fourth = _halves(actor, 3)
    assert _part(actor, third | fourth, 4, 0, 1).outcome == COMPLETED
    _assert_holds(actor, third | fourth, 4)


def test_a_part_staged_as_its_sibling_completes_the_version_names_the_older_one(
    make_actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two ranks' parts of one version race: part 0 is staged, then, before its reply is
    # written, part 1 completes the version. Part 0 is still answered STAGED with the version
    # in force when it staged (a learner refuses STAGED with its own version as an answer no
    # push can have). The hooks only order the two calls; both go through gRPC.
    actor = make_actor()
    first_staged, completed = threading.Event(), threading.Event()
    stage = PartStaging.stage

    def stage_then_hold(self: PartStaging, *args: object) -> tuple:
        count, whole, parts = stage(self, *args)  # type: ignore[arg-type]
        if whole is None:
            first_staged.set()
            assert completed.wait(10), "the sibling part never completed the version"
        return count, whole, parts

    models = actor.worker.models
    swap_parts = models.swap_parts

    def swap_then_signal(*args: object) -> object:
        try:
            return swap_parts(*args)
        finally:
            completed.set()

    monkeypatch.setattr(PartStaging, "stage", stage_then_hold)
    monkeypatch.setattr(models, "swap_parts", swap_then_signal)
    first, second = _halves(actor, 7)
    with ThreadPoolExecutor(2) as pool:
        staged = pool.submit(_part, actor, first, 1, 0, 2)
        assert first_staged.wait(10)
        done = _part(actor, second, 1, 1, 2)
        staged_reply = staged.result(timeout=30)
    assert (done.outcome, done.version) == (COMPLETED, 1)
    assert (staged_reply.outcome, staged_reply.version) == (STAGED, 0)
    _assert_holds(actor, first | second, 1)


def test_bf16_and_delta_parts_apply_like_their_whole_pushes(make_actor) -> None:
    actor = make_actor()
    first, second = _halves(actor, 4)
    _part(actor, first, 1, 0, 2, dtype=torch.bfloat16)
    _part(actor, second, 1, 1, 2, dtype=torch.bfloat16)
    rounded = {k: v.to(torch.bfloat16).float() for k, v in (first | second).items()}
    _assert_holds(actor, rounded, 1)
    # Delta parts on version 1: each rank sends what changed among its keys.
    new_first = {k: v.clone() for k, v in first.items()}
    key = next(iter(new_first))
    new_first[key].view(-1)[0] += 1.0
    delta = encode_delta(first, new_first)
    assert delta is not None
    empty = encode_delta(second, second)  # nothing of this rank's keys changed
    assert empty is not None
    response = actor.stub.PushWeights(_requests(delta, 2, 0, 2, base_version=1), timeout=30)
    assert response.outcome == STAGED
    response = actor.stub.PushWeights(_requests(empty, 2, 1, 2, base_version=1), timeout=30)
    assert response.outcome == COMPLETED
    expected = dict(rounded)
    expected[key] = expected[key].clone()
    expected[key].view(-1)[0] = new_first[key].view(-1)[0]
    _assert_holds(actor, expected, 2)


def test_a_delta_part_refuses_another_base_and_mixes_with_whole_parts(make_actor) -> None:
    actor = make_actor()
    first, second = _halves(actor, 5)
    _part(actor, first, 1, 0, 2)
    _part(actor, second, 1, 1, 2)
    changed = {k: v + 1 for k, v in first.items()}
    delta = encode_delta(first, changed)
    assert delta is not None
    with pytest.raises(grpc.RpcError) as error:  # the actor holds 1, not 0
        actor.stub.PushWeights(_requests(delta, 2, 0, 2, base_version=0), timeout=30)
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    actor.stub.PushWeights(_requests(delta, 2, 0, 2, base_version=1), timeout=30)
    assert _part(actor, second, 2, 1, 2).outcome == COMPLETED  # a whole part beside a delta
    _assert_holds(actor, changed | second, 2)


def test_a_delta_version_whose_base_was_replaced_while_staging_never_applies(make_actor) -> None:
    """A version with a delta part completes only on the base it was computed from.

    A whole push of an older version than the staging one applies meanwhile (the staging
    version stays: it is newer) and changes the base; the version's last part, a whole
    part that names no base, must not swap the delta in on top of the other weights.
    """
    actor = make_actor()
    first, second = _halves(actor, 14)
    _part(actor, first, 1, 0, 2)
    _part(actor, second, 1, 1, 2)
    delta = encode_delta(first, {k: v + 1 for k, v in first.items()})
    reply = actor.stub.PushWeights(_requests(delta, 5, 0, 2, base_version=1), timeout=30)
    assert reply.outcome == STAGED
    other_first, other_second = _halves(actor, 15)
    other = other_first | other_second  # a whole push of version 2: now in force, not 1
    blob = encode_weights(other)
    header = pb.WeightsHeader(version=2, total_bytes=len(blob), crc32c=crc32c(blob))
    chunks = [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(blob, 4096)]
    actor.stub.PushWeights(iter([pb.PushWeightsRequest(header=header), *chunks]), timeout=30)
    error = _refused(actor, second, 5, 1, 2)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    _assert_holds(actor, other, 2)


def _hostile_cases(first: dict, second: dict) -> list:
    """(label, pushes before, the refused push, code, needle): pushes as (state, v, i, n, kw)."""
    key = next(iter(first))
    nan = {k: v.clone() for k, v in first.items()}
    nan[key].view(-1)[0] = float("nan")
    return [
        ("stale_version", [(first | second, 5, 0, 1, {})], (first, 5, 0, 2, {}), ABORTED, "newer"),
        ("duplicate_index", [(first, 1, 0, 2, {})], (first, 1, 0, 2, {}), ABORTED, "replayed"),
        ("overlap", [(first, 1, 0, 2, {})], (first, 1, 1, 2, {}), INVALID, "another part"),
        (
            "unknown_key",
            [],
            (first | {"head.wieght": torch.zeros(2)}, 1, 0, 2, {}),
            INVALID,
            "head.wieght",
        ),
        ("count_zero", [], (first, 1, 0, 0, {}), INVALID, "count 0"),
        ("index_past_count", [], (first, 1, 2, 2, {}), INVALID, "index 2"),
        ("count_2**32-1", [], (first, 1, 0, 2**32 - 1, {}), INVALID, "4294967295"),
        ("count_disagrees", [(first, 1, 0, 2, {})], (second, 1, 1, 3, {}), INVALID, "3 parts"),
        ("version_2**64-1", [], (first, 2**64 - 1, 0, 2, {}), INVALID, "int64"),
        ("nan", [], (nan, 1, 0, 2, {}), INVALID, key),
        ("bad_checksum", [], (first, 1, 0, 2, {"crc": 1}), grpc.StatusCode.DATA_LOSS, "crc32c"),
        (
            "keys_missing_at_the_end",
            [(first, 1, 0, 2, {})],
            ({k: second[k] for k in list(second)[:-1]}, 1, 1, 2, {}),
            INVALID,
            "lacked keys",
        ),
        (
            "older_than_staging",
            [(first, 3, 0, 2, {})],
            (second, 2, 1, 2, {}),
            ABORTED,
            "whose parts are staging",
        ),
        (
            "superseded",
            [(first, 1, 0, 2, {}), (first, 2, 0, 2, {})],
            (second, 1, 1, 2, {}),
            ABORTED,
            "superseded by version 2",
        ),
    ]


@pytest.mark.parametrize(
    "label",
    [
        "stale_version",
        "duplicate_index",
        "overlap",
        "unknown_key",
        "count_zero",
        "index_past_count",
        "count_2**32-1",
        "count_disagrees",
        "version_2**64-1",
        "nan",
        "bad_checksum",
        "keys_missing_at_the_end",
        "older_than_staging",
        "superseded",
    ],
)
def test_a_hostile_part_is_refused_and_nothing_partial_applies(make_actor, label: str) -> None:
    actor = make_actor()
    first, second = _halves(actor, 6)
    _, before, refused, code, needle = next(
        c for c in _hostile_cases(first, second) if c[0] == label
    )
    for state, version, index, count, kw in before:
        _part(actor, state, version, index, count, **kw)
    held, version = _live(actor), _version(actor)
    state, v, index, count, kw = refused
    error = _refused(actor, state, v, index, count, **kw)
    assert error.code() == code, (label, error.details())
    assert needle in error.details(), (label, error.details())
    _assert_holds(actor, held, version)
    # The actor takes the next complete version.
    good_first, good_second = _halves(actor, 7)
    _part(actor, good_first, 10, 0, 2)
    assert _part(actor, good_second, 10, 1, 2).outcome == COMPLETED
    _assert_holds(actor, good_first | good_second, 10)


def test_a_version_whose_last_part_lacks_keys_is_dropped_for_good(make_actor) -> None:
    actor = make_actor()
    first, second = _halves(actor, 8)
    last = sorted(second)[-1]
    _part(actor, first, 1, 0, 3)
    _part(actor, {k: v for k, v in second.items() if k != last}, 1, 1, 3)
    error = _refused(actor, {}, 1, 2, 3)  # an empty third part: a key is still missing
    assert error.code() == INVALID
    assert last in error.details()
    late = _refused(actor, second, 1, 1, 3)  # no part of version 1 is taken again
    assert late.code() == ABORTED
    assert "lacked keys" in late.details()
    _assert_holds(actor, _live(actor), 0)


def test_an_incomplete_version_expires_and_is_never_revived(parts_actor: Actor) -> None:
    actor = parts_actor
    stream = io.StringIO()
    handler = configure_logging("info", "json", stream=stream)
    try:
        before = _live(actor)
        first, second = _halves(actor, 9)
        started = time.monotonic()
        assert _part(actor, first, 1, 0, 2).outcome == STAGED

        def events(name: str) -> list[dict]:
            lines = map(json.loads, stream.getvalue().splitlines())
            return [r["fields"] for r in lines if r["event"] == name]

        pushes = events("weights.push")
        assert [(p["part"], p["outcome"], p["result"]) for p in pushes] == [("0/2", "STAGED", "OK")]
        drops = poll_until(lambda: events("weights.parts.dropped"), timeout=10, message="no drop")
        assert time.monotonic() - started >= 1.5
        assert drops[0]["reason"] == "expired"
        assert (drops[0]["version"], drops[0]["parts"], drops[0]["count"]) == (1, [0], 2)
        error = _refused(actor, second, 1, 1, 2)
        assert error.code() == ABORTED
        assert "expired" in error.details()
        refused = events("weights.push")[-1]  # logged with its status, and no outcome
        assert (refused["part"], refused["result"], "outcome" in refused) == (
            "1/2",
            "ABORTED",
            False,
        )
        _assert_holds(actor, before, 0)
        _part(actor, first, 2, 0, 2)
        assert _part(actor, second, 2, 1, 2).outcome == COMPLETED
        _assert_holds(actor, first | second, 2)
    finally:
        get_logger().removeHandler(handler)


def test_a_part_staged_again_with_other_bytes_drops_its_version(make_actor) -> None:
    """Another push of a staging version (a job restarted between its ranks' parts) must
    not complete it with parts of two pushes: the version is dropped, the next one applies.
    """
    actor = make_actor()
    before = _live(actor)
    old_first, _ = _halves(actor, 11)  # the first job's part 0, its rank 1 died
    first, second = _halves(actor, 12)  # the restarted job's weights for the same version
    assert _part(actor, old_first, 1, 0, 2).outcome == STAGED
    again = _refused(actor, old_first, 1, 0, 2)  # the same bytes: a replay, nothing dropped
    assert (again.code(), "replayed" in again.details()) == (ABORTED, True)
    other = _refused(actor, first, 1, 0, 2)
    assert (other.code(), "other bytes" in other.details()) == (ABORTED, True)
    late = _refused(actor, second, 1, 1, 2)  # used to complete version 1 with old_first
    assert (late.code(), "other bytes" in late.details()) == (ABORTED, True)
    _assert_holds(actor, before, 0)
    assert _part(actor, first, 2, 0, 2).outcome == STAGED
    assert _part(actor, second, 2, 1, 2).outcome == COMPLETED
    _assert_holds(actor, first | second, 2)


#: Header fields refused on their own, and what the refusal names.
INVALID_HEADERS = {
    "no checksum": ({"crc32c": None}, "crc32c or sha256"),
    "sha256 not hex": ({"sha256": "z" * 64}, "sha256"),
    "relay push_id short": ({"relay": pb.Relay(push_id=b"x")}, "relay.push_id"),
}


@pytest.mark.parametrize("case", sorted(INVALID_HEADERS))
def test_an_invalid_header_for_a_staged_part_leaves_its_version_to_complete(
    make_actor, case: str
) -> None:
    """A header refused for its own fields is INVALID_ARGUMENT and changes nothing: it is
    no other push of the staging version, whose next part still completes it.
    """
    actor = make_actor()
    first, second = _halves(actor, 14)
    assert _part(actor, first, 1, 0, 2).outcome == STAGED
    other = encode_weights(_halves(actor, 15)[0], subset=True)  # other bytes, as a new push's
    fields, named = INVALID_HEADERS[case]
    given = {
        "model_id": "policy",
        "version": 1,
        "total_bytes": len(other),
        "crc32c": crc32c(other),
        "part": pb.PartOf(index=0, count=2),
    } | fields
    header = pb.WeightsHeader(**{k: v for k, v in given.items() if v is not None})
    chunks = [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(other, 4096)]
    with pytest.raises(grpc.RpcError) as error:
        actor.stub.PushWeights(iter([pb.PushWeightsRequest(header=header), *chunks]), timeout=30)
    assert error.value.code() == INVALID, error.value.details()
    assert named in error.value.details(), error.value.details()
    assert _part(actor, second, 1, 1, 2).outcome == COMPLETED
    _assert_holds(actor, first | second, 1)


def test_a_whole_push_supersedes_a_staging_version(make_actor) -> None:
    actor = make_actor()
    first, second = _halves(actor, 10)
    _part(actor, first, 2, 0, 2)
    blob = encode_weights(first | second)
    header = pb.WeightsHeader(version=3, total_bytes=len(blob), crc32c=crc32c(blob))
    chunks = [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(blob, 4096)]
    reply = actor.stub.PushWeights(iter([pb.PushWeightsRequest(header=header), *chunks]))
    assert (reply.outcome, reply.version) == (pb.PUSH_OUTCOME_APPLIED, 3)
    error = _refused(actor, second, 2, 1, 2)
    assert error.code() == ABORTED
    _assert_holds(actor, first | second, 3)


def test_a_whole_push_drops_the_staging_version_at_once_not_at_its_deadline(make_actor) -> None:
    """A whole push newer than a staging version drops that version (and lets its staged
    bytes go) when it applies, logged as superseded, not when the part deadline passes.
    """
    actor = make_actor(part_deadline_s=600.0)
    stream = io.StringIO()
    handler = configure_logging("info", "json", stream=stream)
    try:
        first, second = _halves(actor, 13)
        assert _part(actor, first, 2, 0, 2).outcome == STAGED
        blob = encode_weights(first | second)
        header = pb.WeightsHeader(version=3, total_bytes=len(blob), crc32c=crc32c(blob))
        chunks = [pb.PushWeightsRequest(chunk=bytes(p)) for p in iter_blob_chunks(blob, 4096)]
        actor.stub.PushWeights(iter([pb.PushWeightsRequest(header=header), *chunks]), timeout=30)
        lines = map(json.loads, stream.getvalue().splitlines())
        drops = [r["fields"] for r in lines if r["event"] == "weights.parts.dropped"]
        assert [(d["version"], d["reason"]) for d in drops] == [(2, "superseded")]
        assert "whole push of version 3" in drops[0]["detail"]
    finally:
        get_logger().removeHandler(handler)


def test_describe_advertises_the_part_deadline(make_actor) -> None:
    actor = make_actor(part_deadline_s=12.5)
    assert actor.stub.Describe(pb.DescribeRequest(), timeout=10).part_deadline_seconds == 12.5


def test_versions_in_a_row_reuse_receive_buffers_without_mixing_their_bytes(make_actor) -> None:
    actor = make_actor()
    for version in (1, 2, 3):  # from version 2 on, parts are received into kept buffers
        first, second = _halves(actor, 20 + version)
        _part(actor, second, version, 1, 2)
        _part(actor, first, version, 0, 2)
        _assert_holds(actor, first | second, version)
    stale, _ = _halves(actor, 30)
    _part(actor, stale, 4, 0, 2)  # lent a kept buffer, then dropped with its version
    first, second = _halves(actor, 31)
    _part(actor, first, 5, 0, 2)  # supersedes version 4: its buffer goes back to the pool
    assert _part(actor, second, 5, 1, 2).outcome == COMPLETED  # may be received into it
    _assert_holds(actor, first | second, 5)


def test_a_version_dropped_for_missing_keys_never_lends_a_buffer_a_staged_part_views(
    make_actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The last part of a version that lacks keys is refused while another push's part is
    # received into a kept buffer: the refused part's buffer, lent by the pool, must go back
    # once only, or a third part is received into the memory the staged one still views.
    actor = make_actor()
    torch.manual_seed(40)
    state = {k: torch.randn_like(v) for k, v in _live(actor).items()}
    small = "module.0.module.1.weight"  # its part's buffer is the smallest the pool keeps
    rest = {k: v for k, v in state.items() if k != small}
    _part(actor, rest, 1, 0, 2)
    _part(actor, {small: state[small]}, 1, 1, 2)  # both parts' buffers are kept
    refused, go = threading.Event(), threading.Event()
    stage = PartStaging.stage

    def stage_or_hold(self: PartStaging, *args: object) -> tuple:
        try:
            return stage(self, *args)  # type: ignore[arg-type]
        except Exception:
            refused.set()
            assert go.wait(10), "the refused part was never let go"
            raise

    monkeypatch.setattr(PartStaging, "stage", stage_or_hold)
    _part(actor, rest, 2, 0, 2)
    with ThreadPoolExecutor(1) as pool:
        lacking = pool.submit(_refused, actor, {}, 2, 1, 2)  # lent the small buffer
        assert refused.wait(10)
        torch.manual_seed(41)
        new = {k: torch.randn_like(v) for k, v in state.items()}
        assert _part(actor, {small: new[small]}, 3, 0, 3).outcome == STAGED  # the same buffer
        go.set()
        assert lacking.result(timeout=30).code() == INVALID
    second = "module.0.module.5.weight"  # fits the small buffer
    assert _part(actor, {second: new[second]}, 3, 1, 3).outcome == STAGED
    third = {k: v for k, v in new.items() if k not in (small, second)}
    assert _part(actor, third, 3, 2, 3).outcome == COMPLETED
    _assert_holds(actor, new, 3)
