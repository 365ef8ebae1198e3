"""A chat engine's options, checked without rendering anything: the chat template's source
(vLLM's --chat-template), template variables (--default-chat-template-kwargs, and each
request's chat_template_kwargs), and the reasoning parsers' tags (--reasoning-parser).

Plain data beside config.py, which checks EngineArgs with it when it is built; rendering is
strand/engine_core/processing/ (chat_template.py also checks that the template parses, which
needs jinja2: strand/engine_core/config_checks.py). Imports nothing from strand."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Names the renderer sets itself: a request may not replace the messages it sent, the tools,
# the special tokens or the template's helper functions through the back door.
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                      "unk_token", "raise_exception", "strftime_now"})
# Bounded like a tool spec: the kwargs travel between stages and into every render.
MAX_KWARGS_CHARS = 64 * 1024


def check_template_kwargs(kwargs: object) -> dict[str, Any]:
    """The kwargs as given ({} for None); ValueError naming chat_template_kwargs for anything
    but a JSON object of bounded size whose keys the renderer does not set itself."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError("chat_template_kwargs must be an object of template variables, got "
                         f"{type(kwargs).__name__}")
    taken = sorted(RESERVED.intersection(kwargs))
    if taken:
        raise ValueError(f"chat_template_kwargs.{taken[0]} is a variable the server sets "
                         f"itself; allowed: any other name")
    try:
        size = len(json.dumps(kwargs))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"chat_template_kwargs must be JSON: {exc}") from None
    if size > MAX_KWARGS_CHARS:
        raise ValueError(f"chat_template_kwargs must be at most {MAX_KWARGS_CHARS} characters "
                         f"as JSON, got {size}")
    return kwargs


def chat_template_source(value: str) -> str:
    """vLLM's --chat-template: a file's text, or the template itself as given; ValueError
    naming chat_template for neither."""
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"chat_template: {value!r} is no file, and no template either (it "
                     "has no {{ or {%)")


@dataclass(frozen=True, slots=True)
class ThinkTags:
    start: str
    end: str
    # Qwen 3.5 may begin a tool call (<tool_call> then <function=) without closing its
    # reasoning first: vLLM's qwen3 parser ends the reasoning there.
    call_ends: bool = False


REASONING_PARSERS: dict[str, ThinkTags] = {
    "deepseek_r1": ThinkTags("<think>", "</think>"),
    "qwen3": ThinkTags("<think>", "</think>", call_ends=True),
}


def think_tags(parser: str) -> ThinkTags:
    """ValueError naming reasoning_parser and the choices for an unknown name."""
    tags = REASONING_PARSERS.get(parser)
    if tags is None:
        raise ValueError(f"reasoning_parser must be one of {sorted(REASONING_PARSERS)}, got "
                         f"{parser!r}")
    return tags
