"""The tiny tokenizer: exact vocab size, deterministic, and read the same by transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from strand.engine_core.processing.tokenizer import Tokenizer
from strand.testing.tiny_tokenizer import MIN_VOCAB_SIZE, write_tiny_tokenizer

from .conftest import TINY_VOCAB_SIZE

SAMPLES = [
    "kalo mi ne, rusa to!",
    "café naïve über 中文 日本 😀🚀 € ß",
    "  leading spaces and\ttabs\nnew lines\r\n",
    "digits 12345 and 3.14159",
    "a stray 龍 character and 𝄞 music",
]


@pytest.mark.parametrize("vocab_size", [MIN_VOCAB_SIZE, 1000])
def test_vocab_is_exactly_the_requested_size(tmp_path: Path, vocab_size: int) -> None:
    write_tiny_tokenizer(tmp_path, vocab_size)
    assert Tokenizer.from_dir(str(tmp_path)).vocab_size == vocab_size


def test_same_seed_writes_the_same_tokenizer(tmp_path: Path) -> None:
    write_tiny_tokenizer(tmp_path / "a", 300, seed=3)
    write_tiny_tokenizer(tmp_path / "b", 300, seed=3)
    first = (tmp_path / "a" / "tokenizer.json").read_text(encoding="utf-8")
    assert first == (tmp_path / "b" / "tokenizer.json").read_text(encoding="utf-8")


def test_too_small_vocab_is_refused_naming_the_minimum(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"vocab_size must be >= {MIN_VOCAB_SIZE}"):
        write_tiny_tokenizer(tmp_path, MIN_VOCAB_SIZE - 1)


def test_special_tokens_have_their_fixed_ids(tokenizer: Tokenizer) -> None:
    assert (tokenizer.unk_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.token_to_id("<|user|>") is not None
    assert tokenizer.token_to_id("<|assistant|>") is not None


def test_config_declares_bos_and_a_chat_template(tiny_tokenizer_dir: Path) -> None:
    config = json.loads((tiny_tokenizer_dir / "tokenizer_config.json").read_text())
    assert config["add_bos_token"] is True
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "add_generation_prompt" in config["chat_template"]


@pytest.mark.parametrize("text", SAMPLES)
def test_arbitrary_utf8_round_trips(tokenizer: Tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_rare_characters_are_split_into_byte_pieces(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("龍", add_special_tokens=False)
    assert len(ids) == 3  # one token per UTF-8 byte: nothing in the corpus merges them
    assert "\ufffd" in tokenizer.decode(ids[:1])


def test_transformers_autotokenizer_matches_ours(
    tiny_tokenizer_dir: Path, tokenizer: Tokenizer
) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    assert len(hf) == TINY_VOCAB_SIZE
    assert (hf.bos_token_id, hf.eos_token_id, hf.unk_token_id) == (1, 2, 0)
    for text in [*SAMPLES, "x<|user|>y</s>"]:
        ids = tokenizer.encode(text)
        assert hf.encode(text) == ids
        assert hf.encode(text, add_special_tokens=False) == tokenizer.encode(text, False)
        assert hf.convert_ids_to_tokens(ids) == tokenizer.convert_ids_to_tokens(ids)
        for skip in (True, False):
            assert hf.decode(ids, skip_special_tokens=skip) == tokenizer.decode(ids, skip)
