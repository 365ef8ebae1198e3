"""--tool-call-parser qwen3_coder as vLLM's parser answers Qwen3-Coder and Qwen 3.5: each
<tool_call> block's <function=NAME> and its <parameter=NAME> values, each read as the tool's
schema types it; whole or streamed in any pieces; and the qwen3 reasoning parser ending the
reasoning where such a call begins."""

from __future__ import annotations

import json
from typing import Any

import pytest

from strand.services.openai.qwen3_xml import parse_xml_call, typed_value
from strand.services.openai.reasoning import Reasoning
from strand.services.openai.tool_parser import AutoTools

TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "celsius": {"type": "boolean"}, "hours": {"type": "array"},
        "at": {"anyOf": [{"type": "number"}, {"type": "null"}]}}}}}]
# As Qwen 3.5's chat template writes a call (a newline after each opening tag and before each
# closing one).
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=hours>\n[9, 12]\n</parameter>\n"
        "</function>\n</tool_call>")
ARGS = {"city": "San Francisco", "days": 3, "hours": [9, 12]}


def _arguments(call: dict[str, Any] | None) -> dict[str, Any]:
    assert call is not None
    return json.loads(call["function"]["arguments"])


@pytest.mark.parametrize(("text", "spec", "value"), [
    ("42", {"type": "integer"}, 42),
    ("4.5", {"type": "number"}, 4.5),
    ("4.0", {"type": "number"}, 4),  # vLLM's: a whole number as an integer
    ("True", {"type": "boolean"}, True),
    ("false", {"type": "boolean"}, False),
    ('{"a": [1, null]}', {"type": "object"}, {"a": [1, None]}),
    ("{'a': 1}", {"type": "object"}, {"a": 1}),  # a Python literal
    ("null", {"type": "integer"}, None),
    ("None", {"anyOf": [{"type": "string"}, {"type": "null"}]}, None),
    ("null", {"type": "string"}, "null"),  # a string is what it says
    (" 7 ", {"type": "string"}, " 7 "),
    ("7", None, "7"),  # a parameter the schema does not list: its text
    ("7", {"enum": ["7", "8"]}, "7"),  # no type: a string, as vLLM
    ("seven", {"type": "integer"}, "seven"),  # not its type: the text, not a guess
    ("maybe", {"type": "boolean"}, "maybe"),
    ("__import__('os')", {"type": "object"}, "__import__('os')"),  # nothing is evaluated
    ("1e999", {"type": "integer"}, "1e999"),
])
def test_values_are_read_as_their_schema_types(text: str, spec: Any, value: Any) -> None:
    assert typed_value(text, spec) == value


def test_a_block_is_its_function_and_typed_arguments() -> None:
    raw = CALL[len("<tool_call>"):-len("</tool_call>")]
    call = parse_xml_call(raw, TOOLS)
    assert call is not None and call["function"]["name"] == "get_weather"
    assert _arguments(call) == ARGS
    multi_line = "<function=f>\n<parameter=code>\nx = 1\n\ny = 2\n</parameter>\n</function>"
    assert _arguments(parse_xml_call(multi_line, [])) == {"code": "x = 1\n\ny = 2"}
    assert parse_xml_call('{"name": "f", "arguments": {}}', TOOLS) is None  # Hermes' JSON


def test_a_whole_reply_is_its_text_and_its_calls() -> None:
    tools = AutoTools("qwen3_coder", TOOLS)
    message = tools.message(0, "Let me look.\n" + CALL + "\n" + CALL)
    assert message["content"] == "Let me look."
    assert [_arguments(c) for c in message["tool_calls"]] == [ARGS, ARGS]
    assert tools.finish(0, "stop") == "tool_calls"
    plain = AutoTools("qwen3_coder", TOOLS)
    broken = "<tool_call>\nnot a function\n</tool_call>"
    assert plain.message(0, broken) == {"role": "assistant", "content": broken}


def _streamed(text: str, size: int) -> list[dict[str, Any]]:
    tools = AutoTools("qwen3_coder", TOOLS)
    pieces = [text[i:i + size] for i in range(0, len(text), size)]
    return [tools.delta(0, p, first=i == 0, last=i == len(pieces) - 1)
            for i, p in enumerate(pieces)]


def _joined(deltas: list[dict[str, Any]]) -> dict[int, dict[str, str]]:
    """Each call's id, name and arguments, its pieces joined as a client joins them."""
    calls: dict[int, dict[str, str]] = {}
    for delta in deltas:
        for piece in delta.get("tool_calls", []):
            call = calls.setdefault(piece["index"], {"arguments": ""})
            if "id" in piece:
                assert "id" not in call  # one header a call
                call["id"], call["name"] = piece["id"], piece["function"]["name"]
            call["arguments"] += piece["function"]["arguments"]
    return calls


@pytest.mark.parametrize("size", [1, 3, 17, 500])
def test_a_stream_sends_the_text_then_each_call_as_it_is_written(size: int) -> None:
    text = "Checking.\n" + CALL + "\n" + CALL
    deltas = _streamed(text, size)
    assert "".join(d.get("content", "") for d in deltas).strip() == "Checking."
    calls = _joined(deltas)
    whole = AutoTools("qwen3_coder", TOOLS).message(0, text)["tool_calls"]
    # The same arguments text as the whole reply's, key for key.
    assert [c["arguments"] for c in calls.values()] == [c["function"]["arguments"]
                                                        for c in whole]
    assert [c["name"] for c in calls.values()] == ["get_weather", "get_weather"]
    if size < 20:  # the header goes out before the call is written
        first = next(i for i, d in enumerate(deltas) if d.get("tool_calls"))
        assert first < (len("Checking.\n") + CALL.index("<parameter=")) // size + 1


def test_a_call_cut_short_keeps_valid_arguments_and_a_block_that_is_no_call_is_text() -> None:
    cut = CALL[:CALL.index("<parameter=days>") + 12]  # the second parameter never closes
    calls = _joined(_streamed("Hm.\n" + cut, 4))
    assert json.loads(calls[0]["arguments"]) == {"city": "San Francisco"}
    odd = "<tool_call>\nnot a function\n</tool_call> after"
    deltas = _streamed(odd, 5)
    assert not _joined(deltas)
    assert "".join(d.get("content", "") for d in deltas) == odd


def test_qwen3_reasoning_ends_where_a_call_begins_without_its_closing_tag() -> None:
    # Qwen 3.5 may call a tool from inside its reasoning; the call is the content.
    text = "I should check the weather.\n" + CALL
    whole = Reasoning("qwen3")
    whole.note_prompt(0, "<|im_start|>assistant\n<think>\n")
    assert whole.split(0, text) == ("I should check the weather.\n", CALL)
    mention = "A <tool_call> tag starts a call."  # mentioned, not made
    assert whole.split(0, mention) == (mention, None)
    r1 = Reasoning("deepseek_r1")  # only qwen3 reads it so, as in vLLM
    r1.note_prompt(0, "x")
    assert r1.split(0, text) == (text, None)
    for size in (1, 2, 5, 11):
        streamed = Reasoning("qwen3")
        streamed.note_prompt(0, "x")
        pieces = [text[i:i + size] for i in range(0, len(text), size)]
        sent = [streamed.delta(0, 0, p, k == len(pieces) - 1) for k, p in enumerate(pieces)]
        assert "".join(r for r, _ in sent) == "I should check the weather.\n"
        assert "".join(c for _, c in sent) == CALL


def test_a_shaped_reply_has_its_reasoning_then_its_calls() -> None:
    from strand.engine_core.outputs import CompletionOutput, RequestOutput
    from strand.services.openai.shaping import Shaper

    shaper = Shaper(chat=True, model="m", n=1, tool=AutoTools("qwen3_coder", TOOLS),
                    reasoning=Reasoning("qwen3"))
    out = RequestOutput("r", "<|im_start|>assistant\n", [1], [CompletionOutput(
        0, "<think>\nweather first\n</think>\n\n" + CALL, [2], finish_reason="stop")], True)
    choice = shaper.response([out])["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning"] == "\nweather first\n"
    assert [_arguments(c) for c in choice["message"]["tool_calls"]] == [ARGS]
