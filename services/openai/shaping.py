"""RequestOutputs -> OpenAI's response bodies and stream chunks (text_completion and
chat.completion shapes, usage, logprobs)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from engine_core.outputs import CompletionOutput, Logprob, RequestOutput
from services.openai.errors import OpenAIError

DONE = "data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def finish_reason(output: CompletionOutput) -> str | None:
    if output.finish_reason == "error":
        raise OpenAIError(500, "the engine failed this request", type_="server_error")
    return output.finish_reason  # "stop" or "length" (an abort is never shown: its client left)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _token(lp: Logprob | None, token_id: int) -> str:
    return lp.decoded_token if lp is not None and lp.decoded_token is not None else f"<{token_id}>"


def completion_logprobs(output: CompletionOutput, text_offset: int) -> dict[str, Any] | None:
    """Completions' legacy shape: tokens, token_logprobs, top_logprobs, text_offset."""
    if output.logprobs is None:
        return None
    tokens, token_logprobs, top, offsets = [], [], [], []
    for token_id, position in zip(output.token_ids, output.logprobs, strict=False):
        sampled = position.get(token_id)
        text = _token(sampled, token_id)
        tokens.append(text)
        token_logprobs.append(sampled.logprob if sampled is not None else None)
        top.append({_token(lp, tid): lp.logprob for tid, lp in
                    sorted(position.items(), key=lambda kv: kv[1].rank or 0)})
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top,
            "text_offset": offsets}


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
    text_offsets: dict[int, int] = field(default_factory=dict)  # choice -> chars so far
    started: set[int] = field(default_factory=set)  # chat choices that sent their role

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def usage(self) -> dict[str, int]:
        return usage(sum(self.prompt_tokens.values()), sum(self.completion_tokens.values()))

    def _count(self, job: int, out: RequestOutput) -> list[tuple[int, CompletionOutput]]:
        self.prompt_tokens[job] = len(out.prompt_token_ids)
        choices = []
        for c in out.outputs:
            index = job * self.n + c.index
            self.completion_tokens[index] = self.completion_tokens.get(index, 0) + len(c.token_ids)
            choices.append((index, c))
        return choices

    def _logprobs(self, index: int, c: CompletionOutput) -> dict[str, Any] | None:
        if self.chat:
            return chat_logprobs(c, self.num_top_logprobs)
        offset = self.text_offsets.get(index, 0)
        self.text_offsets[index] = offset + len(c.text)
        return completion_logprobs(c, offset)

    def response(self, outputs: list[RequestOutput]) -> dict[str, Any]:
        """The whole (non-streamed) response from each job's final output."""
        choices = []
        for job, out in enumerate(outputs):
            for index, c in self._count(job, out):
                choice: dict[str, Any] = {"index": index, "logprobs": self._logprobs(index, c),
                                          "finish_reason": finish_reason(c)}
                if self.chat:
                    choice["message"] = {"role": "assistant", "content": c.text}
                else:
                    choice["text"] = c.text
                    choice["stop_reason"] = c.stop_reason
                choices.append(choice)
        choices.sort(key=lambda ch: ch["index"])
        return {"id": self.id, "object": self.object, "created": self.created,
                "model": self.model, "choices": choices, "usage": self.usage()}

    def chunks(self, job: int, out: RequestOutput, include_usage: bool) -> list[str]:
        """SSE events for one streamed (DELTA) output: one chunk per choice that moved."""
        events = []
        for index, c in self._count(job, out):
            choice: dict[str, Any] = {"index": index, "logprobs": self._logprobs(index, c),
                                      "finish_reason": finish_reason(c)}
            if self.chat:
                delta: dict[str, Any] = {"content": c.text}
                if index not in self.started:
                    self.started.add(index)
                    delta["role"] = "assistant"
                choice["delta"] = delta
            else:
                choice["text"] = c.text
                choice["stop_reason"] = c.stop_reason
            events.append(sse(self._chunk([choice], include_usage)))
        return events

    def usage_chunk(self) -> str:
        return sse({**self._chunk([], False), "usage": self.usage()})

    def _chunk(self, choices: list[dict[str, Any]], include_usage: bool) -> dict[str, Any]:
        chunk: dict[str, Any] = {"id": self.id,
                                 "object": "chat.completion.chunk" if self.chat else self.object,
                                 "created": self.created, "model": self.model,
                                 "choices": choices}
        if include_usage:
            chunk["usage"] = None  # OpenAI: null on every chunk but the last
        return chunk
