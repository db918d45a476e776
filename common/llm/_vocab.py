"""The tokenizers of the tiny models, built in code: ``bytes``, ``compact`` or ``arith``.

Both share the four specials and the ChatML chat template of
:data:`CHATML_TEMPLATE`, so assistant masks and the actors' decode loop work the
same with either:

* ``bytes`` — 256 byte-level tokens + 4 specials: any text round-trips.
* ``compact`` — one token per character of :data:`COMPACT_CHARS` (digits, ``+-*/=``,
  lowercase letters, space, newline, ``.,:()<>[]``), the ChatML role names
  ``system``/``user``/``assistant`` as whole tokens, and ``<|unk|>`` for every other
  character, so any text encodes (unknown characters decode as nothing). With about
  60 tokens instead of 260 a randomly initialised model samples a task's answer
  characters from the start, which is what reinforcement learning needs.
* ``arith`` — the same, with the characters of :data:`ARITH_CHARS` only (digits,
  ``+-*/=``, newline): 24 tokens. A digit answer then competes with 14 other tokens
  instead of 50, and GRPO learns one-digit sums several times faster (``docs/grpo.md``).
"""

from __future__ import annotations

import importlib.util
import string
from typing import Any

__all__ = [
    "ARITH_CHARS",
    "CHATML_TEMPLATE",
    "COMPACT_CHARS",
    "LLM_EXTRA",
    "VOCABS",
    "build_tokenizer",
    "check_transformers",
]

#: What to install for LLM actors and learners.
LLM_EXTRA = "pip install 'rlfleet[llm]'"

#: ChatML, with ``{% generation %}`` marks so assistant masks can be computed.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: The tiny models' vocabularies, the first the default.
VOCABS = ("bytes", "compact", "arith")

#: The characters of the ``compact`` vocabulary, one token each (the built-in tasks' alphabet).
COMPACT_CHARS = string.digits + "+-*/=" + string.ascii_lowercase + " \n.,:()<>[]"

#: The characters of the ``arith`` vocabulary: the ``arith`` task's alphabet.
ARITH_CHARS = string.digits + "+-*/=\n"

_SPECIALS = ("<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")
_UNK = "<|unk|>"
_ROLES = ("system", "user", "assistant")


def check_transformers() -> None:
    """Raise unless ``transformers`` and ``tokenizers`` can be imported (not importing them).

    Raises:
        ModuleNotFoundError: Naming what is missing and the extra that installs it.
    """
    missing = [n for n in ("transformers", "tokenizers") if not importlib.util.find_spec(n)]
    if missing:
        raise ModuleNotFoundError(
            f"LLM models need {' and '.join(missing)}, which is not installed: {LLM_EXTRA}",
            name=missing[0],
        )


def build_tokenizer(vocab: str = "bytes") -> Any:
    """A tiny model's tokenizer with the ChatML chat template, padding on the left.

    Args:
        vocab: ``bytes`` (256 byte tokens + 4 specials), ``compact`` (one token per
            character of :data:`COMPACT_CHARS`, the role names, the specials and
            ``<|unk|>``) or ``arith`` (the same with :data:`ARITH_CHARS`).

    Returns:
        A ``PreTrainedTokenizerFast`` with pad ``<|pad|>`` and eos ``<|im_end|>``.

    Raises:
        ValueError: An unknown ``vocab``.
        ModuleNotFoundError: ``transformers`` is not installed (naming ``rlfleet[llm]``).
    """
    check_transformers()
    if vocab == "bytes":
        backend, unk = _byte_backend(), None
    elif vocab in ("compact", "arith"):
        backend, unk = _compact_backend(COMPACT_CHARS if vocab == "compact" else ARITH_CHARS), _UNK
    else:
        raise ValueError(f"vocab must be one of {VOCABS}, got {vocab!r}")
    from transformers import PreTrainedTokenizerFast

    tokenizer: Any = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token=None,
        unk_token=unk,
        additional_special_tokens=["<|endoftext|>", "<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def _byte_backend() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())  # type: ignore[no-untyped-call]
    vocab = {symbol: index for index, symbol in enumerate(symbols)}
    for index, special in enumerate(_SPECIALS):
        vocab[special] = len(symbols) + index
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return backend


def _compact_backend(chars: str) -> Any:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    tokens = [*_SPECIALS, _UNK, *_ROLES, *chars]
    vocab = {token: index for index, token in enumerate(tokens)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=_UNK))
    # Every character is a word of its own; the role names are matched whole before that.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, normalized=False) for t in (*_SPECIALS, _UNK)])
    backend.add_tokens([AddedToken(role, normalized=False) for role in _ROLES])
    return backend
