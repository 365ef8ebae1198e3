"""Chat templates: rendered like transformers, in a sandbox that refuses escapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strand.engine_core.processing.chat_template import render_chat_template
from strand.engine_core.processing.tokenizer import Tokenizer

MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "中文?"},
]


def test_template_renders_roles_and_generation_prompt(tokenizer: Tokenizer) -> None:
    text = tokenizer.apply_chat_template(MESSAGES[1:2])
    assert text == "<s><|user|>\nhi<|end|>\n<|assistant|>\n"


def test_generation_prompt_can_be_left_out(tokenizer: Tokenizer) -> None:
    text = tokenizer.apply_chat_template(MESSAGES[1:2], add_generation_prompt=False)
    assert text == "<s><|user|>\nhi<|end|>\n"


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_rendering_matches_transformers(
    tiny_tokenizer_dir: Path, tokenizer: Tokenizer, add_generation_prompt: bool
) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    expected = hf.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert tokenizer.apply_chat_template(MESSAGES, add_generation_prompt) == expected


# A conversation with a tool call and its result, as the OpenAI front hands it on: the call's
# arguments an object (params.py parses OpenAI's JSON string, as vLLM does).
TOOL_TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "3 < 4?"},
    {"role": "assistant", "content": "", "tool_calls": [{
        "id": "c1", "type": "function",
        "function": {"name": "cmp", "arguments": {"a": 3, "b": "<4> & é"}}}]},
    {"role": "tool", "content": "true", "tool_call_id": "c1", "name": "cmp"},
]
TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {
    "name": "cmp", "description": "a < b, 'quoted' & café",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]
# A template that writes tools, calls and results out as the Hermes-style ones do.
TOOL_TEMPLATE = (
    "{% if tools %}<|system|>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|end|>\n"
    "{% endif %}{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", "
    "\"arguments\": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}"
    "{% if m.role == 'tool' %} ({{ m.tool_call_id }}){% endif %}<|end|>\n{% endfor %}")


@pytest.mark.parametrize("template", ["tiny", "tools"])
def test_tool_calls_and_results_render_as_transformers_renders_them(
    tiny_tokenizer_dir: Path, tokenizer: Tokenizer, template: str
) -> None:
    # tojson as transformers defines it: JSON as the model was trained on, not HTML-escaped
    # (jinja2's own filter writes "<" as "\u003c").
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    source = tokenizer.chat_template if template == "tiny" else TOOL_TEMPLATE
    assert source is not None
    expected = hf.apply_chat_template(TOOL_TURNS, tools=TOOLS, tokenize=False,
                                      chat_template=source)
    got = render_chat_template(source, TOOL_TURNS, add_generation_prompt=False, tools=TOOLS,
                               special_tokens={"bos_token": "<s>"})
    assert got == expected
    assert '{"a": 3, "b": "<4> & é"}' in got
    if template == "tools":
        assert "\"a < b, 'quoted' & café\"" in got and "(c1)" in got


def test_raise_exception_in_a_template_becomes_value_error(tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match="unknown role: robot"):
        tokenizer.apply_chat_template([{"role": "robot", "content": "beep"}])


@pytest.mark.parametrize(
    "template",
    [
        "{{ messages.__class__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ raise_exception.__globals__ }}",
    ],
)
def test_sandbox_refuses_unsafe_attribute_access(template: str) -> None:
    with pytest.raises(ValueError, match="chat_template refused by the sandbox"):
        render_chat_template(template, MESSAGES)


def test_sandbox_refuses_mutating_the_messages() -> None:
    messages = [dict(m) for m in MESSAGES]
    with pytest.raises(ValueError, match="chat_template"):
        render_chat_template("{{ messages.append({'role': 'x'}) }}", messages)
    assert messages == MESSAGES


def test_tokenizer_without_template_refuses_messages(tmp_path: Path) -> None:
    import json

    from strand.testing.tiny_tokenizer import write_tiny_tokenizer

    write_tiny_tokenizer(tmp_path, 300)
    config_file = tmp_path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    del config["chat_template"]
    config_file.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="chat_template"):
        Tokenizer.from_dir(str(tmp_path)).apply_chat_template(MESSAGES)


# A thinking template in the form of Qwen 3's: it reads chat_template_kwargs' enable_thinking
# and an earlier turn's reasoning_content.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>\n"
    "{% if m.role == 'assistant' and m.reasoning_content %}<think>{{ m.reasoning_content }}"
    "</think>{% endif %}{{ m.content }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}")
THINKING_TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "two and two"},
    {"role": "user", "content": "and 3+3?"},
]


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}, {"enable_thinking": True}])
def test_template_kwargs_render_as_transformers_passes_them(
    tiny_tokenizer_dir: Path, kwargs: dict[str, Any]
) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    expected = hf.apply_chat_template(THINKING_TURNS, tokenize=False, add_generation_prompt=True,
                                      chat_template=THINKING_TEMPLATE, **kwargs)
    got = render_chat_template(THINKING_TEMPLATE, THINKING_TURNS, template_kwargs=kwargs)
    assert got == expected
    assert "<think>two and two</think>4" in got
    assert got.endswith("<think>\n\n</think>\n\n") == (kwargs.get("enable_thinking") is False)


PREFILLED: list[dict[str, Any]] = [
    {"role": "user", "content": "Name a color."},
    {"role": "assistant", "content": "The color is"},
]


@pytest.mark.parametrize("last", ["The color is", "The color is ", "  (a) "])
@pytest.mark.parametrize("template", ["tiny", "thinking"])
def test_continue_final_message_cuts_as_transformers_does(
    tiny_tokenizer_dir: Path, tokenizer: Tokenizer, template: str, last: str
) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    source = tokenizer.chat_template if template == "tiny" else THINKING_TEMPLATE
    assert source is not None
    turns = [PREFILLED[0], {"role": "assistant", "content": last}]
    expected = hf.apply_chat_template(turns, tokenize=False, chat_template=source,
                                      continue_final_message=True)
    got = render_chat_template(source, turns, add_generation_prompt=False,
                               special_tokens={"bos_token": "<s>"},
                               continue_final_message=True)
    assert got == expected
    assert got.rstrip().endswith(last.strip())


def test_continue_final_message_refuses_what_it_cannot_continue(tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match="cannot both be true"):
        tokenizer.apply_chat_template(PREFILLED, add_generation_prompt=True,
                                      continue_final_message=True)
    dropping = "{% for m in messages %}{{ m.role }}{% endfor %}"  # writes no content
    with pytest.raises(ValueError, match="does not write the last message's text"):
        render_chat_template(dropping, PREFILLED, add_generation_prompt=False,
                             continue_final_message=True)
    with pytest.raises(ValueError, match="needs a last message with text"):
        render_chat_template(dropping, [{"role": "assistant", "content": " "}],
                             add_generation_prompt=False, continue_final_message=True)
