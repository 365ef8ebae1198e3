"""A /v1/responses request (OpenAI's Responses API, as vLLM serves it) as the chat request it
amounts to: instructions and input items as messages, flat function tools as chat's, text.format
as response_format. The reply is then served as a chat completion is, and reshaped
(responses.py). Nothing is stored: a conversation comes whole in `input`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from strand.services.openai.errors import OpenAIError, bad_request, said_as
from strand.services.openai.protocol import ChatCompletionRequest, StreamOptions, _Sampling

_TEXT_PARTS = ("input_text", "output_text", "text")
# Chat's field names in a refusal, as this request spells them.
_NAMES = {"max_tokens": "max_output_tokens", "response_format": "text", "messages": "input"}


class ResponsesRequest(BaseModel):
    # Unknown fields are kept aside (model_extra) and logged as ignored, as for chat.
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | ...}}
    store: bool | None = None  # accepted; nothing is kept (no previous_response_id here)
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    reasoning: dict[str, Any] | None = None  # effort: the template's reasoning_effort
    # vLLM's extra sampling fields, as on chat
    top_k: int | None = None
    seed: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None


def chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request this one amounts to; a 400 naming the field it cannot be."""
    if req.previous_response_id is not None:
        raise bad_request("previous_response_id needs responses stored by the server, which "
                          "this one does not keep: send the conversation as input",
                          "previous_response_id")
    fields: dict[str, Any] = {
        "model": req.model, "messages": _messages(req), "max_tokens": req.max_output_tokens,
        "temperature": req.temperature, "top_p": req.top_p, "stream": req.stream,
        "tools": _tools(req.tools), "tool_choice": _tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls, "response_format": _format(req.text),
        "top_k": req.top_k, "seed": req.seed, "chat_template_kwargs": req.chat_template_kwargs,
        "reasoning_effort": (req.reasoning or {}).get("effort")}
    if req.stream:
        fields["stream_options"] = StreamOptions(include_usage=True)  # for the last event
    return ChatCompletionRequest(**{**sampling_extras(req), **fields})


# vLLM's sampling fields a chat request takes (stop, logit_bias, min_p, guided_regex, ...):
# sent along with a response request too, as its extra fields. n stays 1 (one output), and
# response_format is text.format here.
_EXTRAS = frozenset(_Sampling.model_fields) - {"n", "stream", "stream_options", "model",
                                               "response_format"}


def sampling_extras(req: ResponsesRequest) -> dict[str, Any]:
    """The request's extra fields that are chat's sampling fields (the rest are ignored)."""
    return {k: v for k, v in (req.model_extra or {}).items() if k in _EXTRAS}


def _messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        return [*messages, {"role": "user", "content": req.input}]
    reasoning: str | None = None  # a reasoning item's text, for the assistant turn after it
    for i, item in enumerate(req.input):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_request(f"input[{i}].role must be user, system, developer or "
                                  f"assistant, got {role!r}", "input")
            message = {"role": "system" if role == "developer" else role,
                       "content": _text(item.get("content"), i)}
            if role == "assistant" and reasoning is not None:
                message["reasoning"], reasoning = reasoning, None
            messages.append(message)
        elif kind == "function_call":
            call = {"id": _str(item, "call_id", i), "type": "function",
                    "function": {"name": _str(item, "name", i),
                                 "arguments": item.get("arguments") or "{}"}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                turn: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [call]}
                if reasoning is not None:
                    turn["reasoning"], reasoning = reasoning, None
                messages.append(turn)
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _str(item, "call_id", i),
                             "content": _text(item.get("output"), i)})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
        else:
            raise bad_request(f"input[{i}].type {kind!r} is not supported (message, "
                              "function_call, function_call_output, reasoning)", "input")
    if not messages:
        raise bad_request("input must not be empty", "input")
    return messages


def _text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") in _TEXT_PARTS
                    and isinstance(part.get("text"), str)):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(f"input[{i}].content: only text parts are supported, got "
                                  f"{kind!r}", "input")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"input[{i}].content must be a string or a list of text parts", "input")


def _str(item: dict[str, Any], key: str, i: int) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise bad_request(f"input[{i}].{key} must be a non-empty string", "input")
    return value


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses' flat function tools as chat's nested ones; other kinds are refused."""
    if tools is None:
        return None
    nested = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise bad_request(f"tools[{i}].type {tool.get('type')!r} is not supported: only "
                              "function tools (the client runs them)", "tools")
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        nested.append({"type": "function", "function": function})
    return nested


def _tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request('tool_choice must be "auto", "none", "required" or {"type": "function", '
                      '"name": ...}', "tool_choice")


def _format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """text.format as chat's response_format (None: plain text)."""
    form = (text or {}).get("format")
    if form is None or form.get("type") == "text":
        return None
    if form.get("type") == "json_object":
        return {"type": "json_object"}
    if form.get("type") == "json_schema":
        schema = {k: form[k] for k in ("name", "schema", "strict", "description") if k in form}
        return {"type": "json_schema", "json_schema": schema}
    raise bad_request('text.format.type must be "text", "json_object" or "json_schema", got '
                      f"{form.get('type')!r}", "text")


def said_of_responses(error: OpenAIError) -> OpenAIError:
    """A refusal of the chat request, naming the field as the client sent it."""
    name = _NAMES.get(error.param or "")
    return error if name is None else said_as(error, name)
