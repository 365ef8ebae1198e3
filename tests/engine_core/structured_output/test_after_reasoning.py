"""Under a reasoning parser, structured outputs bind only after the reasoning's closing tag, as
vLLM's engine lets a thinking model reason freely first; a prompt that closed the reasoning
itself is constrained from its first token."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from strand.engine_core import SamplingParams, StructuredOutputsParams
from strand.engine_core.processing.input_processor import InputProcessor
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.structured_output.grammar import GrammarCache, tokenizer_info
from tests.engine_core.engine.conftest import assert_pool_whole, make_engine, run_to_completion
from tests.engine_core.structured_output.thinking_model import build_thinking_model

WORD = "[a-z]{3,6}"
CHAT = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def thinking(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    return build_thinking_model(tmp_path_factory.mktemp("thinking"))


def _accepts(cache: GrammarCache, params: StructuredOutputsParams, tokenizer: Tokenizer,
             text: str) -> bool:
    eos = tokenizer.eos_token_id
    assert eos is not None
    matcher = cache.new_matcher(params, eos)
    ids = [*tokenizer.encode(text, add_special_tokens=False), eos]
    return all(matcher.accept_token(i) for i in ids) and matcher.is_terminated()


def test_the_grammar_lets_anything_through_until_the_tag(
        thinking: tuple[Path, dict[str, int]]) -> None:
    tokenizer = Tokenizer.from_dir(thinking[0])
    cache = GrammarCache(tokenizer_info(tokenizer, 512, tokenizer.eos_token_id))
    held = StructuredOutputsParams(regex=WORD, reasoning_end="</think>")
    assert _accepts(cache, held, tokenizer, "{not a word} <think> </thin </think>abcd")
    assert _accepts(cache, held, tokenizer, "</think>abc")
    assert not _accepts(cache, held, tokenizer, "x</think>ABCD")  # the answer is held
    assert not _accepts(cache, held, tokenizer, "abcd")  # the tag must come
    assert not _accepts(cache, held, tokenizer, "a</think>abc</think>abc")  # once
    plain = StructuredOutputsParams(regex=WORD)
    assert _accepts(cache, plain, tokenizer, "abcd")
    assert held.cache_key() != plain.cache_key()  # two grammars, not one cached for both


def _processed(tokenizer: Tokenizer, parser: str | None, prompt: Any) -> StructuredOutputsParams:
    processor = InputProcessor(tokenizer, max_model_len=512, vocab_size=512,
                               reasoning_parser=parser)
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex=WORD))
    so = processor.process("r", prompt, params).request.sampling_params.structured_outputs
    assert so is not None and params.structured_outputs is not None
    assert params.structured_outputs.reasoning_end is None  # the caller's object untouched
    return so


def test_the_input_processor_holds_the_constraint_only_where_reasoning_comes(
        thinking: tuple[Path, dict[str, int]]) -> None:
    tokenizer = Tokenizer.from_dir(thinking[0])
    off = {"messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}}
    assert _processed(tokenizer, "deepseek_r1", {"messages": CHAT}).reasoning_end == "</think>"
    assert _processed(tokenizer, "qwen3", "plain text").reasoning_end == "</think>"
    assert _processed(tokenizer, "deepseek_r1", off).reasoning_end is None
    closed_ids = tokenizer.encode("a prompt <think>x</think>\n\n")
    assert _processed(tokenizer, "qwen3", {"prompt_token_ids": closed_ids}).reasoning_end is None
    assert _processed(tokenizer, None, {"messages": CHAT}).reasoning_end is None


def _run(engine: Any, prompt: Any, params: SamplingParams) -> str:
    engine.add_request("r", prompt, params)
    return run_to_completion(engine)["r"].outputs[0].text


def test_a_thinking_model_reasons_then_answers_in_the_grammar(
        thinking: tuple[Path, dict[str, int]]) -> None:
    model, ids = thinking
    engine = make_engine(model, reasoning_parser="deepseek_r1")
    # A bias makes the random model close its reasoning (at once, or after some tokens); once
    # the tag is out, the grammar forbids it again (the bitmask comes before the bias).
    reasonings = []
    for bias in (1.5, 6.0):
        params = SamplingParams(max_tokens=40, temperature=0.0,
                                logit_bias={ids["</think>"]: bias},
                                structured_outputs=StructuredOutputsParams(regex=WORD))
        text = _run(engine, {"messages": CHAT}, params)
        reasoning, tag, answer = text.partition("</think>")
        assert tag and re.fullmatch(WORD, answer), text
        reasonings.append(reasoning)
    # Reasoning the grammar would never have let through: it was free.
    assert any(re.search("[^a-z]", r) for r in reasonings), reasonings
    # Asked not to think, the prompt closed the reasoning: constrained from the first token.
    off = _run(engine, {"messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}},
               params)
    assert re.fullmatch(WORD, off), off
    assert_pool_whole(engine)
    # Without the parser the same request is held to the grammar at once.
    plain = make_engine(model)
    assert re.fullmatch(WORD, _run(plain, {"messages": CHAT}, params))
