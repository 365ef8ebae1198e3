"""/v1/responses (OpenAI's Responses API) as the chat request it amounts to, and a chat reply's
deltas as the typed events the OpenAI SDK reads (each checked against the SDK's own types)."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from strand.services.openai.errors import OpenAIError
from strand.services.openai.responses import ResponseEvents, response_base, response_body
from strand.services.openai.responses_input import ResponsesRequest, chat_request

EVENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)
TOOL = {"type": "function", "name": "f", "description": "adds",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}


def test_a_conversation_becomes_chat_messages() -> None:
    req = ResponsesRequest(instructions="be brief", input=[
        {"role": "developer", "content": "no jokes"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "1+"},
                                                        {"type": "input_text", "text": "1?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "use the tool"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"n": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": '{"n": 2}'},
        {"type": "function_call_output", "call_id": "c1", "output": "2"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "It is 2."}]},
    ], tools=[TOOL], tool_choice={"type": "function", "name": "f"}, max_output_tokens=9,
        text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}})
    chat = chat_request(req)
    assert chat.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "system", "content": "no jokes"},
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "", "reasoning": "use the tool", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"n": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "f", "arguments": '{"n": 2}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
        {"role": "assistant", "content": "It is 2."}]
    assert chat.tools == [{"type": "function", "function": {
        "name": "f", "description": "adds", "parameters": TOOL["parameters"]}}]
    assert chat.tool_choice == {"type": "function", "function": {"name": "f"}}
    assert chat.max_tokens == 9
    assert chat.response_format == {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object"}}}
    assert chat_request(ResponsesRequest(input="hi")).messages == [{"role": "user",
                                                                     "content": "hi"}]


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"input": [{"type": "input_image"}]}, "input", "input[0].type 'input_image'"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input",
     "only text parts"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input", "input[0].role"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input", "input[0].call_id"),
    ({"input": []}, "input", "must not be empty"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools", "only function tools"),
    ({"input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice", "tool_choice must"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text", "text.format.type"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "keep"),
])
def test_what_it_cannot_serve_is_a_400_naming_the_field(fields: dict[str, Any], param: str,
                                                       words: str) -> None:
    with pytest.raises(OpenAIError) as info:
        chat_request(ResponsesRequest(**fields))
    assert info.value.status == 400 and info.value.param == param
    assert words in info.value.message


def _base() -> dict[str, Any]:
    return response_base(ResponsesRequest(input="x", tools=[TOOL]), "m", "resp_1")


def test_a_whole_reply_is_its_items_and_a_response_the_sdk_reads() -> None:
    chat = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Adding.", "reasoning": "need f", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}
    body = response_body(_base(), chat)
    response = Response.model_validate(body)
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    assert response.output_text == "Adding." and response.status == "completed"
    assert response.usage is not None and response.usage.total_tokens == 7
    cut = {"choices": [{"index": 0, "finish_reason": "length", "message": {
        "role": "assistant", "content": "Add"}}], "usage": chat["usage"]}
    incomplete = Response.model_validate(response_body(_base(), cut))
    assert incomplete.status == "incomplete"
    assert incomplete.incomplete_details is not None
    assert incomplete.incomplete_details.reason == "max_output_tokens"


def _stream(deltas: list[dict[str, Any]], finish: str = "stop") -> list[Any]:
    events = ResponseEvents(_base())
    raw = events.start()
    for k, delta in enumerate(deltas):
        raw += events.delta({"index": 0, "delta": delta,
                             "finish_reason": finish if k == len(deltas) - 1 else None})
    raw += events.finish({"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3})
    assert [e["sequence_number"] for e in raw] == list(range(len(raw)))
    return [EVENT.validate_python(e) for e in raw]


def test_a_stream_opens_fills_and_closes_each_item_in_order() -> None:
    events = _stream([{"role": "assistant", "reasoning": "hm"}, {"reasoning": "m"},
                      {"content": "It"}, {"content": " is."},
                      {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                       "function": {"name": "f", "arguments": '{"n": 1}'}}]}],
                     finish="tool_calls")
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    final = events[-1].response
    assert [i.type for i in final.output] == ["reasoning", "message", "function_call"]
    assert final.output_text == "It is."
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1, 2]


def test_a_named_tools_arguments_stream_as_argument_deltas() -> None:
    events = _stream([
        {"role": "assistant", "tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                              "function": {"name": "f", "arguments": '{"n"'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": ": 5}"}}]}])
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert deltas == ['{"n"', ": 5}"]
    item = events[-1].response.output[0]
    assert item.type == "function_call" and item.arguments == '{"n": 5}' and item.call_id == "c1"


def test_a_reply_cut_short_is_completed_with_status_incomplete() -> None:
    # vLLM's event (the SDK's stream helper finishes on response.completed only).
    events = _stream([{"role": "assistant", "content": "Hel"}], finish="length")
    assert events[-1].type == "response.completed"
    assert events[-1].response.status == "incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_vllms_sampling_fields_come_along_and_others_do_not() -> None:
    from strand.services.openai.responses_input import sampling_extras

    req = ResponsesRequest.model_validate({
        "input": "x", "stop": ["."], "logit_bias": {"5": 1.0}, "guided_regex": "[a-z]+",
        "min_p": 0.1, "n": 3, "response_format": {"type": "json_object"}, "colour": "red"})
    chat = chat_request(req)
    assert (chat.stop, chat.logit_bias, chat.guided_regex, chat.min_p) == (
        ["."], {"5": 1.0}, "[a-z]+", 0.1)
    assert chat.n == 1 and chat.response_format is None  # text.format is Responses' own
    assert sorted(sampling_extras(req)) == ["guided_regex", "logit_bias", "min_p", "stop"]


def test_reasoning_effort_is_a_template_variable() -> None:
    from strand.services.openai.params import template_kwargs_of
    from strand.services.openai.protocol import ChatCompletionRequest

    chat = chat_request(ResponsesRequest(input="x", reasoning={"effort": "low"}))
    assert template_kwargs_of(chat) == {"reasoning_effort": "low"}
    own = ChatCompletionRequest(messages=[], reasoning_effort="high",
                                chat_template_kwargs={"reasoning_effort": "low", "a": 1})
    assert template_kwargs_of(own) == {"reasoning_effort": "low", "a": 1}  # the kwargs win
    assert template_kwargs_of(ChatCompletionRequest(messages=[])) is None

