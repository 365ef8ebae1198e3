"""chat_template_kwargs and an earlier turn's reasoning, through the input processor."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from strand.engine_core.chat_config import MAX_KWARGS_CHARS
from strand.engine_core.config import EngineArgs
from strand.engine_core.processing.chat_kwargs import with_reasoning_keys
from strand.engine_core.processing.chat_template import load_chat_template
from strand.engine_core.processing.input_processor import InputProcessor
from strand.engine_core.processing.tokenizer import Tokenizer
from tests.engine_core.processing.test_chat_template import THINKING_TEMPLATE

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def processor(tokenizer: Tokenizer) -> InputProcessor:
    thinking = copy.copy(tokenizer)
    thinking.chat_template = THINKING_TEMPLATE
    return InputProcessor(thinking, max_model_len=512, vocab_size=tokenizer.vocab_size)


def _text(processor: InputProcessor, prompt: dict[str, Any]) -> str:
    text = processor.process("r", prompt).prompt
    assert text is not None
    return text


def test_kwargs_reach_the_template(processor: InputProcessor) -> None:
    plain = _text(processor, {"messages": USER})
    off = _text(processor, {"messages": USER,
                            "chat_template_kwargs": {"enable_thinking": False}})
    assert off == plain + "<think>\n\n</think>\n\n"
    assert processor.tokenize({"messages": USER, "chat_template_kwargs": {
        "enable_thinking": False}}) != processor.tokenize({"messages": USER})


@pytest.mark.parametrize("key", ["reasoning", "reasoning_content"])
def test_an_earlier_turns_reasoning_reaches_the_template_under_either_name(
        processor: InputProcessor, key: str) -> None:
    turns = [*USER, {"role": "assistant", "content": "hello", key: "greet back"},
             {"role": "user", "content": "again"}]
    assert "<think>greet back</think>hello" in _text(processor, {"messages": turns})


def test_both_names_are_given_to_the_template() -> None:
    message = {"role": "assistant", "content": "x", "reasoning": "r"}
    assert with_reasoning_keys(message) == {**message, "reasoning_content": "r"}
    assert with_reasoning_keys({"role": "user", "content": "x"}) == {"role": "user",
                                                                     "content": "x"}


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"messages": []}, "chat_template_kwargs.messages"),
    ({"add_generation_prompt": False}, "chat_template_kwargs.add_generation_prompt"),
    ({"bos_token": "x"}, "chat_template_kwargs.bos_token"),
    ([1, 2], "chat_template_kwargs must be an object"),
    ({"x": "y" * MAX_KWARGS_CHARS}, f"at most {MAX_KWARGS_CHARS}"),
    ({"x": {1, 2}}, "chat_template_kwargs must be JSON"),
])
def test_bad_kwargs_are_refused_naming_the_field(processor: InputProcessor, kwargs: Any,
                                                 words: str) -> None:
    with pytest.raises(ValueError, match=words):
        processor.process("r", {"messages": USER, "chat_template_kwargs": kwargs})


def test_reasoning_that_is_no_string_is_refused(processor: InputProcessor) -> None:
    turns = [*USER, {"role": "assistant", "content": "x", "reasoning": 3}]
    with pytest.raises(ValueError, match=r"messages\[1\]\.reasoning must be a str"):
        processor.process("r", {"messages": turns})


def test_a_prefilled_reply_is_continued(processor: InputProcessor) -> None:
    turns = [*USER, {"role": "assistant", "content": "Hello, I am"}]
    text = _text(processor, {"messages": turns, "add_generation_prompt": False,
                             "continue_final_message": True})
    assert text.endswith("<|assistant|>\nHello, I am")
    with pytest.raises(ValueError, match="continue_final_message and add_generation_prompt"):
        processor.process("r", {"messages": turns, "continue_final_message": True})


def test_a_chat_template_comes_from_a_file_or_as_given(tmp_path: Path,
                                                       tiny_tokenizer_dir: Path) -> None:
    file = tmp_path / "thinking.jinja"
    file.write_text(THINKING_TEMPLATE, encoding="utf-8")
    assert load_chat_template(str(file)) == THINKING_TEMPLATE
    assert load_chat_template(THINKING_TEMPLATE) == THINKING_TEMPLATE
    assert Tokenizer.from_dir(tiny_tokenizer_dir, chat_template=str(file)).chat_template == \
        THINKING_TEMPLATE
    with pytest.raises(ValueError, match="is no file, and no template either"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    with pytest.raises(ValueError, match="chat_template does not parse"):
        load_chat_template("{% for m in messages %}")


def test_default_kwargs_lie_under_each_requests_own(tokenizer: Tokenizer) -> None:
    thinking = copy.copy(tokenizer)
    thinking.chat_template = THINKING_TEMPLATE
    processor = InputProcessor(thinking, max_model_len=512, vocab_size=tokenizer.vocab_size,
                               default_template_kwargs={"enable_thinking": False})
    assert _text(processor, {"messages": USER}).endswith("<think>\n\n</think>\n\n")
    asked = {"messages": USER, "chat_template_kwargs": {"enable_thinking": True}}
    assert not _text(processor, asked).endswith("</think>\n\n")


@pytest.mark.parametrize(("fields", "words"), [
    ({"default_chat_template_kwargs": {"messages": []}},
     "default_chat_template_kwargs.messages is a variable the server sets"),
    ({"default_chat_template_kwargs": [1]}, "default_chat_template_kwargs must be an object"),
    ({"chat_template": "no-such-file.jinja"}, "is no file, and no template either"),
])
def test_engine_args_refuse_a_bad_template_or_defaults(fields: dict[str, Any],
                                                       words: str) -> None:
    with pytest.raises(ValueError, match=words):
        EngineArgs(**fields)


def test_llm_engine_renders_with_the_flags_template_and_defaults(tiny_model_dir: Path,
                                                                 tmp_path: Path) -> None:
    from strand.engine_core.llm_engine import LLMEngine

    file = tmp_path / "thinking.jinja"
    file.write_text(THINKING_TEMPLATE, encoding="utf-8")
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=str(tiny_model_dir), device="cpu", chat_template=str(file),
        default_chat_template_kwargs={"enable_thinking": False}))
    text = engine.input_processor.process("r", {"messages": USER}).prompt
    assert text is not None and text.endswith("<|assistant|>\n<think>\n\n</think>\n\n")


def test_what_a_template_writes_beyond_the_messages_text_is_bounded_before_tokenizing(
        tokenizer: Tokenizer) -> None:
    # A client's tools, calls' arguments or reasoning reach the template and the tokenizer too:
    # an oversized one is refused by size, not tokenized at the stage's (every client's) cost.
    from strand.engine_core.processing.request_limits import RequestLimits
    from tests.engine_core.processing.test_chat_template import TOOL_TEMPLATE

    tools_model = copy.copy(tokenizer)
    tools_model.chat_template = TOOL_TEMPLATE
    processor = InputProcessor(tools_model, max_model_len=512, vocab_size=tokenizer.vocab_size,
                               limits=RequestLimits(max_prompt_bytes=4096))
    big_tool = [{"type": "function", "function": {"name": "f", "description": "x" * 5000}}]
    with pytest.raises(ValueError, match=r"prompt \(the chat as its template writes it\) must "
                                         r"be at most 4096 bytes"):
        processor.process("r", {"messages": USER, "tools": big_tool})
    processor.process("r", {"messages": USER, "tools": [{"type": "function",
                                                         "function": {"name": "f"}}]})
    thinking = copy.copy(tokenizer)
    thinking.chat_template = THINKING_TEMPLATE
    small = InputProcessor(thinking, max_model_len=512, vocab_size=tokenizer.vocab_size,
                           limits=RequestLimits(max_prompt_bytes=4096))
    turns = [*USER, {"role": "assistant", "content": "ok", "reasoning": "r" * 5000}]
    with pytest.raises(ValueError, match="prompt must be at most 4096 bytes"):  # before render
        small.process("r", {"messages": turns})
