"""The detokenizer's two paths agree: tokenizers' DecodeStream (where the tokenizer's own decode
gives the text) and the Python window it replaces, token for token, on byte-level BPE and on a
SentencePiece-style decoder (Metaspace, byte fallback, the first space stripped)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models

from strand.engine_core.processing.detokenizer import IncrementalDetokenizer
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sampling_params import SamplingParams

SP_PIECES = ["\u2581", "e", "h", "l", "o", "w", "r", "d", "ll", "he", "\u2581he", "llo",
             "\u2581hello", "\u2581w", "or", "\u2581world", "\u2581\u2581"]
SP_SPECIAL = ["<unk>", "<s>", "</s>"]


@pytest.fixture(scope="module")
def sentencepiece_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """Llama-2's decoder chain over a small vocabulary with every byte as <0xNN>."""
    byte_pieces = [f"<0x{b:02X}>" for b in range(256)]
    vocab = {p: i for i, p in enumerate([*SP_SPECIAL, *byte_pieces, *SP_PIECES])}
    backend = HFTokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    backend.add_special_tokens(SP_SPECIAL)
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    out = tmp_path_factory.mktemp("sp-tokenizer")
    backend.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
    return Tokenizer.from_dir(Path(out))


def _run(detok: IncrementalDetokenizer, chunks: list[list[int]], stop_terminated: bool
         ) -> list[tuple[str | None, str]]:
    """Each update's stop string and delta text, as the output processor takes them."""
    seen = []
    for i, chunk in enumerate(chunks):
        finished = i == len(chunks) - 1
        stop = detok.update(chunk, stop_terminated and finished, finished)
        seen.append((stop, detok.get_next_output_text(finished or stop is not None, delta=True)))
        if stop is not None:
            break
    return seen


def _random_case(rng: random.Random, tokenizer: Tokenizer) -> tuple[list[int], list[list[int]]]:
    specials = sorted(tokenizer.all_special_ids | set(tokenizer.added_token_ids))
    size = tokenizer.vocab_size

    def pick() -> int:
        roll = rng.random()
        if roll < 0.06:
            return rng.choice(specials)
        if roll < 0.09:
            return size + rng.randrange(8)  # a padded vocabulary's ids: decoded as nothing
        if roll < 0.5:
            return rng.randrange(min(size, 300))  # byte pieces: characters split over tokens
        return rng.randrange(size)

    prompt = [pick() for _ in range(rng.randrange(9))]
    ids = [pick() for _ in range(rng.randrange(1, 40))]
    chunks, i = [], 0
    while i < len(ids):
        # Mostly a token or a few a step; sometimes many (what the engine stage held).
        step = rng.randrange(1, 4) if rng.random() < 0.8 else rng.randrange(4, 40)
        chunks.append(ids[i:i + step])
        i += step
    return prompt, chunks


def _params(rng: random.Random) -> dict[str, Any]:
    return {"skip_special_tokens": rng.random() < 0.5,
            "spaces_between_special_tokens": rng.random() < 0.5,
            "stop": rng.choice([[], ["l"], ["lo", "中"], ["he w"]]),
            "include_stop_str_in_output": rng.random() < 0.3}


@pytest.mark.parametrize("name", ["byte-level", "sentencepiece"])
def test_stream_and_window_give_the_same_text_token_for_token(
    name: str, tokenizer: Tokenizer, sentencepiece_tokenizer: Tokenizer
) -> None:
    tok = tokenizer if name == "byte-level" else sentencepiece_tokenizer
    rng = random.Random(0)
    streamed = 0
    for _ in range(400):
        prompt, chunks = _random_case(rng, tok)
        params = SamplingParams(**_params(rng))
        stop_terminated = rng.random() < 0.3
        fast = IncrementalDetokenizer(tok, prompt, params)
        slow = IncrementalDetokenizer(tok, prompt, params)
        slow._stream = None  # the window all the way
        streamed += fast._stream is not None
        assert _run(fast, chunks, stop_terminated) == _run(slow, chunks, stop_terminated), (
            prompt, chunks, params)
        assert fast.output_text == slow.output_text
    assert streamed > 100  # the stream path was the one under test


def test_the_stream_is_used_where_the_tokenizer_decode_gives_the_text(tokenizer: Tokenizer
                                                                      ) -> None:
    prompt = tokenizer.encode("kalo mi")

    def has_stream(**params: Any) -> bool:
        return IncrementalDetokenizer(tokenizer, prompt, SamplingParams(**params))._stream is not None

    assert has_stream()  # skip_special_tokens, vLLM's default
    assert has_stream(skip_special_tokens=False, spaces_between_special_tokens=False)
    # Kept special tokens spaced from the text: Tokenizer.decode's own joining, the window's.
    assert not has_stream(skip_special_tokens=False, spaces_between_special_tokens=True)


def test_a_prompt_ending_mid_character_keeps_the_window(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("ka龍", add_special_tokens=False)  # 龍 is three byte pieces
    prompt, rest = ids[:-1], ids[-1:] + tokenizer.encode(" lo", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt, SamplingParams())
    assert detok._stream is None
    detok.update(rest, stop_terminated=False, finished=True)
    # The character the prompt began is not output text: what follows it is.
    assert detok.output_text == " lo"


@pytest.mark.parametrize("one_first", [True, False])
def test_a_stream_error_hands_the_sequence_to_the_window(tokenizer: Tokenizer,
                                                         one_first: bool) -> None:
    class Failing:
        def step(self, backend: object, token_id: int) -> str | None:
            raise Exception("Invalid prefix encountered")  # noqa: TRY002 - tokenizers' own

    ids = tokenizer.encode("kalo mi 中文 ne", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams())
    detok.update(ids[:3], stop_terminated=False, finished=False)
    detok._stream = Failing()  # type: ignore[assignment]
    if one_first:  # the error on a lone token, else inside a run of many
        detok.update(ids[3:4], stop_terminated=False, finished=False)
    detok.update(ids[4:] if one_first else ids[3:], stop_terminated=False, finished=True)
    assert detok._stream is None
    assert detok.output_text == "kalo mi 中文 ne"
    assert detok.num_output_tokens == len(ids)
