"""What ``rlfleet-actor`` checks before it binds a port, so bad input exits 2, not 1.

:func:`check_before_binding` builds what an actor of ``config.kind`` would fail on at
start and raises ``ValueError`` with the reason: a ``--device`` this machine does not
have; for ``torchrl``, one env and every
model on it (:func:`~actor_service._core._torchrl_pool.check_torchrl_config`); for
``env`` (gymnasium), every model from a ``package.module:function`` factory, built on
one env's spaces, which must not read more than a gymnasium step holds (a TensorDict
policy that needs ``is_init``, recurrent states or keys other than ``observation``
belongs on ``--kind torchrl``); for ``llm`` with ``--engine vllm``, that vLLM is
installed and accepts the model's configuration; for ``llm`` with ``--lora``, that its
targets are modules of the model (and, with vLLM, layers vLLM serves LoRA on). The env is
built once here, then closed. The command line turns the error into its usage error
(exit 2).
"""

from __future__ import annotations

from typing import Any

from actor_service._config import ActorConfig
from common.config import local_device

__all__ = ["check_before_binding"]


def check_before_binding(config: ActorConfig) -> None:
    """Raise ``ValueError`` if an actor of ``config`` would fail to start on its env or models.

    Raises:
        ValueError: The reason, naming the factory, the model and the offending keys.
    """
    if config.device != "cpu":
        local_device(config.device, "--device")
    if config.kind == "torchrl":
        from actor_service._core._torchrl_pool import check_torchrl_config

        check_torchrl_config(config)
    elif config.kind == "env":
        _check_env_policies(config)
    elif config.kind == "llm":
        if config.engine == "vllm":
            _check_vllm(config)
        if config.lora is not None:
            _check_lora(config)


def _check_lora(config: ActorConfig) -> None:
    """The adapter's targets are modules of the model, on its skeleton (no weights).

    peft refuses targets the model lacks. vLLM serves LoRA on every linear layer but the
    output head (``lm_head`` is an embedding there); the engine checks its own list again
    once it is up (:func:`actor_service._vllm_lora.check_targets`).
    """
    import torch
    from torch import nn

    from actor_service._vllm_lora import check_targets
    from common.llm import apply_lora

    assert config.lora is not None
    model = _skeleton(config.models[0].factory, dict(config.models[0].kwargs))
    linear = {n.rpartition(".")[2] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    with torch.device("meta"):
        wrapped = apply_lora(model, config.lora)
    if config.engine == "vllm":
        check_targets(wrapped.state_dict(), linear - {"lm_head"})


def _skeleton(factory: str, kwargs: dict[str, object]) -> Any:
    """The model of ``factory`` on the meta device: its modules, no memory for weights."""
    import torch

    from common.llm import build_policy

    kwargs.pop("dtype", None)  # a skeleton's modules do not depend on it
    if not factory.startswith("hf:"):
        with torch.device("meta"):
            return build_policy(factory, **kwargs)[0]
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.from_pretrained(factory[3:], local_files_only=True)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config)


def _check_vllm(config: ActorConfig) -> None:
    """Check that vLLM is installed and accepts the model's configuration (else its reason)."""
    import tempfile

    import torch

    from actor_service._vllm_engine import VLLMOptions, check_checkpoint, import_vllm
    from common.llm import build_policy, default_dtype

    import_vllm()
    spec = config.models[0]
    kwargs = dict(spec.kwargs)
    kwargs.setdefault("dtype", default_dtype(torch.device(config.device)))
    options = VLLMOptions(
        config.gpu_memory_utilization, config.max_model_len, config.enable_prefix_caching
    )
    if spec.factory.startswith("hf:"):  # not loaded here: vLLM reads its configuration
        dtype = kwargs["dtype"]
        dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"--policy-kwargs: dtype {kwargs['dtype']!r} is not a torch dtype")
        check_checkpoint(spec.factory[3:], dtype, options)
        return
    model, _ = build_policy(spec.factory, **kwargs)  # a built-in model: small, built at once
    with tempfile.TemporaryDirectory(prefix="rlfleet-vllm-check-") as path:
        model.config.save_pretrained(path)
        check_checkpoint(path, model.dtype, options)


def _check_env_policies(config: ActorConfig) -> None:
    """A gymnasium actor's custom policies, built on one env's spaces, read only ``observation``."""
    custom = [spec for spec in config.models if ":" in spec.factory]
    if not custom:
        return  # the built-ins read observations only
    from tensordict.nn import TensorDictModuleBase

    from actor_service._env_pool import env_fn, env_name
    from actor_service._models import unsupplied_keys
    from common.policies import make_policy

    try:
        env = env_fn(config)()
    except Exception as exc:
        raise ValueError(f"env {env_name(config)!r} raised {type(exc).__name__}: {exc}") from exc
    try:
        spaces = env.observation_space, env.action_space
    finally:
        env.close()
    for spec in custom:
        try:
            module = make_policy(spec.factory, *spaces, **dict(spec.kwargs))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"model {spec.model_id!r}: {exc}") from exc
        missing = unsupplied_keys(module) if isinstance(module, TensorDictModuleBase) else []
        if missing:
            raise ValueError(
                f"model {spec.model_id!r} ({spec.factory}) reads {missing}, which a gymnasium "
                "env actor does not provide (its steps hold 'observation' only): run it on a "
                "TorchRL-env actor, --kind torchrl, whose steps carry them"
            )
