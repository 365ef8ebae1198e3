"""Mistral's tool calls (`--tool-call-parser mistral`, vLLM's name), after the [TOOL_CALLS]
control token, in the two forms Mistral's templates write: a JSON array of {"name",
"arguments"} objects (Mistral 7B v0.3, Nemo: `[TOOL_CALLS][{...}, ...]`), or each call as its
name, [ARGS] and the arguments' JSON (Devstral: `[TOOL_CALLS]f[ARGS]{...}`; Mistral Small 3.2
puts the call's id between them: `[TOOL_CALLS]f[CALL_ID]id[ARGS]{...}`).
The text before the first [TOOL_CALLS] is the content; a reply whose calls do not parse is its
text, as vLLM answers it. [TOOL_CALLS] is a special token, which a detokenizer leaves out by
default: with this parser the front keeps special tokens in the reply (as vLLM's parser asks)."""

from __future__ import annotations

import json
from typing import Any

from strand.services.openai.tool_call import arguments_json, openai_call

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


def _call(name: Any, arguments: Any, id_: str | None = None) -> dict[str, Any] | None:
    if not (isinstance(name, str) and name and isinstance(arguments, dict)):
        return None
    return openai_call(name, arguments_json(arguments), id_)


def _array(body: str) -> list[dict[str, Any] | None]:
    """[TOOL_CALLS][{"name", "arguments"}, ...]: the calls, or [None] where it does not parse."""
    try:
        value = json.loads(body)
    except ValueError:
        return [None]
    if not (isinstance(value, list) and value):
        return [None]
    return [_call(v.get("name"), v.get("arguments")) if isinstance(v, dict) else None
            for v in value]


def _named(piece: str) -> dict[str, Any] | None:
    """name[ARGS]{...} or name[CALL_ID]id[ARGS]{...}: the call (with its id), or None."""
    head, sep, raw = piece.partition(ARGS)
    if not sep:
        return None
    try:
        arguments = json.loads(raw)
    except ValueError:
        return None
    name, _, id_ = head.partition(CALL_ID)
    return _call(name.strip(), arguments, id_.strip() or None)


def parse_mistral(text: str) -> tuple[str, list[dict[str, Any]]]:
    """(content, calls) of a whole reply; (text, []) where it holds no call that parses."""
    at = text.find(TOOL_CALLS)
    if at < 0:
        return text, []
    pieces = [p.strip() for p in text[at:].split(TOOL_CALLS)[1:]]
    if len(pieces) == 1 and pieces[0].startswith("["):
        calls = _array(pieces[0])
    else:
        calls = [_named(p) for p in pieces]
    if not calls or any(c is None for c in calls):
        return text, []
    return text[:at], [c for c in calls if c is not None]
