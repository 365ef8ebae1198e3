"""InputProcessor.tokenize / detokenize (vLLM's /tokenize and /detokenize): the ids a request
would carry, each kind's special-token default, and bad input refused by field."""

from __future__ import annotations

import copy

import pytest

from strand.engine_core.processing.input_processor import InputProcessor
from strand.engine_core.processing.request_limits import RequestLimits
from strand.engine_core.processing.tokenizer import Tokenizer

from .conftest import TINY_VOCAB_SIZE

MAX_MODEL_LEN = 64
CHAT = {"messages": [{"role": "user", "content": "kalo"}]}


@pytest.fixture
def processor(tokenizer: Tokenizer) -> InputProcessor:
    return InputProcessor(tokenizer, MAX_MODEL_LEN, TINY_VOCAB_SIZE)


@pytest.mark.parametrize("prompt", ["kalo mi", {"prompt": "kalo mi"}, CHAT,
                                    {**CHAT, "add_generation_prompt": False},
                                    {"prompt_token_ids": [5, 6, 7]}])
def test_tokenize_gives_the_ids_a_request_carries(processor: InputProcessor,
                                                  prompt: str | dict) -> None:
    expected = processor.process("r", prompt).request.prompt_token_ids
    assert processor.tokenize(prompt) == expected


def test_add_special_tokens_overrides_each_kinds_default(processor: InputProcessor,
                                                         tokenizer: Tokenizer) -> None:
    bos = tokenizer.bos_token_id
    assert processor.tokenize("kalo mi")[0] == bos
    assert processor.tokenize("kalo mi", add_special_tokens=False) == \
        tokenizer.encode("kalo mi", add_special_tokens=False)
    chat = processor.tokenize(CHAT)
    assert processor.tokenize(CHAT, add_special_tokens=True) == [bos, *chat]


def test_tokenize_has_no_length_limit_but_a_size_bound(tokenizer: Tokenizer) -> None:
    small = InputProcessor(tokenizer, 4, TINY_VOCAB_SIZE, limits=RequestLimits(max_prompt_bytes=64))
    assert len(small.tokenize("kalo mi " * 4)) > 4  # longer than max_model_len: counted
    with pytest.raises(ValueError, match="prompt must be at most 64 bytes"):
        small.tokenize("kalo " * 20)


def test_tokenize_checks_token_ids_against_the_vocab(processor: InputProcessor) -> None:
    with pytest.raises(ValueError, match=rf"prompt_token_ids must be in \[0, {TINY_VOCAB_SIZE}\)"):
        processor.tokenize({"prompt_token_ids": [1, TINY_VOCAB_SIZE]})


def test_detokenize_keeps_special_tokens(processor: InputProcessor, tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("kalo mi")
    assert processor.detokenize(ids) == tokenizer.decode(ids, skip_special_tokens=False)
    assert processor.detokenize(ids) != tokenizer.decode(ids)  # the bos is there
    assert processor.token_strs(ids) == tokenizer.convert_ids_to_tokens(ids)


def test_detokenize_refuses_ids_outside_the_vocab_and_too_many(tokenizer: Tokenizer) -> None:
    processor = InputProcessor(tokenizer, MAX_MODEL_LEN, TINY_VOCAB_SIZE,
                               limits=RequestLimits(max_prompt_bytes=8))
    with pytest.raises(ValueError, match=r"tokens must be in \[0, .*got \[-1\]"):
        processor.detokenize([3, -1])
    with pytest.raises(ValueError, match="tokens must be at most 8 ids, got 9"):
        processor.detokenize([3] * 9)


def test_without_a_tokenizer_only_token_ids_are_counted() -> None:
    processor = InputProcessor(None, MAX_MODEL_LEN, TINY_VOCAB_SIZE)
    assert processor.tokenize({"prompt_token_ids": [1, 2]}) == [1, 2]
    with pytest.raises(ValueError, match="detokenize needs a tokenizer"):
        processor.detokenize([1])
    with pytest.raises(ValueError, match="return_token_strs needs a tokenizer"):
        processor.token_strs([1])
    with pytest.raises(ValueError, match="You cannot pass text prompts"):
        processor.tokenize("kalo")


def test_tools_reach_the_chat_template(tokenizer: Tokenizer) -> None:
    listing = copy.copy(tokenizer)
    listing.chat_template = ("{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}"
                             "{% for m in messages %}{{ m.content }}{% endfor %}")
    processor = InputProcessor(listing, MAX_MODEL_LEN, TINY_VOCAB_SIZE)
    tools = [{"type": "function", "function": {"name": "kalo"}}]
    processed = processor.process("r", {**CHAT, "tools": tools})
    assert processed.prompt == "[kalo]kalo"
    assert processor.process("r", CHAT).prompt == "kalo"
    with pytest.raises(ValueError, match="tools must be a list of dicts"):
        processor.process("r", {**CHAT, "tools": "kalo"})
