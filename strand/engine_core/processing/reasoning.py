"""Thinking models' reasoning tags (vLLM's --reasoning-parser names), shared by the engine,
which holds structured outputs back until the reasoning ends, and the OpenAI front, which
answers the reasoning apart from the content. Each parser's tags (REASONING_PARSERS, think_tags)
are plain data beside EngineArgs, in strand/engine_core/chat_config.py.

Both parsers read <think> ... </think>: DeepSeek R1 (and its distills, QwQ) and Qwen 3 write
it so. Their templates differ in who writes the opening tag: R1's generation prompt ends with
"<think>\\n", so the model writes only the closing one; Qwen 3's model writes both. A prompt
that already ends with the closing tag (Qwen 3's template with enable_thinking false writes
"<think>\\n\\n</think>\\n\\n") has no reasoning to come: the reply is all content."""

from __future__ import annotations

from strand.engine_core.chat_config import ThinkTags


def prompt_ends_reasoning(prompt: str, tags: ThinkTags) -> bool:
    """Whether the prompt closes the reasoning itself (its text ends with the closing tag,
    whitespace aside): then the reply has none. An earlier turn's closed reasoning in the
    history does not count: only the prompt's end says what the model writes next."""
    return prompt.rstrip().endswith(tags.end)
