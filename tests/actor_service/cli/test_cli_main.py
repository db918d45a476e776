"""The rlfleet-actor command line: flags, RLFLEET_* variables, defaults and errors."""

from __future__ import annotations

import io
import json
import logging
import os
import pathlib
import re
import subprocess
import sys
import warnings

import gymnasium
import pytest
import torch

from actor_service._cli._checks import check_before_binding
from actor_service._cli._main import default_worker_id, parse_config, unknown_variables
from actor_service._config import INT_RANGES, ActorConfig, ModelSpec, vllm_lora_rank
from actor_service._core._settings import EnvPoolSettings
from actor_service._kinds.llm.settings import LLMActorSettings
from actor_service._serve._logging import (
    MAX_FIELD_CHARS,
    configure_logging,
    get_logger,
    log_event,
)
from common.plain_config import MAX_DEPTH, to_plain


def _parse(
    argv: list[str], environ: dict[str, str] | None = None, hostname: str = "laptop"
) -> ActorConfig:
    return parse_config(argv, environ or {}, hostname=hostname)


def _error(
    capsys: pytest.CaptureFixture[str], argv: list[str], environ: dict[str, str] | None = None
) -> str:
    with pytest.raises(SystemExit) as exit_info:
        _parse(argv, environ)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_cli_defaults_match_actor_config() -> None:
    config = _parse([])
    assert config == ActorConfig(worker_id=0)


# A self-signed pair made for these tests alone (openssl, EC P-256): TLS files must load.
_TLS = pathlib.Path(__file__).parent / "tls"
ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_cli_flags_fill_every_field() -> None:
    cert, key, ca = _TLS / "test-only.crt", _TLS / "test-only.key", _TLS / "test-only.crt"
    config = _parse(
        [
            "--host",
            "0.0.0.0",
            "--port",
            "6000",
            "--health-port",
            "6001",
            "--worker-id",
            "7",
            "--env",
            "Pendulum-v1",
            "--env-kwargs",
            '{"g": 9.8}',
            "--env-factory",
            "pkg.mod:make",
            "--num-envs",
            "3",
            "--env-backend",
            "async",
            "--step-timeout",
            "2.5",
            "--env-error-detail",
            "type",
            "--policy",
            "random",
            "--policy-kwargs",
            '{"a": 1}',
            "--model",
            "critic=mlp",
            "--model-kwargs",
            'critic={"hidden": [8]}',
            "--device",
            "cpu",
            "--seed",
            "11",
            "--max-credits",
            "6",
            "--grace-period",
            "3",
            "--token",
            "s3cret",
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
            "--tls-client-ca",
            str(ca),
            "--max-weight-bytes",
            "1000",
            "--part-deadline-s",
            "7.5",
            "--torch-threads",
            "2",
            "--log-level",
            "debug",
            "--log-format",
            "json",
        ]
    )
    assert config == ActorConfig(
        host="0.0.0.0",
        port=6000,
        health_port=6001,
        worker_id=7,
        env_pool=EnvPoolSettings(
            env="Pendulum-v1",
            env_kwargs={"g": 9.8},
            env_factory="pkg.mod:make",
            env_backend="async",
            step_timeout=2.5,
        ),
        num_envs=3,
        env_error_detail="type",
        models=(
            ModelSpec("policy", "random", {"a": 1}),
            ModelSpec("critic", "mlp", {"hidden": [8]}),
        ),
        device="cpu",
        seed=11,
        max_credits=6,
        grace_period=3.0,
        token="s3cret",
        tls_cert=str(cert),
        tls_key=str(key),
        tls_client_ca=str(ca),
        max_weight_bytes=1000,
        part_deadline_s=7.5,
        torch_threads=2,
        log_level="debug",
        log_format="json",
    )


def test_cli_environment_variables_are_read() -> None:
    config = _parse(
        [],
        {
            "RLFLEET_NUM_ENVS": "5",
            "RLFLEET_PORT": "7000",
            "RLFLEET_TOKEN": "t",
            "RLFLEET_POLICY": "random",
            "RLFLEET_MODELS": "critic=mlp,value=pkg.m:f",
            "RLFLEET_MODEL_KWARGS": '{"critic": {"hidden": [4]}}',
            "RLFLEET_HEALTH_PORT": "",
            "RLFLEET_SEED": "3",
            "RLFLEET_ENV_ERROR_DETAIL": "type",
        },
    )
    assert (config.num_envs, config.port, config.token, config.seed) == (5, 7000, "t", 3)
    assert config.env_error_detail == "type"
    assert config.health_port is None
    assert config.models == (
        ModelSpec("policy", "random", {}),
        ModelSpec("critic", "mlp", {"hidden": [4]}),
        ModelSpec("value", "pkg.m:f", {}),
    )


def test_a_misspelt_variable_is_named_with_the_setting_meant() -> None:
    """Every variable of the actor docs' tables is read; one no setting reads is named at start."""
    table = [line for line in (ROOT / "docs" / "actor.md").read_text().splitlines() if "|" in line]
    documented = re.findall(r"RLFLEET_[A-Z_]+", "\n".join(table))
    assert len(set(documented)) > 30
    assert unknown_variables(dict.fromkeys(documented, "1")) == []
    environ = {"RLFLEET_NUMENVS": "4", "RLFLEET_TOKNE": "t", "RLFLEET_ZZZ": "", "HOME": "/"}
    assert unknown_variables(environ) == [
        ("RLFLEET_NUMENVS", "RLFLEET_NUM_ENVS"),
        ("RLFLEET_TOKNE", "RLFLEET_TOKEN"),
        ("RLFLEET_ZZZ", None),
    ]


def test_cli_flag_wins_over_environment_variable() -> None:
    config = _parse(
        ["--num-envs", "2", "--policy", "mlp"],
        {"RLFLEET_NUM_ENVS": "9", "RLFLEET_POLICY": "random"},
    )
    assert config.num_envs == 2
    assert config.models[0].factory == "mlp"


def test_cli_worker_id_defaults_to_hostname_ordinal() -> None:
    assert _parse([], hostname="actor-3").worker_id == 3
    assert _parse([], {"RLFLEET_WORKER_ID": "5"}, hostname="actor-3").worker_id == 5
    assert _parse(["--worker-id", "8"], {"RLFLEET_WORKER_ID": "5"}).worker_id == 8
    assert default_worker_id({}, "my-host") == 0
    assert default_worker_id({}, "rlfleet-actor-12") == 12


@pytest.mark.parametrize(
    ("argv", "environ", "needle"),
    [
        (["--num-envs", "0"], {}, "--num-envs"),
        (["--num-envs", "many"], {}, "--num-envs"),
        ([], {"RLFLEET_NUM_ENVS": "-1"}, "RLFLEET_NUM_ENVS"),
        (["--port", "70000"], {}, "--port"),
        (["--env-backend", "threads"], {}, "--env-backend"),
        (["--env-kwargs", "[1, 2]"], {}, "--env-kwargs"),
        ([], {"RLFLEET_ENV_KWARGS": "{bad"}, "RLFLEET_ENV_KWARGS"),
        (["--policy", "not a factory"], {}, "--policy"),
        (["--model", "critic"], {}, "--model"),
        (["--model-kwargs", 'critic={"a": 1}'], {}, "--model-kwargs"),
        (["--step-timeout", "nan"], {}, "--step-timeout"),
        (["--grace-period", "-1"], {}, "--grace-period"),
        (["--grace-period", "1e300"], {}, "--grace-period"),
        (["--tls-cert", "/no/such/cert.pem"], {}, "--tls-cert"),
        (["--log-format", "xml"], {}, "--log-format"),
        ([], {"RLFLEET_WORKER_ID": "x"}, "RLFLEET_WORKER_ID"),
        (["--max-credits", "0"], {}, "--max-credits"),
        (["--env-error-detail", "none"], {}, "--env-error-detail"),
        (["--port", "50091", "--metrics-port", "50091"], {}, "must differ, both are 50091"),
        (["--health-port", "50092", "--metrics-port", "50092"], {}, "--metrics-port"),
        # A Secret file's trailing newline: no learner could send that token.
        ([], {"RLFLEET_TOKEN": "s3cret\n"}, "token must hold printable ASCII characters only"),
        ([], {"RLFLEET_TOKEN": "t" * 4097}, "token must be at most 4096 characters"),
        (["--model", ".critic=mlp"], {}, "--model"),
        (["--policy", "pkg.mod:"], {}, "--policy"),
        # It bound nothing and blamed a port in use ("cannot bind [unix:/x.sock]:..."), exit 1.
        (["--host", "unix:/tmp/x.sock"], {}, "actors listen on TCP"),
        (["--host", "::1:50051"], {}, "--host"),
    ],
)
def test_cli_raises_if_a_value_is_bad(
    capsys: pytest.CaptureFixture[str], argv: list[str], environ: dict[str, str], needle: str
) -> None:
    assert needle in _error(capsys, argv, environ)


def test_cli_raises_if_tls_key_is_missing(
    capsys: pytest.CaptureFixture[str], tmp_path: pytest.TempPathFactory
) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    assert "--tls-key" in _error(capsys, ["--tls-cert", str(cert)])


def test_cli_subprocess_exits_2_on_a_bad_flag() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "actor_service", "--num-envs", "zero"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--num-envs" in result.stderr
    assert "usage: " in result.stderr  # the flags are wrong: they are recalled
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ("CartPole-v9", "It provides versioned environments: [ `v0`, `v1` ]"),
        ("CartPol-v1", "Environment `CartPol` doesn't exist"),
    ],
)
def test_cli_subprocess_exits_2_before_binding_on_an_env_gymnasium_does_not_know(
    env: str, message: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "actor_service", "--env", env, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert f"rlfleet-actor: error: --kind env: env '{env}': " in result.stderr
    assert message in result.stderr
    assert "ready" not in result.stdout  # refused before its port was bound


@pytest.mark.parametrize(
    "env", ["CartPole-v1", "CartPole", "gymnasium.envs.classic_control:CartPole-v1"]
)
def test_env_ids_gymnasium_make_takes_pass_the_check_before_binding(env: str) -> None:
    from actor_service._kinds.env.check import check

    with warnings.catch_warnings():  # an id without a version: make names the one it takes
        warnings.simplefilter("ignore")
        gymnasium.make(env).close()  # what the actor's pool will call
    check(ActorConfig(env_pool=EnvPoolSettings(env=env), num_envs=1))


@pytest.mark.parametrize(
    ("device", "message"),
    [
        pytest.param(
            "cuda",
            "no CUDA device",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA"),
        ),
        ("gpu0", "not a torch device"),
        pytest.param(
            "mps",
            "no mps device here",
            marks=pytest.mark.skipif(torch.backends.mps.is_available(), reason="this has MPS"),
        ),
    ],
)
def test_cli_subprocess_exits_2_on_a_device_it_does_not_have(device: str, message: str) -> None:
    for kind in ("env", "llm"):
        result = subprocess.run(
            [sys.executable, "-m", "actor_service", "--kind", kind, "--device", device],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, result.stderr
        assert "--device" in result.stderr
        assert message in result.stderr
        assert result.stdout == ""


def test_logging_json_lines_carry_event_and_fields() -> None:
    stream = io.StringIO()
    handler = configure_logging("info", "json", worker_id=4, stream=stream)
    try:
        log_event("session.opened", logging.INFO, learner="L1", credits=2)
        log_event("hidden", logging.DEBUG)
    finally:
        get_logger().removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["event"] == "session.opened"
    assert record["worker_id"] == 4
    assert record["level"] == "info"
    assert record["fields"] == {"learner": "L1", "credits": 2}
    assert "ts" in record


def test_logging_text_lines_are_key_value() -> None:
    stream = io.StringIO()
    handler = configure_logging("debug", "text", worker_id=1, stream=stream)
    try:
        log_event("weights.push", logging.WARNING, model_id="policy", result="ABORTED")
    finally:
        get_logger().removeHandler(handler)
    line = stream.getvalue().strip()
    assert "WARNING" in line
    assert "weights.push model_id=policy result=ABORTED" in line


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_logging_cuts_a_long_field_and_says_how_long_it_was(fmt: str) -> None:
    stream = io.StringIO()
    handler = configure_logging("info", fmt, stream=stream)
    long = "L" * (MAX_FIELD_CHARS * 50)
    try:
        log_event("rpc.failed", logging.INFO, details=long, error=ValueError(long), count=7)
    finally:
        get_logger().removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    assert len(line) < 3 * MAX_FIELD_CHARS
    assert f"({len(long)} characters)" in line
    if fmt == "json":
        fields = json.loads(line)["fields"]
        assert fields["details"] == "L" * MAX_FIELD_CHARS + f"... ({len(long)} characters)"
        assert fields["error"] == fields["details"]  # an exception's text is cut alike
        assert fields["count"] == 7  # numbers stay numbers


def test_logging_renders_other_libraries_in_the_same_format() -> None:
    stream = io.StringIO()
    handler = configure_logging("info", "json", stream=stream, include_others=True)
    try:
        logging.getLogger("grpc.somewhere").warning("channel %s broke", "x")
        logging.getLogger("grpc.somewhere").info("not shown")
    finally:
        get_logger().removeHandler(handler)
        for other in [h for h in logging.getLogger().handlers if getattr(h, "_rlfleet", False)]:
            logging.getLogger().removeHandler(other)
    (line,) = stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["event"] == "log"
    assert record["fields"] == {"logger": "grpc.somewhere", "message": "channel x broke"}


def test_logging_keeps_a_field_of_exactly_the_bound_whole() -> None:
    stream = io.StringIO()
    handler = configure_logging("info", "json", stream=stream)
    try:
        log_event("rpc.failed", logging.INFO, details="L" * MAX_FIELD_CHARS)
    finally:
        get_logger().removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    assert json.loads(line)["fields"]["details"] == "L" * MAX_FIELD_CHARS


def test_logging_text_quotes_a_value_with_spaces_or_newlines_so_it_stays_one_line() -> None:
    stream = io.StringIO()
    handler = configure_logging("info", "text", stream=stream)
    forged = "x\n12:00:00.000 ERROR   worker=0 actor.stopped"
    try:
        log_event("rpc.failed", logging.INFO, learner=forged, details="two words", empty="")
    finally:
        get_logger().removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    assert f"learner={json.dumps(forged)}" in line
    assert 'details="two words" empty=""' in line


def test_logging_configured_twice_writes_each_event_once() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "json", stream=first, include_others=True)
    handler = configure_logging("info", "json", stream=second, include_others=True)
    root = logging.getLogger()
    try:
        log_event("session.taken_over", logging.WARNING, old="L1", new="L2")
        logging.getLogger("grpc.somewhere").warning("channel broke")
    finally:
        get_logger().removeHandler(handler)
        for other in [h for h in root.handlers if getattr(h, "_rlfleet", False)]:
            root.removeHandler(other)
    assert first.getvalue() == ""  # the first call's handlers were replaced
    events = [json.loads(line)["event"] for line in second.getvalue().splitlines()]
    assert events == ["session.taken_over", "log"]  # not again through the root's handler


def test_logging_renders_only_other_libraries_warnings_and_keeps_their_traceback() -> None:
    stream = io.StringIO()
    handler = configure_logging("debug", "json", stream=stream, include_others=True)
    other = logging.getLogger("grpc.somewhere")
    other.setLevel(logging.DEBUG)
    try:
        other.info("not shown")
        try:
            raise ValueError("handler broke")
        except ValueError:
            other.exception("servicer failed")
    finally:
        other.setLevel(logging.NOTSET)
        get_logger().removeHandler(handler)
        for owned in [h for h in logging.getLogger().handlers if getattr(h, "_rlfleet", False)]:
            logging.getLogger().removeHandler(owned)
    (line,) = stream.getvalue().splitlines()
    fields = json.loads(line)["fields"]
    assert fields["message"] == "servicer failed"
    assert "Traceback" in fields["exception"]
    assert "ValueError: handler broke" in fields["exception"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_envs", 0),
        ("num_envs", None),
        ("port", 70000),
        ("metrics_port", -1),
        ("max_credits", 10**12),
        ("worker_id", True),
        ("env_backend", "threads"),
        ("log_format", "xml"),
        ("seed", 2**64),
        ("grace_period", -1.0),
        ("part_deadline_s", 0.0),
        ("part_deadline_s", 601.0),
        ("part_deadline_s", float("nan")),
        ("models", ()),
    ],
)
def test_actor_config_raises_if_a_field_is_out_of_range(field: str, value: object) -> None:
    given: dict[str, object] = {field: value}
    if field == "env_backend":  # a setting of the env pool's section
        given = {"env_pool": EnvPoolSettings(env_backend=value)}
    with pytest.raises(ValueError, match=field):
        ActorConfig(**given)


_LLM = {"kind": "llm", "models": (ModelSpec(factory="rlfleet:tiny-qwen2"),)}


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"env_pool": EnvPoolSettings(env_kwargs=None)}, "env_kwargs"),  # type: ignore[arg-type]
        ({"env_pool": EnvPoolSettings(env_kwargs=[1])}, "env_kwargs"),  # type: ignore[arg-type]
        ({"env_pool": EnvPoolSettings(step_timeout="3")}, "step_timeout"),  # type: ignore[arg-type]
        ({**_LLM, "llm": LLMActorSettings(task_kwargs=None)}, "task_kwargs"),  # type: ignore[arg-type]
        ({"models": ("mlp",)}, "models"),
        ({"shared_memory": "no"}, "shared_memory"),
        ({"device": None}, "device"),
        ({"device": ""}, "device"),
        ({"grace_period": "10"}, "grace_period"),
        ({"part_deadline_s": None}, "part_deadline_s"),
        ({"part_deadline_s": True}, "part_deadline_s"),
    ],
)
def test_actor_config_raises_if_a_field_has_the_wrong_type(given: dict, field: str) -> None:
    """A programmatic config of the wrong type is refused naming its field, as one out of
    range: not accepted (``"no"`` read as True) nor met later as a bare AttributeError."""
    with pytest.raises(ValueError, match=field):
        ActorConfig(**given)


def test_model_spec_raises_if_its_kwargs_are_not_a_mapping() -> None:
    """``kwargs=None`` (TorchRL's "no kwargs") was met at start as a bare AttributeError."""
    for bad in (None, [("hidden", [8])]):
        with pytest.raises(ValueError, match="model 'policy': kwargs must be a Mapping"):
            ModelSpec(kwargs=bad)  # type: ignore[arg-type]


def test_the_logged_config_masks_the_token_and_reads_the_kinds_section_flat() -> None:
    logged = ActorConfig(token="s3cret-token", num_envs=2).logged()
    assert logged["token"] == "***"
    assert "s3cret-token" not in repr(logged)
    assert logged["env"] == "CartPole-v1"
    assert ActorConfig().logged()["token"] == ""
    llm = ActorConfig(kind="llm", models=(ModelSpec(factory="rlfleet:tiny-qwen2"),)).logged()
    assert llm["task"] == "arith"
    assert "env" not in llm


@pytest.mark.parametrize("value", ["0", "-1", "601", "nan", "soon"])
def test_cli_raises_if_the_part_deadline_is_out_of_range(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    assert "--part-deadline-s" in _error(capsys, ["--part-deadline-s", value])
    assert parse_config(["--part-deadline-s", "600"], {}).part_deadline_s == 600.0


@pytest.mark.parametrize("value", ["0", "3e6", "1e10", "inf"])
def test_cli_raises_if_the_step_timeout_is_out_of_range(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    # An async env pool's pipe wait overflows above ~2.1e6 s: the actor used to start
    # listening and die at its first reset, blaming the env.
    assert "--step-timeout" in _error(capsys, ["--step-timeout", value])
    assert parse_config(["--step-timeout", "1e6"], {}).step_timeout == 1e6
    for bad in (float("inf"), True, 0.0):
        with pytest.raises(ValueError, match="step_timeout"):
            ActorConfig(env_pool=EnvPoolSettings(env_backend="async", step_timeout=bad))


def test_actor_config_raises_if_a_section_is_for_another_kind() -> None:
    with pytest.raises(ValueError, match=r"llm settings \(task\) are for kind 'llm', not 'env'"):
        ActorConfig(llm=LLMActorSettings(task="reverse"))
    with pytest.raises(
        ValueError, match=r"env_pool settings \(env\) are for kind 'env' or 'torchrl'"
    ):
        ActorConfig(kind="llm", env_pool=EnvPoolSettings(env="Pendulum-v1"))
    with pytest.raises(ValueError, match="llm must be an LLMActorSettings"):
        ActorConfig(llm=EnvPoolSettings())
    assert ActorConfig(kind="llm", llm=LLMActorSettings(task="reverse")).task == "reverse"
    config = ActorConfig(kind="torchrl", env_pool=EnvPoolSettings(env="Pendulum-v1"))
    assert (config.env, config.env_pool.env) == ("Pendulum-v1", "Pendulum-v1")
    assert ActorConfig(llm=LLMActorSettings()) == ActorConfig()  # its defaults: nothing given


def test_cli_keeps_another_kinds_settings_unread() -> None:
    config = _parse([], {"RLFLEET_TASK": "reverse"})  # a variable the fleet's LLM actors read
    assert (config.kind, config.llm.task) == ("env", "reverse")


def test_tls_files_that_do_not_load_exit_2_naming_them(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    """gRPC's own error was "Failed to bind to address", the cause in its stderr alone."""
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    cert, key = str(_TLS / "test-only.crt"), str(_TLS / "test-only.key")
    broken_key = tmp_path / "broken.key"
    broken_key.write_text((_TLS / "test-only.key").read_text().replace("PRIVATE KEY", "KEY"))
    for flags, named in (
        (["--tls-cert", str(garbage), "--tls-key", key], "garbage.pem"),
        (["--tls-cert", cert, "--tls-key", str(broken_key)], "broken.key"),
        (["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", str(garbage)], "garbage.pem"),
        (["--tls-cert", cert, "--tls-key", key, "--relay-ca", str(garbage)], "garbage.pem"),
    ):
        assert named in _error(capsys, flags)
    assert _parse(["--tls-cert", cert, "--tls-key", key]).tls_cert == cert


def test_actor_config_holds_its_token_and_factories_to_the_learners_rules() -> None:
    """One rule each: a token the learner can send, a model id and import path it can name."""
    assert ActorConfig(token="t" * 4096).token == "t" * 4096
    for token in ("a b\n", "s\u00e9cret", "t" * 4097):
        with pytest.raises(ValueError, match="token must"):
            ActorConfig(token=token)
    nested = _parse(["--policy", "pkg.mod:Factory.build", "--model", "v.1=pkg.m:f"])
    assert [spec.factory for spec in nested.models] == ["pkg.mod:Factory.build", "pkg.m:f"]


def test_actor_config_raises_if_tls_files_are_given_by_halves() -> None:
    with pytest.raises(ValueError, match="tls_cert and tls_key"):
        ActorConfig(tls_cert="c.pem")
    with pytest.raises(ValueError, match="tls_client_ca"):
        ActorConfig(tls_client_ca="ca.pem")
    with pytest.raises(ValueError, match="relay_ca needs tls_cert"):
        ActorConfig(relay_ca="ca.pem")  # a plaintext actor forwards in the clear already


def test_cli_and_actor_config_share_one_range_per_field(
    capsys: pytest.CaptureFixture[str],
) -> None:
    low, high = INT_RANGES["num_envs"]
    assert high is not None
    assert parse_config(["--num-envs", str(high)], {}).num_envs == high
    assert "--num-envs" in _error(capsys, ["--num-envs", str(high + 1)])
    with pytest.raises(ValueError, match="num_envs"):
        ActorConfig(num_envs=high + 1)
    assert ActorConfig(num_envs=low).num_envs == low


def test_cli_decode_takes_the_three_modes_and_refuses_others() -> None:
    assert parse_config(["--kind", "llm"], {}, hostname="h").decode == "eager"
    for mode in ("eager", "static", "compiled"):
        assert parse_config(["--kind", "llm", "--decode", mode], {}, hostname="h").decode == mode
    assert parse_config([], {"RLFLEET_DECODE": "static"}, hostname="h").decode == "static"
    with pytest.raises(SystemExit) as exc:
        parse_config(["--decode", "graphs"], {}, hostname="h")
    assert exc.value.code == 2


def test_cli_decode_other_than_eager_is_refused_with_the_vllm_engine() -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(["--kind", "llm", "--engine", "vllm", "--decode", "static"], {}, hostname="h")
    assert exc.value.code == 2


@pytest.mark.parametrize("kind", ["torchrl", "env"])
def test_a_factory_neither_an_import_path_nor_a_callable_is_refused_by_name(kind: str) -> None:
    with pytest.raises(
        ValueError, match=r"env_factory must be an import path or a callable, got 42"
    ):
        ActorConfig(kind=kind, env_pool=EnvPoolSettings(env_factory=42))  # type: ignore[arg-type]


def test_cli_takes_each_integer_flag_at_the_low_end_of_its_range() -> None:
    flags = ["--port", "0", "--worker-id", "0", "--num-envs", "1", "--max-credits", "1"]
    flags += ["--torch-threads", "1", "--health-port", "0", "--max-weight-bytes", "1"]
    config = _parse(flags)
    assert (config.port, config.worker_id, config.num_envs, config.max_credits) == (0, 0, 1, 1)
    assert (config.torch_threads, config.health_port, config.max_weight_bytes) == (1, 0, 1)


@pytest.mark.parametrize(
    ("text", "value"),
    [("yes", True), ("True", True), (" 1 ", True), ("no", False), ("FALSE", False), ("0", False)],
)
def test_cli_reads_each_spelling_of_a_boolean_flag_and_variable(text: str, value: bool) -> None:
    assert _parse(["--shared-memory", text]).shared_memory is value
    assert _parse([], {"RLFLEET_SHARED_MEMORY": text}).shared_memory is value
    assert _parse(["--no-shared-memory"], {"RLFLEET_SHARED_MEMORY": "yes"}).shared_memory is False


@pytest.mark.parametrize("flag", ["--env", "--device", "--task", "--policy"])
def test_cli_refuses_a_blank_value_naming_its_flag(
    capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    assert flag in _error(capsys, [flag, "  "])


def test_cli_refuses_an_env_factory_that_is_not_an_import_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "--env-factory" in _error(capsys, ["--env-factory", "no_colon"])
    assert "RLFLEET_ENV_FACTORY" in _error(capsys, [], {"RLFLEET_ENV_FACTORY": "a b:c"})
    assert _parse([], {"RLFLEET_ENV_FACTORY": ""}).env_factory == ""


def test_cli_reads_a_blank_optional_variable_as_unset() -> None:
    blank = {f"RLFLEET_{name}": " " for name in ("METRICS_PORT", "SEED", "LORA", "MAX_MODEL_LEN")}
    config = _parse([], blank)
    assert (config.metrics_port, config.seed, config.lora, config.max_model_len) == (None,) * 4


def test_cli_worker_id_is_0_when_the_hostname_ordinal_is_past_the_largest_id() -> None:
    assert default_worker_id({}, "node-65535") == 65535
    assert default_worker_id({}, "node-65536") == 0
    assert _parse([], hostname="ip-10-0-0-123456").worker_id == 0
    with pytest.raises(ValueError, match=r"in \[0, 65535\], got 70000"):
        default_worker_id({"RLFLEET_WORKER_ID": "70000"}, "node-1")


def test_cli_an_empty_flag_wins_over_its_variable() -> None:
    given = {"RLFLEET_HEALTH_PORT": "6001", "RLFLEET_SEED": "4"}
    config = _parse(["--health-port", "", "--seed", ""], given)
    assert (config.health_port, config.seed) == (None, None)


def test_cli_refuses_an_extra_model_named_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert "use --policy" in _error(capsys, ["--model", "policy=mlp"])
    assert "use --policy" in _error(capsys, [], {"RLFLEET_MODELS": "policy=random"})


def test_cli_model_variables_blank_mean_none_and_kwargs_must_be_objects(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _parse([], {"RLFLEET_MODELS": " "}).models == (ModelSpec("policy", "mlp", {}),)
    given = {"RLFLEET_MODELS": "critic=mlp", "RLFLEET_MODEL_KWARGS": '{"critic": 3}'}
    assert "'critic' must map to a JSON object" in _error(capsys, [], given)


def test_cli_takes_a_jsonl_task_and_refuses_a_built_in_tasks_bad_kwargs(
    capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    (tmp_path / "one.jsonl").write_text('{"prompt": "say hi", "answer": "hi"}\n')
    task = f"jsonl:{tmp_path / 'one.jsonl'}"
    assert _parse(["--kind", "llm", "--task", task]).llm.task == task
    bad = ["--kind", "llm", "--task", "arith", "--task-kwargs", '{"no_such_kwarg": 1}']
    assert "--task / RLFLEET_TASK: task 'arith'" in _error(capsys, bad)


def test_cli_a_config_error_names_the_flags_and_variables_of_its_fields(
    capsys: pytest.CaptureFixture[str],
) -> None:
    error = _error(capsys, ["--port", "5000", "--health-port", "5000"])
    assert "(--port / RLFLEET_PORT, --health-port / RLFLEET_HEALTH_PORT)" in error


def test_actor_config_refuses_a_callable_model_factory_on_a_gymnasium_actor() -> None:
    with pytest.raises(ValueError, match=r"model 'policy' given as a callable: .*kind 'torchrl'"):
        ActorConfig(models=(ModelSpec(factory=default_worker_id),))


def test_the_check_before_binding_imports_every_models_module_and_says_why_one_fails(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rlfleet_broken_factory.py").write_text("raise ImportError('needs libfoo')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = ModelSpec(factory="mlp")
    for module in ("rlfleet_no_such_module", "rlfleet_broken_factory"):
        spec = ModelSpec(model_id="critic", factory=f"{module}:make")
        with pytest.raises(ValueError, match=rf"model 'critic' '{module}:make': .*cannot import"):
            check_before_binding(ActorConfig(models=(first, spec)))


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("gpu_memory_utilization", 0.0, r"gpu_memory_utilization must be a float in \(0, 1\]"),
        ("enable_prefix_caching", 1, "enable_prefix_caching must be a bool, got 1"),
    ],
)
def test_actor_config_refuses_a_vllm_share_of_0_and_a_prefix_caching_flag_not_a_bool(
    setting: str, value: object, message: str
) -> None:
    llm = LLMActorSettings(engine="vllm", **{setting: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        ActorConfig(kind="llm", models=(ModelSpec(factory="rlfleet:tiny-qwen2"),), llm=llm)


def test_vllm_gets_the_lora_rank_itself_when_vllm_has_a_slot_of_that_size() -> None:
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 512)] == [1, 8, 8, 16, 512]


def test_cli_an_llm_actor_refuses_extra_models_given_by_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    error = _error(capsys, ["--kind", "llm"], {"RLFLEET_MODELS": "critic=mlp"})
    assert "--model: an LLM actor holds one model, the --policy" in error
    assert _parse(["--kind", "llm"], {"RLFLEET_MODELS": " "}).models[0].path == "rlfleet:tiny-qwen2"


@pytest.mark.parametrize("field", ["env_kwargs", "policy_kwargs", "task_kwargs"])
def test_cli_refuses_json_nested_too_deeply_or_too_long_in_one_short_line(
    capsys: pytest.CaptureFixture[str], field: str
) -> None:
    flag, var = "--" + field.replace("_", "-"), "RLFLEET_" + field.upper()
    deep = "[" * 100_000 + "]" * 100_000
    assert f"{flag}: expected a JSON object nested less deeply" in _error(capsys, [flag, deep])
    assert f"{var}: expected a JSON object nested less deeply" in _error(capsys, [], {var: deep})
    huge = '{"a": "' + "x" * 10_000_000  # unterminated: invalid
    message = _error(capsys, [flag, huge]).splitlines()[-1]
    assert message.startswith(f"rlfleet-actor: error: {flag}: expected a JSON object, got ")
    assert len(message) < 400


@pytest.mark.parametrize("flag", ["--env-kwargs", "--policy-kwargs"])
def test_cli_refuses_json_nested_deeper_than_the_learner_gives_naming_the_flag(
    capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    # json parses 500 levels; the factory's arguments were rebuilt recursively only at start
    deep = '{"a": ' + "[" * 500 + "]" * 500 + "}"
    error = _error(capsys, [flag, deep]).splitlines()[-1]
    assert f"{flag}: " in error
    assert f"nested more than {MAX_DEPTH} levels deep" in error
    level = '{"a": ' + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "}"
    assert to_plain(json.loads(level)) == json.loads(level)  # what a learner sends still parses
    assert _parse([flag, level]) is not None


def test_cli_refuses_model_kwargs_nested_too_deeply(capsys: pytest.CaptureFixture[str]) -> None:
    deep = '{"critic": ' + "[" * 100_000 + "]" * 100_000 + "}"
    given = {"RLFLEET_MODELS": "critic=mlp", "RLFLEET_MODEL_KWARGS": deep}
    assert "RLFLEET_MODEL_KWARGS: expected a JSON object nested less deeply" in _error(
        capsys, [], given
    )


@pytest.mark.parametrize(
    ("body", "raised"),
    [
        ("raise RuntimeError('needs a GPU')", "RuntimeError: needs a GPU"),
        ("raise SystemExit(0)", "SystemExit: 0"),
        ("import sys\nsys.exit('no display')", "SystemExit: no display"),
    ],
)
def test_the_check_before_binding_refuses_a_factory_module_that_raises_or_exits_on_import(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, body: str, raised: str
) -> None:
    (tmp_path / "rlfleet_exiting_factory.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for config in (
        ActorConfig(env_pool=EnvPoolSettings(env_factory="rlfleet_exiting_factory:make")),
        ActorConfig(models=(ModelSpec(factory="rlfleet_exiting_factory:make"),)),
    ):
        monkeypatch.delitem(sys.modules, "rlfleet_exiting_factory", raising=False)
        with pytest.raises(
            ValueError, match=f"importing 'rlfleet_exiting_factory' raised {raised}"
        ):
            check_before_binding(config)


@pytest.mark.parametrize("body", ["raise SystemExit(0)", "raise KeyboardInterrupt"])
def test_cli_subprocess_exits_2_when_a_factory_module_exits_on_import(
    tmp_path: pathlib.Path, body: str
) -> None:
    (tmp_path / "rlfleet_exiting_factory.py").write_text(body + "\n")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    flags = ["--port", "0", "--env-factory", "rlfleet_exiting_factory:make"]
    result = subprocess.run(
        [sys.executable, "-m", "actor_service", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("rlfleet-actor: error: --kind env: env_factory ")
    assert len(result.stderr.splitlines()) == 1, result.stderr  # no traceback
    assert result.stdout == ""  # refused before its port was bound
