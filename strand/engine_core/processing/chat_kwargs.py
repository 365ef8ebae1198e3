"""What a chat request hands its template besides the messages: vLLM's chat_template_kwargs
(Qwen 3's `enable_thinking`, SmolLM 3's, Granite's `thinking`, ...), and an assistant message's
earlier reasoning, which thinking templates read back. check_template_kwargs is plain data
beside EngineArgs, in strand/engine_core/chat_config.py."""

from __future__ import annotations

from typing import Any

# OpenAI-style clients send an earlier turn's reasoning as `reasoning` (vLLM's name since
# 0.11) or `reasoning_content` (before it; what Qwen 3's template reads): a template gets both.
REASONING_KEYS = ("reasoning", "reasoning_content")


def with_reasoning_keys(message: dict[str, Any]) -> dict[str, Any]:
    """The message with its reasoning under both names where it gives one (a copy then)."""
    text = next((message[k] for k in REASONING_KEYS if message.get(k)), None)
    if text is None or all(message.get(k) == text for k in REASONING_KEYS):
        return message
    return {**message, **{k: text for k in REASONING_KEYS}}
