"""The language-model registry both sides share: ``build_policy(spec, **kwargs)``.

A spec names where a causal LM and its tokenizer come from:

* ``rlfleet:tiny-qwen2`` / ``rlfleet:tiny-gpt2`` — built from a config with random
  weights (seeded by ``seed``, 0 by default, so a learner and an actor that pass the
  same kwargs hold identical weights) and a tokenizer built in code with a ChatML
  chat template (``vocab``: ``"bytes"``, 260 byte-level tokens, by default, or
  ``"compact"`` or ``"arith"``, one token per character of a task alphabet; see ``_vocab``); sized
  by ``hidden``, ``layers``, ``heads``, ``max_positions``.
* ``hf:DIR`` — a local Hugging Face checkpoint directory, loaded with
  ``local_files_only=True``; nothing is ever downloaded.

``transformers`` is imported only here and only when a spec is built, so env-only
installs never need it; ``HF_HUB_OFFLINE=1`` is set before the import.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

from common.llm._vocab import CHATML_TEMPLATE, VOCABS, build_tokenizer, check_transformers

__all__ = [
    "CHATML_TEMPLATE",
    "MODEL_SPECS",
    "PolicySpecError",
    "build_policy",
    "build_tokenizer",
    "check_policy_spec",
    "end_token_ids",
]

#: The specs built in; ``hf:DIR`` loads a local checkpoint.
MODEL_SPECS = ("rlfleet:tiny-qwen2", "rlfleet:tiny-gpt2")

_TINY_DEFAULTS = {"hidden": 64, "layers": 2, "heads": 4, "max_positions": 512, "seed": 0}


class PolicySpecError(ValueError):
    """A model spec that names nothing buildable (unknown spec, missing directory, bad kwargs)."""


def check_policy_spec(spec: str, **kwargs: Any) -> None:
    """Refuse a spec that cannot name a model, without importing transformers.

    Args:
        spec: The model spec.
        **kwargs: A tiny model's kwargs (:func:`build_policy`), checked when given.

    Raises:
        PolicySpecError: Naming the spec and what is wrong.
    """
    if not isinstance(spec, str):
        raise PolicySpecError(f"a model spec must be a string, got {type(spec).__name__}")
    if spec in MODEL_SPECS:
        if kwargs:
            _tiny_kwargs({key: value for key, value in kwargs.items() if key != "dtype"})
        return
    if spec.startswith("hf:"):
        path = spec[3:]
        if not path or not os.path.isdir(path):
            raise PolicySpecError(f"model spec {spec!r}: no such checkpoint directory {path!r}")
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise PolicySpecError(
                f"model spec {spec!r}: {path!r} is not a checkpoint directory (no config.json; "
                "give the folder save_pretrained wrote)"
            )
        if not _has_chat_template(path):
            raise PolicySpecError(
                f"model spec {spec!r}: the tokenizer in {path!r} has no chat template"
            )
        return
    raise PolicySpecError(
        f"unknown model spec {spec!r}; expected one of {', '.join(MODEL_SPECS)} or hf:DIR"
    )


def _has_chat_template(path: str) -> bool:
    """Whether a checkpoint directory's tokenizer files carry a chat template."""
    if any(
        os.path.isfile(os.path.join(path, n)) for n in ("chat_template.jinja", "chat_template.json")
    ):
        return True
    config = os.path.join(path, "tokenizer_config.json")
    if not os.path.isfile(config) or os.path.getsize(config) > 64 << 20:
        return False
    try:
        with open(config, encoding="utf-8") as file:
            return bool(json.load(file).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def build_policy(spec: str, **kwargs: Any) -> tuple[Any, Any]:
    """Build a causal LM and its tokenizer from a spec, offline.

    Args:
        spec: ``rlfleet:tiny-qwen2``, ``rlfleet:tiny-gpt2`` or ``hf:DIR``.
        **kwargs: Tiny models: ``hidden`` (64), ``layers`` (2), ``heads`` (4),
            ``max_positions`` (512), ``seed`` (0), ``vocab`` (``"bytes"`` or
            ``"compact"`` or ``"arith"``). Every spec: ``dtype`` (``"float32"``, the
            default, or ``"bfloat16"``; a tiny model is initialised in float32 and cast).

    Returns:
        ``(model, tokenizer)``: a ``PreTrainedModel`` in eval mode on CPU and a
        tokenizer with a chat template and a pad token.

    Raises:
        PolicySpecError: An unknown spec or kwarg, a missing directory, or a tokenizer
            without a chat template.
        ModuleNotFoundError: ``transformers`` is not installed (naming ``rlfleet[llm]``).

    Example::

        model, tokenizer = build_policy("rlfleet:tiny-qwen2", hidden=64, layers=2)
    """
    check_policy_spec(spec)
    check_transformers()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    dtype = _dtype(kwargs.pop("dtype", "float32"))
    if spec.startswith("hf:"):
        model, tokenizer = _load_local(spec[3:], dtype, **kwargs)
    else:
        model, tokenizer = _build_tiny(spec.split(":", 1)[1], **kwargs)
        model = model.to(dtype)  # initialised in float32: every dtype holds the same draws
    if not getattr(tokenizer, "chat_template", None):
        raise PolicySpecError(f"model spec {spec!r}: the tokenizer has no chat template")
    if tokenizer.eos_token_id is None:
        raise PolicySpecError(
            f"model spec {spec!r}: the tokenizer has no EOS token, so no response could end "
            "(set eos_token in the checkpoint's tokenizer_config.json)"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    _check_ids_fit(spec, model, tokenizer)
    return model.eval(), tokenizer


def end_token_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """The ids a response ends on: the tokenizer's EOS, then the checkpoint's others.

    A checkpoint's ``generation_config.eos_token_id`` may list several (a chat model's
    ``<end_of_turn>`` beside ``<eos>``); ``transformers``' ``generate`` stops on each, and so
    does an actor.
    """
    ids = [int(tokenizer.eos_token_id)]
    for token in _listed_end_ids(model):
        if int(token) not in ids:
            ids.append(int(token))
    return tuple(ids)


def _listed_end_ids(model: Any) -> list[Any]:
    """``generation_config.eos_token_id`` as a list (it may be None, an int or a list)."""
    listed = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return [listed] if isinstance(listed, int) else list(listed or ())


def _check_ids_fit(spec: str, model: Any, tokenizer: Any) -> None:
    """Every id the tokenizer or the checkpoint's end ids name is a row of the embeddings."""
    rows = int(model.get_input_embeddings().num_embeddings)
    if len(tokenizer) > rows:
        raise PolicySpecError(
            f"model spec {spec!r}: the tokenizer has {len(tokenizer)} ids but the model "
            f"embeds {rows}, so a prompt with an id from {rows} up would fail: resize the "
            "model's embeddings (model.resize_token_embeddings(len(tokenizer))) and save it"
        )
    for token in _listed_end_ids(model):
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < rows:
            raise PolicySpecError(
                f"model spec {spec!r}: generation_config.eos_token_id lists {token!r:.40}, "
                f"not an id of the model's {rows} embeddings"
            )


def _tiny_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, int], str]:
    """The tiny model's int kwargs and its vocabulary, checked."""
    unknown = sorted(set(kwargs) - {*_TINY_DEFAULTS, "vocab"})
    if unknown:
        known = sorted({*_TINY_DEFAULTS, "vocab", "dtype"})
        raise PolicySpecError(f"unknown kwargs {unknown} for a tiny model; known: {known}")
    values = {**_TINY_DEFAULTS, **kwargs}
    vocab = values.pop("vocab", VOCABS[0])
    if vocab not in VOCABS:
        raise PolicySpecError(f"tiny model kwarg vocab={vocab!r} must be one of {VOCABS}")
    for key, value in values.items():
        low = 0 if key == "seed" else 1
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value < 2**31:
            raise PolicySpecError(
                f"tiny model kwarg {key}={value!r} must be an int in [{low}, 2**31)"
            )
    if values["hidden"] % values["heads"] or (values["hidden"] // values["heads"]) % 2:
        raise PolicySpecError(
            f"hidden={values['hidden']} must be a multiple of 2*heads (heads={values['heads']})"
        )
    return values, vocab


def _build_tiny(arch: str, **kwargs: Any) -> tuple[Any, Any]:
    values, vocab_name = _tiny_kwargs(kwargs)
    tokenizer = build_tokenizer(vocab_name)
    vocab = len(tokenizer)
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    }
    hidden, layers, heads = values["hidden"], values["layers"], values["heads"]
    with _seeded(values["seed"]):
        if arch == "tiny-qwen2":
            from transformers import Qwen2Config, Qwen2ForCausalLM

            config: Any = Qwen2Config(
                vocab_size=vocab,
                hidden_size=hidden,
                intermediate_size=2 * hidden,
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=heads,
                max_position_embeddings=values["max_positions"],
                tie_word_embeddings=True,
                initializer_range=0.2,
                **ids,
            )
            model: Any = Qwen2ForCausalLM(config)
        else:
            from transformers import GPT2Config, GPT2LMHeadModel

            config = GPT2Config(  # one name, two architectures
                vocab_size=vocab,
                n_embd=hidden,
                n_layer=layers,
                n_head=heads,
                n_positions=values["max_positions"],
                initializer_range=0.2,
                **ids,
            )
            model = GPT2LMHeadModel(config)
    _neutral_generation_config(model)
    return model, tokenizer


def _dtype(name: object) -> Any:
    """The torch dtype of the ``dtype`` kwarg (``"float32"`` or ``"bfloat16"``)."""
    from common.llm._device import model_dtype

    try:
        return model_dtype(name, "cpu")
    except ValueError as exc:
        raise PolicySpecError(str(exc)) from None


def _load_local(path: str, dtype: Any, **kwargs: Any) -> tuple[Any, Any]:
    if kwargs:
        raise PolicySpecError(f"unknown kwargs {sorted(kwargs)} for hf:DIR; known: ['dtype']")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise PolicySpecError(f"hf:{path}: cannot load the checkpoint: {exc}") from None
    _neutral_generation_config(model)
    return model, tokenizer


def _neutral_generation_config(model: Any) -> None:
    """Drop transformers' sampling defaults (``top_k=50``) so nothing truncates silently."""
    config = getattr(model, "generation_config", None)
    if config is not None:
        config.top_k = None
        config.top_p = None
        config.temperature = None
        config.do_sample = False


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
