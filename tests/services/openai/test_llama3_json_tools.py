"""--tool-call-parser llama3_json as vLLM's parser answers Llama 3.1 / 3.2 / 3.3: a reply that is
JSON calls (after an optional <|python_tag|>, separated by ";") is its tool calls, any other
reply its text; a stream sends text as it comes and a call whole at the reply's end."""

from __future__ import annotations

import json
from typing import Any

import pytest

from strand.services.openai.llama3_json import begins_as_call, parse_llama3_json
from strand.services.openai.tool_parser import AutoTools

# As the Llama 3.1 template writes an assistant's call (and the model writes its own).
ONE = '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "°C"}}'
TWO = ('<|python_tag|>{"name": "f", "parameters": {"n": 3}}; '
       '{"name": "g", "arguments": {"s": "x"}}')


def _calls(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_a_reply_of_calls_is_its_calls() -> None:
    assert parse_llama3_json(ONE)[0] == ""
    assert _calls(parse_llama3_json(ONE)[1]) == [("get_weather", {"city": "Paris",
                                                                  "unit": "°C"})]
    # "arguments" is taken too; non-ASCII kept as written (vLLM's json.dumps, ensure_ascii off)
    assert _calls(parse_llama3_json(TWO)[1]) == [("f", {"n": 3}), ("g", {"s": "x"})]
    assert "°C" in parse_llama3_json(ONE)[1][0]["function"]["arguments"]
    tool = AutoTools("llama3_json")
    message = tool.message(0, "\n" + ONE)
    assert message["content"] is None and len(message["tool_calls"]) == 1
    assert tool.finish(0, "stop") == "tool_calls" and tool.finish(0, "length") == "length"


@pytest.mark.parametrize("text", [
    "The weather in Paris is mild.",
    '{"name": "f", "parameters": {"n": 3}',  # cut short
    '{"name": "f"}',  # neither parameters nor arguments (vLLM: text)
    '{"parameters": {}}',  # no name
    ONE + " and then some words",
    "[1, 2]",
])
def test_a_reply_that_is_not_calls_throughout_is_its_text(text: str) -> None:
    assert parse_llama3_json(text) == (text, [])
    tool = AutoTools("llama3_json")
    assert tool.message(0, text) == {"role": "assistant", "content": text}
    assert tool.finish(0, "stop") == "stop"


def test_whether_a_reply_begins_as_a_call() -> None:
    assert begins_as_call(" {") is True and begins_as_call("<|python_tag|>") is True
    assert begins_as_call("") is None and begins_as_call("  \n") is None
    assert begins_as_call("<|pyth") is None
    assert begins_as_call("Sure") is False and begins_as_call("<b>") is False


@pytest.mark.parametrize("size", [1, 4, 50])
def test_a_stream_sends_text_as_it_comes_and_calls_at_the_end(size: int) -> None:
    tool = AutoTools("llama3_json")
    pieces = [TWO[i:i + size] for i in range(0, len(TWO), size)]
    deltas = [tool.delta(0, p, first=i == 0, last=i == len(pieces) - 1)
              for i, p in enumerate(pieces)]
    assert deltas[0]["role"] == "assistant"
    assert not any("content" in d for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert "tool_calls" in deltas[-1] and [c["index"] for c in calls] == [0, 1]
    assert _calls(calls) == [("f", {"n": 3}), ("g", {"s": "x"})]
    assert tool.finish(0, "stop") == "tool_calls"
    text = "Hello, it is {warm} today."
    plain = AutoTools("llama3_json")
    got = [plain.delta(0, text[i:i + size], first=i == 0) for i in range(0, len(text), size)]
    assert got[0].get("content", "") == text[:size]  # text goes out as it comes
    assert "".join(d.get("content", "") for d in got) == text
    assert plain.finish(0, "stop") == "stop"


def test_a_stream_that_began_as_a_call_and_is_not_one_drops_nothing() -> None:
    cut = AutoTools("llama3_json")
    first = cut.delta(0, '{"name": "f", "param', first=True)
    assert "content" not in first and "tool_calls" not in first
    last = cut.delta(0, "eters", first=False, last=True)
    assert last["content"] == '{"name": "f", "parameters' and "tool_calls" not in last
    assert cut.finish(0, "length") == "length"
    spaces = AutoTools("llama3_json")
    assert "content" not in spaces.delta(0, "  ", first=True)  # not known yet
    assert spaces.delta(0, "", first=False, last=True)["content"] == "  "
