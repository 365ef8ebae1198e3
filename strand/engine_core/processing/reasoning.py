"""Thinking models' reasoning tags (vLLM's --reasoning-parser names), shared by the engine,
which holds structured outputs back until the reasoning ends, and the OpenAI front, which
answers the reasoning apart from the content.

Both parsers read <think> ... </think>: DeepSeek R1 (and its distills, QwQ) and Qwen 3 write
it so. Their templates differ in who writes the opening tag: R1's generation prompt ends with
"<think>\\n", so the model writes only the closing one; Qwen 3's model writes both. A prompt
that already ends with the closing tag (Qwen 3's template with enable_thinking false writes
"<think>\\n\\n</think>\\n\\n") has no reasoning to come: the reply is all content."""

from __future__ import annotations

from dataclasses import dataclass


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


def prompt_ends_reasoning(prompt: str, tags: ThinkTags) -> bool:
    """Whether the prompt closes the reasoning itself (its text ends with the closing tag,
    whitespace aside): then the reply has none. An earlier turn's closed reasoning in the
    history does not count: only the prompt's end says what the model writes next."""
    return prompt.rstrip().endswith(tags.end)
