"""--reasoning-parser: a thinking model's reasoning answered apart from its content, as vLLM's
parsers answer it: in the message's (or each delta's) `reasoning` field (vLLM's name since
0.11; `reasoning_content` before), the text after the closing tag as `content`.

The reply's reasoning runs from its start (past an opening tag the model wrote itself) to the
closing tag (with qwen3, or to a tool call Qwen 3.5 began without closing it: <tool_call> then
<function=); a reply that never closes it (cut short by max_tokens) is all reasoning and has no
content. A prompt that closed the reasoning already (strand/engine_core/processing/reasoning.py), or
Qwen 3 asked not to think (chat_template_kwargs enable_thinking false), gives a reply that is
all content. A stream sends each piece as it comes, holding back only what may begin a tag;
nothing the model wrote is dropped. What follows the reasoning is the content that a tool-call
parser or a forced tool choice then reads."""

from __future__ import annotations

from dataclasses import dataclass, field

from strand.engine_core.chat_config import ThinkTags, think_tags
from strand.engine_core.processing.reasoning import prompt_ends_reasoning
from strand.services.openai.protocol import ChatCompletionRequest
from strand.services.openai.tool_call import held_back

_CALL_OPEN, _FUNCTION_OPEN = "<tool_call>", "<function="


def _regions(text: str, tags: ThinkTags, final: bool) -> tuple[int, int, int | None]:
    """(reasoning start, reasoning end, content start or None) of a reply so far; a stream's
    (final False) reasoning ends before what may begin a closing tag, and it waits while the
    text may still be the opening one."""
    body = text.lstrip()
    lead = len(text) - len(body)
    if not final and tags.start.startswith(body) and body != tags.start:
        return 0, 0, None  # whitespace, or part of an opening tag: not yet known
    start = lead + len(tags.start) if body.startswith(tags.start) else 0
    end = text.find(tags.end, start)
    call, undecided = _call_start(text, start, end, final) if tags.call_ends else (None, False)
    if call is not None:  # a call before any closing tag: the reasoning ends where it begins
        return start, call, None if undecided else call
    if end >= 0:
        return start, end, end + len(tags.end)
    if final:
        return start, len(text), None
    # Only the last few characters may begin a tag: no copy of the whole reply a delta.
    tail = text[max(start, len(text) - max(len(tags.end), len(_CALL_OPEN))):]
    held = held_back(tail, tags.end)
    if tags.call_ends:
        held = max(held, held_back(tail, _CALL_OPEN))
    return start, len(text) - held, None


def _call_start(text: str, start: int, end: int, final: bool) -> tuple[int | None, bool]:
    """(where a <tool_call><function=... block begins before the closing tag, whether a
    stream cannot tell yet that the tag is a call's); (None, False) where none does."""
    at = text.find(_CALL_OPEN, start)
    while at >= 0 and (end < 0 or at < end):
        after = text[at + len(_CALL_OPEN):at + len(_CALL_OPEN) + 256].lstrip()  # a window
        if after.startswith(_FUNCTION_OPEN):
            return at, False
        if not final and _FUNCTION_OPEN.startswith(after):
            return at, True
        at = text.find(_CALL_OPEN, at + 1)
    return None, False


@dataclass(slots=True)
class Reasoning:
    """One chat request's reasoning split: per choice, what was sent of each part."""

    parser: str
    include: bool = True  # vLLM's include_reasoning: false leaves it out of the response
    thinking_off: bool = False  # Qwen 3 with chat_template_kwargs enable_thinking false
    content_only: dict[int, bool] = field(default_factory=dict)  # job -> no reasoning comes
    streamed: dict[int, str] = field(default_factory=dict)  # choice -> its text so far
    # choice -> how far its reasoning and its content were sent
    sent: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def tags(self) -> ThinkTags:
        return think_tags(self.parser)

    def note_prompt(self, job: int, prompt: str | None) -> None:
        """Whether the job's prompt leaves no reasoning to come (from its first output that
        carries the prompt's text)."""
        if job not in self.content_only and prompt is not None:
            self.content_only[job] = self.thinking_off or prompt_ends_reasoning(prompt,
                                                                              self.tags)

    def split(self, job: int, text: str) -> tuple[str | None, str | None]:
        """A whole reply's (reasoning, content); None for a part it does not have."""
        if self._content_only(job):
            return None, text
        start, end, content = _regions(text, self.tags, final=True)
        return text[start:end], (text[content:] or None) if content is not None else None

    def delta(self, job: int, index: int, piece: str, last: bool) -> tuple[str, str]:
        """A streamed piece's (reasoning, content) to send now ("" for none)."""
        if self._content_only(job):
            return "", piece
        text = self.streamed.get(index, "") + piece
        self.streamed[index] = text
        start, end, content = _regions(text, self.tags, final=last)
        reasoning_to, content_to = self.sent.get(index, (start, -1))
        reasoning = text[max(reasoning_to, start):end]
        shown = ""
        if content is not None:
            shown = text[max(content_to, content):]
            content_to = len(text)
        self.sent[index] = (max(reasoning_to, end), content_to)
        return reasoning, shown

    def _content_only(self, job: int) -> bool:
        return self.content_only.get(job, self.thinking_off)


def reasoning_of(req: ChatCompletionRequest, parser: str | None) -> Reasoning | None:
    """The request's split under the front's parser (None: no parser, no split)."""
    if parser is None:
        return None
    thinking = (req.chat_template_kwargs or {}).get("enable_thinking")
    return Reasoning(parser, include=req.include_reasoning,
                     thinking_off=parser == "qwen3" and thinking is False)
