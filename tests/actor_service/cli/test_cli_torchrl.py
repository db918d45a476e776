"""``rlfleet-actor --kind torchrl``: defaults, and exit 2 before binding on bad input."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from actor_service import parse_config

HERE = pathlib.Path(__file__).resolve().parents[1]  # the helpers of tests/actor_service
ROOT = HERE.parents[1]
ENV = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}


def _run(
    args: list[str], prelude: str = "", kind: str = "torchrl"
) -> subprocess.CompletedProcess[str]:
    code = f"{prelude}\nfrom actor_service.__main__ import main\nmain()"
    return subprocess.run(
        [sys.executable, "-c", code, "--kind", kind, "--port", "0", *args],
        capture_output=True, text=True, timeout=120, env=ENV,
    )  # fmt: skip


def test_cli_torchrl_kind_acts_at_random_unless_given_a_policy() -> None:
    config = parse_config(["--kind", "torchrl"], {}, hostname="h")
    assert config.kind == "torchrl"
    assert config.models[0].factory == "random"
    given = parse_config(["--kind", "torchrl", "--policy", "pkg.mod:make"], {}, hostname="h")
    assert given.models[0].factory == "pkg.mod:make"


def test_cli_env_backend_torchrl_is_the_torchrl_kind_in_process() -> None:
    config = parse_config(["--env", "Pendulum-v1", "--env-backend", "torchrl"], {}, hostname="h")
    assert (config.kind, config.env_backend, config.env) == ("torchrl", "sync", "Pendulum-v1")
    assert config.models[0].factory == "random"
    by_variable = parse_config([], {"RLFLEET_ENV_BACKEND": "torchrl"}, hostname="h")
    assert (by_variable.kind, by_variable.env_backend) == ("torchrl", "sync")
    with pytest.raises(SystemExit) as exc:
        parse_config(["--kind", "llm", "--env-backend", "torchrl"], {}, hostname="h")
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env-factory", "rlfleet_test_torchrl:raising_env"], "no env today"),
        (["--env-factory", "rlfleet_test_torchrl:not_an_env"], "not a torchrl.envs.EnvBase"),
        (["--policy", "rlfleet_test_torchrl:raising_policy"], "no policy today"),
        (["--policy", "mlp"], "gymnasium spaces"),
        (["--policy-kwargs", '{"cfg": {"lr": 1}}'], "'random' policy takes no arguments"),
        (["--env-factory", "no_such_module_x:make"], "no_such_module_x"),
        (["--device", "meta"], "the meta device holds no data"),
        (
            ["--env-factory", "rlfleet_test_torchrl:heterogeneous_counting"],
            "agents of different shapes",
        ),
        (["--env-factory", "rlfleet_test_torchrl:dynamic_spec"], "a varying shape"),
        (["--env-factory", "rlfleet_test_torchrl:metadata_env"], "non_tensor"),
    ],
    ids=[
        "env-raises",
        "not-an-env",
        "policy-raises",
        "mlp",
        "random-with-kwargs",
        "no-module",
        "meta-device",
        "heterogeneous",
        "dynamic-spec",
        "non-tensor-int",
    ],
)
@pytest.mark.long
def test_cli_torchrl_exits_2_before_binding_on_bad_factories(args: list[str], message: str) -> None:
    out = _run(args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert "--kind torchrl" in out.stderr
    assert "ready" not in out.stdout


def test_cli_torchrl_exits_2_naming_the_extra_without_torchrl() -> None:
    out = _run([], prelude="import sys; sys.modules['torchrl'] = None")
    assert out.returncode == 2, out.stderr
    assert "pip install 'rlfleet[torchrl]'" in out.stderr
    assert "ready" not in out.stdout


@pytest.mark.parametrize(
    ("env", "policy", "needs"),
    [
        ("CartPole-v1", "gym_lstm_policy", "'recurrent_state_c'"),
        ("Pendulum-v1", "gym_ou_policy", "'is_init'"),
    ],
    ids=["lstm", "ou-noise"],
)
@pytest.mark.long
def test_cli_gymnasium_actor_exits_2_before_binding_on_a_policy_that_needs_torchrl(
    env: str, policy: str, needs: str
) -> None:
    out = _run(["--env", env, "--policy", f"rlfleet_test_torchrl:{policy}"], kind="env")
    assert out.returncode == 2, out.stderr
    assert needs in out.stderr
    assert "--kind torchrl" in out.stderr
    assert "ready" not in out.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env-factory", "rlfleet_test_torchrl:not_an_env"], "returned a str, not a gymnasium"),
        (
            ["--policy", "rlfleet_test_torchrl:keyerror_policy"],
            "policy factory 'rlfleet_test_torchrl:keyerror_policy' raised KeyError: 'hidden'",
        ),
    ],
    ids=["not-an-env", "policy-raises-keyerror"],
)
@pytest.mark.long  # 4-6 s: moved out of the quick suite's 10 minutes
def test_cli_gymnasium_actor_exits_2_before_binding_on_a_factory_that_fails(
    args: list[str], message: str
) -> None:
    out = _run(args, kind="env")
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr
    assert "ready" not in out.stdout


@pytest.mark.parametrize("factory", ["cartpole", "stacked_cartpole"])
@pytest.mark.long  # 4-6 s: moved out of the quick suite's 10 minutes
def test_cli_gymnasium_actor_exits_2_before_binding_on_a_torchrl_env_naming_the_kind(
    factory: str,
) -> None:
    out = _run(["--env-factory", f"rlfleet_test_torchrl:{factory}"], kind="env")
    assert out.returncode == 2, out.stderr
    assert "returns a TorchRL env" in out.stderr
    assert "--kind torchrl" in out.stderr
    assert 'kind="torchrl"' in out.stderr
    assert "ready" not in out.stdout


@pytest.mark.parametrize("kind", ["torchrl", "env"])
@pytest.mark.parametrize("flag", ["--env-factory", "--policy"])
def test_cli_a_factory_the_actor_cannot_import_names_the_actors_path(kind: str, flag: str) -> None:
    out = _run([flag, "no_such_module_x:make"], kind=kind)
    assert out.returncode == 2, out.stderr
    assert "this actor process cannot import 'no_such_module_x'" in out.stderr
    assert "usage:" not in out.stderr  # the flags are fine: no usage text
    assert f"PYTHONPATH '{ENV['PYTHONPATH']}'" in out.stderr
    assert str(HERE) in out.stderr  # its sys.path, as the actor has it
    assert "put the folder that holds 'no_such_module_x'" in out.stderr
    assert "ready" not in out.stdout
