"""Tool calls with a named function (`tool_choice: {"type": "function", "function": {"name":
...}}`, what clients such as instructor send): the tools go to the chat template, and the reply
is constrained to the named function's parameters schema (structured outputs), then answered
as that function's tool call, as vLLM does. `tool_choice: "none"` renders the tools and
constrains nothing. "auto" and "required" need a parser of the model's own tool-call format,
which Strand does not have: refused by name, as vLLM refuses "auto" without
--tool-call-parser. A history with tool calls or tool results is refused too: the chat
messages carry text only, and dropping the calls would change the conversation."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from services.openai.errors import bad_request
from services.openai.protocol import ChatCompletionRequest


@dataclass(slots=True)
class NamedTool:
    """The function every choice calls, and each choice's call id."""

    name: str
    parameters: dict[str, Any]
    ids: dict[int, str] = field(default_factory=dict)

    def call_id(self, index: int) -> str:
        return self.ids.setdefault(index, f"chatcmpl-tool-{uuid.uuid4().hex}")

    def message(self, index: int, arguments: str) -> dict[str, Any]:
        """A whole response's assistant message: the call, no text."""
        return {"role": "assistant", "content": "", "tool_calls": [{
            "id": self.call_id(index), "type": "function",
            "function": {"name": self.name, "arguments": arguments}}]}

    def delta(self, index: int, arguments: str, first: bool) -> dict[str, Any]:
        """A stream's delta: the call's id and name first, then arguments as they come."""
        if not first:
            return {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}
        return {"role": "assistant", "tool_calls": [{
            "index": 0, "id": self.call_id(index), "type": "function",
            "function": {"name": self.name, "arguments": arguments}}]}


def named_tool(req: ChatCompletionRequest) -> NamedTool | None:
    """The request's named tool choice (None: no tool call), or a 400 naming the field."""
    if req.functions or req.function_call:
        older = "functions" if req.functions else "function_call"
        raise bad_request(f"{older} is not supported (the older API): use tools and "
                          "tool_choice", older)
    _check_history(req.messages)
    tools = _check_tools(req.tools)
    choice = req.tool_choice
    if (choice is None and not tools) or choice == "none":
        return None
    if choice is None or choice in ("auto", "required"):
        shown = "auto" if choice is None else choice
        raise bad_request(f'tool_choice "{shown}" needs a parser of the model\'s tool-call '
                          'format, which Strand does not have: name the function '
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


def _check_history(messages: list[dict[str, Any]]) -> None:
    for i, message in enumerate(messages):
        if message.get("role") == "tool" or message.get("tool_calls"):
            raise bad_request(f"messages[{i}]: tool calls and tool results in the history are "
                              "not supported (the chat messages carry text only)", "messages")


def _constrained(req: ChatCompletionRequest) -> bool:
    return any(getattr(req, name) is not None for name in (
        "structured_outputs", "response_format", "guided_json", "guided_regex",
        "guided_choice", "guided_grammar"))
