"""LocalFleet: real actor subprocesses, started, probed, killed and never orphaned."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time

import grpc
import gymnasium
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import poll_until, process_alive
from learner_fleet import ACTOR_ENV, cartpole_policy

from common.config import ExplorationType
from common.errors import (
    ActorUnavailableError,
    AuthenticationError,
    DeadlineError,
    SessionStateError,
    UnknownWorkerError,
)
from common.rlfleet.v1 import actor_service_pb2, actor_service_pb2_grpc
from learner_client import GrpcCollector, MissingWorkersError, WeightPushError
from learner_client._local_fleet import LocalFleet, exit_message

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _all_gone(pids) -> bool:
    return not any(process_alive(pid) for pid in pids)


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    return reply.status


def _worker_id(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = actor_service_pb2_grpc.ActorServiceStub(channel)
        return stub.Describe(actor_service_pb2.DescribeRequest(), timeout=5).worker_id


@pytest.mark.long
def test_local_fleet_starts_actors_that_answer_health_with_their_worker_ids():
    with LocalFleet(2, num_envs=2, seed=3, grace_period=1.0) as fleet:
        addresses = fleet.addresses
        assert len(set(addresses)) == 2
        assert all(a.startswith("127.0.0.1:") for a in addresses)
        assert [_health(a) for a in addresses] == [health_pb2.HealthCheckResponse.SERVING] * 2
        assert [_worker_id(a) for a in addresses] == [0, 1]
        pids = fleet.pids
    assert _all_gone(pids)
    fleet.stop()  # idempotent
    with pytest.raises(SessionStateError, match="stopped"):
        _ = fleet.addresses
    with pytest.raises(SessionStateError):
        fleet.start()


def _fail_inside_a_fleet(pids: list[int]) -> None:
    with LocalFleet(1, num_envs=1) as fleet:
        pids.extend(fleet.pids)
        raise RuntimeError("boom")


@pytest.mark.long
def test_local_fleet_stops_actors_when_the_body_raises():
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="boom"):
        _fail_inside_a_fleet(pids)
    assert len(pids) == 1
    assert _all_gone(pids)


def test_local_fleet_raises_if_an_actor_dies_before_ready():
    with pytest.raises(ActorUnavailableError) as info:
        LocalFleet(2, num_envs=1, extra_args=["--num-envs", "0"], start_timeout=30).start()
    message = str(info.value)
    assert "worker_id=" in message
    assert "exited with code 2" in message
    assert "num-envs" in message  # the actor's own complaint, from its stderr


@pytest.mark.long
def test_local_fleet_kill_and_restart_keep_worker_id_and_address():
    with LocalFleet(2, num_envs=1, seed=0, grace_period=1.0) as fleet:
        address = fleet.addresses[1]
        old_pid = fleet.pids[1]
        first_life = _first_observations(address)
        assert fleet.kill(1) == -signal.SIGKILL
        assert not fleet.is_alive(1)
        assert fleet.is_alive(0)
        assert fleet.restart(1) == address
        assert fleet.pids[1] != old_pid
        assert _health(address) == health_pb2.HealthCheckResponse.SERVING
        assert _worker_id(address) == 1
        # A fresh seed: with its first one, its envs would send the same experience again.
        assert not torch.equal(_first_observations(address), first_life)
        with pytest.raises(UnknownWorkerError, match="worker_id=7"):
            fleet.kill(7)


def _first_observations(address: str) -> torch.Tensor:
    """The observations of an actor's first batch (a new session's)."""
    with GrpcCollector([address], frames_per_batch=8) as collector:
        return next(iter(collector))["observation"]


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("num_actors", {"num_actors": 0}),
        ("num_envs", {"num_actors": 1, "num_envs": -1}),
        ("start_timeout", {"num_actors": 1, "start_timeout": 0}),
        ("extra_args", {"num_actors": 1, "extra_args": "--seed 1"}),
        ("seed", {"num_actors": 1, "seed": -1}),
        ("seed", {"num_actors": 1, "seed": 1.0}),
        ("seed", {"num_actors": 2, "seed": 2**64 - 1}),  # actor 1's seed would be 2**64
        # An actor refuses worker ids above 65535: refused before any starts.
        ("num_actors", {"num_actors": 65537}),
        ("worker_ids", {"num_actors": 1, "worker_ids": [2**64 - 1]}),
        ("worker_ids", {"num_actors": 2, "worker_ids": [0, 65536]}),
        ("distinct", {"num_actors": 2, "worker_ids": [3, 3]}),  # one actor would be lost
        ("worker_ids", {"num_actors": 1, "worker_ids": [0, 1]}),  # not num_actors of them
        # Flags the fleet sets itself: its ids, ports and seeds would not be its actors'.
        ("--worker-id", {"num_actors": 1, "extra_args": ["--worker-id", "9"]}),
        ("--port", {"num_actors": 1, "extra_args": ["--port=5555"]}),
        ("--worker-id", {"num_actors": 1, "extra_args": ["--work", "9"]}),  # argparse's prefix
        ("--seed", {"num_actors": 1, "extra_args": ["--seed", "3"]}),
        ("--seed", {"num_actors": 1, "extra_args": ["--see=3"]}),  # a short prefix too
        ("--kind", {"num_actors": 1, "extra_args": ["--kind", "llm"]}),
        ("--host", {"num_actors": 1, "extra_args": ["--host", "0.0.0.0"]}),
        ("token=", {"num_actors": 1, "extra_args": ["--token", "s3cret"]}),  # never in `ps`
        ("extra_args", {"num_actors": 1, "extra_args": ["--torch-threads", 1]}),
        # What an actor would refuse only once started, and wrong types named by argument.
        ("num_envs", {"num_actors": 1, "num_envs": 10**12}),
        ("grace_period", {"num_actors": 1, "grace_period": float("inf")}),
        ("grace_period", {"num_actors": 1, "grace_period": 1e300}),  # beyond every timeout's 1e7
        ("start_timeout", {"num_actors": 1, "start_timeout": float("nan")}),
        ("grace_period", {"num_actors": 1, "grace_period": None}),
        ("start_timeout", {"num_actors": 1, "start_timeout": "60"}),
        ("start_timeout", {"num_actors": 1, "start_timeout": True}),
        ("start_timeout", {"num_actors": 1, "start_timeout": 2**2000}),  # float() overflowed
        ("host", {"num_actors": 1, "host": None}),
        ("worker_ids", {"num_actors": 1, "worker_ids": 0}),
        ("extra_args", {"num_actors": 1, "extra_args": 5}),
        ("env_kwargs", {"num_actors": 1, "env_kwargs": []}),
        ("policy_kwargs", {"num_actors": 1, "policy_kwargs": [("hidden", [8])]}),
        ("task_kwargs", {"num_actors": 1, "kind": "llm", "task_kwargs": "{}"}),
    ],
)
def test_local_fleet_raises_if_an_argument_is_invalid(name, kwargs):
    with pytest.raises((TypeError, ValueError), match=re.escape(name)):
        LocalFleet(**kwargs)


def test_local_fleet_raises_if_kwargs_outgrow_a_command_line_argument():
    # Linux takes 128 KiB per argument: the actors' start would fail with E2BIG.
    with pytest.raises(
        ValueError,
        match=r"env_kwargs is 200,013 bytes on the actor.s command line .* a path to a file",
    ):
        LocalFleet(1, env_kwargs={"stats": "x" * 200_000})
    with pytest.raises(ValueError, match="policy_kwargs"):
        LocalFleet(1, policy_kwargs={"table": list(range(40_000))})
    LocalFleet(1, env_kwargs={"stats": "x" * 100_000})  # within it


def test_local_fleet_raises_if_kwargs_hold_what_json_does_not_carry():
    with pytest.raises(TypeError, match=re.escape("env_kwargs['path'] is a PosixPath")):
        LocalFleet(1, env_kwargs={"path": pathlib.Path("/data")})
    with pytest.raises(TypeError, match=re.escape("policy_kwargs['sizes'] has the key 0")):
        LocalFleet(1, policy_kwargs={"sizes": {0: 64}})  # it would arrive as {"0": 64}


def test_local_fleet_takes_the_numbers_a_config_gives():
    fleet = LocalFleet(1, start_timeout=np.float32(30), grace_period=np.int64(2))
    assert (fleet.start_timeout, fleet.grace_period) == (30.0, 2.0)
    forever = LocalFleet(1, start_timeout=float("inf"), grace_period=0)  # no deadline, no drain
    assert (forever.start_timeout, forever.grace_period) == (float("inf"), 0.0)


def test_local_fleet_refuses_objects_where_actors_need_names():
    env = gymnasium.make("CartPole-v1")
    with pytest.raises(TypeError, match=r"env must be a gymnasium id .* env_factory="):
        LocalFleet(1, env)
    policy = cartpole_policy()
    with pytest.raises(TypeError, match=re.escape("GrpcCollector(policy=...)")):
        LocalFleet(1, "CartPole-v1", policy=policy)


@pytest.mark.long
def test_local_fleet_takes_no_env_id_beside_an_env_factory_and_ids_without_a_version(
    monkeypatch,
):
    monkeypatch.setenv("PYTHONPATH", ACTOR_ENV["PYTHONPATH"])
    factory = "rlfleet_test_envs:slow_cartpole"
    with (
        LocalFleet(1, None, num_envs=2, env_factory=factory, env_kwargs={"delay": 0.0}) as a,
        LocalFleet(1, "CartPole", num_envs=2, worker_ids=[1]) as b,  # make takes the newest
        GrpcCollector([*a.addresses, *b.addresses], frames_per_batch=8, sync=True) as collector,
    ):
        assert next(iter(collector)).batch_size == (2, 2, 2)


@pytest.mark.long  # 5-10 s: an actor of its own
def test_local_fleet_finds_the_ready_line_after_a_factorys_unended_output(monkeypatch) -> None:
    """A factory printing progress without a newline put the ready line mid-line; the fleet
    waited for it until its start_timeout."""
    monkeypatch.setenv("PYTHONPATH", ACTOR_ENV["PYTHONPATH"])
    began = time.monotonic()
    with LocalFleet(
        1, None, num_envs=1, env_factory="rlfleet_test_envs:chatty_cartpole", start_timeout=30
    ) as fleet:
        assert len(fleet.addresses) == 1
    assert time.monotonic() - began < 25


@pytest.mark.long  # 20 s: an actor ready 6 s after the first, a start_timeout of 10 s
def test_start_timeout_bounds_a_stall_not_a_fleet_whose_actors_keep_coming(monkeypatch, tmp_path):
    """Three actors, the second ready 6 s after the first, the third never, start_timeout=10:
    the start goes on while actors become ready (a large fleet on a few cores takes longer
    than start_timeout in all: the second used to be named too), and fails start_timeout
    after the second, naming the third alone."""
    monkeypatch.setenv("PYTHONPATH", ACTOR_ENV["PYTHONPATH"])
    counter = str(tmp_path / "counter")
    fleet = LocalFleet(
        3, None, num_envs=1, env_factory="rlfleet_test_envs:staggered_cartpole",
        env_kwargs={"counter": counter, "step": 6.0, "hang_from": 2},
        start_timeout=10, grace_period=0,
    )  # fmt: skip
    started = time.monotonic()
    with pytest.raises(DeadlineError, match=r"no actor became ready for 10\.0s") as stall:
        fleet.start()
    assert time.monotonic() - started > 16  # 6 s to the second's ready, then 10 s without
    hung = re.findall(r"worker_id=(\d+)", str(stall.value).splitlines()[0])
    assert len(hung) == 1
    assert pathlib.Path(counter).stat().st_size == 3  # each of the three built its env once
    leftover = subprocess.run(["pgrep", "-f", counter], capture_output=True, text=True)
    assert leftover.stdout == ""  # every actor of the failed start was stopped


@pytest.mark.long  # 4-6 s: moved out of the quick suite's 10 minutes
def test_a_fleet_on_a_bracketed_ipv6_host_gives_addresses_a_collector_dials():
    """``host="[::1]"`` (the collector's own form) gave ``[[::1]]:port``: nothing dialled it."""
    with (
        LocalFleet(1, num_envs=1, host="[::1]", grace_period=1.0) as fleet,
        GrpcCollector(fleet, frames_per_batch=4) as collector,
    ):
        assert fleet.addresses[0].startswith("[::1]:")
        assert collector.next().numel() == 4
    for host in ("", " ", "::1 "):
        with pytest.raises(ValueError, match="an IP address or a host name"):
            LocalFleet(1, host=host)


@pytest.mark.long  # 4-6 s: moved out of the quick suite's 10 minutes
def test_an_actor_that_fails_to_start_is_reported_by_its_error_line_first():
    with pytest.raises(ActorUnavailableError) as failure:
        LocalFleet(1, "CartPole-v9", num_envs=2).start()
    first = str(failure.value).splitlines()[0]
    assert "exited with code 2 before it was ready" in first  # a bad flag: --env
    assert "CartPole-v9" in first  # the cause, not the config the log opens with
    assert "stderr tail:" in str(failure.value)


def test_local_fleet_takes_flags_it_does_not_set_in_extra_args():
    # Flags that begin like the fleet's own, but are others, are the actor's to read.
    fleet = LocalFleet(1, extra_args=["--health-port", "0", "--torch-threads", "1"])
    assert fleet.worker_ids == [0]


# A learner process that starts a fleet, reports the actor pids, then waits to be signalled.
_LEARNER = textwrap.dedent("""
    import json, time
    from learner_client._local_fleet import LocalFleet
    with LocalFleet(2, num_envs=1, grace_period=1.0) as fleet:
        print(json.dumps(fleet.pids), flush=True)
        time.sleep(120)
""")


def _start_learner() -> tuple[subprocess.Popen, list[int]]:
    learner = subprocess.Popen(
        [sys.executable, "-c", _LEARNER],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = learner.stdout.readline()
    if not line:
        learner.kill()
        _, err = learner.communicate(timeout=10)
        pytest.fail(f"learner did not start its fleet: {err}")
    return learner, json.loads(line)


@pytest.mark.parametrize(
    "sig",
    [
        pytest.param(signal.SIGINT, marks=pytest.mark.long),
        pytest.param(signal.SIGKILL, marks=pytest.mark.slow),
    ],
)
def test_local_fleet_leaves_no_actor_after_the_learner_is_signalled(sig):
    learner, pids = _start_learner()
    try:
        assert all(process_alive(pid) for pid in pids)
        os.kill(learner.pid, sig)
        learner.communicate(timeout=30)
        # SIGINT: the learner stops them; SIGKILL: the kernel's parent-death signal does.
        poll_until(lambda: _all_gone(pids), timeout=5, message=f"actors {pids} still running")
    finally:
        learner.kill()
        learner.communicate()


@pytest.mark.long
def test_local_fleet_starts_torchrl_env_actors_from_importable_factories(monkeypatch) -> None:
    pytest.importorskip("torchrl")
    from learner_client import GrpcCollector

    factories = ROOT / "tests" / "actor_service"  # rlfleet_test_torchrl, on the actors' path
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(factories)]))
    fleet = LocalFleet(
        2,
        kind="torchrl",
        env_factory="rlfleet_test_torchrl:cartpole",
        policy="rlfleet_test_torchrl:sampling_policy",
        policy_kwargs={"seed": 3},
        num_envs=2,
        seed=0,
        grace_period=1.0,
    )
    with fleet, GrpcCollector(fleet.addresses, frames_per_batch=80, sync=True) as collector:
        batch = collector.next()
    assert batch.batch_size == (2, 2, 20)  # [workers, envs, time]
    assert batch["next", "episode_reward"].dtype == torch.float32
    assert batch["step_count"].dtype == torch.int64
    assert batch["collector", "worker_id"][:, 0, 0].tolist() == [0, 1]
    ids = batch["collector", "traj_ids"]
    assert not set(ids[0].unique().tolist()) & set(ids[1].unique().tolist())


def test_local_fleet_raises_if_the_kind_is_unknown() -> None:
    with pytest.raises(ValueError, match="kind must be one of"):
        LocalFleet(1, kind="vmas")


@pytest.mark.long
def test_a_checkpoint_just_after_an_actor_restarts_waits_for_it():
    with (
        LocalFleet(1, num_envs=1, seed=0, grace_period=1.0) as fleet,
        GrpcCollector(fleet.addresses, frames_per_batch=8) as collector,
    ):
        next(iter(collector))
        fleet.kill(0)
        fleet.restart(0)  # the collector's channel may still be waiting to reconnect
        state = collector.state_dict()
        assert list(state["workers"]) == [0]
        collector.load_state_dict(state)


@pytest.mark.long
def test_a_sync_batch_right_after_a_restart_waits_for_the_restarted_actor():
    """``restart()`` returns once the new actor is ready; the collector's link to it may be
    sleeping in its reconnection backoff (up to 5 s) by then. The next sync round wakes that
    reconnection and waits for it instead of failing on an actor known to be down (it raised
    ``MissingWorkersError`` once, and the batch after it waited out the backoff)."""
    with (
        LocalFleet(2, num_envs=1, seed=0, grace_period=1.0) as fleet,
        GrpcCollector(fleet.addresses, frames_per_batch=8, sync=True) as collector,
    ):
        collector.next()
        for _ in range(2):
            fleet.kill(1)
            poll_until(lambda: collector.worker_states[1] == "down", timeout=10)
            fleet.restart(1)
            batch = collector.next()  # no MissingWorkersError
            assert batch["collector", "worker_id"][:, 0, 0].tolist() == [0, 1]


@pytest.mark.long
def test_a_second_collector_on_a_held_actor_fails_its_round_at_once_naming_take_over():
    """A notebook cell re-run while the last collector still holds the actor: the actor
    refuses the new session as busy, a failed connection attempt, so the strict round fails
    at once with the refusal and its fix (it waited out ``batch_timeout``, 60 s)."""
    with (
        LocalFleet(1, num_envs=1, grace_period=1.0) as fleet,
        GrpcCollector(fleet.addresses, frames_per_batch=4, sync=True) as first,
    ):
        first.next()
        second = GrpcCollector(fleet.addresses, frames_per_batch=4, sync=True, batch_timeout=2)
        with second:
            started = time.monotonic()
            with pytest.raises(MissingWorkersError, match=r"ActorBusyError.*take_over"):
                second.next()
            assert time.monotonic() - started < 15
            assert second.worker_states == {0: "down"}
            # A loop that catches the error and retries waits for the actor's return each
            # time: no spin of refused sessions at the other learner's actor.
            started = time.monotonic()
            for _ in range(2):
                with pytest.raises(MissingWorkersError):
                    second.next()
            assert time.monotonic() - started >= 3.5
            assert second.stats()["failures"] <= 10
        assert first.next().numel() == 4  # the first kept its session


@pytest.mark.long
def test_a_second_collector_on_a_held_actor_never_changes_the_policy_of_the_first():
    """A second job's collector with its own ``policy=`` on an actor another collector holds:
    the actor refuses its pushes as it refuses its session (RESOURCE_EXHAUSTED, naming the
    owner and take_over), so the first collector's batches go on acting with its weights
    (they acted with the second's, under a version the first never pushed). Once the first
    is gone, the second's first batch acts with its own weights, sent on admission."""
    with (
        LocalFleet(1, num_envs=1, grace_period=1.0) as fleet,
        GrpcCollector(
            fleet.addresses, frames_per_batch=4, sync=True, policy=cartpole_policy(action=0)
        ) as first,
    ):
        assert first.next()["action"].argmax(-1).eq(0).all()
        second = GrpcCollector(
            fleet.addresses,
            frames_per_batch=4,
            sync=True,
            policy=cartpole_policy(action=1),
            batch_timeout=2,
        )
        with second:
            with pytest.raises(MissingWorkersError, match=r"ActorBusyError.*serving.*take_over"):
                second.next()
            with pytest.raises(WeightPushError, match=r"RESOURCE_EXHAUSTED.*serving.*take_over"):
                second.update_policy_weights_()
            batch = first.next()
            assert batch["action"].argmax(-1).eq(0).all()
            assert batch["policy_version"].eq(1).all()
            first.shutdown()
            assert second.next()["action"].argmax(-1).eq(1).all()


@pytest.mark.long
def test_a_strict_round_fails_at_once_on_an_actor_another_learner_took_over():
    """A lost actor (taken over) is never retried, so the round does not wait on a
    reconnection for it: it fails well within ``batch_timeout``, naming that actor."""
    with (
        LocalFleet(2, num_envs=1, grace_period=1.0) as fleet,
        GrpcCollector(fleet.addresses, frames_per_batch=8, sync=True, batch_timeout=30) as first,
    ):
        first.next()
        with GrpcCollector(
            fleet.addresses[1:], frames_per_batch=4, take_over=True, batch_timeout=30
        ) as second:
            second.next()
            poll_until(lambda: first.worker_states[1] == "lost", timeout=10)
            started = time.monotonic()
            with pytest.raises(MissingWorkersError) as raised:
                first.next()
            assert time.monotonic() - started < 10
            assert raised.value.worker_ids == [1]


@pytest.mark.long  # 4-6 s: moved out of the quick suite's 10 minutes
def test_partial_rounds_go_on_at_once_without_a_dead_actor():
    """``allow_partial_batches``: a dead actor is left out of each round at once (a round
    does not wait on a reconnection attempt to it)."""
    with (
        LocalFleet(2, num_envs=1, grace_period=1.0) as fleet,
        GrpcCollector(
            fleet.addresses, frames_per_batch=8, sync=True, allow_partial_batches=True
        ) as collector,
    ):
        collector.next()
        fleet.kill(1)
        poll_until(lambda: collector.worker_states[1] == "down", timeout=10)
        for _ in range(5):
            started = time.monotonic()
            batch = collector.next()
            assert time.monotonic() - started < 1.0
            assert collector.missing_workers == [1]
            assert batch["collector", "worker_id"].unique().tolist() == [0]


@pytest.mark.long  # two actor starts: 6-7 s on 2 loaded cores
def test_an_actor_restarted_is_given_the_push_it_took_whole_and_versions_never_fall():
    """A push an actor applied is what it should hold: restarted (initial weights, version
    0) it is given that push again, whole where it was a delta, before its share counts,
    even where another actor holds a later one; the learner's counter stays at the latest.
    Each actor of a seeded fleet has a seed of its own."""
    policy = cartpole_policy(action=0)
    with (
        LocalFleet(2, num_envs=1, seed=0, grace_period=1.0) as fleet,
        GrpcCollector(
            fleet.addresses,
            frames_per_batch=8,
            sync=True,
            exploration_type=ExplorationType.DETERMINISTIC,
        ) as collector,
    ):
        first = collector.next()["observation"]
        assert not torch.equal(first[0], first[1])  # actor i is seeded seed + i
        version = collector.update_policy_weights_(policy, delta=True)[0]  # full: the first
        with torch.no_grad():
            [m for m in policy.modules() if isinstance(m, torch.nn.Linear)][-1].bias[0] = 6.0
        assert collector.update_policy_weights_(policy, delta=True) == dict.fromkeys(
            [0, 1], version + 1
        )
        assert collector.stats()["delta_pushes"] == 2
        assert collector.update_policy_weights_(cartpole_policy(action=1), worker_ids=[0]) == {
            0: version + 2
        }
        fleet.kill(1)
        fleet.restart(1)
        batch = collector.next()
        assert batch["policy_version"][1].unique().tolist() == [version + 1]
        assert batch["action"][1].argmax(-1).eq(0).all()
        assert collector.policy_version == version + 2
        pushed = collector.update_policy_weights_(cartpole_policy(action=0))
        assert pushed == {0: version + 3, 1: version + 3}


@pytest.mark.long
def test_an_actor_restarted_after_a_checkpoint_restore_is_given_the_checkpoints_weights():
    """A restore's weights are what each actor should hold from then on: one that restarts
    after it is given them again before its share is used (it came back with its initial
    weights, version 0, and its batches were acted with them)."""
    with (
        LocalFleet(2, num_envs=1, seed=0, grace_period=1.0) as fleet,
        GrpcCollector(
            fleet.addresses,
            frames_per_batch=8,
            sync=True,
            exploration_type=ExplorationType.DETERMINISTIC,  # sampled, 1 is picked 0.7% of steps
        ) as collector,
    ):
        collector.update_policy_weights_(cartpole_policy(action=0))
        saved_at = collector.next()["policy_version"].max().item()
        saved = collector.state_dict()
        collector.update_policy_weights_(cartpole_policy(action=1))
        collector.load_state_dict(saved)
        fleet.kill(1)
        fleet.restart(1)
        batch = collector.next()
        assert sorted(set(batch["policy_version"].flatten().tolist())) == [saved_at]
        assert batch["action"].argmax(-1).eq(0).all()  # the checkpoint's policy: always 0


def test_a_fleet_with_a_token_gives_it_to_its_actors_and_collectors_off_the_command_line():
    """Other users of the machine reach the actors' loopback ports: with ``token=`` the actors
    require it (from their environment: ``ps`` shows no token), and a collector given the
    fleet sends it; one given only the addresses is refused."""
    token = "fleet-secret-" + os.urandom(4).hex()
    with LocalFleet(1, num_envs=1, token=token, grace_period=1.0) as fleet:
        command_line = pathlib.Path(f"/proc/{fleet.pids[0]}/cmdline").read_bytes()
        assert token.encode() not in command_line
        with pytest.raises(AuthenticationError):
            GrpcCollector(fleet.addresses, frames_per_batch=4)
        collector = GrpcCollector(fleet, frames_per_batch=4, total_frames=8)
        assert sum(batch.numel() for batch in collector) == 8
        collector.shutdown()
    with pytest.raises(ValueError, match="printable ASCII"):
        LocalFleet(1, token="two\nlines")


def test_a_fleet_takes_any_integer_seed_up_to_the_largest_one():
    """Seeds are uint64 on the wire: the top one reaches the actor (its flag used to stop at
    2**63 - 1, so a fleet's actor died at start), and a numpy int is an int."""
    with (
        LocalFleet(1, num_envs=1, seed=np.uint64(2**64 - 1), grace_period=1.0) as fleet,
        GrpcCollector(fleet.addresses, frames_per_batch=4) as collector,
    ):
        assert collector.next().numel() == 4


@pytest.mark.long
def test_an_actor_down_during_an_automatic_push_is_given_that_push_when_it_returns():
    """The ``policy=`` module's automatic push goes to the actors that are up; one that was
    down is given that push when it is re-admitted (it used to get the push before it, and
    the sync batch mixed two versions)."""
    policy = cartpole_policy(action=0)
    with (
        LocalFleet(2, num_envs=1, seed=0, grace_period=1.0) as fleet,
        GrpcCollector(fleet, frames_per_batch=8, sync=True, policy=policy) as collector,
    ):
        collector.next()
        fleet.kill(0)
        with torch.no_grad():  # an optimiser step: the automatic push of the next batch
            next(policy.parameters()).add_(0.5)
        with pytest.raises(MissingWorkersError):  # pushed to worker 1; worker 0 is down
            collector.next()
        fleet.restart(0)
        batch = collector.next()
        versions = batch["policy_version"].flatten().tolist()
        assert set(versions) == {collector.policy_version}


def _actor_argv(pid: int) -> list[str]:
    """An actor process's command line (its launcher exec'd into it: same pid)."""
    return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def _flag(argv: list[str], name: str) -> str:
    return argv[len(argv) - 1 - argv[::-1].index(name) + 1]  # the last one given wins


def test_each_actor_is_started_with_its_worker_id_its_seed_and_the_fleets_grace_period(
    monkeypatch,
):
    """Actor ``w`` is seeded ``seed + w`` (two actors on one seed would send the same
    trajectories), gets the fleet's grace period and unbuffered output (its ready line)."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # the fleet sets it, not the shell
    with LocalFleet(2, num_envs=1, seed=5, worker_ids=[2, 7], grace_period=1.5) as fleet:
        argvs = [_actor_argv(pid) for pid in fleet.pids]
        environ = pathlib.Path(f"/proc/{fleet.pids[0]}/environ").read_bytes().split(b"\0")
        assert [_worker_id(a) for a in fleet.addresses] == [2, 7]
    assert [_flag(argv, "--worker-id") for argv in argvs] == ["2", "7"]
    assert [_flag(argv, "--seed") for argv in argvs] == ["7", "12"]
    assert [float(_flag(argv, "--grace-period")) for argv in argvs] == [1.5, 1.5]
    assert b"PYTHONUNBUFFERED=1" in environ
    assert "worker_id" in fleet.stderr_tail(7)  # its log, kept once the actor is stopped


def test_a_fleet_takes_the_learners_token_and_none_from_an_empty_one(monkeypatch):
    monkeypatch.setenv("RLFLEET_TOKEN", "inherited")
    assert LocalFleet(1).token == "inherited"
    assert LocalFleet(1, token="own").token == "own"
    monkeypatch.setenv("RLFLEET_TOKEN", "")  # unset by an empty export: no token
    assert LocalFleet(1).token is None


def test_an_exit_message_names_the_error_line_even_when_the_actor_logged_after_it():
    tail = (
        '{"event": "actor.config", "env": "CartPole-v1"}\n'
        '{"event": "actor.start_failed", "error": "port 5 in use"}\n'
        '{"event": "actor.exit"}\n'
    )
    first = exit_message("actor worker_id=3", 1, tail).splitlines()[0]
    assert first.startswith("actor worker_id=3 exited with code 1 before it was ready: ")
    assert "port 5 in use" in first
    assert "(no output)" in exit_message("actor", None, "\n").splitlines()[0]
