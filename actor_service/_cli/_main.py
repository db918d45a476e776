"""The ``rlfleet-actor`` command line: flags and ``RLFLEET_*`` variables into an ActorConfig.

Every :class:`~actor_service._config.ActorConfig` setting, a section's included, has one
flag and one environment variable (``--num-envs`` / ``RLFLEET_NUM_ENVS``, ``--task`` /
``RLFLEET_TASK``); the flag wins, and a section's settings fill its section.
Models are given as ``--policy FACTORY`` (the ``"policy"`` model) plus
repeatable ``--model ID=FACTORY`` and ``--model-kwargs ID=JSON``; their
variables are ``RLFLEET_POLICY``, ``RLFLEET_POLICY_KWARGS``, ``RLFLEET_MODELS``
(``id=factory,id2=factory2``) and ``RLFLEET_MODEL_KWARGS`` (a JSON object of
objects). A bad value exits with code 2 and a message naming the flag or the
variable it came from. Parsing imports neither torch nor gRPC, so mistakes are
reported at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import logging
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from actor_service._cli._values import (
    TORCHRL_BACKEND,
    BadValue,
    boolean,
    choice,
    chosen,
    existing_file_or_empty,
    factory,
    float_min,
    import_path_or_empty,
    int_in,
    json_object,
    lora,
    nonempty,
    optional,
    ranged,
    share,
)
from actor_service._config import (
    CHOICES,
    INT_RANGES,
    SECTIONS,
    ActorConfig,
    ModelSpec,
    section_of,
)
from actor_service._core._settings import EnvPoolSettings
from actor_service._kinds.llm.settings import LLMActorSettings
from common.config import DEFAULT_MODEL_ID, MAX_SEED, MODEL_ID_RE, is_loopback

__all__ = ["build_parser", "default_worker_id", "main", "parse_config", "unknown_variables"]

_ENV_PREFIX = "RLFLEET_"
# Variables the project sets beside an actor's (a learner pod's, a build's, a benchmark's).
_NOT_ACTOR_SETTINGS = ("POD_INDEX", "RUN_ID", "IMAGE", "EXTRAS", "TORCHRL_SOURCE", "RESULT")
_ORDINAL_RE = re.compile(r"-(\d+)$")


# (field, converter, help); the flag is --field-with-dashes, the variable RLFLEET_FIELD.
_SIMPLE_FIELDS: tuple[tuple[str, Callable[[str], Any], str], ...] = (
    ("host", nonempty, "address to bind (0.0.0.0 in containers)"),
    ("port", ranged("port"), "port to bind; 0 picks a free one"),
    (
        "health_port",
        optional(ranged("health_port")),
        "extra plaintext port with health+reflection",
    ),
    (
        "metrics_port",
        optional(ranged("metrics_port")),
        "HTTP port of Prometheus /metrics (off if unset)",
    ),
    ("worker_id", ranged("worker_id"), "this actor's id (default: hostname ordinal)"),
    ("env", nonempty, "registered gymnasium env id"),
    ("env_kwargs", json_object, "JSON object of kwargs for gymnasium.make or the factory"),
    (
        "env_factory",
        import_path_or_empty,
        "package.module:function returning a gymnasium Env (--kind torchrl: a TorchRL EnvBase)",
    ),
    ("num_envs", ranged("num_envs"), "size of the env pool"),
    (
        "env_backend",
        choice(*CHOICES["env_backend"], TORCHRL_BACKEND),
        "sync (in-process) or async (subprocesses); --kind torchrl: SerialEnv or ParallelEnv; "
        "torchrl: --kind torchrl in-process",
    ),
    ("step_timeout", float_min(0.0, strict=True), "seconds an async env step may take"),
    (
        "env_error_detail",
        chosen("env_error_detail"),
        "what the learner hears of an env's exception: full (type and text) or type",
    ),
    ("device", nonempty, "torch device of the policy"),
    ("seed", optional(int_in(0, MAX_SEED)), "seed for envs, torch and numpy"),
    ("max_credits", ranged("max_credits"), "most unconsumed credits / retained batches"),
    (
        "grace_period",
        float_min(0.0, strict=False),
        "seconds from SIGTERM to exit (drain, then teardown)",
    ),
    ("token", str, "bearer token required on every ActorService call"),
    ("tls_cert", existing_file_or_empty, "PEM certificate chain (with --tls-key enables TLS)"),
    ("tls_key", existing_file_or_empty, "PEM private key"),
    ("tls_client_ca", existing_file_or_empty, "PEM CA; clients must present a certificate"),
    (
        "relay_ca",
        existing_file_or_empty,
        "PEM CA of the other actors' certificates: forward relayed pushes over TLS",
    ),
    (
        "max_weight_bytes",
        optional(ranged("max_weight_bytes")),
        "largest weight or state blob accepted (default: max(1 GiB, 1.25 x the model's bytes))",
    ),
    (
        "decode",
        chosen("decode"),
        "LLM actors: eager (growing KV cache), static (fixed-size cache) or compiled",
    ),
    ("part_deadline_s", float_min(0.0, strict=True), "seconds a multi-part push may take"),
    (
        "shared_memory",
        boolean,
        "take pushes and send batches through /dev/shm with a learner on this host "
        "(false: over gRPC)",
    ),
    ("torch_threads", ranged("torch_threads"), "torch intra-op threads"),
    ("log_level", chosen("log_level"), "log level"),
    ("log_format", chosen("log_format"), "text or json (one object per line)"),
    (
        "kind",
        chosen("kind"),
        "env (gymnasium envs), torchrl (TorchRL envs) or llm (chat slots + a language model)",
    ),
    ("task", nonempty, "llm: arith | reverse | countdown | jsonl:PATH | pkg.mod:factory"),
    ("task_kwargs", json_object, "llm: JSON object of kwargs for the task"),
    (
        "max_new_tokens_cap",
        ranged("max_new_tokens_cap"),
        "llm: most new tokens per turn a learner may ask",
    ),
    ("lora", lora, "llm: a LoRA adapter on the model, r=16,targets=q_proj,v_proj[,alpha=32]"),
    ("engine", chosen("engine"), "llm: transformers (rlfleet's decode loop) or vllm"),
    ("gpu_memory_utilization", share, "vllm: share of the GPU's memory vLLM may take"),
    ("max_model_len", optional(ranged("max_model_len")), "vllm: longest prompt + response"),
    ("enable_prefix_caching", boolean, "vllm: reuse the KV cache of shared prompt prefixes"),
)


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _var(field: str) -> str:
    return _ENV_PREFIX + field.upper()


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """The ``RLFLEET_*`` names in ``environ`` that no setting reads, each with a close match.

    A misspelt variable (``RLFLEET_NUMENVS``) would otherwise be ignored in silence.
    """
    fields = [field for field, _, _ in _SIMPLE_FIELDS]
    fields += ["worker_id", "policy", "policy_kwargs", "models", "model_kwargs"]
    known = {_var(field) for field in fields}
    others = {_ENV_PREFIX + name for name in _NOT_ACTOR_SETTINGS}
    unknown = sorted(
        name for name in environ if name.startswith(_ENV_PREFIX) and name not in known | others
    )
    suffixes = [name.removeprefix(_ENV_PREFIX) for name in known]
    return [(name, _close_match(name.removeprefix(_ENV_PREFIX), suffixes)) for name in unknown]


def _close_match(suffix: str, suffixes: list[str]) -> str | None:
    matches = difflib.get_close_matches(suffix, suffixes, 1)
    return _ENV_PREFIX + matches[0] if matches else None


def build_parser() -> argparse.ArgumentParser:
    """Return the ``rlfleet-actor`` argument parser (every value is read as a string)."""
    parser = argparse.ArgumentParser(
        prog="rlfleet-actor",
        description="Serve an rlfleet actor: an env pool plus a local policy over gRPC.",
        epilog="Every flag also reads RLFLEET_<FLAG_NAME> from the environment; the flag wins.",
    )
    for field, _, text in _SIMPLE_FIELDS:
        parser.add_argument(
            _flag(field), dest=field, metavar=field.upper(), help=f"{text} [{_var(field)}]"
        )
    parser.add_argument(
        "--no-shared-memory",
        dest="shared_memory",
        action="store_const",
        const="false",
        help="the same as --shared-memory false [RLFLEET_SHARED_MEMORY=0]",
    )
    parser.add_argument(
        "--policy",
        metavar="FACTORY",
        help="the 'policy' model: random | mlp | pkg.mod:fn; with --kind torchrl random "
        "(default) | pkg.mod:fn called (env, **kwargs); with --kind llm "
        "rlfleet:tiny-qwen2 | rlfleet:tiny-gpt2 | hf:DIR [RLFLEET_POLICY]",
    )
    parser.add_argument(
        "--policy-kwargs",
        metavar="JSON",
        help="JSON kwargs for the policy factory [RLFLEET_POLICY_KWARGS]",
    )
    parser.add_argument(
        "--model",
        action="append",
        metavar="ID=FACTORY",
        help="an extra model (repeatable) [RLFLEET_MODELS=id=f,id2=f2]",
    )
    parser.add_argument(
        "--model-kwargs",
        action="append",
        metavar="ID=JSON",
        help='JSON kwargs of an extra model (repeatable) [RLFLEET_MODEL_KWARGS={"id": {...}}]',
    )
    return parser


def default_worker_id(environ: Mapping[str, str] | None = None, hostname: str | None = None) -> int:
    """The worker id when ``--worker-id`` is not given.

    ``RLFLEET_WORKER_ID`` if set, else the ordinal suffix of the hostname
    (``actor-3`` → 3, as a Kubernetes StatefulSet names its pods), else 0.

    Args:
        environ: Environment variables (``os.environ`` by default).
        hostname: The host name (``socket.gethostname()`` by default).
    """
    environ = os.environ if environ is None else environ
    if _var("worker_id") in environ:
        return ranged("worker_id")(environ[_var("worker_id")])
    match = _ORDINAL_RE.search(hostname if hostname is not None else socket.gethostname())
    if match and int(match.group(1)) <= (INT_RANGES["worker_id"][1] or 0):
        return int(match.group(1))
    return 0


def parse_config(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    hostname: str | None = None,
) -> ActorConfig:
    """Build an ActorConfig from flags and ``RLFLEET_*`` variables (flag wins).

    Args:
        argv: Arguments without the program name (``sys.argv[1:]`` by default).
        environ: Environment variables (``os.environ`` by default).
        hostname: Host name used for the default worker id.

    Returns:
        The validated config.

    Raises:
        SystemExit: With code 2 and a message naming the flag or variable on a bad value.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    try:
        for field, convert, _ in _SIMPLE_FIELDS:
            value = _lookup(args, environ, field, convert)
            if value is not _MISSING:
                values[field] = value
        if "worker_id" not in values:
            values["worker_id"] = _guard(
                f"{_var('worker_id')} / hostname", lambda: default_worker_id(environ, hostname)
            )
        _torchrl_backend(values)
        if values.get("kind") == "llm":
            values["models"] = _llm_model(args, environ)
            _check_task(values.get("task", "arith"), values.get("task_kwargs", {}))
        else:  # a TorchRL-env actor acts at random unless given a policy factory
            default = "random" if values.get("kind") == "torchrl" else "mlp"
            values["models"] = _models(args, environ, default)
    except _FieldError as exc:
        parser.error(str(exc))
    try:
        return _config(values)
    except ValueError as exc:  # a rule across fields (see ActorConfig)
        parser.error(_with_flags(str(exc)))


def _config(values: dict[str, Any]) -> ActorConfig:
    """The config of the parsed ``values``, each section's settings in its section."""
    sections: dict[str, dict[str, Any]] = {"env_pool": {}, "llm": {}}
    for name in list(values):
        section = section_of(name)
        if section is not None:
            sections[section][name] = values.pop(name)
    return ActorConfig(
        **values,
        env_pool=EnvPoolSettings(**sections["env_pool"]),
        llm=LLMActorSettings(**sections["llm"]),
        keep_other_kinds=True,  # a fleet's variables may name every kind's settings
    )


_MISSING = object()


def _torchrl_backend(values: dict[str, Any]) -> None:
    """Rewrites ``--env-backend torchrl`` as ``--kind torchrl --env-backend sync``."""
    if values.get("env_backend") != TORCHRL_BACKEND:
        return
    if values.get("kind", "torchrl") != "torchrl":
        raise _FieldError(
            f"--env-backend torchrl hosts a TorchRL env; it cannot go with --kind {values['kind']}"
        )
    values["kind"] = "torchrl"
    values["env_backend"] = "sync"


class _FieldError(Exception):
    """A conversion error already prefixed with the flag or variable name."""


def _guard(source: str, thunk: Callable[[], Any]) -> Any:
    try:
        return thunk()
    except BadValue as exc:
        raise _FieldError(f"{source}: {exc}") from None


def _lookup(
    args: argparse.Namespace, environ: Mapping[str, str], field: str, convert: Callable[[str], Any]
) -> Any:
    given = getattr(args, field)
    if given is not None:
        return _guard(_flag(field), lambda: convert(given))
    if _var(field) in environ:
        return _guard(_var(field), lambda: convert(environ[_var(field)]))
    return _MISSING


def _models(
    args: argparse.Namespace, environ: Mapping[str, str], default: str
) -> tuple[ModelSpec, ...]:
    policy = _pick(args.policy, environ, "POLICY", "--policy", factory, default)
    policy_kwargs = _pick(
        args.policy_kwargs, environ, "POLICY_KWARGS", "--policy-kwargs", json_object, {}
    )
    extra: dict[str, str] = {}
    if args.model is not None:
        for item in args.model:
            model_id, model_factory = _guard("--model", functools.partial(_pair, item, factory))
            extra[model_id] = model_factory
    elif _ENV_PREFIX + "MODELS" in environ and environ[_ENV_PREFIX + "MODELS"].strip():
        for item in environ[_ENV_PREFIX + "MODELS"].split(","):
            model_id, model_factory = _guard(
                "RLFLEET_MODELS", functools.partial(_pair, item, factory)
            )
            extra[model_id] = model_factory
    kwargs = _model_kwargs(args, environ)
    if DEFAULT_MODEL_ID in extra:
        raise _FieldError("--model: use --policy for the 'policy' model")
    unknown = sorted(set(kwargs) - set(extra))
    if unknown:
        raise _FieldError(f"--model-kwargs: no --model named {unknown}")
    specs = [ModelSpec(DEFAULT_MODEL_ID, policy, policy_kwargs)]
    specs += [ModelSpec(mid, fac, kwargs.get(mid, {})) for mid, fac in extra.items()]
    return tuple(specs)


def _llm_model(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[ModelSpec, ...]:
    from common.llm import PolicySpecError, check_policy_spec

    def spec(text: str) -> str:
        try:
            check_policy_spec(text.strip())
        except PolicySpecError as exc:
            raise BadValue(str(exc)) from None
        return text.strip()

    policy = _pick(args.policy, environ, "POLICY", "--policy", spec, "rlfleet:tiny-qwen2")
    kwargs = _pick(args.policy_kwargs, environ, "POLICY_KWARGS", "--policy-kwargs", json_object, {})
    if args.model is not None or environ.get(_ENV_PREFIX + "MODELS", "").strip():
        raise _FieldError("--model: an LLM actor holds one model, the --policy")
    return (ModelSpec(DEFAULT_MODEL_ID, policy, kwargs),)


def _check_task(task: str, kwargs: dict[str, Any]) -> None:
    import importlib.util

    from common.llm import TaskSpecError, build_task, check_task_spec

    try:
        check_task_spec(task)
        if ":" in task and not task.startswith("jsonl:"):  # a user module: not imported yet
            module = task.partition(":")[0]
            if importlib.util.find_spec(module) is None:
                raise TaskSpecError(f"task {task!r}: no module named {module!r}")
        else:  # built in: cheap to build, so bad kwargs are reported now
            build_task(task, **kwargs)
    except (TaskSpecError, ImportError, ValueError) as exc:
        raise _FieldError(f"--task / RLFLEET_TASK: {exc}") from None


def _model_kwargs(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    if args.model_kwargs is not None:
        return dict(
            _guard("--model-kwargs", functools.partial(_pair, item, json_object))
            for item in args.model_kwargs
        )
    text = environ.get(_ENV_PREFIX + "MODEL_KWARGS", "").strip()
    if not text:
        return {}
    table: dict[str, dict[str, Any]] = _guard("RLFLEET_MODEL_KWARGS", lambda: json_object(text))
    for model_id, value in table.items():
        if not isinstance(value, dict):
            raise _FieldError(f"RLFLEET_MODEL_KWARGS: {model_id!r} must map to a JSON object")
    return table


def _pick(
    given: str | None,
    environ: Mapping[str, str],
    suffix: str,
    flag: str,
    convert: Callable[[str], Any],
    default: Any,
) -> Any:
    if given is not None:
        return _guard(flag, lambda: convert(given))
    if _ENV_PREFIX + suffix in environ:
        return _guard(_ENV_PREFIX + suffix, lambda: convert(environ[_ENV_PREFIX + suffix]))
    return default


def _pair(item: str, convert: Callable[[str], Any]) -> tuple[str, Any]:
    model_id, sep, value = item.strip().partition("=")
    if not sep or not MODEL_ID_RE.match(model_id):
        raise BadValue(f"expected ID=VALUE with an id of letters, digits, _ . -, got {item!r}")
    return model_id, convert(value)


def _with_flags(message: str) -> str:
    """A config error with the flags and variables of the fields it names appended."""
    names = [f.name for f in dataclasses.fields(ActorConfig) if f.name not in SECTIONS]
    names += [f.name for f in dataclasses.fields(EnvPoolSettings)]
    names += [f.name for f in dataclasses.fields(LLMActorSettings)]
    named = [name for name in names if re.search(rf"\b{name}\b", message)]
    sources = ", ".join(f"{_flag(name)} / {_var(name)}" for name in named)
    return f"{message} ({sources})" if sources else message


def _check_before_binding(config: ActorConfig) -> None:
    """Exit 2 before a port is bound if the actor's env or models cannot start.

    torchrl missing (the message names the extra), an env factory that raises or returns
    the wrong kind of env, a model the kind cannot build or one that reads keys its steps
    do not hold (see :mod:`actor_service._cli._checks`).
    """
    from actor_service._cli._checks import check_before_binding

    try:
        check_before_binding(config)
    except ValueError as exc:  # the factories' own failure, not the flags': no usage text
        parser = build_parser()
        parser.exit(2, f"{parser.prog}: error: --kind {config.kind}: {exc}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``rlfleet-actor``: parse, set up logging, serve until SIGTERM/SIGINT.

    Args:
        argv: Arguments without the program name (``sys.argv[1:]`` by default).

    Returns:
        The process exit code: 0 after a graceful stop, 1 if the actor failed to start.
    """
    config = parse_config(argv)
    _check_before_binding(config)
    # torch and gRPC are imported only once the arguments are known to be good.
    from actor_service._serve._logging import configure_logging
    from actor_service._serve._server import serve

    configure_logging(
        config.log_level, config.log_format, worker_id=config.worker_id, include_others=True
    )
    logging.captureWarnings(True)
    _warn_if_open(config)
    _warn_unknown_variables(os.environ)
    return serve(config)


def _warn_unknown_variables(environ: Mapping[str, str]) -> None:
    from actor_service._serve._logging import log_event

    for name, match in unknown_variables(environ):
        hint = f"; did you mean {match}?" if match else ""
        log_event(
            "actor.unknown_variable",
            logging.WARNING,
            variable=name,
            reason=f"{name} is set but no rlfleet-actor setting reads it{hint}",
        )


def _warn_if_open(config: ActorConfig) -> None:
    """Say loudly that auth is off when that may not be meant: an empty token, or the network."""
    if config.token:
        return
    if "RLFLEET_TOKEN" in os.environ:  # e.g. a Secret whose value is empty
        reason = "RLFLEET_TOKEN is set but empty"
    elif not is_loopback(config.host):  # e.g. an optional Secret that is absent
        reason = f"no token, and it listens on {config.host}"
    else:
        return
    from actor_service._serve._logging import log_event

    log_event("actor.auth_off", logging.WARNING, reason=f"{reason}: every caller is accepted")
