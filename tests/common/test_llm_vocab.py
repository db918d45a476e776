"""The tiny models' ``compact`` and ``arith`` tokenizers: a token per task character, ChatML."""

from __future__ import annotations

import pytest

from common.llm import ARITH_CHARS, COMPACT_CHARS, build_policy, build_tokenizer

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer("compact")


def test_compact_vocab_is_small_and_has_the_specials_and_role_names(tokenizer) -> None:
    assert len(tokenizer) == len(COMPACT_CHARS) + 8 <= 60
    assert tokenizer.pad_token == "<|pad|>"
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.unk_token == "<|unk|>"
    for role in ("system", "user", "assistant"):
        assert tokenizer.encode(role, add_special_tokens=False) == [
            tokenizer.convert_tokens_to_ids(role)
        ]


def test_compact_round_trips_task_text_one_token_per_character(tokenizer) -> None:
    text = "reverse: abc xyz\n7*8=56, (3-1)/2. user:"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert len(ids) == len(text) - len("user") + 1  # the role name is one token
    for char in COMPACT_CHARS:
        assert len(tokenizer.encode(char, add_special_tokens=False)) == 1


def test_compact_maps_unknown_characters_to_unk_and_never_raises(tokenizer) -> None:
    hostile = "Hé 😀\x00\t<|im_start|x" + "\U0010ffff" * 1000
    ids = tokenizer.encode(hostile, add_special_tokens=False)
    unk = tokenizer.unk_token_id
    assert ids[0] == unk  # "H": no uppercase letters
    assert ids.count(unk) >= 1005
    assert max(ids) < len(tokenizer)
    assert tokenizer.decode(ids, skip_special_tokens=True).startswith(" ")  # unks drop out


def test_compact_chat_template_marks_only_the_assistant_reply(tokenizer) -> None:
    messages = [
        {"role": "system", "content": "add"},
        {"role": "user", "content": "3+4="},
        {"role": "assistant", "content": "7"},
    ]
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert tokenizer.decode(ids) == (
        "<|im_start|>system\nadd<|im_end|>\n<|im_start|>user\n3+4=<|im_end|>\n"
        "<|im_start|>assistant\n7<|im_end|>\n"
    )
    marked = [i for i, m in zip(ids, mask, strict=True) if m]
    assert marked == tokenizer.encode("7<|im_end|>", add_special_tokens=False)
    prompt = tokenizer.apply_chat_template(messages[:2], add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n")


def test_compact_models_are_sized_by_the_vocab_and_identical_from_the_same_kwargs() -> None:
    kwargs = {"hidden": 16, "layers": 1, "heads": 2, "vocab": "compact", "seed": 3}
    model, tokenizer = build_policy("rlfleet:tiny-qwen2", **kwargs)
    again, _ = build_policy("rlfleet:tiny-qwen2", **kwargs)
    assert model.config.vocab_size == len(tokenizer)
    assert all(
        (a == b).all()
        for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True)
    )
    byte_model, byte_tokenizer = build_policy("rlfleet:tiny-qwen2", hidden=16, layers=1, heads=2)
    assert byte_model.config.vocab_size == len(byte_tokenizer) == 260


def test_unknown_vocab_raises() -> None:
    with pytest.raises(ValueError, match="vocab must be one of"):
        build_tokenizer("words")


def test_arith_vocab_is_the_arith_alphabet_with_chatml_and_unk_else() -> None:
    tokenizer = build_tokenizer("arith")
    assert len(tokenizer) == len(ARITH_CHARS) + 8 == 24
    for char in ARITH_CHARS:
        assert len(tokenizer.encode(char, add_special_tokens=False)) == 1
    assert tokenizer.decode(tokenizer.encode("7*8=56\n", add_special_tokens=False)) == "7*8=56\n"
    # Letters are unknown (a retry message encodes, its letters decode as nothing).
    ids = tokenizer.encode("No. 3", add_special_tokens=False)
    assert ids.count(tokenizer.unk_token_id) == 4
    assert tokenizer.decode(ids, skip_special_tokens=True) == "3"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "3+4="}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"]
    assert tokenizer.decode(prompt) == "<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"
    assert len(prompt) == 12  # the role names are one token each


def test_arith_models_are_sized_by_the_vocab() -> None:
    model, tokenizer = build_policy(
        "rlfleet:tiny-qwen2", hidden=16, layers=1, heads=2, vocab="arith"
    )
    assert model.config.vocab_size == len(tokenizer) == 24
