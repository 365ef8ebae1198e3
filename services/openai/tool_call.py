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
