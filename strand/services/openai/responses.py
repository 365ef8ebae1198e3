"""A chat completion (shaping.py's choice 0) reshaped as OpenAI's Responses API answers: output
items (a reasoning item, a message with its output_text, a function_call per tool call), the
status (incomplete when max_output_tokens cut it), usage; and a stream's deltas as the typed
events the OpenAI SDK accumulates (response.created, output_item.added, content_part.added,
output_text.delta, ..., response.completed), each item opened, filled and closed in order."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from strand.engine_core.outputs import RequestOutput
from strand.services.openai.errors import from_exception
from strand.services.openai.responses_input import ResponsesRequest
from strand.services.openai.shaping import Shaper


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_base(req: ResponsesRequest, model: str, response_id: str) -> dict[str, Any]:
    """The response object's fields that echo the request (status in_progress, no output)."""
    return {"id": response_id, "object": "response", "created_at": int(time.time()),
            "status": "in_progress", "model": model, "output": [], "error": None,
            "incomplete_details": None, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "temperature": req.temperature,
            "top_p": req.top_p, "tools": req.tools or [],
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "parallel_tool_calls": req.parallel_tool_calls,
            "text": req.text or {"format": {"type": "text"}}, "metadata": req.metadata or {},
            "previous_response_id": None, "store": False, "usage": None}


def _usage(chat_usage: dict[str, int] | None, cached: int) -> dict[str, Any] | None:
    """Responses' usage: the prompt tokens the prefix cache held are its cached_tokens; the
    reasoning tokens are not counted apart (0)."""
    if chat_usage is None:
        return None
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat_usage["total_tokens"]}


def _finished(base: dict[str, Any], output: list[dict[str, Any]], finish_reason: str | None,
              usage: dict[str, int] | None, cached: int) -> dict[str, Any]:
    incomplete = finish_reason == "length"
    return {**base, "status": "incomplete" if incomplete else "completed", "output": output,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "usage": _usage(usage, cached)}


def reasoning_item(item_id: str, text: str, done: bool = True) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if done else [],
            "status": "completed" if done else "in_progress"}


def message_item(item_id: str, text: str, done: bool = True) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "role": "assistant",
            "status": "completed" if done else "in_progress",
            "content": [_text_part(text)] if done else []}


def call_item(item_id: str, call: dict[str, Any], done: bool = True) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call["id"],
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"] if done else "",
            "status": "completed" if done else "in_progress"}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class _TextItem(NamedTuple):
    """What differs between a reasoning item and a message in a stream's events."""

    prefix: str  # of the item's id
    item: Callable[[str, str, bool], dict[str, Any]]  # (id, text, done) -> the item
    events: str  # the delta / done events' type, less the suffix
    part: Callable[[str], dict[str, Any]]  # its content part
    extra: dict[str, Any]  # more fields of its delta / done events


_TEXT_ITEMS = {
    "reasoning": _TextItem("rs", reasoning_item, "response.reasoning_text",
                           lambda text: {"type": "reasoning_text", "text": text}, {}),
    "message": _TextItem("msg", message_item, "response.output_text", _text_part,
                         {"logprobs": []}),
}


def response_body(base: dict[str, Any], chat: dict[str, Any], cached: int = 0
                  ) -> dict[str, Any]:
    """A whole (non-streamed) chat completion body as a response."""
    choice = chat["choices"][0]
    message = choice["message"]
    output = []
    if message.get("reasoning"):
        output.append(reasoning_item(_id("rs"), message["reasoning"]))
    if message.get("content"):
        output.append(message_item(_id("msg"), message["content"]))
    output += [call_item(_id("fc"), call) for call in message.get("tool_calls") or []]
    return _finished(base, output, choice["finish_reason"], chat.get("usage"), cached)


def event_sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


@dataclass(slots=True)
class ResponseEvents:
    """One streamed response's events, from its chat deltas: the open item (reasoning, then
    the message) filled as text comes, each tool call an item of its own, all closed in
    order before response.completed (whose status says whether max_output_tokens cut it)."""

    base: dict[str, Any]
    sequence: int = 0
    output: list[dict[str, Any]] = field(default_factory=list)  # closed items
    open_kind: str | None = None  # "reasoning" | "message" | "function_call"
    open_id: str = ""
    open_text: str = ""
    open_call: dict[str, Any] = field(default_factory=dict)  # the open call's id and name
    finish_reason: str | None = None

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        return [self.event("response.created", response=self.base),
                self.event("response.in_progress", response=self.base)]

    def delta(self, choice: dict[str, Any]) -> list[dict[str, Any]]:
        """Events for one chat choice delta (reasoning, content, tool calls)."""
        events: list[dict[str, Any]] = []
        delta = choice.get("delta") or {}
        if delta.get("reasoning"):
            events += self._text("reasoning", delta["reasoning"])
        if delta.get("content"):
            events += self._text("message", delta["content"])
        for call in delta.get("tool_calls") or []:
            events += self._call(call)
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        return events

    def finish(self, chat_usage: dict[str, int] | None,
               cached: int = 0) -> list[dict[str, Any]]:
        events = self._close()
        final = _finished(self.base, self.output, self.finish_reason, chat_usage, cached)
        # response.completed even when max_output_tokens cut it (its status says so), as vLLM
        # sends it: the SDK's stream helper finishes on that event only.
        return [*events, self.event("response.completed", response=final)]

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        """A reasoning or message delta: its item opened first where another kind was."""
        events: list[dict[str, Any]] = []
        spec = _TEXT_ITEMS[kind]
        if self.open_kind != kind:
            events += self._close()
            self.open_kind, self.open_id, self.open_text = kind, _id(spec.prefix), ""
            events.append(self.event("response.output_item.added", output_index=len(self.output),
                                     item=spec.item(self.open_id, "", False)))
            events.append(self.event("response.content_part.added", **self._where(),
                                     part=spec.part("")))
        self.open_text += text
        return [*events, self.event(f"{spec.events}.delta", **self._where(), delta=text,
                                    **spec.extra)]

    def _close(self) -> list[dict[str, Any]]:
        """Close the open item (none: nothing)."""
        if self.open_kind is None:
            return []
        kind, text, where = self.open_kind, self.open_text, self._where()
        self.open_kind = None
        if kind == "function_call":
            item = call_item(self.open_id, {**self.open_call, "function": {
                "name": self.open_call["name"], "arguments": text}})
            events = [self.event("response.function_call_arguments.done", item_id=self.open_id,
                                 output_index=where["output_index"], name=item["name"],
                                 arguments=text)]
        else:
            spec = _TEXT_ITEMS[kind]
            item = spec.item(self.open_id, text, True)
            events = [self.event(f"{spec.events}.done", **where, text=text, **spec.extra),
                      self.event("response.content_part.done", **where, part=spec.part(text))]
        events.append(self.event("response.output_item.done", output_index=where["output_index"],
                                 item=item))
        self.output.append(item)
        return events

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        """A tool call's delta: one with an id begins a call item (a whole call, or a named
        tool's first piece); its arguments come as argument deltas."""
        events: list[dict[str, Any]] = []
        if "id" in call:
            events += self._close()
            self.open_kind, self.open_id, self.open_text = "function_call", _id("fc"), ""
            self.open_call = {"id": call["id"], "name": call["function"]["name"]}
            item = call_item(self.open_id, {"id": call["id"], "function": {
                "name": self.open_call["name"], "arguments": ""}}, done=False)
            events.append(self.event("response.output_item.added",
                                      output_index=len(self.output), item=item))
        arguments = (call.get("function") or {}).get("arguments") or ""
        if arguments and self.open_kind == "function_call":
            self.open_text += arguments
            events.append(self.event("response.function_call_arguments.delta",
                                      item_id=self.open_id, output_index=len(self.output),
                                      delta=arguments))
        return events

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.open_id, "output_index": len(self.output), "content_index": 0}


@dataclass(slots=True)
class ResponsesShape:
    """How app.py answers a /v1/responses request from its chat Shaper: the body, or the
    stream's events as SSE (the form shaping.ChatEvents has for chat)."""

    base: dict[str, Any]
    shaper: Shaper
    events: ResponseEvents = field(init=False)

    def __post_init__(self) -> None:
        self.events = ResponseEvents(self.base)

    def _cached(self) -> int:
        return sum(self.shaper.cached_tokens.values())

    def body(self, chat: dict[str, Any]) -> dict[str, Any]:
        return response_body(self.base, chat, self._cached())

    def start(self) -> list[str]:
        return [event_sse(e) for e in self.events.start()]

    def output(self, job: int, out: RequestOutput) -> list[str]:
        return [event_sse(e) for choice in self.shaper.moved(job, out)
                for e in self.events.delta(choice)]

    def end(self) -> list[str]:
        return [event_sse(e) for e in self.events.finish(self.shaper.usage(), self._cached())]

    def error(self, exc: Exception) -> str:
        """A failure once the stream began: OpenAI's error event."""
        error = from_exception(exc)
        return event_sse(self.events.event("error", code=error.code, message=error.message,
                                           param=error.param))

    def after(self) -> list[str]:
        return []  # no [DONE]: the SDK ends on response.completed
