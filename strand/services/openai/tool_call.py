"""A tool call as OpenAI's messages carry it, the form every tool-call parser answers in."""

from __future__ import annotations

import json
import uuid
from typing import Any


def call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"  # vLLM's form


def openai_call(name: str, arguments: str, id_: str | None = None) -> dict[str, Any]:
    """A tool call as OpenAI's message carries it (arguments: JSON text; arguments_json)."""
    return {"id": id_ or call_id(), "type": "function",
            "function": {"name": name, "arguments": arguments}}


def arguments_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # as vLLM writes them: non-ASCII kept


def held_back(text: str, tag: str) -> int:
    """How many characters at the end of a streamed `text` may begin `tag` (<tool_call>,
    [TOOL_CALLS]): held back until the next piece says whether they do."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
