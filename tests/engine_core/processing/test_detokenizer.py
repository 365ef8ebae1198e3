"""Incremental detokenization: the streamed pieces add up to decode() and never split a char."""

from __future__ import annotations

import random
from typing import Any

import pytest

from strand.engine_core.processing.detokenizer import IncrementalDetokenizer
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sampling_params import SamplingParams

ALPHABET = list("kalomine ,.!\n") + ["é", "中", "龍", "😀", "𝄞", "ß", "€", "Ω"]


def stream(
    tokenizer: Tokenizer, ids: list[int], prompt_ids: list[int] | None = None, **params: Any
) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids or [], SamplingParams(**params))
    pieces = []
    for i, token_id in enumerate(ids):
        detok.update([token_id], stop_terminated=False, finished=i == len(ids) - 1)
        pieces.append(detok.get_next_output_text(finished=i == len(ids) - 1, delta=True))
    return pieces


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 30)))


@pytest.mark.parametrize("seed", range(20))
def test_stream_of_real_text_equals_decode_and_never_emits_a_broken_char(
    tokenizer: Tokenizer, seed: int
) -> None:
    text = random_text(random.Random(seed))
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = stream(tokenizer, ids)
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_multibyte_char_split_over_tokens_arrives_whole(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("a龍b", add_special_tokens=False)
    assert len(ids) == 5  # "a", three byte pieces of 龍, "b"
    assert stream(tokenizer, ids) == ["a", "", "", "龍", "b"]


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize(
    ("skip", "spaces"), [(True, True), (False, False), (False, True)]
)
def test_stream_of_random_ids_equals_decode_of_the_whole_sequence(
    tokenizer: Tokenizer, seed: int, skip: bool, spaces: bool
) -> None:
    rng = random.Random(seed)
    ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randint(1, 25))]
    pieces = stream(
        tokenizer, ids, skip_special_tokens=skip, spaces_between_special_tokens=spaces
    )
    assert "".join(pieces) == tokenizer.decode(ids, skip, spaces_between_special_tokens=spaces)


def test_prompt_context_does_not_leak_into_the_output(tokenizer: Tokenizer) -> None:
    prompt_ids = tokenizer.encode("kalo mi 中")
    ids = tokenizer.encode(" ne ru", add_special_tokens=False)
    assert "".join(stream(tokenizer, ids, prompt_ids)) == " ne ru"


def test_special_tokens_are_spaced_from_text_when_kept(tokenizer: Tokenizer) -> None:
    ids = [*tokenizer.encode("mi", add_special_tokens=False), 2]
    text = "".join(stream(tokenizer, ids, skip_special_tokens=False))
    assert text == "mi </s>"
    unspaced = stream(
        tokenizer, ids, skip_special_tokens=False, spaces_between_special_tokens=False
    )
    assert "".join(unspaced) == "mi</s>"


def test_stop_token_is_left_out_of_the_text(tokenizer: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(skip_special_tokens=False))
    ids = tokenizer.encode("mi", add_special_tokens=False)
    detok.update([*ids, 2], stop_terminated=True, finished=True)
    assert detok.output_text == "mi"


def test_stop_token_is_kept_with_include_stop_str_in_output(tokenizer: Tokenizer) -> None:
    params = SamplingParams(skip_special_tokens=False, include_stop_str_in_output=True)
    detok = IncrementalDetokenizer(tokenizer, [], params)
    ids = tokenizer.encode("mi", add_special_tokens=False)
    detok.update([*ids, 2], stop_terminated=True, finished=True)
    assert detok.output_text == "mi </s>"


def test_stop_strings_are_not_checked_before_min_tokens(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("ab", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=["a"], min_tokens=5))
    assert detok.update(ids, stop_terminated=False, finished=False) is None
    assert detok.output_text == "ab"
