"""The settings of one actor server, filled from command-line flags or ``RLFLEET_*`` variables.

Each field of :class:`ActorConfig` has one flag (``--num-envs``) and one
environment variable (``RLFLEET_NUM_ENVS``); the flag wins. The CLI module
builds the config; the collection core and the server read it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from common.config import DEFAULT_MODEL_ID, DEFAULT_PORT

__all__ = ["ActorConfig", "ModelSpec"]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One named model an actor holds.

    Attributes:
        model_id: The name weights are addressed by (``"policy"`` acts by default).
        factory: ``"random"``, ``"mlp"`` or ``"package.module:function"``; the function is
            called with ``(observation_space, action_space, **kwargs)`` and returns an
            ``nn.Module`` (observation tensor -> action tensor) or a TensorDictModule
            (reads ``"observation"``, writes ``"action"`` and any extra keys).
        kwargs: Keyword arguments for the factory (e.g. ``{"hidden": [64, 64]}`` for ``mlp``).
    """

    model_id: str = DEFAULT_MODEL_ID
    factory: str = "mlp"
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


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
        env: A registered gymnasium id, used when ``env_factory`` is empty.
        env_kwargs: Keyword arguments for ``gymnasium.make`` or the factory.
        env_factory: ``"package.module:function"`` returning a gymnasium ``Env``.
        num_envs: Size of the env pool.
        env_backend: ``"sync"`` (in-process) or ``"async"`` (subprocesses, spawn context).
        step_timeout: Seconds an async env step may take before it counts as hung.
        env_error_detail: What a session's end message tells the learner when an env
            raises: ``"full"`` (the exception's type and text) or ``"type"`` (its type
            only; the text, which may hold paths or data, stays in the actor's log).
        models: The models this actor holds; the first is the default actor.
        device: Torch device of the policy (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        seed: Seed for envs, torch and numpy at start; None draws one.
        max_credits: Most batches a learner may have granted and not yet acknowledged.
        grace_period: Seconds SIGTERM waits for streams to drain before stopping.
        token: Bearer token required on every call (learner role); empty disables auth.
        tls_cert: PEM certificate chain file; with ``tls_key`` enables TLS.
        tls_key: PEM private key file.
        tls_client_ca: PEM CA file; when set, clients must present a certificate (mTLS).
        max_weight_bytes: Largest weight or state blob accepted.
        torch_threads: Torch intra-op threads (1 keeps many actors per host from fighting).
        log_level: ``"debug"``, ``"info"``, ``"warning"`` or ``"error"``.
        log_format: ``"text"`` or ``"json"`` (one JSON object per line).
        kind: ``"env"`` (an env pool) or ``"llm"`` (chat slots, a task and a language
            model: ``num_envs`` is the number of slots, the ``policy`` model spec is
            ``rlfleet:tiny-qwen2``, ``hf:DIR``...).
        task: The LLM task: ``arith``, ``reverse``, ``countdown``, ``jsonl:PATH`` or
            ``package.module:factory``.
        task_kwargs: Keyword arguments for the task.
        max_new_tokens_cap: Most new tokens per turn a learner may ask an LLM actor for.
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    health_port: int | None = None
    metrics_port: int | None = None
    worker_id: int = 0
    env: str = "CartPole-v1"
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    env_factory: str = ""
    num_envs: int = 8
    env_backend: str = "sync"
    step_timeout: float = 30.0
    env_error_detail: str = "full"
    models: tuple[ModelSpec, ...] = (ModelSpec(),)
    device: str = "cpu"
    seed: int | None = None
    max_credits: int = 4
    grace_period: float = 10.0
    token: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    max_weight_bytes: int = 1 << 30
    torch_threads: int = 1
    log_level: str = "info"
    log_format: str = "text"
    kind: str = "env"
    task: str = "arith"
    task_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_new_tokens_cap: int = 4096

    def __post_init__(self) -> None:
        """Refuse settings the collection core cannot run with, naming them.

        Raises:
            ValueError: ``worker_id``, ``torch_threads``, ``step_timeout``,
                ``env_error_detail``, ``seed`` or ``kind`` out of range.
        """
        if not isinstance(self.worker_id, int) or not 0 <= self.worker_id <= 0xFFFF:
            raise ValueError(f"worker_id must be an int in 0..65535, got {self.worker_id!r}")
        if not isinstance(self.torch_threads, int) or self.torch_threads < 1:
            raise ValueError(f"torch_threads must be a positive int, got {self.torch_threads!r}")
        if not self.step_timeout > 0:
            raise ValueError(f"step_timeout must be positive, got {self.step_timeout!r}")
        if self.env_error_detail not in ("full", "type"):
            raise ValueError(
                f"env_error_detail must be 'full' or 'type', got {self.env_error_detail!r}"
            )
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2**64):
            raise ValueError(f"seed must be None or an int in [0, 2**64), got {self.seed!r}")
        if self.kind not in ("env", "llm"):
            raise ValueError(f"kind must be 'env' or 'llm', got {self.kind!r}")
