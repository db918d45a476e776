"""What ``rlfleet-actor --kind llm`` checks before it binds a port.

That ``transformers`` is installed (the ``rlfleet[llm]`` extra); with ``--engine vllm``,
that vLLM is installed and accepts the model's configuration; with ``--lora``, that the
adapter's targets are modules of the model (and, with vLLM, layers vLLM serves LoRA on),
on the model's skeleton, with no memory for weights.
"""

from __future__ import annotations

from typing import Any

from actor_service._config import ActorConfig

__all__ = ["check"]


def check(config: ActorConfig) -> None:
    """Raise ``ValueError`` if transformers, vLLM or the LoRA adapter of ``config`` would fail.

    Raises:
        ValueError: The reason: transformers or vLLM missing (naming what to install), vLLM
            refusing the model, or a target it lacks.
    """
    from common.llm import check_transformers

    try:
        check_transformers()
    except ImportError as exc:
        raise ValueError(str(exc)) from None
    if config.engine == "vllm":
        _check_vllm(config)
    if config.lora is not None:
        _check_lora(config)


def _check_lora(config: ActorConfig) -> None:
    """The adapter's targets are modules of the model, on its skeleton (no weights).

    peft refuses targets the model lacks. vLLM serves LoRA on every linear layer but the
    output head (``lm_head`` is an embedding there); the engine checks its own list again
    once it is up (:func:`actor_service._kinds.llm.vllm_lora.check_targets`).
    """
    import torch
    from torch import nn

    from actor_service._kinds.llm.vllm_lora import check_targets
    from common.llm import apply_lora

    assert config.lora is not None
    model = _skeleton(config.models[0].path, dict(config.models[0].kwargs))
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

    from actor_service._kinds.llm.vllm_engine import VLLMOptions, check_checkpoint, import_vllm
    from common.llm import build_policy, default_dtype

    import_vllm()
    spec = config.models[0]
    kwargs = dict(spec.kwargs)
    kwargs.setdefault("dtype", default_dtype(torch.device(config.device)))
    options = VLLMOptions(
        config.gpu_memory_utilization, config.max_model_len, config.enable_prefix_caching
    )
    if spec.path.startswith("hf:"):  # not loaded here: vLLM reads its configuration
        dtype = kwargs["dtype"]
        dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"--policy-kwargs: dtype {kwargs['dtype']!r} is not a torch dtype")
        check_checkpoint(spec.path[3:], dtype, options)
        return
    model, _ = build_policy(spec.path, **kwargs)  # a built-in model: small, built at once
    with tempfile.TemporaryDirectory(prefix="rlfleet-vllm-check-") as path:
        model.config.save_pretrained(path)
        check_checkpoint(path, model.dtype, options)
