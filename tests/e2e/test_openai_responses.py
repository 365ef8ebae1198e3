"""/v1/responses through the OpenAI SDK against a real stack: the same reply as chat, whole and
streamed (the SDK's stream accumulator checks every event's order and identity), function
tools, a conversation with tool results, and its refusals."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import openai
import pytest

from strand.services.launch import Stack
from tests.e2e.test_openai import (  # noqa: F401
    LONG_MAX_TOKENS,
    TOOL,
    _post,
    assert_dropping_aborts,
    client,
    model_name,
    openai_stack,
)

FLAT_TOOL: dict[str, Any] = {"type": "function", **dict(TOOL["function"])}  # type: ignore[arg-type]


def test_a_response_is_the_chat_reply_whole_and_streamed(client: openai.OpenAI,  # noqa: F811
                                                         model_name: str) -> None:  # noqa: F811
    chat = client.chat.completions.create(
        model=model_name, messages=[{"role": "system", "content": "be brief"},
                                    {"role": "user", "content": "Say hello"}],
        max_tokens=6, temperature=0)
    response = client.responses.create(model=model_name, instructions="be brief",
                                       input="Say hello", max_output_tokens=6, temperature=0)
    assert response.output_text == chat.choices[0].message.content
    assert response.status == ("incomplete" if chat.choices[0].finish_reason == "length"
                               else "completed")
    assert response.usage is not None and chat.usage is not None
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    # The same prompt again: the prefix cache holds its full blocks.
    again = client.responses.create(model=model_name, instructions="be brief",
                                     input="Say hello", max_output_tokens=6, temperature=0)
    assert again.usage is not None and again.usage.input_tokens_details.cached_tokens > 0
    with client.responses.stream(model=model_name, instructions="be brief", input="Say hello",
                                 max_output_tokens=6, temperature=0) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == response.output_text
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") >= 1


def test_a_named_function_tool_is_a_function_call_item(client: openai.OpenAI,  # noqa: F811
                                                       model_name: str) -> None:  # noqa: F811
    fields: dict[str, Any] = {"model": model_name, "input": "Call f",
                              "tools": [FLAT_TOOL], "max_output_tokens": 48,
                              "tool_choice": {"type": "function", "name": "f"}}
    response = client.responses.create(**fields)
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "f"
    assert isinstance(json.loads(calls[0].arguments)["n"], int)
    with client.responses.stream(**fields) as stream:
        argument_deltas = [e.delta for e in stream
                           if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    streamed = [item for item in final.output if item.type == "function_call"]
    assert "".join(argument_deltas) == streamed[0].arguments
    assert isinstance(json.loads(streamed[0].arguments)["n"], int)


def test_a_conversation_with_a_tool_result_is_continued(client: openai.OpenAI,  # noqa: F811
                                                        model_name: str) -> None:  # noqa: F811
    response = client.responses.create(  # type: ignore[call-overload]
        model=model_name, max_output_tokens=4, tools=[FLAT_TOOL], tool_choice="none", input=[
        {"role": "user", "content": "What is f(1)?"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"n": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "2"}])
    assert response.output and response.output[0].type == "message"


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input"),
    ({"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s",
                                        "schema": {"type": "nonsense"}}}}, "text"),
])
def test_refusals_are_400s_naming_the_field(openai_stack: Stack, body: dict,  # noqa: F811
                                            param: str) -> None:
    status, answer = _post(f"http://{openai_stack.address('openai')}/v1/responses", body)
    assert status == 400 and answer["error"]["param"] == param, answer


def test_no_response_is_stored(openai_stack: Stack) -> None:  # noqa: F811
    url = f"http://{openai_stack.address('openai')}/v1/responses/resp_1"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url, timeout=30)
    assert info.value.code == 404


def test_a_dropped_response_stream_aborts_its_request(client: openai.OpenAI,  # noqa: F811
                                                      model_name: str,  # noqa: F811
                                                      openai_stack: Stack) -> None:  # noqa: F811
    stream = client.responses.create(model=model_name, input="Say hello", stream=True,
                                     max_output_tokens=LONG_MAX_TOKENS - 64,
                                     extra_body={"ignore_eos": True})
    assert_dropping_aborts(stream, 6, openai_stack)
