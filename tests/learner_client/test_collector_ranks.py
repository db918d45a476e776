"""Several learner ranks sharing one fleet: ownership, versioned pushes, refusals, restarts.

Four actors (worker_ids 0..3) serve two ranks: rank 0 owns 0 and 2, rank 1 owns 1 and 3.
Both ranks run in the test process here (as two collectors), except where a rank must be
a process of its own to be stopped, killed and restarted.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import urllib.request
import warnings
from collections.abc import Iterator

import grpc
import pytest
from helpers import ActorProcess, free_port, poll_until, start_actor
from learner_fleet import cartpole_policy, start_actors

from common.errors import UnknownWorkerError
from common.rlfleet.v1 import actor_service_pb2 as pb
from common.rlfleet.v1 import actor_service_pb2_grpc as pb_grpc
from learner_client import (
    ActorDescription,
    GrpcCollector,
    LocalFleet,
    MissingWorkersError,
    serve_metrics,
)
from learner_client._members import Ranks

ARGS = [
    ["--worker-id", str(w), "--num-envs", "2", "--seed", str(w), "--model", "critic=mlp"]
    for w in range(4)
]


@pytest.fixture(scope="module")
def four() -> Iterator[list[ActorProcess]]:
    """Worker_ids 0..3, for the module; a test that kills one starts it again."""
    actors = start_actors(ARGS)
    yield actors
    for actor in actors:
        actor.close()


def _describe(actor: ActorProcess) -> ActorDescription:
    with grpc.insecure_channel(actor.address) as channel:
        reply = pb_grpc.ActorServiceStub(channel).Describe(pb.DescribeRequest(), timeout=10)
    return ActorDescription.from_response(actor.address, reply)


def _rank(actors: list[ActorProcess], rank: int, **kwargs: object) -> GrpcCollector:
    options: dict = {"frames_per_batch": 8, "sync": True, "batch_timeout": 30} | kwargs
    return GrpcCollector([a.address for a in actors], rank=rank, world_size=2, **options)


@pytest.mark.parametrize(
    ("rank", "world_size", "error"),
    [
        (0, 0, ValueError),
        (2, 2, ValueError),
        (-1, 2, ValueError),
        (0, None, ValueError),
        (None, 2, ValueError),
        ("1", 2, TypeError),
        (True, 2, TypeError),
    ],
)
def test_collector_raises_if_rank_or_world_size_is_out_of_range(
    rank: object, world_size: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match=r"rank|world_size"):
        GrpcCollector(["127.0.0.1:1"], frames_per_batch=8, rank=rank, world_size=world_size)


def test_ranks_read_torchrun_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert Ranks.given("env", None) == Ranks(3, 4)
    assert Ranks(3, 4).learner_id("job-7") == "job-7/rank3"
    assert Ranks().learner_id("job-7") == "job-7"
    assert Ranks(3, 4).learner_id("") == ""  # empty: each rank draws a unique one
    with pytest.raises(ValueError, match="world_size"):
        Ranks.given("env", 4)
    monkeypatch.setenv("WORLD_SIZE", "four")
    with pytest.raises(ValueError, match="WORLD_SIZE='four'"):
        Ranks.given("env", None)
    monkeypatch.delenv("RANK")
    with pytest.raises(ValueError, match="RANK"):
        Ranks.given("env", None)


def test_ranks_given_by_hand_unlike_torchruns_are_warned_about(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.warns(UserWarning, match=r'rank=0 was given.*rank 1 of 2.*rank="env"'):
        assert Ranks.given(0, 2) == Ranks(0, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Ranks.given(1, 2) == Ranks(1, 2)  # its own rank
        assert Ranks.given(0, 4) == Ranks(0, 4)  # ranks of another group than torchrun's
        monkeypatch.delenv("RANK")
        assert Ranks.given(0, 2) == Ranks(0, 2)  # not under torchrun


@pytest.mark.long
def test_collector_raises_if_its_rank_owns_no_actor(four: list[ActorProcess]) -> None:
    with pytest.raises(ValueError, match=r"rank 3 of 4 owns no actor.*\[0, 1\]"):
        GrpcCollector([a.address for a in four[:2]], frames_per_batch=8, rank=3, world_size=4)


@pytest.mark.long
def test_a_rank_given_a_fleet_of_its_own_warns_of_the_actors_it_leaves_idle() -> None:
    """``LocalFleet`` per rank with default ids: rank 1 of 2 owns only worker 1 of its two
    actors, and worker 0 (no other rank reaches it) would idle; ids it owns are quiet."""
    with pytest.warns(UserWarning, match=r"actors \[0\] idle.*worker_ids=\[1 \+ 2 \* i"):
        collector = GrpcCollector(
            LocalFleet(2, num_envs=2), frames_per_batch=4, total_frames=4, rank=1, world_size=2
        )
    with collector:
        assert collector.worker_ids == [1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with GrpcCollector(
            LocalFleet(2, num_envs=2, worker_ids=[1, 3]), frames_per_batch=8, total_frames=8,
            rank=1, world_size=2,
        ) as collector:  # fmt: skip
            assert collector.worker_ids == [1, 3]
            assert collector.next().numel() == 8


def test_two_ranks_split_the_fleet_and_push_versions_to_their_own(
    four: list[ActorProcess],
) -> None:
    policy = cartpole_policy()
    with _rank(four, 0) as first, _rank(four, 1) as second:
        assert (first.worker_ids, second.worker_ids) == ([0, 2], [1, 3])
        assert first.member_ids == second.member_ids == [0, 1, 2, 3]
        start = max(max(_describe(a).models.values()) for a in four) + 1
        assert first.update_policy_weights_(policy, version=start) == {0: start, 2: start}
        assert second.update_policy_weights_(policy, version=start) == {1: start, 3: start}
        for _ in range(3):
            for collector, owned in ((first, [0, 2]), (second, [1, 3])):
                batch = collector.next()
                assert batch.shape[:2] == (2, 2)  # [owned workers, envs, time]: 8 frames
                assert batch["collector", "worker_id"][:, 0, 0].tolist() == owned
                assert (batch["policy_version"] == start).all()
        assert first.update_policy_weights_(policy, version=start + 5) == {
            0: start + 5,
            2: start + 5,
        }
        with pytest.raises(ValueError, match="not above"):
            first.update_policy_weights_(policy, version=start + 5)
        stats = first.stats()
        assert (stats["rank"], stats["world_size"], stats["members"], stats["workers"]) == (
            0,
            2,
            4,
            2,
        )
        assert "worker_1/frames" not in first.stats("per_worker")
        with urllib.request.urlopen(
            f"http://127.0.0.1:{serve_metrics(second, 0).port}/metrics"
        ) as r:
            metrics = r.read().decode()
        assert "rlfleet_learner_rank 1.0" in metrics
        assert "rlfleet_learner_world_size 2.0" in metrics
        assert 'rlfleet_learner_frames_total{worker_id="3"}' in metrics
        assert 'worker_id="0"' not in metrics  # another rank's actor
        assert "rank=0/2" in repr(first)
        with pytest.raises(UnknownWorkerError, match=r"\[0, 2\] are other learner ranks' act"):
            second.load_state_dict(first.state_dict())  # the other rank's checkpoint
    held = {a.worker_id: _describe(a).models["policy"] for a in four}
    assert held == {0: start + 5, 1: start, 2: start + 5, 3: start}


@pytest.mark.long
def test_a_rank_refuses_a_second_address_of_another_ranks_actor(four: list[ActorProcess]) -> None:
    # worker_id 1 is rank 1's, yet a member here: a second address reporting it is refused
    # (it would take the member's link away), like a repeated owned worker_id.
    with _rank(four[:2], 0, sync=False) as collector:
        with pytest.raises(ValueError, match=r"worker_ids must be unique.*worker_id 1 at"):
            collector.add_collectors([f"localhost:{four[1].port}"])
        assert collector.worker_ids == [0]


@pytest.mark.long
def test_ownership_follows_actors_as_they_join_and_return(four: list[ActorProcess]) -> None:
    with _rank(four[:2], 0, sync=False) as first, _rank(four[:2], 1, sync=False) as second:
        first.next(), second.next()
        assert first.add_collectors([four[2].address, four[3].address])[0].worker_id == 2
        assert [a.worker_id for a in second.add_collectors([four[2].address, four[3].address])] == [
            3
        ]
        assert (first.worker_ids, second.worker_ids) == ([0, 2], [1, 3])
        seen: set[int] = set()
        poll_until(
            lambda: (
                seen.update(first.next()["collector", "worker_id"].unique().tolist()) or 2 in seen
            ),
            timeout=30,
        )
        assert seen <= {0, 2}
        version = first.policy_version + 1
        first.update_policy_weights_(cartpole_policy(), version=version)
        # Worker 2 dies and comes back: only its owner re-admits it, with the current weights.
        four[2].close()
        poll_until(lambda: first.worker_states[2] == "down", timeout=30)
        assert 2 not in second.worker_states
        four[2] = start_actor([*ARGS[2], "--port", str(four[2].port)])
        poll_until(lambda: first.worker_states[2] == "streaming", timeout=60)
        assert _describe(four[2]).models["policy"] == version
        assert second.stats()["failures"] == 0


def test_a_second_rank_claiming_an_owned_actor_is_refused_naming_the_owner(
    four: list[ActorProcess], caplog: pytest.LogCaptureFixture
) -> None:
    with _rank(four, 0, learner_id="job") as owner:
        owner.next()
        # A misconfigured second "rank 0" (another identity) claims the same actors.
        intruder = _rank(four, 0, learner_id="other", sync=False, replay_buffer=[])
        with caplog.at_level(logging.INFO, logger="learner_client"), intruder:
            intruder.start()
            poll_until(lambda: intruder.stats()["failures"] >= 2, timeout=30)
            assert intruder.stats()["frames"] == 0
            for _ in range(3):
                owner.next()  # the owner keeps its sessions throughout
        refusals = [r.getMessage() for r in caplog.records if "ActorBusyError" in r.getMessage()]
        assert refusals
        assert "is serving learner 'job/rank0'" in refusals[0], refusals
        assert owner.stats()["failures"] == 0
    assert "session.taken_over" not in four[0].stderr()


def test_a_collector_without_rank_under_torchrun_says_to_pass_rank_env(
    four: list[ActorProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rank's collector claims every actor when none is given ``rank``: say so."""
    addresses = [a.address for a in four[:2]]
    with _rank(four[:2], 0, learner_id="job") as owner:  # another rank's collector
        owner.next()
        monkeypatch.setenv("RANK", "1")  # this process: rank 1 under torchrun
        monkeypatch.setenv("WORLD_SIZE", "2")
        late = GrpcCollector(addresses, frames_per_batch=8, sync=True, batch_timeout=2)
        with late, pytest.raises(MissingWorkersError, match=r'ActorBusyError.*pass rank="env"'):
            late.next()
    assert Ranks(1, 2).unsharded_hint() == ""  # a collector given its rank: no hint
    monkeypatch.setenv("WORLD_SIZE", "1")  # a single learner: no hint
    assert Ranks().unsharded_hint() == ""


_RANK_ONE = """
import json, sys
from learner_client import GrpcCollector
from learner_fleet import cartpole_policy
addresses, version = json.loads(sys.argv[1]), int(sys.argv[2])
collector = GrpcCollector(addresses, frames_per_batch=8, sync=True, rank=1, world_size=2,
                          learner_id="job", batch_timeout=30, connect_timeout=30)
pushed = collector.update_policy_weights_(cartpole_policy(), version=version)
workers = collector.next()["collector", "worker_id"][:, 0, 0].tolist()
print(json.dumps({"pushed": pushed, "workers": workers, "stats": collector.stats()}), flush=True)
sys.stdin.readline()
"""


def _test_env() -> dict[str, str]:
    """The environment of a rank subprocess: the test helpers importable."""
    here = pathlib.Path(__file__).resolve().parent
    path = [str(here.parent), str(here), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def _start_rank_one(four: list[ActorProcess], version: int) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", _RANK_ONE, json.dumps([a.address for a in four]), str(version)]
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_test_env(),
    )


def _report(process: subprocess.Popen[str]) -> dict:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise AssertionError(f"rank 1 exited: {process.communicate(timeout=30)[1][-3000:]}")
    return json.loads(line)


@pytest.mark.long
def test_a_restarted_rank_resumes_its_own_sessions_and_pushes(four: list[ActorProcess]) -> None:
    version = max(max(_describe(a).models.values()) for a in four) + 1
    with _rank(four, 0, learner_id="job") as rank_zero:
        rank_zero.update_policy_weights_(cartpole_policy(), version=version)
        old = _start_rank_one(four, version)
        new = None
        try:
            report = _report(old)
            assert report["pushed"] == {"1": version, "3": version}
            assert report["workers"] == [1, 3]
            # The old process hangs with its sessions open (as on a partition); rank 0 pushes on.
            os.kill(old.pid, signal.SIGSTOP)
            rank_zero.update_policy_weights_(cartpole_policy(), version=version + 1)
            rank_zero.update_policy_weights_(cartpole_policy(), version=version + 2)
            assert _describe(four[1]).learner_id == "job/rank1"
            # Its replacement, under the same learner_id, takes its own sessions back at once
            # and brings its actors, which missed two versions, to the current one.
            new = _start_rank_one(four, version + 2)
            report = _report(new)
            assert report["pushed"] == {"1": version + 2, "3": version + 2}
            assert report["workers"] == [1, 3]
            assert report["stats"]["failures"] == 0
            for actor in (four[1], four[3]):
                assert "session.reconnected" in actor.stderr()
                assert "session.taken_over" not in actor.stderr()
            for _ in range(2):
                rank_zero.next()
            assert rank_zero.stats()["failures"] == 0
        finally:
            for process in (old, new):
                if process is not None:
                    process.kill()
                    process.communicate(timeout=30)  # reaps it and closes its pipes
    held = {a.worker_id: _describe(a).models["policy"] for a in four}
    assert held == dict.fromkeys(range(4), version + 2)


_DDP_RANK = """
import json, os, sys, time
import torch
import torch.distributed as dist
from common.errors import DeadlineError, UnknownWorkerError
from learner_client import GrpcCollector, VersionConflictError
from learner_fleet import cartpole_policy
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
policy = cartpole_policy()  # the same weights on both ranks
version = int(sys.argv[2])
out = {}
actors = json.loads(sys.argv[1])
with GrpcCollector(actors, frames_per_batch=8, rank="env", call_timeout=3) as collector:
    out["ranks"] = [collector.rank, collector.world_size, collector.worker_ids]
    out["agreed"] = collector.update_policy_weights_(policy, version=version)
    if rank == 1:  # this rank's weights drift from the other's
        with torch.no_grad():
            next(policy.parameters()).add_(1e-3)
    try:
        collector.update_policy_weights_(policy, version=version + 1)
    except VersionConflictError as exc:
        out["conflict"] = {str(r): v for r, (v, _) in exc.pushed.items()}
    try:  # and ranks that disagree on the step count: the rank behind learns it at once,
        # the rank ahead waits for the other, which may still come, up to call_timeout
        collector.update_policy_weights_(cartpole_policy(0), version=version + 1 + rank)
    except VersionConflictError as exc:
        out["steps"] = {str(r): v for r, (v, _) in exc.pushed.items()}
    except DeadlineError:
        out["steps"] = "DeadlineError"
    dist.barrier()  # rank 0 learnt it at once, rank 1 waited call_timeout for rank 0
    fresh = cartpole_policy(0)
    if rank == 1:  # late past call_timeout: rank 0 gives up; rank 1 then finds its entry
        time.sleep(4)
    try:
        out["late"] = list(collector.update_policy_weights_(fresh, version=version + 3).values())
    except DeadlineError:
        out["late"] = "DeadlineError"
    # ... and both meet at the next version (a timed-out gloo collective stays broken).
    out["met"] = list(collector.update_policy_weights_(fresh, version=version + 4).values())
    if rank == 1:  # late again; rank 0 retries the version that timed out and meets it there
        time.sleep(4)
    for attempt in range(2 - rank):
        try:
            pushed = collector.update_policy_weights_(fresh, version=version + 5)
            out["retried"] = [attempt, list(pushed.values())]
            break
        except DeadlineError:
            out["retried"] = [attempt, "DeadlineError"]
    if rank == 0:  # a collector rebuilt on one rank still meets the other rank's
        collector.shutdown()
        collector = GrpcCollector(actors, frames_per_batch=8, rank="env", call_timeout=3)
    out["rebuilt"] = list(collector.update_policy_weights_(fresh, version=version + 6).values())
    try:  # rank 1 names rank 0's actor: it refuses, and tells rank 0, before anything is sent
        targets = [0] if rank else None
        collector.update_policy_weights_(fresh, version=version + 7, worker_ids=targets)
    except (UnknownWorkerError, VersionConflictError) as exc:
        out["target"] = [type(exc).__name__, "other learner ranks' actors" in str(exc)]
    if rank == 0:  # rank 1 skips a version: rank 0's push of it fails, that push only,
        try:  # as soon as rank 1 pushes a later one
            collector.update_policy_weights_(fresh, version=version + 8)
        except VersionConflictError as exc:
            out["skipped"] = {str(r): v for r, (v, _) in exc.pushed.items()}
    else:
        time.sleep(1)
    out["after"] = list(collector.update_policy_weights_(fresh, version=version + 9).values())
    try:  # rank 1 times out; rank 0 comes later with other weights: a conflict, on rank 0
        if rank == 0:
            time.sleep(4)
        collector.update_policy_weights_(cartpole_policy(rank), version=version + 10)
    except (DeadlineError, VersionConflictError) as exc:
        out["fixed"] = [type(exc).__name__]
    dist.barrier()  # both load the same weights and retry: the version meets afresh on both
    retried = collector.update_policy_weights_(fresh, version=version + 10)
    out["fixed"].append(list(retried.values()))
    if rank == 1:  # another model meets apart, though its versions are below the policy's
        time.sleep(0.5)
    critic = collector.update_policy_weights_(cartpole_policy(0), model_id="critic", version=3)
    out["critic"] = list(critic.values())
    if rank == 1:  # late past call_timeout for the critic; rank 1 then finds rank 0's entry
        time.sleep(4)
    try:
        collector.update_policy_weights_(cartpole_policy(0), model_id="critic", version=4)
        out["critic_late"] = "pushed"
    except DeadlineError:
        out["critic_late"] = "DeadlineError"
    between = collector.update_policy_weights_(fresh, version=version + 11)
    out["policy_between"] = list(between.values())
    if rank == 0:  # retries the critic's version: its meeting's outcome is still there
        started = time.monotonic()
        collector.update_policy_weights_(cartpole_policy(0), model_id="critic", version=4)
        out["critic_retry_s"] = time.monotonic() - started
print(json.dumps(out), flush=True)
collector.shutdown()
dist.barrier()  # rank 0 serves the store: it stays until rank 1 is done with it
dist.destroy_process_group()
"""


@pytest.mark.long
def test_ranks_pushing_one_version_differently_raise_on_every_rank(
    four: list[ActorProcess],
) -> None:
    version = max(max(_describe(a).models.values()) for a in four) + 1
    env = {**_test_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env["WORLD_SIZE"] = "2"
    argv = [sys.executable, "-c", _DDP_RANK, json.dumps([a.address for a in four]), str(version)]
    ranks = [
        subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "RANK": str(r)},
        )
        for r in range(2)
    ]
    ended = [process.communicate(timeout=120) for process in ranks]
    for process, (_, err) in zip(ranks, ended, strict=True):
        assert process.returncode == 0, err[-3000:]
    outs = [json.loads(out.strip().splitlines()[-1]) for out, _ in ended]
    for rank, out in enumerate(outs):
        owned = [rank, rank + 2]
        assert out["ranks"] == [rank, 2, owned]
        assert out["agreed"] == {str(w): version for w in owned}
        assert out["conflict"] == {"0": version + 1, "1": version + 1}
    assert [out["steps"] for out in outs] == [
        {"0": version + 1, "1": version + 2},
        "DeadlineError",
    ]
    assert [out["late"] for out in outs] == ["DeadlineError", [version + 3] * 2]
    assert [out["met"] for out in outs] == [[version + 4] * 2] * 2
    assert [out["retried"] for out in outs] == [[1, [version + 5] * 2], [0, [version + 5] * 2]]
    assert [out["rebuilt"] for out in outs] == [[version + 6] * 2] * 2
    assert [out["target"] for out in outs] == [
        ["VersionConflictError", False],
        ["UnknownWorkerError", True],
    ]
    assert outs[0]["skipped"] == {"0": version + 8, "1": version + 9}
    assert [out["after"] for out in outs] == [[version + 9] * 2] * 2
    assert [out["fixed"] for out in outs] == [
        ["VersionConflictError", [version + 10] * 2],
        ["DeadlineError", [version + 10] * 2],
    ]
    assert [out["critic"] for out in outs] == [[3, 3]] * 2
    assert [out["critic_late"] for out in outs] == ["DeadlineError", "pushed"]
    assert [out["policy_between"] for out in outs] == [[version + 11] * 2] * 2
    assert outs[0]["critic_retry_s"] < 2  # it pushed at once (call_timeout is 3 s)
    # Nothing was pushed by the refused calls: every actor holds the version both met at.
    assert {a.worker_id: _describe(a).models["policy"] for a in four} == dict.fromkeys(
        range(4), version + 11
    )
