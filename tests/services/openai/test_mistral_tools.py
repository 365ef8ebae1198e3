"""--tool-call-parser mistral as vLLM's parser answers Mistral's models: the calls after the
[TOOL_CALLS] control token, as a JSON array (7B v0.3, Nemo) or as name[ARGS]{...} each
(Small 3.2, Devstral); the text before it the content; special tokens kept in the reply."""

from __future__ import annotations

import json
from typing import Any

import pytest

from strand.services.openai.mistral import parse_mistral
from strand.services.openai.params import chat_params
from strand.services.openai.protocol import ChatCompletionRequest
from strand.services.openai.tool_parser import AutoTools
from strand.services.openai.tools import tool_choice

ARRAY = ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, '
         '"id": "a1b2c3d4e"}, {"name": "g", "arguments": {}}]')
NAMED = 'Looking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]g[ARGS]{}'
# Mistral Small 3.2's template: the call's id between its name and arguments.
WITH_ID = '[TOOL_CALLS]get_weather[CALL_ID]abcdefghi[ARGS]{"city": "Paris"}[TOOL_CALLS]g[ARGS]{}'
F = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def _calls(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize(("text", "content"), [(ARRAY, ""), (NAMED, "Looking."), (WITH_ID, "")])
def test_both_forms_are_their_calls(text: str, content: str) -> None:
    got_content, calls = parse_mistral(text)
    assert got_content == content
    assert _calls(calls) == [("get_weather", {"city": "Paris"}), ("g", {})]
    tool = AutoTools("mistral")
    message = tool.message(0, text)
    assert message["content"] == (content or None) and len(message["tool_calls"]) == 2
    assert tool.finish(0, "stop") == "tool_calls"
    if text == WITH_ID:
        assert calls[0]["id"] == "abcdefghi" and calls[1]["id"].startswith("chatcmpl-tool-")


@pytest.mark.parametrize("text", [
    "No call, [brackets] and all.",
    "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"n\": 1}",  # cut short
    "[TOOL_CALLS]f[ARGS]{\"n\": ",  # cut short
    "[TOOL_CALLS]f{\"n\": 1}",  # no [ARGS]
    "[TOOL_CALLS][]",
    "[TOOL_CALLS][{\"arguments\": {}}]",  # no name
])
def test_a_reply_without_whole_calls_is_its_text(text: str) -> None:
    assert parse_mistral(text) == (text, [])
    assert AutoTools("mistral").message(0, text) == {"role": "assistant", "content": text}


@pytest.mark.parametrize("size", [1, 5, 200])
def test_a_stream_sends_the_text_as_it_comes_and_the_calls_at_the_end(size: int) -> None:
    tool = AutoTools("mistral")
    pieces = [NAMED[i:i + size] for i in range(0, len(NAMED), size)]
    deltas = [tool.delta(0, p, first=i == 0, last=i == len(pieces) - 1)
              for i, p in enumerate(pieces)]
    assert "".join(d.get("content", "") for d in deltas) == "Looking."  # no "[TOOL" leaked
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert _calls(calls) == [("get_weather", {"city": "Paris"}), ("g", {})]
    assert [c["index"] for c in calls] == [0, 1]
    cut = AutoTools("mistral")
    text = 'ok [TOOL_CALLS]f[ARGS]{"n": '
    got = [cut.delta(0, text[i:i + size], first=i == 0, last=i + size >= len(text))
           for i in range(0, len(text), size)]
    assert "".join(d.get("content", "") for d in got) == text  # nothing dropped
    assert cut.finish(0, "length") == "length"
    plain = AutoTools("mistral")
    assert plain.delta(0, "a [TOOL", first=True)["content"] == "a "  # may begin the tag
    assert plain.delta(0, "S]", first=False, last=True)["content"] == "[TOOLS]"


def test_the_reply_keeps_special_tokens_under_this_parser_only() -> None:
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=[F])
    assert chat_params(req, tool_choice(req, "mistral")).skip_special_tokens is False
    assert chat_params(req, tool_choice(req, "hermes")).skip_special_tokens is True
