"""RequestOutputs -> OpenAI's response bodies and stream chunks (text_completion and
chat.completion shapes, usage, logprobs)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from strand.engine_core.outputs import CompletionOutput, Logprob, RequestOutput
from strand.services.openai.echo import Echo, Position
from strand.services.openai.errors import OpenAIError, from_exception
from strand.services.openai.reasoning import Reasoning
from strand.services.openai.tools import ToolChoice

DONE = "data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def finish_reason(output: CompletionOutput) -> str | None:
    if output.finish_reason == "error":
        raise OpenAIError(500, "the engine failed this request", type_="server_error")
    return output.finish_reason  # "stop" or "length" (an abort is never shown: its client left)


def usage(prompt_tokens: int, completion_tokens: int,
          cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage; with cached_tokens (--enable-prompt-tokens-details) its
    prompt_tokens_details: the prompt tokens the prefix cache held."""
    body: dict[str, Any] = {"prompt_tokens": prompt_tokens,
                            "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return body


def _token(lp: Logprob | None, token_id: int) -> str:
    return lp.decoded_token if lp is not None and lp.decoded_token is not None else f"<{token_id}>"


def completion_logprobs(token_ids: list[int], rows: list[Position], text_offset: int,
                        first_token: str | None = None) -> dict[str, Any]:
    """Completions' legacy shape: tokens, token_logprobs, top_logprobs, text_offset. A row
    that is None (an echoed prompt's first token) has null logprobs, its text first_token."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for token_id, position in zip(token_ids, rows, strict=False):
        if position is None:
            text = first_token if first_token is not None else f"<{token_id}>"
            token_logprobs.append(None)
            top.append(None)
        else:
            sampled = position.get(token_id)
            text = _token(sampled, token_id)
            token_logprobs.append(sampled.logprob if sampled is not None else None)
            top.append({_token(lp, tid): lp.logprob for tid, lp in
                        sorted(position.items(), key=lambda kv: kv[1].rank or 0)})
        tokens.append(text)
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top,
            "text_offset": offsets}


def prompt_logprobs_json(out: RequestOutput) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's prompt_logprobs field: per prompt position, token id -> logprob, rank and
    decoded token (None at the first position, which nothing precedes)."""
    return [None if position is None else
            {str(tid): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
             for tid, lp in position.items()}
            for position in out.prompt_logprobs or []]


def chat_logprobs(output: CompletionOutput, num_top: int) -> dict[str, Any] | None:
    """Chat's shape: content = [{token, logprob, bytes, top_logprobs: [...]}, ...]."""
    if output.logprobs is None:
        return None
    content = []
    for token_id, position in zip(output.token_ids, output.logprobs, strict=False):
        sampled = position.get(token_id)
        text = _token(sampled, token_id)
        ranked = sorted((lp for tid, lp in position.items() if lp.rank is not None),
                        key=lambda lp: lp.rank or 0)[:num_top]
        content.append({
            "token": text, "logprob": sampled.logprob if sampled is not None else None,
            "bytes": list(text.encode()),
            "top_logprobs": [{"token": lp.decoded_token or "", "logprob": lp.logprob,
                              "bytes": list((lp.decoded_token or "").encode())}
                             for lp in ranked]})
    return {"content": content}


def first_call_only(part: dict[str, Any]) -> dict[str, Any]:
    """A message's first tool call, or a delta's calls of index 0 (and none where that leaves
    none): what vLLM answers to parallel_tool_calls false."""
    calls = part.get("tool_calls")
    if not calls:
        return part
    kept = calls[:1] if "index" not in calls[0] else [c for c in calls if c["index"] == 0]
    out = {k: v for k, v in part.items() if k != "tool_calls"}
    return {**out, "tool_calls": kept} if kept else out


@dataclass(slots=True)
class Shaper:
    """One HTTP request's response: its id, kind and the running counts a stream needs."""

    chat: bool
    model: str
    n: int
    num_top_logprobs: int = 0
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    prompt_tokens: dict[int, int] = field(default_factory=dict)  # job -> prompt length
    completion_tokens: dict[int, int] = field(default_factory=dict)  # choice -> tokens so far
    cached_tokens: dict[int, int] = field(default_factory=dict)  # job -> prompt tokens cached
    text_offsets: dict[int, int] = field(default_factory=dict)  # choice -> chars so far
    started: set[int] = field(default_factory=set)  # chat choices already begun
    echo: Echo | None = None  # completions' echo: the prompts before the text
    prompt_logprobs: bool = False  # vLLM's prompt_logprobs: per completion choice, once a chat
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats
    tool: ToolChoice | None = None  # forced tool calls: each choice's text is their JSON
    one_call: bool = False  # parallel_tool_calls false: only a choice's first call goes out
    reasoning: Reasoning | None = None  # --reasoning-parser: the reasoning apart, first
    tool_started: set[int] = field(default_factory=set)  # choices whose text reached the tool
    token_details: bool = False  # vLLM's --enable-prompt-tokens-details: cached_tokens in usage
    chat_echo: str = ""  # chat's echo: the assistant's begun reply, before each choice's text

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def usage(self) -> dict[str, Any]:
        cached = sum(self.cached_tokens.values()) if self.token_details else None
        return usage(sum(self.prompt_tokens.values()), sum(self.completion_tokens.values()),
                     cached)

    def _count(self, job: int, out: RequestOutput) -> list[tuple[int, CompletionOutput]]:
        self.prompt_tokens[job] = len(out.prompt_token_ids)
        self.cached_tokens[job] = max(self.cached_tokens.get(job, 0), out.num_cached_tokens)
        choices = []
        for c in out.outputs:
            index = job * self.n + c.index
            self.completion_tokens[index] = self.completion_tokens.get(index, 0) + len(c.token_ids)
            choices.append((index, c))
        return choices

    def _completion(self, job: int, index: int, out: RequestOutput, c: CompletionOutput
                    ) -> tuple[str, dict[str, Any] | None] | None:
        """A completion choice's next (text, logprobs), the echoed prompt first; None while an
        echoing stream has nothing to show for it yet."""
        rows: list[Position] = list(c.logprobs or [])
        parts = ((c.text, c.token_ids, rows, None) if self.echo is None
                 else self.echo.choice(job, index, out, c))
        if parts is None:
            return None
        text, token_ids, rows, first_token = parts
        offset = self.text_offsets.get(index, 0)
        self.text_offsets[index] = offset + len(text)
        if c.logprobs is None:
            return text, None
        return text, completion_logprobs(token_ids, rows, offset, first_token)

    def _choice(self, job: int, index: int, out: RequestOutput, c: CompletionOutput,
                key: str) -> dict[str, Any] | None:
        """One choice's fields; chat's text under `key` ("message" or "delta")."""
        choice: dict[str, Any] = {"index": index, "finish_reason": finish_reason(c)}
        if self.chat:
            choice["logprobs"] = chat_logprobs(c, self.num_top_logprobs)
            if self.reasoning is not None:
                self.reasoning.note_prompt(job, out.prompt)
            choice[key] = self._chat_text(job, index, c.text, streamed=key == "delta",
                                          last=c.finish_reason is not None)
            if self.tool is not None:  # after the text: whether it made calls
                choice["finish_reason"] = self.tool.finish(index, choice["finish_reason"])
            return choice
        part = self._completion(job, index, out, c)
        if part is None:
            return None
        choice["text"], choice["logprobs"] = part
        choice["stop_reason"] = c.stop_reason
        return choice

    def _chat_text(self, job: int, index: int, text: str, streamed: bool,
                   last: bool = False) -> dict[str, Any]:
        """A chat choice's message (or a stream's next delta, the role in its first), the
        echoed reply first where asked."""
        first = index not in self.started
        self.started.add(index)
        part = self._chat_part(job, index, text, streamed, first, last)
        if self.chat_echo and (first or not streamed):
            part = {**part, "content": self.chat_echo + (part.get("content") or "")}
        return part

    def _chat_part(self, job: int, index: int, text: str, streamed: bool, first: bool,
                   last: bool) -> dict[str, Any]:
        """Its reasoning apart under a reasoning parser (reasoning.py), then its text, or with
        tool calls the calls its text holds (tools.py, tool_parser.py)."""
        if self.reasoning is None:
            return self._content(index, text, streamed, first, last)
        if streamed:
            reasoning, text = self.reasoning.delta(job, index, text, last)
            part = self._content(index, text, streamed, first, last) if text or last else (
                {"role": "assistant"} if first else {})
            if not text and part.get("content") == "":
                del part["content"]  # a delta of reasoning alone
        else:
            whole, content = self.reasoning.split(job, text)
            part = self._content(index, content or "", streamed, first, last)
            reasoning = whole or ""
            if part.get("content") == "" and not part.get("tool_calls"):
                part = {**part, "content": None}  # vLLM's: no text after the reasoning
        if reasoning and self.reasoning.include:
            part["reasoning"] = reasoning
        return part

    def _content(self, index: int, text: str, streamed: bool, first: bool,
                 last: bool) -> dict[str, Any]:
        """The text (after any reasoning) as content, or the tool calls it holds."""
        if self.tool is not None:
            if streamed:
                tool_first = index not in self.tool_started
                self.tool_started.add(index)
                part = self.tool.delta(index, text, tool_first, last)
                if not first:  # the role went with the reasoning's first delta
                    part = {k: v for k, v in part.items() if k != "role"}
                elif "role" not in part:
                    part = {"role": "assistant", **part}
            else:
                part = self.tool.message(index, text)
            return first_call_only(part) if self.one_call else part
        if streamed and not first:
            return {"content": text}
        return {"role": "assistant", "content": text}

    def response(self, outputs: list[RequestOutput]) -> dict[str, Any]:
        """The whole (non-streamed) response from each job's final output."""
        choices = []
        for job, out in enumerate(outputs):
            if self.echo is not None:
                self.echo.collect(job, out)
            for index, c in self._count(job, out):
                choice = self._choice(job, index, out, c, "message")
                assert choice is not None  # a final output has its tokens
                if self.prompt_logprobs and not self.chat:  # vLLM: per completion choice
                    choice["prompt_logprobs"] = prompt_logprobs_json(out)
                choices.append(choice)
        choices.sort(key=lambda ch: ch["index"])
        body = {"id": self.id, "object": self.object, "created": self.created,
                "model": self.model, "choices": choices, "usage": self.usage()}
        if self.prompt_logprobs and self.chat:  # vLLM: once, for the one prompt
            body["prompt_logprobs"] = prompt_logprobs_json(outputs[0])
        return body

    def chunks(self, job: int, out: RequestOutput, include_usage: bool) -> list[str]:
        """SSE events for one streamed (DELTA) output: one chunk per choice that moved."""
        return [sse(self._chunk([choice], include_usage)) for choice in self.moved(job, out)]

    def moved(self, job: int, out: RequestOutput) -> list[dict[str, Any]]:
        """The choices one streamed (DELTA) output moved, each with its delta."""
        if self.echo is not None:
            self.echo.collect(job, out)
        moved = []
        for index, c in self._count(job, out):
            choice = self._choice(job, index, out, c, "delta")
            if choice is not None:
                moved.append(choice)
        return moved

    def usage_chunk(self) -> str:
        return sse({**self._chunk([], False), "usage": self.usage()})

    def _chunk(self, choices: list[dict[str, Any]], include_usage: bool) -> dict[str, Any]:
        chunk: dict[str, Any] = {"id": self.id,
                                 "object": "chat.completion.chunk" if self.chat else self.object,
                                 "created": self.created, "model": self.model,
                                 "choices": choices}
        if include_usage:
            # OpenAI: null on every chunk but the last; vLLM's continuous_usage_stats: the
            # counts so far on each.
            chunk["usage"] = self.usage() if self.continuous_usage else None
        return chunk


@dataclass(slots=True)
class ChatEvents:
    """A chat or completion stream's SSE events, as app.py writes them: each output's chunks,
    the usage chunk where asked, an error as its body, then [DONE]."""

    shaper: Shaper
    include_usage: bool

    def start(self) -> list[str]:
        return []

    def output(self, job: int, out: RequestOutput) -> list[str]:
        return self.shaper.chunks(job, out, self.include_usage)

    def end(self) -> list[str]:
        return [self.shaper.usage_chunk()] if self.include_usage else []

    def error(self, exc: Exception) -> str:
        return sse(from_exception(exc).body())

    def after(self) -> list[str]:
        return [DONE]
