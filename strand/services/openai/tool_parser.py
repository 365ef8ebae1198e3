"""tool_choice "auto" (OpenAI's default when tools are given): the model decides, in its own
tool-call format, and a parser finds the calls in its text, as vLLM's --enable-auto-tool-choice
--tool-call-parser does. Nothing constrains the reply.

`hermes` is the format of the Hermes, Qwen 2.5 and Qwen 3 chat templates: each call a JSON
object {"name": ..., "arguments": {...}} between <tool_call> and </tool_call>, after any text.
The text before the first call is the message's content; the calls are its tool_calls and
finish_reason is "tool_calls" (a reply cut short by max_tokens keeps "length"). A call whose
JSON does not parse leaves the whole reply as text, as vLLM's parser does. A stream sends the
text as it comes, holding back what may be the start of a <tool_call> tag, and each call whole
once its closing tag arrives (a block that is no call goes as text, and by the stream's end
whatever was held back or never closed: nothing the model wrote is dropped).

`llama3_json` is Llama 3.1, 3.2 and 3.3's (llama3_json.py): a reply that is calls is JSON
objects {"name": ..., "parameters": {...}} (or "arguments"), after an optional <|python_tag|>,
separated by ";"; any other reply is text. A stream sends text as it comes and a reply that
begins as a call whole at its end (its calls, or its text where they do not parse).

`qwen3_coder` is Qwen3-Coder's and Qwen 3.5's (qwen3_xml.py): the same <tool_call> blocks, each
holding <function=NAME> and one <parameter=NAME> per argument, the values read as the tool's
schema types them; a stream sends each call as it is written: its id and name, then its
arguments a parameter at a time (as vLLM's parser streams them).

`mistral` is Mistral's (mistral.py): the calls after the [TOOL_CALLS] control token, a JSON array
of them or each as name[ARGS]{...}; the text before it is the content. A stream sends that text
as it comes and the calls at the reply's end."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from strand.services.openai.llama3_json import begins_as_call, parse_llama3_json
from strand.services.openai.mistral import TOOL_CALLS, parse_mistral
from strand.services.openai.qwen3_xml import OpenCall, parse_xml_call
from strand.services.openai.tool_call import arguments_json, call_id, held_back, openai_call

__all__ = ["PARSERS", "AutoTools", "arguments_json", "call_id", "openai_call", "parse_hermes"]

PARSERS = ("hermes", "llama3_json", "mistral", "qwen3_coder")
_START, _END = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _call(raw: str) -> dict[str, Any] | None:
    """One call's OpenAI form from the JSON between the tags; None where it is not a call."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not (isinstance(value, dict) and isinstance(value.get("name"), str)):
        return None
    return openai_call(value["name"], arguments_json(value.get("arguments", {})))


def parse_hermes(text: str, read: Callable[[str], dict[str, Any] | None] = _call
                 ) -> tuple[str, list[dict[str, Any]]]:
    """(content, calls) of a whole reply; (text, []) where it holds no call that parses. read:
    one block's call (Hermes' JSON; qwen3_coder's XML)."""
    if _START not in text:
        return text, []
    calls = [read(raw) for raw in _CALL.findall(text)]
    unclosed = text.count(_START) != len(calls)
    if not calls or unclosed or any(c is None for c in calls):
        return text, []
    return text[:text.index(_START)], [c for c in calls if c is not None]


@dataclass(slots=True)
class AutoTools:
    """tool_choice "auto" under a parser (PARSERS): no schema; each choice's text is parsed."""

    parser: str
    tools: list[dict[str, Any]] = field(default_factory=list)  # qwen3_coder types its values
    schema: None = None
    streamed: dict[int, str] = field(default_factory=dict)  # choice -> its text so far
    shown: dict[int, int] = field(default_factory=dict)  # choice -> text chars sent as content
    sent: dict[int, int] = field(default_factory=dict)  # choice -> calls already streamed
    seen: dict[int, int] = field(default_factory=dict)  # choice -> <tool_call> blocks read
    # qwen3_coder: choice -> the call its open block is writing, and that call's number
    open_calls: dict[int, OpenCall] = field(default_factory=dict)
    open_numbers: dict[int, int] = field(default_factory=dict)

    def message(self, index: int, text: str) -> dict[str, Any]:
        if self.parser == "llama3_json":
            content, calls = parse_llama3_json(text)
        elif self.parser == "mistral":
            content, calls = parse_mistral(text)
        else:
            content, calls = parse_hermes(text, self._call)
        if calls:
            self.sent[index] = len(calls)
            return {"role": "assistant", "content": content.strip() or None,
                    "tool_calls": calls}
        return {"role": "assistant", "content": text}

    def delta(self, index: int, text: str, first: bool, last: bool = False) -> dict[str, Any]:
        """The text before any call as content, but for what may begin a tag; each call once
        its closing tag is in; at the last delta, whatever is left unsent (the held-back
        characters, or a call never closed) as content: nothing the model wrote is dropped."""
        whole = self.streamed.get(index, "") + text
        self.streamed[index] = whole
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if self.parser == "llama3_json":
            return self._json_delta(index, whole, delta, last)
        if self.parser == "mistral":
            return self._mistral_delta(index, whole, delta, last)
        if self.parser == "qwen3_coder":
            return self._xml_delta(index, whole, delta, last)
        content, start = self._text_before(index, whole, _START)
        closed_to = self.shown[index]
        if start >= 0:
            blocks = list(_CALL.finditer(whole, start))
            if blocks:
                closed_to = blocks[-1].end()
            new = []
            for block in blocks[self.seen.get(index, 0):]:
                call = self._call(block.group(1))
                if call is None:  # a block that is no call: its text, as the text it is
                    content += block.group(0)
                else:
                    new.append(call)
            self.seen[index] = len(blocks)
            if new:
                done = self.sent.get(index, 0)
                delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(new, start=done)]
                self.sent[index] = done + len(new)
        if last:
            tail = whole[closed_to:]
            if start < 0 or tail.strip():  # held back, or a call never closed
                content += tail
        if content:
            delta["content"] = content
        return delta

    def _xml_delta(self, index: int, whole: str, delta: dict[str, Any],
                   last: bool) -> dict[str, Any]:
        """qwen3_coder: the text before any call as hermes sends it; each call as it is
        written (qwen3_xml.OpenCall): its id and name, then its arguments a parameter at a
        time; a block that is no call, or one never begun, as its text."""
        content, start = self._text_before(index, whole, _START)
        calls: list[dict[str, Any]] = []
        if start >= 0:
            closed = list(_CALL.finditer(whole, start))
            for block in closed[self.seen.get(index, 0):]:
                content += self._xml_block(index, block.group(1), block.group(0), True, calls)
            self.seen[index] = len(closed)
            tail_at = closed[-1].end() if closed else start
            open_at = whole.find(_START, tail_at)
            if open_at >= 0:  # a block being written (to its end when the reply ends)
                content += self._xml_block(index, whole[open_at + len(_START):],
                                           whole[open_at:], last, calls)
            elif last and whole[tail_at:].strip():
                content += whole[tail_at:]
        elif last:
            content += whole[self.shown[index]:]
        if calls:
            delta["tool_calls"] = calls
        if content:
            delta["content"] = content
        return delta

    def _xml_block(self, index: int, body: str, raw: str, end: bool,
                   calls: list[dict[str, Any]]) -> str:
        """One block's news (appended to calls); its text where it ends as no call."""
        call = self.open_calls.get(index)
        if call is None:
            call = OpenCall.begun(body)
            if call is None:
                return raw if end else ""
            number = self.sent.get(index, 0)
            self.sent[index] = number + 1
            self.open_numbers[index] = number
            calls.append({"index": number, "id": call.id, "type": "function", "function": {
                "name": call.name, "arguments": call.more(body, self.tools, end)}})
        else:
            more = call.more(body, self.tools, end)
            if more:
                calls.append({"index": self.open_numbers[index],
                              "function": {"arguments": more}})
        if end:
            self.open_calls.pop(index, None)
        else:
            self.open_calls[index] = call
        return ""

    def _json_delta(self, index: int, whole: str, delta: dict[str, Any],
                    last: bool) -> dict[str, Any]:
        """llama3_json: text as it comes; a reply that begins as a call held to its end."""
        opening = begins_as_call(whole)
        if opening is not False and not last:
            return delta  # a call (sent whole at the end), or not yet known
        if opening and last:
            _, calls = parse_llama3_json(whole)
            if calls:
                delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(calls)]
                self.sent[index] = len(calls)
                return delta
        content = whole[self.shown.get(index, 0):]
        self.shown[index] = len(whole)
        if content:
            delta["content"] = content
        return delta

    def _mistral_delta(self, index: int, whole: str, delta: dict[str, Any],
                       last: bool) -> dict[str, Any]:
        """mistral: the text before [TOOL_CALLS] as it comes, but for what may begin the tag;
        the calls after it at the reply's end (or, where they do not parse, their text)."""
        content, at = self._text_before(index, whole, TOOL_CALLS)
        shown = self.shown[index]
        if last:
            calls = parse_mistral(whole)[1] if at >= 0 else []
            if calls:
                delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(calls)]
                self.sent[index] = len(calls)
            else:
                content += whole[shown:]
                self.shown[index] = len(whole)
        if content:
            delta["content"] = content
        return delta

    def _text_before(self, index: int, whole: str, tag: str) -> tuple[str, int]:
        """(the text before `tag` not yet sent, but for what may begin it; where the tag
        is, -1 while it is not): the content a stream sends ahead of the calls."""
        at = whole.find(tag)
        shown = self.shown.get(index, 0)
        shown_to = at if at >= 0 else len(whole) - held_back(whole, tag)
        self.shown[index] = max(shown, shown_to)
        return (whole[shown:shown_to] if shown_to > shown else ""), at

    def _call(self, raw: str) -> dict[str, Any] | None:
        """One <tool_call> block's call: Hermes' JSON, or qwen3_coder's XML."""
        if self.parser == "qwen3_coder":
            return parse_xml_call(raw, self.tools)
        return _call(raw)

    def finish(self, index: int, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" and self.sent.get(index) else reason
