"""Tokenizer: bos handling and decode options."""

from __future__ import annotations

import json
from pathlib import Path

from strand.engine_core.processing.tokenizer import Tokenizer
from strand.testing.tiny_tokenizer import write_tiny_tokenizer


def test_encode_adds_bos_only_with_special_tokens(tokenizer: Tokenizer) -> None:
    with_bos = tokenizer.encode("kalo")
    assert with_bos[0] == tokenizer.bos_token_id
    assert with_bos[1:] == tokenizer.encode("kalo", add_special_tokens=False)


def test_add_bos_token_false_in_config_drops_the_bos(tmp_path: Path) -> None:
    write_tiny_tokenizer(tmp_path, 300)
    config_file = tmp_path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["add_bos_token"] = False
    config_file.write_text(json.dumps(config))
    tokenizer = Tokenizer.from_dir(str(tmp_path))
    assert tokenizer.encode("kalo") == tokenizer.encode("kalo", add_special_tokens=False)


def test_all_special_ids_cover_bos_eos_unk_and_chat_tokens(tokenizer: Tokenizer) -> None:
    assert {0, 1, 2, tokenizer.token_to_id("<|user|>")} <= tokenizer.all_special_ids
    assert tokenizer.encode("kalo", add_special_tokens=False)[0] not in tokenizer.all_special_ids


def test_decode_skips_special_tokens_by_default(tokenizer: Tokenizer) -> None:
    ids = [1, *tokenizer.encode("mi", add_special_tokens=False), 2]
    assert tokenizer.decode(ids) == "mi"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<s>mi</s>"


def test_spaces_between_special_tokens_separates_them_from_text(tokenizer: Tokenizer) -> None:
    ids = [1, *tokenizer.encode("mi", add_special_tokens=False), 2, 2]
    text = tokenizer.decode(ids, skip_special_tokens=False, spaces_between_special_tokens=True)
    assert text == "<s> mi </s> </s>"


def test_ids_outside_the_tokenizer_decode_to_nothing(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("mi", add_special_tokens=False)
    assert tokenizer.decode([*ids, tokenizer.vocab_size + 5]) == "mi"
