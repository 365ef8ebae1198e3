"""Bounds on what one request may ask for, checked before any work is done for it.

A request that is legal but huge (n=100000, a 10 MB prompt, 100k stop token ids) would
otherwise allocate for, or stall, everyone else; each bound has a clear error naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strand.engine_core.sampling_params import SamplingParams

# Bytes of prompt text per token of context that any real tokenizer stays far below: a prompt
# longer than this cannot fit max_model_len, and it is refused before the tokenizer sees it.
_BYTES_PER_TOKEN_BOUND = 64
_MIN_PROMPT_BYTES = 1 << 16


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_n: int = 128
    max_stop_strings: int = 64
    max_stop_string_chars: int = 1024
    max_stop_token_ids: int = 1024
    max_logit_bias: int = 1024
    max_bad_words: int = 1024
    max_prompt_bytes: int | None = None  # None: from max_model_len

    def prompt_bytes_bound(self, max_model_len: int) -> int:
        if self.max_prompt_bytes is not None:
            return self.max_prompt_bytes
        return max(_MIN_PROMPT_BYTES, _BYTES_PER_TOKEN_BOUND * max_model_len)


def check_params(params: SamplingParams, limits: RequestLimits, max_model_len: int) -> None:
    _at_most("n", params.n, limits.max_n)
    if params.max_tokens is not None and params.max_tokens > max_model_len:
        raise ValueError(f"max_tokens must be <= max_model_len ({max_model_len}), got "
                         f"{params.max_tokens}")
    _at_most("stop", len(params.stop), limits.max_stop_strings, "strings")
    longest = max((len(s) for s in params.stop), default=0)
    if longest > limits.max_stop_string_chars:
        raise ValueError(f"stop strings must be at most {limits.max_stop_string_chars} "
                         f"characters each, got one of {longest}")
    _at_most("stop_token_ids", len(params.stop_token_ids), limits.max_stop_token_ids, "ids")
    _at_most("logit_bias", len(params.logit_bias or {}), limits.max_logit_bias, "entries")
    _at_most("bad_words", len(params.bad_words or []), limits.max_bad_words, "entries")


def check_prompt_size(prompt: Any, limits: RequestLimits, max_model_len: int) -> None:
    """Refuse oversized prompt text before tokenizing it (which would stall the stage)."""
    bound = limits.prompt_bytes_bound(max_model_len)
    texts: list[str] = []
    if isinstance(prompt, str):
        texts = [prompt]
    elif isinstance(prompt, dict):
        texts += [prompt[key] for key in ("prompt", "text_pair")
                  if isinstance(prompt.get(key), str)]
        messages = prompt.get("messages")
        if isinstance(messages, list):  # what a template writes of them: text and reasoning
            texts += [m[key] for m in messages if isinstance(m, dict)
                      for key in ("content", "reasoning", "reasoning_content")
                      if isinstance(m.get(key), str)]
        ids = prompt.get("prompt_token_ids")
        if isinstance(ids, list) and len(ids) > max_model_len:
            raise ValueError(f"prompt is {len(ids)} tokens, longer than max_model_len "
                             f"({max_model_len})")
    check_text_size(texts, bound, max_model_len, "prompt")


def check_text_size(texts: list[str], bound: int, max_model_len: int, what: str) -> None:
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    if size > bound:
        raise ValueError(f"{what} must be at most {bound} bytes of text (it could not fit "
                         f"max_model_len {max_model_len}), got {size} bytes")


def _at_most(name: str, value: int, bound: int, unit: str = "") -> None:
    if value > bound:
        what = f" {unit}" if unit else ""
        raise ValueError(f"{name} must be <= {bound}{what}, got {value}")
