"""The env pool: gymnasium vector envs with same-step autoreset, timeouts and reaping."""

from __future__ import annotations

import multiprocessing
import pathlib
import threading
import time
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv
from helpers import process_gone

from actor_service._config import ActorConfig, section_of
from actor_service._core._settings import EnvPoolSettings
from actor_service._kinds.env import pool as pool_module
from actor_service._kinds.env.check import check
from actor_service._kinds.env.pool import (
    close_pool,
    kill_pool,
    make_env_pool,
    reset_pool,
    step_pool,
)
from actor_service._kinds.env.spaces import check_space
from actor_service._serve._collect import env_failure
from common.errors import MAX_ENV_MESSAGE, EnvError

HERE = str(pathlib.Path(__file__).resolve().parents[2])  # the helpers of tests/actor_service


@pytest.fixture(autouse=True)
def _test_factories_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(HERE)


def test_make_env_pool_autoresets_in_the_same_step_with_final_obs_in_info() -> None:
    config = ActorConfig(num_envs=2, env_pool=EnvPoolSettings(env_kwargs={"max_episode_steps": 3}))
    pool = make_env_pool(config)
    try:
        assert isinstance(pool, SyncVectorEnv)
        first = reset_pool(pool, 1.0, seed=[1, 2]).copy()
        for _ in range(2):
            obs, _, _, truncated, info = step_pool(pool, np.zeros(2, dtype=np.int64), 1.0)
            assert not truncated.any()
        obs, _, _, truncated, info = step_pool(pool, np.zeros(2, dtype=np.int64), 1.0)
        assert truncated.all()  # env_kwargs reached gymnasium.make
        assert info["_final_obs"].all()
        assert not np.allclose(info["final_obs"][0], obs[0])
        assert np.abs(obs).max() <= 0.05
        assert np.abs(first).max() <= 0.05
    finally:
        close_pool(pool)


def test_make_env_pool_calls_the_factory_with_env_kwargs() -> None:
    config = ActorConfig(
        num_envs=1,
        env_pool=EnvPoolSettings(
            env_factory="rlfleet_test_envs:crashing_cartpole", env_kwargs={"steps": 1}
        ),
    )
    pool = make_env_pool(config)
    try:
        reset_pool(pool, 1.0)
        step_pool(pool, np.zeros(1, dtype=np.int64), 1.0)
        with pytest.raises(EnvError, match="simulator crashed") as info:
            step_pool(pool, np.zeros(1, dtype=np.int64), 1.0, env="crashing")
        assert (info.value.env, info.value.exception_type) == ("crashing", "RuntimeError")
        assert info.value.exception_message == "simulator crashed"
    finally:
        close_pool(pool)


@pytest.mark.parametrize(
    ("kind", "exception_type", "text"),
    [
        ("surrogates", "RuntimeError", "\\udcff"),
        ("huge", "RuntimeError", "xxx..."),
        ("unprintable", "_UnprintableError", "str() of the _UnprintableError raised ValueError>"),
        ("base_exception", "_UserBaseError", "abort"),
        ("system_exit", "SystemExit", "3"),
        ("keyboard_interrupt", "KeyboardInterrupt", ""),
    ],
)
def test_any_exception_of_the_env_is_an_env_error_that_can_be_sent(
    kind: str, exception_type: str, text: str
) -> None:
    # A surrogate could not go into the end message, a __str__ that raised or an exception
    # outside Exception escaped: the session stalled (the learner waited out batch_timeout);
    # SystemExit and KeyboardInterrupt ended the actor's process.
    config = ActorConfig(
        num_envs=1,
        env_pool=EnvPoolSettings(
            env_factory="rlfleet_test_envs:oddly_crashing_cartpole", env_kwargs={"kind": kind}
        ),
    )
    pool = make_env_pool(config)
    try:
        reset_pool(pool, 1.0)
        with pytest.raises(EnvError) as info:
            step_pool(pool, np.zeros(1, dtype=np.int64), 1.0, env="odd")
        error = info.value
        assert error.exception_type == exception_type
        assert error.exception_message is not None
        assert error.exception_message.endswith(text)
        assert len(error.exception_message) <= MAX_ENV_MESSAGE
        failure = env_failure(error, full=True)  # what the end message carries
        assert failure.exception_message == error.exception_message
        assert len(failure.SerializeToString()) < 2 * MAX_ENV_MESSAGE
    finally:
        close_pool(pool)


def _config(fields: dict[str, Any]) -> ActorConfig:
    """The config of ``fields``, the env pool's in its section."""
    pool = {name: fields.pop(name) for name in list(fields) if section_of(name) == "env_pool"}
    return ActorConfig(env_pool=EnvPoolSettings(**pool), **fields)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"env_factory": "no_colon"}, "package.module:function"),
        ({"env_factory": "not_a_module_xyz:make"}, "cannot import module"),
        ({"env_factory": "rlfleet_test_envs:missing"}, "has no attribute"),
        ({"env_factory": "rlfleet_test_envs:text_env"}, "observation space .* not supported"),
        (  # a Dict space is named by its kind and size, and the fixes are named
            {"env_factory": "rlfleet_test_envs:dict_env"},
            r"^observation space Dict of 500 spaces is not supported .*FlattenObservation"
            r".*kind torchrl.{0,200}$",
        ),
        ({"env": "NoSuchEnv-v9"}, "cannot create"),
        ({"env_backend": "threads"}, "env_backend"),
        ({"num_envs": 0}, "num_envs"),
    ],
)
def test_make_env_pool_raises_if_misconfigured(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_env_pool(_config({"num_envs": 1, **overrides}))


@pytest.mark.parametrize(
    "space",
    [
        gymnasium.spaces.Sequence(gymnasium.spaces.Discrete(3)),
        gymnasium.spaces.Graph(gymnasium.spaces.Box(0, 1, (2,)), None),
    ],
)
def test_a_space_no_wrapper_takes_is_refused_without_naming_wrappers_that_fail(space) -> None:
    """Sequence and Graph: FlattenObservation keeps them what they are and TorchRL's
    GymWrapper refuses them; the message named both as fixes."""
    with pytest.raises(ValueError, match="a wrapper of your own") as refused:
        check_space(space, "observation")
    assert "--kind torchrl" not in str(refused.value)


def _two_async_envs(factory: str = "", **env_kwargs: Any) -> tuple[Any, list[int]]:
    """An async pool of two envs (``factory``'s, else CartPole) and its workers' pids."""
    settings = EnvPoolSettings(env_backend="async", env_factory=factory, env_kwargs=env_kwargs)
    pool = make_env_pool(ActorConfig(num_envs=2, env_pool=settings))
    return pool, [p.pid for p in pool.processes]


def test_async_pool_steps_in_subprocesses_and_close_reaps_them() -> None:
    pool = make_env_pool(ActorConfig(num_envs=2, env_pool=EnvPoolSettings(env_backend="async")))
    assert isinstance(pool, AsyncVectorEnv)
    pids = [p.pid for p in pool.processes]
    reset_pool(pool, 30.0, seed=[0, 1])
    obs, reward, *_ = step_pool(pool, np.zeros(2, dtype=np.int64), 30.0)
    assert obs.shape == (2, 4)
    assert reward.tolist() == [1.0, 1.0]
    close_pool(pool)
    close_pool(pool)  # idempotent
    assert all(process_gone(pid) for pid in pids)


def test_step_pool_names_the_declared_shape_when_an_observation_breaks_it() -> None:
    # The sync pool's error is numpy's "Output array is the wrong shape", naming no shape
    # (the async pool's worker says "could not broadcast ... from shape (5,) into (4,)").
    config = ActorConfig(
        num_envs=2, env_pool=EnvPoolSettings(env_factory="rlfleet_test_envs:wrong_shape_cartpole")
    )
    pool = make_env_pool(config)
    try:
        reset_pool(pool, 30.0)
        with pytest.raises(EnvError) as raised:
            step_pool(pool, np.zeros(2, dtype=np.int64), 30.0, env="wrong")
    finally:
        close_pool(pool, force=True)
    assert "shape [4] and dtype float32 its observation_space declares" in (
        raised.value.exception_message or ""
    )


@pytest.mark.parametrize(
    ("env_kwargs", "declared"),
    [
        ({"shape": [1]}, "shape [1] and dtype float32"),  # numpy: "wrong dimensionality"
        ({"shape": [], "dtype": "int64"}, "shape [] and dtype int64"),  # numpy: "Cannot cast"
    ],
)
def test_reset_pool_names_the_declared_space_when_an_observation_does_not_fit_it(
    env_kwargs: dict[str, Any], declared: str
) -> None:
    # A python float for a Box of shape (1,), or for an integer Box, failed with numpy's
    # words alone, naming neither the space nor what the env should return.
    settings = EnvPoolSettings(
        env_factory="rlfleet_test_envs:plain_number_env", env_kwargs=env_kwargs
    )
    pool = make_env_pool(ActorConfig(num_envs=2, env_pool=settings))
    try:
        with pytest.raises(EnvError) as raised:
            reset_pool(pool, 30.0, env="plain")
    finally:
        close_pool(pool, force=True)
    assert f"observation does not have the {declared} its observation_space declares" in (
        raised.value.exception_message or ""
    )


def test_step_pool_names_an_async_envs_own_exception_if_its_text_holds_a_percent_sign() -> None:
    # gymnasium formatted the worker's traceback as a %-format string: the learner was told
    # "TypeError: not enough arguments for format string", not the env's error.
    pool, pids = _two_async_envs(
        "rlfleet_test_envs:crashing_cartpole", message="pressure at 120% of the limit"
    )
    try:
        reset_pool(pool, 30.0)
        with pytest.raises(EnvError) as raised:
            step_pool(pool, np.zeros(2, dtype=np.int64), 30.0, env="crashing")
    finally:
        close_pool(pool, force=True)
    assert raised.value.exception_type == "RuntimeError"
    assert raised.value.exception_message == "pressure at 120% of the limit"
    assert all(process_gone(pid) for pid in pids)


def test_step_pool_raises_the_envs_timeout_if_an_async_env_hangs() -> None:
    pool, pids = _two_async_envs("rlfleet_test_envs:hanging_cartpole")
    try:
        reset_pool(pool, 30.0)
        started = time.monotonic()
        with pytest.raises(EnvError, match=r"step_timeout=0\.3") as raised:
            step_pool(pool, np.zeros(2, dtype=np.int64), 0.3)
        assert raised.value.exception_type == "TimeoutError"
        assert time.monotonic() - started < 5.0
    finally:
        close_pool(pool, force=True)
    assert all(process_gone(pid) for pid in pids)


def test_an_env_errors_type_and_escaped_text_are_cut_to_the_limit() -> None:
    """The cut holds after escaping (a surrogate is 6 characters) and for the type name too."""
    error = EnvError("e", "T" * 100_000, "\udcff" * MAX_ENV_MESSAGE)
    assert error.exception_type is not None
    assert error.exception_message is not None
    assert 0 < len(error.exception_type) <= MAX_ENV_MESSAGE
    assert 0 < len(error.exception_message) <= MAX_ENV_MESSAGE
    assert error.exception_message.startswith("\\udcff")


def test_make_env_pool_refuses_an_unsupported_action_space() -> None:
    config = ActorConfig(
        num_envs=1,
        env_pool=EnvPoolSettings(
            env_factory="rlfleet_test_envs:text_env", env_kwargs={"role": "action"}
        ),
    )
    with pytest.raises(ValueError, match=r"^action space Text\(.* is not supported"):
        make_env_pool(config)


def test_an_async_pool_of_unsupported_spaces_is_reaped_before_the_error() -> None:
    config = ActorConfig(
        num_envs=1,
        env_pool=EnvPoolSettings(env_backend="async", env_factory="rlfleet_test_envs:text_env"),
    )
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match="observation space Text") as refused:
        make_env_pool(config)
    # The traceback holds the pool: its workers are gone by then, not when it is collected.
    assert refused.traceback
    assert set(multiprocessing.active_children()) <= before


def test_reset_pool_raises_the_envs_timeout_if_an_async_env_hangs_in_reset() -> None:
    pool, pids = _two_async_envs("rlfleet_test_envs:reset_hanging_cartpole")
    try:
        started = time.monotonic()
        with pytest.raises(EnvError, match=r"an env reset took .*step_timeout=0\.3") as raised:
            reset_pool(pool, 0.3, seed=[0, 1])
        assert raised.value.exception_type == "TimeoutError"
        assert time.monotonic() - started < 5.0
    finally:
        close_pool(pool, force=True)
    assert all(process_gone(pid) for pid in pids)


def test_close_pool_kills_a_hung_worker_that_ignores_sigterm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool_module, "_REAP_TIMEOUT", 0.2)
    pool, pids = _two_async_envs("rlfleet_test_envs:sigterm_deaf_hanging_cartpole")
    closing = threading.Thread(target=close_pool, args=(pool,), kwargs={"force": True})
    try:
        reset_pool(pool, 30.0)
        with pytest.raises(EnvError, match="step_timeout"):
            step_pool(pool, np.zeros(2, dtype=np.int64), 0.3)
        closing.start()
        closing.join(5.0)
        assert not closing.is_alive()
    finally:
        kill_pool(pool)  # a close that hung returns once its workers are gone
        if closing.ident:
            closing.join(5.0)
    assert all(process_gone(pid) for pid in pids)


def test_close_pool_terminates_a_worker_whose_envs_close_hangs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool_module, "_REAP_TIMEOUT", 0.2)
    pool, pids = _two_async_envs("rlfleet_test_envs:close_hanging_cartpole", where="worker")
    closing = threading.Thread(target=close_pool, args=(pool,), daemon=True)
    try:
        reset_pool(pool, 30.0)
        closing.start()
        closing.join(10.0)
        assert not closing.is_alive(), "close_pool waited for a close() that never returns"
    finally:
        kill_pool(pool)  # a close that hung returns once its workers are gone
    assert all(process_gone(pid) for pid in pids)


@pytest.mark.long
@pytest.mark.parametrize(
    ("factory", "env_kwargs", "logged"),
    [
        ("close_hanging_cartpole", {"where": "actor", "seconds": 60.0}, "took over 0.2 s"),
        ("close_raising_crashing_cartpole", {}, "raised RuntimeError: the simulator would not"),
    ],
)
def test_make_env_pool_builds_an_async_pool_if_the_envs_close_hangs_or_raises(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    factory: str,
    env_kwargs: dict[str, Any],
    logged: str,
) -> None:
    """gymnasium builds and closes one env in the actor's process to read the spaces: a
    close() that hangs there hung the build (the actor never served), one that raises
    failed it; both are logged, naming the env and the fix, and the pool is built."""
    monkeypatch.setattr(pool_module, "_REAP_TIMEOUT", 0.2)
    settings = EnvPoolSettings(
        env_backend="async", env_factory=f"rlfleet_test_envs:{factory}", env_kwargs=env_kwargs
    )
    built: list[Any] = []

    def build() -> None:
        try:
            built.append(make_env_pool(ActorConfig(num_envs=1, env_pool=settings)))
        except ValueError as exc:
            built.append(exc)

    building = threading.Thread(target=build, daemon=True)
    building.start()
    building.join(45.0)
    assert not building.is_alive(), "the pool was not built"
    assert isinstance(built[0], AsyncVectorEnv), built[0]
    pids = [p.pid for p in built[0].processes]
    close_pool(built[0], force=True)
    assert all(process_gone(pid) for pid in pids)
    assert f"env 'rlfleet_test_envs:{factory}'" in caplog.text
    assert logged in caplog.text
    assert "make close() return" in caplog.text


def test_kill_pool_kills_an_async_pools_workers_and_counts_the_live_ones() -> None:
    pool, pids = _two_async_envs()
    try:
        reset_pool(pool, 30.0)
        assert kill_pool(pool) == 2
        assert all(process_gone(pid) for pid in pids)
        assert kill_pool(pool) == 0  # none left alive
    finally:
        close_pool(pool, force=True)
    sync = make_env_pool(ActorConfig(num_envs=2))
    try:
        assert kill_pool(sync) == 0  # nothing runs in a subprocess
    finally:
        close_pool(sync)


@pytest.mark.parametrize("kind", ["system_exit", "keyboard_interrupt", "base_exception"])
def test_any_exception_of_an_env_reset_is_an_env_error(kind: str) -> None:
    config = ActorConfig(
        num_envs=1,
        env_pool=EnvPoolSettings(
            env_factory="rlfleet_test_envs:oddly_crashing_cartpole",
            env_kwargs={"kind": kind, "call": "reset"},
        ),
    )
    pool = make_env_pool(config)
    try:
        with pytest.raises(EnvError) as info:
            reset_pool(pool, 1.0, env="odd")
    finally:
        close_pool(pool)
    assert info.value.env == "odd"


def test_close_pool_closes_a_healthy_async_pools_envs_in_their_workers(
    tmp_path: pathlib.Path,
) -> None:
    marker = tmp_path / "closed"
    pool, pids = _two_async_envs("rlfleet_test_envs:close_marking_cartpole", marker=str(marker))
    marker.unlink(missing_ok=True)  # the parent's probe env, closed while building the pool
    reset_pool(pool, 30.0)
    close_pool(pool)
    assert all(process_gone(pid) for pid in pids)
    assert marker.read_text().splitlines() == ["closed", "closed"]  # each worker's env.close()


def test_the_check_names_kind_torchrl_for_a_torchrl_env_class_of_the_users_own() -> None:
    config = ActorConfig(
        num_envs=1, env_pool=EnvPoolSettings(env_factory="rlfleet_test_torchrl:users_torchrl_env")
    )
    with pytest.raises(
        ValueError, match=r"returns a TorchRL env \(_UsersCountingEnv\).*--kind torchrl"
    ):
        check(config)


@pytest.mark.parametrize("backend", ["sync", "async"])
def test_make_env_pool_raises_if_the_factory_returns_a_vector_env(backend: str) -> None:
    """A factory returning ``gymnasium.make_vec(...)`` made a pool of pools: an in-process
    server came up SERVING and every batch failed on numpy's words ("setting an array element
    with a sequence"), or the mlp policy refused a MultiDiscrete, never naming the factory."""
    settings = EnvPoolSettings(env_factory="rlfleet_test_envs:vector_cartpole", env_backend=backend)
    config = ActorConfig(num_envs=2, env_pool=settings)
    fix = r"returned a CartPoleVectorEnv, a vector env of 2 envs: it must return one env.*num_envs"
    with pytest.raises(ValueError, match=fix):
        make_env_pool(config)
    with pytest.raises(ValueError, match=fix):  # the command line's check says the same
        check(config)


def test_the_check_goes_on_naming_the_env_if_its_close_hangs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The check before the port is bound builds and closes one env in the actor's
    process: a close() that hung there kept the actor from ever binding, saying nothing."""
    monkeypatch.setattr(pool_module, "_REAP_TIMEOUT", 0.2)
    factory = "rlfleet_test_envs:close_hanging_cartpole"
    settings = EnvPoolSettings(env_factory=factory, env_kwargs={"where": "actor", "seconds": 30.0})
    checking = threading.Thread(target=check, args=(ActorConfig(env_pool=settings),), daemon=True)
    checking.start()
    checking.join(20.0)
    assert not checking.is_alive(), "the check waited for a close() that does not return"
    assert f"env {factory!r}: close() of an env built in the actor's process" in caplog.text
    assert "make close() return" in caplog.text


def test_an_unsupported_action_space_is_not_told_to_flatten_observations() -> None:
    space = gymnasium.spaces.Dict({"a": gymnasium.spaces.Box(0, 1, (2,))})
    with pytest.raises(
        ValueError, match=r"^action space Dict of 1 spaces .*--kind torchrl"
    ) as info:
        check_space(space, "action")
    assert "FlattenObservation" not in str(info.value)


def test_an_unsupported_space_with_a_huge_repr_is_cut_in_the_message() -> None:
    space = gymnasium.spaces.Text(5, charset="".join(chr(c) for c in range(0x100, 0x900)))
    with pytest.raises(ValueError, match="is not supported") as info:
        check_space(space, "observation")
    assert len(str(info.value)) < 1000
