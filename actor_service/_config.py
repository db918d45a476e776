"""The settings of one actor server, filled from command-line flags or ``RLFLEET_*`` variables.

:class:`ActorConfig` holds what every actor has (address, ports, ``worker_id``, auth and
TLS, limits, models, device, seed, ``num_envs``) and one typed section per group of kinds
(:data:`SECTIONS`): ``env_pool`` (:class:`~actor_service._core._settings.EnvPoolSettings`,
what the ``env`` and ``torchrl`` kinds step) and ``llm``
(:class:`~actor_service._kinds.llm.settings.LLMActorSettings`). A section is built by its
own class, ``ActorConfig(kind="llm", llm=LLMActorSettings(task="reverse"))``, and refused
on an actor of another kind unless it holds only its defaults. The sections are leaves
(they import nothing of ``actor_service``); this module composes them under every role.

Every setting, a section's included, has one flag (``--num-envs``, ``--task``) and one
environment variable (``RLFLEET_NUM_ENVS``, ``RLFLEET_TASK``); the flag wins. The CLI
module builds the config; the collection core and the server read it, a section's fields
by their flat names too (``config.task`` is ``config.llm.task``).
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Callable, Mapping
from typing import Any

from actor_service._core._settings import EnvPoolSettings
from actor_service._kinds.llm.settings import LLMActorSettings
from common.config import (
    DEFAULT_MODEL_ID,
    DEFAULT_PORT,
    MAX_CREDITS,
    MAX_NUM_ENVS,
    MAX_SEED,
    MAX_TIMEOUT_S,
    MAX_WORKER_ID,
    check_bind_host,
    check_model_id,
    check_token,
)
from common.llm import LoraSpec, check_peft

__all__ = [
    "CHOICES",
    "INT_RANGES",
    "MAX_PART_DEADLINE_S",
    "MAX_STEP_TIMEOUT_S",
    "OPTIONAL_INTS",
    "SECTIONS",
    "VLLM_LORA_RANKS",
    "ActorConfig",
    "ModelSpec",
    "Section",
    "section_of",
    "vllm_lora_rank",
]

#: The longest an incomplete multi-part version may wait for its last part (seconds):
#: its staged parts hold up to one copy of the model meanwhile.
MAX_PART_DEADLINE_S = 600.0

#: The longest ``step_timeout``: an async env pool waits on its pipes in whole
#: milliseconds of a C int, which overflows above 2,147,483 s (about 24.8 days).
MAX_STEP_TIMEOUT_S = 1e6

# The one home of every integer range and choice of an actor's settings (CLI and config).
INT_RANGES: dict[str, tuple[int, int | None]] = {
    "port": (0, 65535),
    "health_port": (0, 65535),
    "metrics_port": (0, 65535),
    "worker_id": (0, MAX_WORKER_ID),
    "num_envs": (1, MAX_NUM_ENVS),
    "max_credits": (1, MAX_CREDITS),
    "max_weight_bytes": (1, None),
    "torch_threads": (1, 1024),
    "max_new_tokens_cap": (1, 1 << 20),
    "max_model_len": (1, 1 << 24),
}
# Integer settings that may also be None (off).
OPTIONAL_INTS = frozenset({"health_port", "metrics_port", "max_weight_bytes", "max_model_len"})
CHOICES: dict[str, tuple[str, ...]] = {
    "env_backend": ("sync", "async"),
    "env_error_detail": ("full", "type"),
    "log_level": ("debug", "info", "warning", "error"),
    "log_format": ("text", "json"),
    "kind": ("env", "torchrl", "llm"),
    "decode": ("eager", "static", "compiled"),
    "engine": ("transformers", "vllm"),
}
#: Settings of one type that no range or choice above covers (a section's read flat).
_TYPES: dict[str, type] = {
    "device": str,
    "shared_memory": bool,
    "env_kwargs": Mapping,
    "task_kwargs": Mapping,
}
#: The ``max_lora_rank`` values vLLM 0.32 takes; an adapter's rank fits the next one up.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclasses.dataclass(frozen=True)
class Section:
    """One settings section of :class:`ActorConfig`: its class and the kinds it is for.

    Attributes:
        settings: The frozen dataclass that declares the section's fields.
        kinds: The ``ActorConfig.kind`` values that read it.
    """

    settings: type[EnvPoolSettings] | type[LLMActorSettings]
    kinds: tuple[str, ...]


#: Each section field of :class:`ActorConfig`, by name. A kind with settings of its own
#: declares them in ``_kinds/<kind>/settings.py`` and adds its field and a line here.
SECTIONS: dict[str, Section] = {
    "env_pool": Section(EnvPoolSettings, ("env", "torchrl")),
    "llm": Section(LLMActorSettings, ("llm",)),
}


def section_of(name: str) -> str | None:
    """The section that declares the setting ``name``, or None for a setting of every actor."""
    for section_name, section in SECTIONS.items():
        if name in {f.name for f in dataclasses.fields(section.settings)}:
            return section_name
    return None


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One named model an actor holds.

    Attributes:
        model_id: The name weights are addressed by (``"policy"`` acts by default).
        factory: ``"random"``, ``"mlp"`` or ``"package.module:function"``; the function is
            called with ``(observation_space, action_space, **kwargs)`` and returns an
            ``nn.Module`` (observation tensor -> action tensor) or a TensorDictModule
            (reads ``"observation"``, writes ``"action"`` and any extra keys). On a
            TorchRL-env actor (kind ``"torchrl"``): ``"random"`` (the env's action spec) or a
            function called with ``(env, **kwargs)`` returning any ``TensorDictModuleBase``;
            there a server built in-process (``create_server``) also takes that function
            itself (a closure); the command line takes names only.
        kwargs: Keyword arguments for the factory (e.g. ``{"hidden": [64, 64]}`` for ``mlp``).
    """

    model_id: str = DEFAULT_MODEL_ID
    factory: str | Callable[..., Any] = "mlp"
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        """Refuse a ``model_id`` no learner could address (:func:`common.config.check_model_id`).

        Raises:
            ValueError: Naming the id and the rule, or ``kwargs`` that are not a mapping.
        """
        check_model_id(self.model_id)
        if not isinstance(self.kwargs, Mapping):
            raise ValueError(
                f"model {self.model_id!r}: kwargs must be a Mapping, got {self.kwargs!r:.80}"
            )

    @property
    def path(self) -> str:
        """``factory`` as a name or import path: what every kind but ``torchrl`` reads.

        Raises:
            TypeError: The factory was given in memory (``ActorConfig`` allows that for
                kind ``torchrl`` only).
        """
        if not isinstance(self.factory, str):
            raise TypeError(f"model {self.model_id!r}: its factory is a callable, not a name")
        return self.factory


@dataclasses.dataclass(frozen=True)
class ActorConfig:
    """Everything an actor server needs to start.

    Attributes:
        host: Address to bind; ``0.0.0.0`` in containers.
        port: Port to bind; 0 picks a free one (printed on stdout when ready).
        health_port: When set, a plaintext server with only health and reflection on this
            port (Kubernetes' gRPC probe cannot do TLS); the main port still serves health.
        metrics_port: When set, Prometheus metrics over plain HTTP at ``/metrics`` on this
            port (0 picks a free one); nothing else is served there. Off by default.
        worker_id: This actor's id in the fleet (0..65535).
        num_envs: Size of the env pool (kind ``"torchrl"`` with an env that is batched
            itself: its batch size; kind ``"llm"``: the number of chat slots).
        env_error_detail: What a session's end message tells the learner when an env
            raises: ``"full"`` (the exception's type and text) or ``"type"`` (its type
            only; the text, which may hold paths or data, stays in the actor's log).
        models: The models this actor holds; the first is the default actor.
        device: Torch device of the policy (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        seed: Seed for envs, torch and numpy at start; None draws one.
        max_credits: Most batches a learner may have granted and not yet acknowledged.
        grace_period: Seconds from SIGTERM to exit: the drain, then the teardown.
        token: Bearer token required on every call (learner role); empty disables auth.
        tls_cert: PEM certificate chain file; with ``tls_key`` enables TLS.
        tls_key: PEM private key file.
        tls_client_ca: PEM CA file; when set, clients must present a certificate (mTLS).
        relay_ca: PEM CA file of the other actors' certificates: with TLS, this actor
            forwards relayed pushes over TLS, presenting ``tls_cert`` as its client
            certificate (for mTLS fleets); empty: a TLS actor forwards nothing.
        max_weight_bytes: Largest weight or state blob accepted; None follows the model:
            ``max(1 GiB, 1.25 x its bytes)`` (``common.weights.default_max_weight_bytes``).
        part_deadline_s: Seconds an incomplete multi-part version (learner ranks each
            pushing a part) waits for its last part from its first before it expires,
            in ``(0, MAX_PART_DEADLINE_S]``; its parts are dropped and none of it applies.
        shared_memory: Take weight pushes through a shared-memory segment, and send batches
            through segments when asked, when the learner shares this host (False: every
            push's and batch's bytes travel over gRPC).
        torch_threads: Torch intra-op threads (1 keeps many actors per host from fighting).
        log_level: ``"debug"``, ``"info"``, ``"warning"`` or ``"error"``.
        log_format: ``"text"`` or ``"json"`` (one JSON object per line).
        kind: ``"env"`` (a pool of gymnasium envs), ``"torchrl"`` (a pool of TorchRL
            envs: ``GymEnv(env, **env_kwargs)`` or ``env_factory``; models are ``random``
            or factories called ``factory(env, **kwargs)``; needs the ``torchrl`` extra)
            or ``"llm"`` (chat slots, a task and a language model: ``num_envs`` is the
            number of slots, the ``policy`` model spec is ``rlfleet:tiny-qwen2``,
            ``hf:DIR``...).
        env_pool: What an ``env`` or ``torchrl`` actor steps and how its env pool runs
            (:class:`~actor_service._core._settings.EnvPoolSettings`: ``env``,
            ``env_kwargs``, ``env_factory``, ``env_backend``, ``step_timeout``).
        llm: What an ``llm`` actor decodes with and for which task
            (:class:`~actor_service._kinds.llm.settings.LLMActorSettings`: ``task``,
            ``task_kwargs``, ``max_new_tokens_cap``, ``lora``, ``decode``, ``engine`` and
            the vLLM knobs).

    A section's fields read flat too (``config.env`` is ``config.env_pool.env``).

    Args:
        keep_other_kinds: Keep, unread, a section another kind reads instead of refusing
            it. The command line sets it: its ``RLFLEET_*`` variables may be shared by a
            fleet's actors of every kind (not a field: it is not part of the settings).
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    health_port: int | None = None
    metrics_port: int | None = None
    worker_id: int = 0
    num_envs: int = 8
    env_error_detail: str = "full"
    models: tuple[ModelSpec, ...] = (ModelSpec(),)
    device: str = "cpu"
    seed: int | None = None
    max_credits: int = 4
    grace_period: float = 10.0
    token: str = dataclasses.field(default="", repr=False)  # a secret: never in a repr
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    relay_ca: str = ""
    max_weight_bytes: int | None = None
    part_deadline_s: float = 60.0
    shared_memory: bool = True
    torch_threads: int = 1
    log_level: str = "info"
    log_format: str = "text"
    kind: str = "env"
    env_pool: EnvPoolSettings = dataclasses.field(default_factory=EnvPoolSettings)
    llm: LLMActorSettings = dataclasses.field(default_factory=LLMActorSettings)
    keep_other_kinds: dataclasses.InitVar[bool] = False

    def __post_init__(self, keep_other_kinds: bool) -> None:
        """Refuse settings the actor cannot run with, naming the field and its range.

        The ranges live in :data:`INT_RANGES` and :data:`CHOICES`; the command line
        reads the same tables, so a flag and a programmatic config obey one rule.

        Raises:
            ValueError: A section that is not its settings class, a field out of its
                range or choices, a seed outside ``[0, 2**64)``, a ``token`` a learner
                cannot send (:func:`~common.config.check_token`), a ``step_timeout`` out
                of ``(0, MAX_STEP_TIMEOUT_S]``, a ``grace_period`` outside ``[0, MAX_TIMEOUT_S]``, a
                ``part_deadline_s`` out of range, a field of the wrong type (``device``
                empty or not a str, ``shared_memory`` not a bool, ``env_kwargs`` or
                ``task_kwargs`` not a mapping, a duration not a number, ``models`` not
                ``ModelSpec`` objects), TLS files given by halves
                (``relay_ca`` included), no models, a ``lora`` that is not a
                ``LoraSpec`` on an LLM actor with peft installed, vLLM settings without
                ``engine="vllm"`` on an LLM actor, a ``decode`` other than ``"eager"``
                with ``engine="vllm"``, two of ``port``/``health_port``/``metrics_port``
                alike, or (unless ``keep_other_kinds``) a section other than its
                defaults on an actor of a kind it is not for.
        """
        for name, section in SECTIONS.items():
            given = getattr(self, name)
            if not isinstance(given, section.settings):
                raise ValueError(
                    f"{name} must be an {section.settings.__name__}, got {given!r:.80}"
                )
        for name, (low, high) in INT_RANGES.items():
            value = getattr(self, name)
            if value is None and name in OPTIONAL_INTS:
                continue
            if not _int_within(value, low, high):
                bounds = f"in {low}..{high}" if high is not None else f">= {low}"
                raise ValueError(f"{name} must be an int {bounds}, got {value!r}")
        for name, choices in CHOICES.items():
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        if self.seed is not None and not _int_within(self.seed, 0, MAX_SEED):
            raise ValueError(f"seed must be None or an int in [0, 2**64), got {self.seed!r}")
        check_bind_host(self.host)
        self._check_types()
        if self.token:  # "" disables auth; a learner must be able to send any other
            check_token(self.token)
        self._check_durations()
        self._check_tls()
        self._check_ports()
        if not self.models:
            raise ValueError("models must name at least one model")
        self._check_in_memory()
        self._check_engine()
        if self.lora is not None:
            if not isinstance(self.lora, LoraSpec):
                raise ValueError(f"lora must be a LoraSpec or None, got {self.lora!r:.80}")
            if self.kind != "llm":
                raise ValueError("lora adapts a language model: it needs kind 'llm'")
            check_peft()
        if not keep_other_kinds:
            self._check_sections()

    def _check_types(self) -> None:
        """The settings no range or choice covers have their type (a section's read flat).

        A wrong one was taken (``shared_memory="no"`` as True) or met at start as a bare
        ``AttributeError`` (``env_kwargs=None``).
        """
        for name, kind in _TYPES.items():
            if not isinstance(getattr(self, name), kind):
                raise ValueError(
                    f"{name} must be a {kind.__name__}, got {getattr(self, name)!r:.80}"
                )
        if not self.device.strip():
            raise ValueError("device must name a torch device ('cpu', 'cuda:1'), got ''")
        for name in ("step_timeout", "grace_period", "part_deadline_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number of seconds, got {value!r:.80}")
        if not isinstance(self.models, list | tuple):
            raise ValueError(f"models must be a tuple of ModelSpec, got {self.models!r:.80}")
        for spec in self.models:
            if not isinstance(spec, ModelSpec):
                raise ValueError(f"models must hold ModelSpec objects, got {spec!r:.80}")

    def _check_durations(self) -> None:
        """``step_timeout``, ``grace_period`` and ``part_deadline_s`` are in their ranges."""
        if isinstance(self.step_timeout, bool) or not 0 < self.step_timeout <= MAX_STEP_TIMEOUT_S:
            raise ValueError(
                f"step_timeout must be in (0, {MAX_STEP_TIMEOUT_S:g}] seconds, "
                f"got {self.step_timeout!r}"
            )
        if isinstance(self.grace_period, bool) or not 0 <= self.grace_period <= MAX_TIMEOUT_S:
            raise ValueError(
                f"grace_period must be in [0, {MAX_TIMEOUT_S:g}] seconds, got {self.grace_period!r}"
            )
        if not 0 < self.part_deadline_s <= MAX_PART_DEADLINE_S:
            raise ValueError(
                f"part_deadline_s must be in (0, {MAX_PART_DEADLINE_S:g}], "
                f"got {self.part_deadline_s!r}"
            )

    def _check_ports(self) -> None:
        """The gRPC, health and metrics ports differ (0, any free port, may repeat)."""
        named = {"port": self.port, "health_port": self.health_port}
        named["metrics_port"] = self.metrics_port
        seen: dict[int, str] = {}
        for name, port in named.items():
            if port and port in seen:
                raise ValueError(f"{name} and {seen[port]} must differ, both are {port}")
            if port:
                seen[port] = name

    def _check_tls(self) -> None:
        """TLS files come whole: a key with its certificate, CAs only with both."""
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key must be given together")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("tls_client_ca needs tls_cert and tls_key")
        if self.relay_ca and not self.tls_cert:
            raise ValueError("relay_ca needs tls_cert and tls_key (it is for TLS fleets)")
        if self.tls_cert:
            _check_pem_files(self.tls_cert, self.tls_key, self.tls_client_ca, self.relay_ca)

    def _check_sections(self) -> None:
        """A section other than its defaults is for the kinds that read it."""
        for name, section in SECTIONS.items():
            given, default = getattr(self, name), section.settings()
            if self.kind in section.kinds or given == default:
                continue
            changed = [
                f.name
                for f in dataclasses.fields(given)
                if getattr(given, f.name) != getattr(default, f.name)
            ]
            kinds = " or ".join(repr(kind) for kind in section.kinds)
            raise ValueError(
                f"{name} settings ({', '.join(changed)}) are for kind {kinds}, not {self.kind!r}"
            )

    def _check_in_memory(self) -> None:
        """Factories given in memory (callables, not import paths) are for kind ``torchrl``."""
        factories = [("env_factory", self.env_pool.env_factory)]
        factories += [(f"model {spec.model_id!r}", spec.factory) for spec in self.models]
        for name, factory in factories:
            if not isinstance(factory, str) and not callable(factory):
                raise ValueError(
                    f"{name} must be an import path or a callable, got {factory!r:.80}"
                )
        given = [name for name, factory in factories if not isinstance(factory, str)]
        if given and self.kind != "torchrl":
            raise ValueError(
                f"{', '.join(given)} given as a callable: in-memory factories are for kind "
                f"'torchrl' (in-process servers); kind {self.kind!r} takes import paths "
                "('package.module:function')"
            )

    def logged(self) -> dict[str, Any]:
        """The settings as the actor logs them at start (``actor.config``).

        Its kind's section is read flat, and the token masked (``"***"`` when one is set).
        """
        fields = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("env_pool", "llm", "token")
        }
        section = self.llm if self.kind == "llm" else self.env_pool
        fields |= {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}
        return fields | {"token": "***" if self.token else ""}

    # A section's fields, read flat: code and logs name them as the flags do.
    @property
    def env(self) -> str:
        """``env_pool.env``."""
        return self.env_pool.env

    @property
    def env_kwargs(self) -> dict[str, Any]:
        """``env_pool.env_kwargs``."""
        return self.env_pool.env_kwargs

    @property
    def env_factory(self) -> str | Callable[..., Any]:
        """``env_pool.env_factory``."""
        return self.env_pool.env_factory

    @property
    def env_backend(self) -> str:
        """``env_pool.env_backend``."""
        return self.env_pool.env_backend

    @property
    def step_timeout(self) -> float:
        """``env_pool.step_timeout``."""
        return self.env_pool.step_timeout

    @property
    def task(self) -> str:
        """``llm.task``."""
        return self.llm.task

    @property
    def task_kwargs(self) -> dict[str, Any]:
        """``llm.task_kwargs``."""
        return self.llm.task_kwargs

    @property
    def max_new_tokens_cap(self) -> int:
        """``llm.max_new_tokens_cap``."""
        return self.llm.max_new_tokens_cap

    @property
    def lora(self) -> LoraSpec | None:
        """``llm.lora``."""
        return self.llm.lora

    @property
    def decode(self) -> str:
        """``llm.decode``."""
        return self.llm.decode

    @property
    def engine(self) -> str:
        """``llm.engine``."""
        return self.llm.engine

    @property
    def gpu_memory_utilization(self) -> float | None:
        """``llm.gpu_memory_utilization``."""
        return self.llm.gpu_memory_utilization

    @property
    def max_model_len(self) -> int | None:
        """``llm.max_model_len``."""
        return self.llm.max_model_len

    @property
    def enable_prefix_caching(self) -> bool:
        """``llm.enable_prefix_caching``."""
        return self.llm.enable_prefix_caching

    def _check_engine(self) -> None:
        """The engine rules: vLLM serves LLM actors and LoRA ranks it has slots for."""
        if self.engine == "vllm":
            if self.kind != "llm":
                raise ValueError("engine 'vllm' decodes for a language model: it needs kind 'llm'")
            if isinstance(self.lora, LoraSpec):
                vllm_lora_rank(self.lora.r)
            if self.decode != "eager":
                raise ValueError(
                    f"decode {self.decode!r} runs rlfleet's decode loop: engine 'vllm' decodes "
                    "in vLLM (leave decode at 'eager')"
                )
        knobs = {
            "gpu_memory_utilization": self.gpu_memory_utilization is not None,
            "max_model_len": self.max_model_len is not None,
            "enable_prefix_caching": self.enable_prefix_caching,
        }
        given = [name for name, set_ in knobs.items() if set_]
        if given and self.engine != "vllm":
            raise ValueError(f"{', '.join(given)} configure vLLM: they need engine 'vllm'")
        share = self.gpu_memory_utilization
        if share is not None and not (isinstance(share, float) and 0.0 < share <= 1.0):
            raise ValueError(f"gpu_memory_utilization must be a float in (0, 1], got {share!r}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(
                f"enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}"
            )


def vllm_lora_rank(rank: int) -> int:
    """The ``max_lora_rank`` vLLM gets for an adapter of ``rank``: the smallest that fits.

    Raises:
        ValueError: ``rank`` above vLLM's largest, naming it.
    """
    for slot in VLLM_LORA_RANKS:
        if rank <= slot:
            return slot
    raise ValueError(
        f"engine 'vllm' serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}, got lora r={rank}"
    )


def _int_within(value: object, low: int, high: int | None) -> bool:
    """Whether ``value`` is an int (not a bool) in ``low..high`` (no upper bound if None)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    return low <= value and (high is None or value <= high)


def _check_pem_files(cert: str, key: str, *cas: str) -> None:
    """The TLS files load: a certificate chain with its private key, CA bundles.

    Checked with the standard ``ssl`` module before gRPC reads them, whose own error is
    "Failed to bind to address" with the cause only in its stderr lines.

    Raises:
        ValueError: Naming the file(s) and what is wrong.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:  # an encrypted key gets an empty password: gRPC cannot decrypt one either
        context.load_cert_chain(cert, key, password=lambda: b"")
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(
            f"tls_cert {cert!r} and tls_key {key!r} are not a PEM certificate chain and its "
            f"(unencrypted) private key: {exc}"
        ) from None
    for ca in filter(None, cas):
        try:
            context.load_verify_locations(cafile=ca)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"{ca!r} is not a PEM CA bundle: {exc}") from None
