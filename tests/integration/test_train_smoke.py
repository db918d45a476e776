"""Smoke test of ``rlfleet-train``: the real entry point, real actors, a tiny budget."""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import sys

import grpc
import gymnasium as gym
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.policies import make_policy
from common.weights import decode_weights, load_into
from learner_client import GrpcCollector
from learner_client._local_fleet import LocalFleet

pytestmark = pytest.mark.long

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _actor_processes(seed: int) -> list[int]:
    # Actors of one run are recognisable by their --seed (seed + worker_id).
    marks = {f"--seed\0{seed}\0", f"--seed\0{seed + 1}\0"}
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "actor_service" in cmdline and any(mark in cmdline for mark in marks):
            found.append(int(proc.name))
    return found


def _train(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apps.ppo", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env=None if env is None else {**os.environ, **env},
    )


def test_train_entry_point_runs_a_tiny_budget_and_writes_its_outputs(tmp_path):
    # Async here; the sync loop runs the entry point in test_train_solves_cartpole.
    seed = random.randrange(10**6, 10**9)
    out = tmp_path / "run"
    result = _train(
        "--num-actors",
        "2",
        "--num-envs",
        "2",
        "--frames-per-batch",
        "64",
        "--total-frames",
        "128",
        "--minibatch-size",
        "32",
        "--hidden",
        "16,16",
        "--seed",
        str(seed),
        "--out",
        str(out),
        "--no-progress",
        "--async",
    )
    assert result.returncode == 0, result.stderr
    assert "128 frames" in result.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert summary["frames"] == 128
    assert summary["batches"] == 2
    assert summary["reached_target"] is False
    assert summary["policy_version"] >= 2
    assert summary["settings"]["sync"] is False
    assert (out / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"

    env = gym.make("CartPole-v1")
    policy = make_policy("mlp", env.observation_space, env.action_space, hidden=[16, 16])
    state, metadata = decode_weights((out / "policy.safetensors").read_bytes())
    load_into(policy, state)
    assert metadata["env"] == "CartPole-v1"
    assert _actor_processes(seed) == []


def test_train_last_update_learns_and_the_progress_shows_the_end(tmp_path):
    # Annealing by the frames after the batch gave the last update (here the only one with a
    # change to make: one batch) a learning rate of 0, and --log-every 5 hid the last state.
    flags = ["--num-actors", "1", "--num-envs", "2", "--frames-per-batch", "64"]
    flags += ["--total-frames", "64", "--minibatch-size", "32", "--hidden", "16,16"]
    result = _train(*flags, "--seed", "3", "--log-every", "5", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("frames=")]
    assert lines[-1].startswith("frames=64 "), lines
    torch.manual_seed(3)  # as the job seeds the policy it builds
    env = gym.make("CartPole-v1")
    initial = make_policy("mlp", env.observation_space, env.action_space, hidden=[16, 16])
    state, _ = decode_weights((tmp_path / "policy.safetensors").read_bytes())
    moved = [k for k, v in initial.state_dict().items() if not torch.equal(v, state[k])]
    assert moved, "the only update left the weights as they were built"


def test_train_entry_point_exits_non_zero_with_a_message_on_an_unknown_env(tmp_path):
    result = _train("--env", "NoSuchEnv-v0", "--out", str(tmp_path), "--no-progress")
    assert result.returncode == 1
    assert "rlfleet-train: error:" in result.stderr
    assert "NoSuchEnv" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def external_fleet():
    with LocalFleet(
        2, num_envs=2, seed=5, grace_period=1.0, policy_kwargs={"hidden": [16, 16]}
    ) as fleet:
        yield fleet


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def test_train_entry_point_trains_against_an_existing_fleet_and_leaves_it_running(
    tmp_path, external_fleet
):
    result = _train(
        "--actors",
        ",".join(external_fleet.addresses),
        "--frames-per-batch",
        "64",
        "--total-frames",
        "128",
        "--minibatch-size",
        "32",
        "--hidden",
        "16,16",
        "--out",
        str(tmp_path),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "summary.json").read_text())["frames"] == 128
    assert all(external_fleet.is_alive(w) for w in (0, 1))
    assert all(_serving(a) for a in external_fleet.addresses)


def test_train_entry_point_takes_over_actors_another_learner_holds(tmp_path, external_fleet):
    """--take-over ends the sessions another learner left open (else: retried, then exit 1)."""
    holder = GrpcCollector(external_fleet.addresses, frames_per_batch=16)
    try:
        holder.next()  # its sessions stay open: the actors serve it
        result = _train(
            "--actors", ",".join(external_fleet.addresses), "--take-over",
            "--frames-per-batch", "64", "--total-frames", "64", "--minibatch-size", "32",
            "--hidden", "16,16", "--out", str(tmp_path), "--no-progress",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        assert json.loads((tmp_path / "summary.json").read_text())["frames"] == 64
    finally:
        holder.shutdown(timeout=5)


def test_train_entry_point_refuses_a_fleet_that_runs_another_env_or_repeats_a_worker_id(
    tmp_path, external_fleet
):
    """One-line messages and exit 1, not a traceback, nor a run on another env."""
    addresses = external_fleet.addresses
    fleet = ",".join(addresses)
    other_env = _train("--actors", fleet, "--env", "CartPole-v0", "--out", str(tmp_path))
    assert other_env.returncode == 1, other_env.stderr
    assert "rlfleet-train: error: --env CartPole-v0, but the actors at" in other_env.stderr
    assert "CartPole-v1" in other_env.stderr
    port = addresses[0].rpartition(":")[2]  # one actor under two names: one worker_id twice
    other_policy = _train("--actors", fleet, "--hidden", "32,32", "--out", str(tmp_path))
    assert other_policy.returncode == 1, other_policy.stderr  # not after a training step
    assert "--hidden 32,32 builds a policy whose module.0.module.1.bias is [32], but the " in (
        other_policy.stderr
    )
    twice = _train(
        "--actors",
        f"127.0.0.1:{port},localhost:{port}",
        "--hidden",
        "16,16",
        "--out",
        str(tmp_path),
    )
    assert twice.returncode == 1, twice.stderr
    assert "rlfleet-train: error: the fleet at --actors: worker_ids must be unique" in twice.stderr
    for result in (other_env, other_policy, twice):
        assert "Traceback" not in result.stderr
    assert all(_serving(a) for a in addresses)


def test_train_entry_point_exits_130_on_ctrl_c_and_releases_the_actors(tmp_path, external_fleet):
    learner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "apps.ppo",
            "--actors",
            ",".join(external_fleet.addresses),
            "--frames-per-batch",
            "64",
            "--minibatch-size",
            "32",
            "--hidden",
            "16,16",
            "--out",
            str(tmp_path),
            "--no-progress",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The first progress line means training is under way.
        assert learner.stderr.readline().startswith("frames=")
        learner.send_signal(signal.SIGINT)
        _, err = learner.communicate(timeout=60)
    finally:
        learner.kill()
    assert learner.returncode == 130, err
    assert "rlfleet-train: interrupted (outputs of " in err
    assert "Traceback" not in err
    # Stopped between two updates: the weights every actor took, and what led to them, kept.
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert summary["batches"] >= 1
    assert summary["frames"] == 64 * summary["batches"]
    state, _ = decode_weights((tmp_path / "policy.safetensors").read_bytes())
    # The actors are free for the next learner.
    with GrpcCollector(
        external_fleet.addresses, frames_per_batch=16, total_frames=16, sync=False
    ) as collector:
        held = collector.actor_state(collector.worker_ids[0])["models"]["policy"]["weights"]
        assert next(iter(collector)).numel() == 16
    assert state.keys() == held.keys()
    assert all(torch.equal(state[k], held[k]) for k in state)


@pytest.mark.slow
def test_train_entry_point_authenticates_with_the_token_from_the_environment(tmp_path):
    flags = [
        "--frames-per-batch",
        "32",
        "--total-frames",
        "64",
        "--minibatch-size",
        "32",
        "--hidden",
        "16,16",
        "--no-progress",
        "--async",
    ]
    with LocalFleet(
        1,
        num_envs=2,
        seed=7,
        grace_period=1.0,
        policy_kwargs={"hidden": [16, 16]},
        token="s3cret",
    ) as fleet:
        refused = _train(
            "--actors",
            fleet.addresses[0],
            "--out",
            str(tmp_path / "a"),
            *flags,
            env={"RLFLEET_TOKEN": "wrong"},
        )
        accepted = _train(
            "--actors",
            fleet.addresses[0],
            "--out",
            str(tmp_path / "b"),
            *flags,
            env={"RLFLEET_TOKEN": "s3cret"},
        )
    assert refused.returncode == 1
    assert "UNAUTHENTICATED" in refused.stderr
    assert "s3cret" not in refused.stderr
    assert accepted.returncode == 0, accepted.stderr
    summary = (tmp_path / "b" / "summary.json").read_text()
    assert json.loads(summary)["frames"] == 64
    assert "s3cret" not in summary
