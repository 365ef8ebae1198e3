"""Qwen3-Coder's and Qwen 3.5's tool calls (vLLM's --tool-call-parser qwen3_coder): each call
an XML-like block, its arguments one <parameter=NAME> each, their values as plain text:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

The text carries no types, so each value is read as its parameter's type in the tool's schema
says, as vLLM reads it: integers and numbers as numbers, booleans, null for "null" or "None"
where the type is not a string (or allows null), objects and arrays as JSON (or a Python
literal). A string, a parameter the schema does not list, or a value that does not read as its
type stays the text it is; nothing is turned into something else silently.

A stream sends a call as it is written (OpenCall), as vLLM's parser does: its id and name first,
then each parameter as it closes."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

from strand.services.openai.tool_call import arguments_json, call_id, openai_call

_CLOSED = re.compile(r"</function>\s*\Z")
# The template writes a newline after the opening tag and before the closing one: not the value.
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
_STRINGS = ("string", "str", "text", "enum")


def parse_xml_call(raw: str, tools: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One call's OpenAI form from the text between <tool_call> and </tool_call>; None where it
    is not a whole <function=...> block. The arguments are OpenCall's, all at once: a stream's
    pieces join into the same text."""
    call = OpenCall.begun(raw) if _CLOSED.search(raw) else None
    if call is None:
        return None
    return openai_call(call.name, call.more(raw, tools, end=True), call.id)


_FUNCTION_OPEN = re.compile(r"\s*<function=([^>\n]+)>")


@dataclass(slots=True)
class OpenCall:
    """A call streamed as the model writes it: its id and name once <function=NAME> is in,
    then its arguments' JSON a parameter at a time, each as it closes (its type needs its whole
    value), and the closing brace at </function>. The pieces join into what the whole reply's
    call has: arguments_json of the same values, key for key."""

    id: str
    name: str
    params: int = 0  # parameters sent
    closed: bool = False  # the closing brace sent

    @classmethod
    def begun(cls, body: str) -> OpenCall | None:
        """The call a block's text so far (after <tool_call>) begins; None until its
        <function=NAME> is whole (or where the block is no call)."""
        match = _FUNCTION_OPEN.match(body)
        return None if match is None else cls(call_id(), match.group(1).strip())

    def more(self, body: str, tools: list[dict[str, Any]], end: bool) -> str:
        """The arguments' JSON that the block's text so far adds; end: the block is over, so
        the JSON closes whatever the text did (a call cut short keeps valid arguments)."""
        match = _FUNCTION_OPEN.match(body)
        rest = body[match.end():] if match is not None else ""
        properties = _properties(tools, self.name)
        params = list(_PARAMETER.finditer(rest))
        pieces = []
        for parameter in params[self.params:]:
            key = parameter.group(1).strip()
            value = typed_value(parameter.group(2), properties.get(key))
            pieces.append(("{" if self.params == 0 else ", ")
                          + f"{arguments_json(key)}: {arguments_json(value)}")
            self.params += 1
        after = rest[params[-1].end():] if params else rest
        if not self.closed and (end or "</function>" in after):
            pieces.append("}" if self.params else "{}")
            self.closed = True
        return "".join(pieces)


def _properties(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for tool in tools:
        function = tool.get("function") or {}
        if function.get("name") == name:
            properties = (function.get("parameters") or {}).get("properties")
            return properties if isinstance(properties, dict) else {}
    return {}


def _types(spec: dict[str, Any]) -> tuple[str, bool]:
    """(the first type that is not null, whether null is allowed); "string" where none is
    given (vLLM's default)."""
    options = spec["type"] if "type" in spec else [
        o.get("type") for o in spec.get("anyOf", []) if isinstance(o, dict)]
    names = [str(t).lower() for t in (options if isinstance(options, list) else [options])
             if t is not None]
    kinds = [t for t in names if t != "null"]
    return (kinds[0] if kinds else "string" if not names else "null"), "null" in names


def typed_value(text: str, spec: object) -> Any:
    """The value as its schema's type reads it (the text where it does not)."""
    if not isinstance(spec, dict):
        return text
    kind, nullable = _types(spec)
    if text.strip().lower() in ("null", "none") and (nullable or kind not in _STRINGS):
        return None
    if kind in _STRINGS:
        return text
    value = text.strip()
    if kind.startswith("int"):
        return _or_text(int, value, text)
    if kind.startswith("num") or kind.startswith("float"):
        number = _or_text(float, value, text)
        return int(number) if isinstance(number, float) and number.is_integer() else number
    if kind.startswith("bool"):
        return {"true": True, "false": False}.get(value.lower(), text)
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:
        return ast.literal_eval(value)  # a Python literal ({'k': 'v'}, True): evaluates nothing
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _or_text(read: Any, value: str, text: str) -> Any:
    try:
        return read(value)
    except (ValueError, OverflowError):
        return text
