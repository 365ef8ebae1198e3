"""tool_choice "required" as vLLM serves it: the schema the reply is held to, and the reply's
JSON array answered as tool calls, whole or streamed as each call completes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.openai.errors import OpenAIError
from services.openai.params import chat_params
from services.openai.protocol import ChatCompletionRequest
from services.openai.tools import NamedTool, RequiredTools, required_schema, tool_choice

CHAT = [{"role": "user", "content": "hi"}]
F_PARAMETERS = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
F: dict[str, Any] = {"type": "function", "function": {"name": "f", "parameters": F_PARAMETERS}}
G: dict[str, Any] = {"type": "function", "function": {"name": "g"}}  # no parameters


def _choice(**fields: Any) -> Any:
    return tool_choice(ChatCompletionRequest(messages=CHAT, **fields))


def test_required_holds_the_reply_to_an_array_of_the_tools_calls() -> None:
    tool = _choice(tools=[F, G], tool_choice="required")
    assert isinstance(tool, RequiredTools)
    assert tool.schema == {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": [
        {"properties": {"name": {"type": "string", "enum": ["f"]},
                        "parameters": F_PARAMETERS},
         "required": ["name", "parameters"]},
        {"properties": {"name": {"type": "string", "enum": ["g"]},
                        "parameters": {"type": "object", "properties": {}}},
         "required": ["name", "parameters"]}]}}
    params = chat_params(ChatCompletionRequest(messages=CHAT, tools=[F, G],
                                               tool_choice="required"), tool)
    assert params.structured_outputs is not None
    assert params.structured_outputs.json == tool.schema
    assert isinstance(_choice(tools=[F], tool_choice={"type": "function",
                                                      "function": {"name": "f"}}), NamedTool)
    assert _choice(tools=[F], tool_choice="none") is None


def test_the_tools_defs_are_gathered_at_the_top() -> None:
    def tool(name: str, item: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "parameters": {
            "type": "object", "properties": {"x": {"$ref": "#/$defs/Item"}},
            "$defs": {"Item": item}}}}

    a, b = tool("a", {"type": "integer"}), tool("b", {"type": "integer"})
    schema = required_schema([a, b])
    assert schema["$defs"] == {"Item": {"type": "integer"}}
    assert all("$defs" not in v["properties"]["parameters"] for v in schema["items"]["anyOf"])
    assert "$defs" in a["function"]["parameters"]  # the request's own tools are not changed
    with pytest.raises(OpenAIError, match="define \\$defs 'Item' differently"):
        required_schema([a, tool("c", {"type": "string"})])


@pytest.mark.parametrize(("fields", "message"), [
    ({"tool_choice": "required"}, 'tool_choice "required" needs tools'),
    ({"tools": [F], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "constrains the reply itself"),
    ({"tools": [F]}, 'tool_choice "auto" needs a parser'),  # OpenAI's default with tools
    ({"tools": [F], "tool_choice": "auto"}, 'send "required"'),
])
def test_choices_it_cannot_serve_are_refused_by_name(fields: dict[str, Any],
                                                     message: str) -> None:
    with pytest.raises(OpenAIError, match=message) as info:
        _choice(**fields)
    assert info.value.param == "tool_choice"


REPLY = '[{"name": "f", "parameters": {"n": 3}}, {"name": "g", "parameters": {"s": "é"}}]'


def test_a_whole_reply_is_its_calls() -> None:
    message = RequiredTools({}).message(0, REPLY)
    assert message["content"] == ""
    calls = message["tool_calls"]
    assert [(c["type"], c["function"]["name"]) for c in calls] == [("function", "f"),
                                                                   ("function", "g")]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"n": 3}, {"s": "é"}]
    assert '"é"' in calls[1]["function"]["arguments"]  # as vLLM: ensure_ascii=False
    assert all(c["id"].startswith("chatcmpl-tool-") for c in calls)
    assert len({c["id"] for c in calls}) == 2


@pytest.mark.parametrize("text", [REPLY[:30], REPLY[:-1], "", "[]", '{"name": "f"}',
                                  '[{"n": 1}]'])
def test_a_reply_that_is_not_a_whole_array_of_calls_is_its_text(text: str) -> None:
    # Cut short by max_tokens (finish_reason "length"): what the model wrote, as text.
    assert RequiredTools({}).message(0, text) == {"role": "assistant", "content": text}


def test_a_stream_sends_each_call_once_its_element_completes() -> None:
    tool = RequiredTools({})
    pieces = [REPLY[i:i + 7] for i in range(0, len(REPLY), 7)]
    deltas = [tool.delta(0, piece, first=i == 0) for i, piece in enumerate(pieces)]
    assert deltas[0]["role"] == "assistant"
    assert all("role" not in d for d in deltas[1:])
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "f"), (1, "g")]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"n": 3}, {"s": "é"}]
    # The first call goes as soon as its object closes, before the rest has been written.
    first_at = next(i for i, d in enumerate(deltas) if d.get("tool_calls"))
    assert sum(len(p) for p in pieces[:first_at + 1]) < len(REPLY) // 2 + 7
    other = RequiredTools({})  # choices of one request stream apart
    assert other.delta(1, REPLY, first=True)["tool_calls"][1]["index"] == 1
