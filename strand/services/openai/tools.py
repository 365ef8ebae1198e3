"""Tool calls that structured outputs can force, as vLLM answers them: the tools go to the chat
template, and the reply is constrained by a JSON schema, then answered as tool calls.
- A named function (`tool_choice: {"type": "function", "function": {"name": ...}}`, what
  clients such as instructor send): the reply is the function's parameters, its one call.
- `tool_choice: "required"`: the reply is a JSON array of at least one {"name", "parameters"}
  object, each name one of the tools' and its parameters that tool's schema (vLLM's schema,
  the tools' $defs gathered at its top), each element one call. A reply cut short by max_tokens
  is answered as the text it is (finish_reason "length"); a stream sends each call as its
  element of the array completes.
`tool_choice: "none"` renders the tools and constrains nothing. "auto" (OpenAI's default when
tools are given) needs a parser of the model's own tool-call format (tool_parser.py: the front's
--enable-auto-tool-choice --tool-call-parser); without one it is refused by name, as vLLM
refuses it. Tool calls and tool results
in the history go to the chat template (params.py), for a template that writes them out."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from strand.services.openai.errors import OpenAIError, bad_request
from strand.services.openai.protocol import ChatCompletionRequest
from strand.services.openai.tool_parser import AutoTools, arguments_json, call_id, openai_call


@dataclass(slots=True)
class NamedTool:
    """The function every choice calls, and each choice's call id."""

    name: str
    parameters: dict[str, Any]
    ids: dict[int, str] = field(default_factory=dict)

    @property
    def schema(self) -> dict[str, Any]:
        return self.parameters

    def call_id(self, index: int) -> str:
        return self.ids.setdefault(index, call_id())

    def message(self, index: int, arguments: str) -> dict[str, Any]:
        """A whole response's assistant message: the call, no text."""
        return {"role": "assistant", "content": "",
                "tool_calls": [openai_call(self.name, arguments, self.call_id(index))]}

    def finish(self, index: int, reason: str | None) -> str | None:
        return reason  # OpenAI's, and vLLM's: a named call ends with "stop"

    def delta(self, index: int, arguments: str, first: bool, last: bool = False
              ) -> dict[str, Any]:
        """A stream's delta: the call's id and name first, then arguments as they come."""
        if not first:
            return {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}
        return {"role": "assistant", "tool_calls": [
            {"index": 0, **openai_call(self.name, arguments, self.call_id(index))}]}


@dataclass(slots=True)
class RequiredTools:
    """tool_choice "required": each choice's text is a JSON array of calls (`schema`)."""

    schema: dict[str, Any]
    streamed: dict[int, str] = field(default_factory=dict)  # choice -> its text so far
    sent: dict[int, int] = field(default_factory=dict)  # choice -> calls already streamed

    def message(self, index: int, text: str) -> dict[str, Any]:
        """A whole response's assistant message: the array's calls; the text itself where it
        is not a whole array (cut short by max_tokens)."""
        calls, whole, _ = _calls(text)
        if not whole:
            return {"role": "assistant", "content": text}
        return {"role": "assistant", "content": "", "tool_calls": [
            openai_call(c["name"], arguments_json(c["parameters"])) for c in calls]}

    def delta(self, index: int, text: str, first: bool, last: bool = False) -> dict[str, Any]:
        """A stream's delta: the calls whose elements the text so far completes, each whole;
        at the last, where the array is not whole (cut short), the text after the last whole
        call as content: nothing the model wrote is dropped."""
        whole_text = self.streamed.get(index, "") + text
        self.streamed[index] = whole_text
        calls, whole, done = _calls(whole_text)
        start = self.sent.get(index, 0)
        self.sent[index] = len(calls)
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if len(calls) > start:
            delta["tool_calls"] = [
                {"index": k, **openai_call(c["name"], arguments_json(c["parameters"]))}
                for k, c in enumerate(calls[start:], start=start)]
        if last and not whole and whole_text[done:].strip():
            delta["content"] = whole_text[done:]
        return delta

    def finish(self, index: int, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" else reason  # vLLM's, for "required"


ToolChoice = NamedTool | RequiredTools | AutoTools


def _calls(text: str) -> tuple[list[dict[str, Any]], bool, int]:
    """The array's elements that `text` completes (objects with a name and parameters),
    whether it is the whole array, and where the last complete element ends (0: none)."""
    decoder = json.JSONDecoder()
    calls: list[dict[str, Any]] = []
    at = len(text) - len(text.lstrip())
    done = 0
    if not text.startswith("[", at):
        return calls, False, done
    at += 1
    while True:
        at += len(text[at:]) - len(text[at:].lstrip(" \t\n\r,"))
        if text.startswith("]", at):
            return calls, bool(calls) and not text[at + 1:].strip(), done
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:  # the element is not complete yet
            return calls, False, done
        if not (isinstance(value, dict) and isinstance(value.get("name"), str)
                and "parameters" in value):
            return calls, False, done
        calls.append(value)
        done = at


def required_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """vLLM's schema for tool_choice "required": an array of one or more calls, each a tool's
    name and its parameters; the tools' $defs gathered at the top (a 400 where two tools
    define one name differently)."""
    defs: dict[str, Any] = {}
    variants = []
    for tool in tools:
        function = tool["function"]
        parameters = dict(function.get("parameters") or {"type": "object", "properties": {}})
        for name, definition in parameters.pop("$defs", {}).items():
            if defs.setdefault(name, definition) != definition:
                raise bad_request(f"tools define $defs {name!r} differently: tool_choice "
                                  '"required" needs one definition of it', "tools")
        variants.append({"properties": {"name": {"type": "string", "enum": [function["name"]]},
                                        "parameters": parameters},
                         "required": ["name", "parameters"]})
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "object", "anyOf": variants}}
    if defs:
        schema["$defs"] = defs
    return schema


def tool_choice(req: ChatCompletionRequest, parser: str | None = None) -> ToolChoice | None:
    """How the request's reply makes tool calls (None: it makes none), or a 400 naming the
    field; parser: the front's --tool-call-parser, which "auto" needs."""
    if req.functions or req.function_call:
        older = "functions" if req.functions else "function_call"
        raise bad_request(f"{older} is not supported (the older API): use tools and "
                          "tool_choice", older)
    tools = _check_tools(req.tools)
    choice = req.tool_choice
    if (choice is None and not tools) or choice == "none":
        return None
    if choice == "required":
        if not tools:
            raise bad_request('tool_choice "required" needs tools', "tool_choice")
        if _constrained(req):
            raise bad_request('tool_choice "required" constrains the reply itself: drop '
                              "response_format / structured_outputs", "tool_choice")
        return RequiredTools(required_schema(tools))
    if choice is None or choice == "auto":
        if parser is not None:
            return AutoTools(parser, tools)
        raise bad_request('tool_choice "auto" needs a parser of the model\'s tool-call '
                          'format: start the front with --enable-auto-tool-choice '
                          '--tool-call-parser hermes (a model that writes Hermes-style '
                          '<tool_call> blocks: Qwen 2.5, Qwen 3), llama3_json (Llama 3.1-3.3), '
                          'mistral or qwen3_coder (Qwen3-Coder, Qwen 3.5), or send "required", '
                          'name the function '
                          '({"type": "function", "function": {"name": ...}}) or send "none"',
                          "tool_choice")
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not (isinstance(choice, dict) and choice.get("type") == "function"
            and isinstance(name, str)):
        raise bad_request('tool_choice must be "none", "auto", "required" or {"type": '
                          '"function", "function": {"name": ...}}', "tool_choice")
    for tool in tools:
        if tool["function"]["name"] == name:
            if _constrained(req):
                raise bad_request("a named tool_choice constrains the reply itself: drop "
                                  "response_format / structured_outputs", "tool_choice")
            parameters = tool["function"].get("parameters") or {"type": "object"}
            return NamedTool(name, parameters)
    raise bad_request(f"tool_choice names {name!r}, which is not among tools "
                      f"{[t['function']['name'] for t in tools]}", "tool_choice")


def said_of_tools(error: OpenAIError, tool: ToolChoice | None) -> OpenAIError:
    """The engine's refusal of the schema a named or "required" tool choice made from the tools
    (which it names structured_outputs.json, the field that carried it), said of the tools:
    the client sent no structured_outputs."""
    prefix = "structured_outputs.json is invalid: "
    if not isinstance(tool, NamedTool | RequiredTools) or not error.message.startswith(prefix):
        return error
    return bad_request("tools: the function parameters are not a JSON schema the reply can be "
                       f"held to: {error.message[len(prefix):]}", "tools")


def _check_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    for i, tool in enumerate(tools or []):
        function = tool.get("function")
        if not (tool.get("type") == "function" and isinstance(function, dict)
                and isinstance(function.get("name"), str) and function["name"]):
            raise bad_request(f'tools[{i}] must be {{"type": "function", "function": '
                              '{"name": ..., "parameters": {...}}}', "tools")
        if not isinstance(function.get("parameters", {}), dict):
            raise bad_request(f"tools[{i}].function.parameters must be a JSON schema object",
                              "tools")
    return tools or []


def _constrained(req: ChatCompletionRequest) -> bool:
    return any(getattr(req, name) is not None for name in (
        "structured_outputs", "response_format", "guided_json", "guided_regex",
        "guided_choice", "guided_grammar"))
