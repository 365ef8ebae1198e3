"""What a chat request hands its template besides the messages: vLLM's chat_template_kwargs
(Qwen 3's `enable_thinking`, SmolLM 3's, Granite's `thinking`, ...), and an assistant message's
earlier reasoning, which thinking templates read back."""

from __future__ import annotations

import json
from typing import Any

# Names the renderer sets itself: a request may not replace the messages it sent, the tools,
# the special tokens or the template's helper functions through the back door.
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                      "unk_token", "raise_exception", "strftime_now"})
# Bounded like a tool spec: the kwargs travel between stages and into every render.
MAX_KWARGS_CHARS = 64 * 1024

# OpenAI-style clients send an earlier turn's reasoning as `reasoning` (vLLM's name since
# 0.11) or `reasoning_content` (before it; what Qwen 3's template reads): a template gets both.
REASONING_KEYS = ("reasoning", "reasoning_content")


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


def with_reasoning_keys(message: dict[str, Any]) -> dict[str, Any]:
    """The message with its reasoning under both names where it gives one (a copy then)."""
    text = next((message[k] for k in REASONING_KEYS if message.get(k)), None)
    if text is None or all(message.get(k) == text for k in REASONING_KEYS):
        return message
    return {**message, **{k: text for k in REASONING_KEYS}}
