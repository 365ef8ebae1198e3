"""tool_choice "required" and "auto" as vLLM serves them: the schema a "required" reply is held
to and its JSON array answered as tool calls; an "auto" reply's Hermes-style <tool_call> blocks
found by the parser; whole or streamed, and the finish reasons."""

from __future__ import annotations

import json
from typing import Any

import pytest

from strand.services.openai.errors import OpenAIError
from strand.services.openai.params import chat_params
from strand.services.openai.protocol import ChatCompletionRequest
from strand.services.openai.tool_parser import AutoTools
from strand.services.openai.tools import (
    NamedTool,
    RequiredTools,
    required_schema,
    said_of_tools,
    tool_choice,
)

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
    cut = RequiredTools({})  # cut short by max_tokens: the unfinished element comes as text
    done = cut.delta(0, REPLY[:60], first=True)
    assert [c["function"]["name"] for c in done["tool_calls"]] == ["f"]
    tail = cut.delta(0, REPLY[60:70], first=False, last=True)
    assert tail["content"] == REPLY[REPLY.index("}, {") + 1:70] and "tool_calls" not in tail
    assert RequiredTools({}).delta(0, "[{", first=True, last=True)["content"] == "[{"
    other = RequiredTools({})  # choices of one request stream apart
    assert other.delta(1, REPLY, first=True)["tool_calls"][1]["index"] == 1


HERMES = ('Let me look.\n<tool_call>\n{"name": "f", "arguments": {"n": 3}}\n</tool_call>\n'
          '<tool_call>\n{"name": "g", "arguments": {"s": "é"}}\n</tool_call>')


def test_auto_needs_the_fronts_parser_and_then_constrains_nothing() -> None:
    tool = tool_choice(ChatCompletionRequest(messages=CHAT, tools=[F]), "hermes")
    assert isinstance(tool, AutoTools)
    params = chat_params(ChatCompletionRequest(messages=CHAT, tools=[F]), tool)
    assert params.structured_outputs is None
    assert isinstance(tool_choice(ChatCompletionRequest(messages=CHAT, tools=[F],
                                                        tool_choice="auto"), "hermes"), AutoTools)
    with pytest.raises(OpenAIError, match="--enable-auto-tool-choice --tool-call-parser hermes"):
        tool_choice(ChatCompletionRequest(messages=CHAT, tools=[F], tool_choice="auto"))


def test_a_hermes_reply_is_its_text_and_its_calls() -> None:
    tool = AutoTools("hermes")
    message = tool.message(0, HERMES)
    assert message["content"] == "Let me look."
    calls = message["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("f", {"n": 3}), ("g", {"s": "é"})]
    assert tool.finish(0, "stop") == "tool_calls"
    assert tool.finish(0, "length") == "length"  # cut short: not a clean call
    only = AutoTools("hermes").message(0, HERMES[len("Let me look.\n"):])
    assert only["content"] is None and len(only["tool_calls"]) == 2


@pytest.mark.parametrize("text", [
    "no call here",
    'x <tool_call>{"name": "f", "arguments": {"n": 3}}',  # unclosed: cut short
    "<tool_call>{not json}</tool_call>",  # as vLLM: the whole reply stays text
    '<tool_call>{"arguments": {}}</tool_call>',  # no name
])
def test_a_reply_without_a_whole_call_is_its_text(text: str) -> None:
    tool = AutoTools("hermes")
    assert tool.message(0, text) == {"role": "assistant", "content": text}
    assert tool.finish(0, "stop") == "stop"


@pytest.mark.parametrize("size", [1, 3, 11])
def test_a_hermes_stream_sends_text_then_each_call_whole(size: int) -> None:
    tool = AutoTools("hermes")
    pieces = [HERMES[i:i + size] for i in range(0, len(HERMES), size)]
    deltas = [tool.delta(0, piece, first=i == 0) for i, piece in enumerate(pieces)]
    assert deltas[0]["role"] == "assistant"
    content = "".join(d.get("content", "") for d in deltas)
    assert content == "Let me look.\n"  # no character of a tag ever went out as text
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in calls] == [(0, "f", {"n": 3}), (1, "g", {"s": "é"})]
    assert tool.finish(0, "stop") == "tool_calls"
    plain = AutoTools("hermes")
    text = "a < b and <tool"  # a "<" that starts no tag goes out; "<tool" waits
    got = "".join(plain.delta(0, ch, first=i == 0).get("content", "") for i, ch in enumerate(text))
    assert got == "a < b and " and plain.finish(0, "stop") == "stop"
    assert plain.delta(0, "", first=False, last=True)["content"] == "<tool"  # then goes out


def test_a_stream_drops_nothing_the_model_wrote() -> None:
    # A call never closed (max_tokens), text after the calls, a block that is no call: what is
    # not a call reaches the client as text by the stream's end.
    cut = AutoTools("hermes")
    first = cut.delta(0, 'ok <tool_call>{"name": "f", "argu', first=True)
    assert first["content"] == "ok " and "tool_calls" not in first
    assert cut.delta(0, "ments", first=False, last=True)["content"] == (
        '<tool_call>{"name": "f", "arguments')
    assert cut.finish(0, "length") == "length"
    after = AutoTools("hermes")
    deltas = [after.delta(0, "<tool_call>{bad}</tool_call>", first=True),
              after.delta(0, HERMES[HERMES.index("<tool_call>"):], first=False),
              after.delta(0, " done", first=False, last=True)]
    assert [c["index"] for d in deltas for c in d.get("tool_calls", [])] == [0, 1]
    assert deltas[0]["content"] == "<tool_call>{bad}</tool_call>"
    assert deltas[-1]["content"] == " done"


def test_the_tool_flags_go_together(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from strand.services.openai.tool_flags import add_tool_flags, check_tool_flags, tool_flags

    parser = argparse.ArgumentParser()
    add_tool_flags(parser)
    for argv, error in ((["--enable-auto-tool-choice"], "needs --tool-call-parser"),
                        (["--tool-call-parser", "hermes"], "needs --enable-auto-tool-choice")):
        args = parser.parse_args(argv)
        with pytest.raises(SystemExit):
            check_tool_flags(parser, args)
        assert error in capsys.readouterr().err
    for name in ("hermes", "llama3_json", "mistral"):
        args = parser.parse_args(["--enable-auto-tool-choice", "--tool-call-parser", name])
        check_tool_flags(parser, args)
        assert tool_flags(args) == ["--enable-auto-tool-choice", "--tool-call-parser", name]
    with pytest.raises(SystemExit):  # a format there is no parser of
        parser.parse_args(["--enable-auto-tool-choice", "--tool-call-parser", "pythonic"])
    assert "invalid choice: 'pythonic'" in capsys.readouterr().err


def test_the_engines_refusal_of_a_tools_schema_is_said_of_the_tools() -> None:
    refused = OpenAIError(400, "structured_outputs.json is invalid: properties must be an object",
                          param="structured_outputs")
    for tool in (_choice(tools=[F], tool_choice="required"),
                 _choice(tools=[F], tool_choice={"type": "function", "function": {"name": "f"}})):
        said = said_of_tools(refused, tool)
        assert said.param == "tools" and said.status == 400
        assert said.message == ("tools: the function parameters are not a JSON schema the reply "
                                "can be held to: properties must be an object")
    # A client's own structured outputs, or another refusal, stay as they are.
    assert said_of_tools(refused, None) is refused
    other = OpenAIError(400, "temperature must be in [0, 2]", param="temperature")
    assert said_of_tools(other, _choice(tools=[F], tool_choice="required")) is other


def test_parallel_tool_calls_false_keeps_a_choices_first_call_only() -> None:
    # vLLM's filter: the message's first call; a stream's deltas of index 0 only.
    from strand.services.openai.shaping import first_call_only

    message = AutoTools("hermes").message(0, HERMES)
    one = first_call_only(message)
    assert [c["function"]["name"] for c in one["tool_calls"]] == ["f"]
    assert one["content"] == message["content"]
    tool = AutoTools("hermes")
    deltas = [first_call_only(tool.delta(0, HERMES[i:i + 7], first=i == 0))
              for i in range(0, len(HERMES), 7)]
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "f")]
    assert all(d.get("tool_calls") != [] for d in deltas)  # a delta left empty drops the key
    assert first_call_only({"role": "assistant", "content": "hi"}) == {"role": "assistant",
                                                                       "content": "hi"}


def test_a_shaper_with_parallel_tool_calls_false_answers_one_call() -> None:
    from strand.engine_core.outputs import CompletionOutput, RequestOutput
    from strand.services.openai.shaping import Shaper

    def output(text: str, finished: bool) -> RequestOutput:
        return RequestOutput("r", None, [1, 2], [CompletionOutput(
            0, text, [3], finish_reason="stop" if finished else None)], finished)

    for one_call, names in ((False, ["f", "g"]), (True, ["f"])):
        shaper = Shaper(chat=True, model="m", n=1, tool=AutoTools("hermes"), one_call=one_call)
        message = shaper.response([output(HERMES, True)])["choices"][0]
        assert [c["function"]["name"] for c in message["message"]["tool_calls"]] == names
        assert message["finish_reason"] == "tool_calls"
        streamer = Shaper(chat=True, model="m", n=1, tool=AutoTools("hermes"), one_call=one_call)
        cut = HERMES.index("</tool_call>") + 20
        events = (streamer.chunks(0, output(HERMES[:cut], False), False)
                  + streamer.chunks(0, output(HERMES[cut:], True), False))
        deltas = [json.loads(e[len("data: "):])["choices"][0]["delta"] for e in events
                  if e.startswith("data: {")]
        assert [c["function"]["name"] for d in deltas for c in d.get("tool_calls", [])] == names
