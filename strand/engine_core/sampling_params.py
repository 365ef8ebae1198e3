"""SamplingParams: what a user asks of one request's sampling, validated with vLLM's bounds."""

from __future__ import annotations

import enum
import json
import logging
import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from strand.engine_core.structured_output.params import StructuredOutputsParams

logger = logging.getLogger(__name__)

# The engine's default cap on logprobs / prompt_logprobs (EngineArgs.max_logprobs); the cap itself
# is checked by the InputProcessor, which knows the engine's setting.
MAX_LOGPROBS = 20
_GREEDY_EPS = 1e-5
# vLLM's _MAX_TEMP: below it, logits / temperature overflows to inf and softmax gives NaN.
_MIN_RANDOM_TEMPERATURE = 1e-2


class RequestOutputKind(enum.IntEnum):
    CUMULATIVE = 0  # every RequestOutput carries the whole text and token ids so far
    DELTA = 1  # only what is new since the previous RequestOutput
    FINAL_ONLY = 2  # a single RequestOutput when the request finishes


@dataclass(slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # Words never generated: a word's last token is banned once the output ends with the rest
    # of it (each word tokenized alone and after a space, as vLLM does).
    bad_words: list[str] | None = None
    # False: token ids only; text stays "" and logprobs carry no decoded_token.
    detokenize: bool = True
    # Keep only the last k prompt tokens (-1: the last max_model_len).
    truncate_prompt_tokens: int | None = None
    # Free-form, JSON-serialisable; custom logits processors read their options here.
    extra_args: dict[str, Any] | None = None
    # Set by the InputProcessor from bad_words (needs the tokenizer); travels to the sampler.
    bad_words_token_ids: list[list[int]] | None = None
    # Constrain the output to a JSON schema, regex, choice, grammar or any JSON object.
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = _structured_from_dict(self.structured_outputs)
        if self.top_k == -1:
            self.top_k = 0
        if self.seed == -1:  # vLLM: -1 means "no seed", as None does
            self.seed = None
        if 0.0 < self.temperature < _MIN_RANDOM_TEMPERATURE:
            logger.warning("temperature %s is below %s, which may cause NaN or inf in the "
                           "sampler; it is raised to %s", self.temperature,
                           _MIN_RANDOM_TEMPERATURE, _MIN_RANDOM_TEMPERATURE)
            self.temperature = _MIN_RANDOM_TEMPERATURE
        self.validate()
        if self.is_greedy:
            # Greedy: the truncations cannot change an argmax, so they are normalised away
            # (after validation, as vLLM does: a bad top_p is still refused).
            self.top_p = 1.0
            self.top_k = 0
            self.min_p = 0.0

    @classmethod
    def from_validated(cls, **values: Any) -> SamplingParams:
        """Rebuild params that a stage upstream already validated and normalised (the tokenizer
        stage, over the ring): carried as data, not checked a second time in the engine and the
        detokenizer. Fields not given take their defaults."""
        obj = cls.__new__(cls)
        for f in fields(cls):
            if f.name in values:
                value = values[f.name]
            elif f.default_factory is not MISSING:
                value = f.default_factory()
            else:
                value = f.default
            object.__setattr__(obj, f.name, value)
        return obj

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def all_stop_token_ids(self) -> set[int]:
        return set(self.stop_token_ids)

    def validate(self) -> None:
        """Raise ValueError naming the field and its bound. Called on construction."""
        _check(isinstance(self.n, int) and self.n >= 1, "n", "must be >= 1", self.n)
        _check(0.0 <= self.temperature <= 2.0, "temperature", "must be in [0, 2]", self.temperature)
        _check(0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]", self.top_p)
        _check(isinstance(self.top_k, int) and self.top_k >= 0, "top_k",
               "must be >= -1 (0 or -1 disables it)", self.top_k)
        _check(0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]", self.min_p)
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]",
               self.presence_penalty)
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]",
               self.frequency_penalty)
        _check(math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0.0,
               "repetition_penalty", "must be finite and > 0", self.repetition_penalty)
        if self.max_tokens is not None:
            _check(isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens",
                   "must be >= 1", self.max_tokens)
        _check(isinstance(self.min_tokens, int) and self.min_tokens >= 0, "min_tokens",
               "must be >= 0", self.min_tokens)
        if self.max_tokens is not None:
            _check(self.min_tokens <= self.max_tokens, "min_tokens",
                   f"must be <= max_tokens ({self.max_tokens})", self.min_tokens)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                # -1: the whole vocabulary; the engine's max_logprobs is checked on admission.
                _check(isinstance(value, int) and value >= -1, name,
                       "must be >= -1 (-1: the whole vocabulary)", value)
        _check(all(isinstance(s, str) and s for s in self.stop), "stop",
               "must not contain an empty string", self.stop)
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True (they are matched on text), "
                             f"got stop={self.stop!r}")
        if self.bad_words is not None:
            _check(isinstance(self.bad_words, list)
                   and all(isinstance(w, str) and w.strip() for w in self.bad_words),
                   "bad_words", "must be a list of non-blank strings", self.bad_words)
        if self.bad_words_token_ids is not None:
            _check(all(isinstance(ids, list) and ids
                       and all(isinstance(t, int) and t >= 0 for t in ids)
                       for ids in self.bad_words_token_ids),
                   "bad_words_token_ids", "must be non-empty lists of token ids",
                   self.bad_words_token_ids)
        if self.truncate_prompt_tokens is not None:
            _check(isinstance(self.truncate_prompt_tokens, int)
                   and (self.truncate_prompt_tokens >= 1 or self.truncate_prompt_tokens == -1),
                   "truncate_prompt_tokens", "must be an integer >= 1 or -1",
                   self.truncate_prompt_tokens)
        if self.extra_args is not None:
            _check(isinstance(self.extra_args, dict)
                   and all(isinstance(k, str) for k in self.extra_args),
                   "extra_args", "must be a dict with str keys", self.extra_args)
            try:
                json.dumps(self.extra_args)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"extra_args must be JSON-serialisable: {exc}") from None
        _check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids), "stop_token_ids",
               "must be non-negative token ids", self.stop_token_ids)
        if self.seed is not None:
            _check(isinstance(self.seed, int) and 0 <= self.seed < 2**63, "seed",
                   "must be in [0, 2**63)", self.seed)
        if self.allowed_token_ids is not None:
            _check(len(self.allowed_token_ids) > 0, "allowed_token_ids", "must not be empty",
                   self.allowed_token_ids)
        if self.structured_outputs is not None:
            _check(isinstance(self.structured_outputs, StructuredOutputsParams),
                   "structured_outputs", "must be a StructuredOutputsParams",
                   type(self.structured_outputs).__name__)
            self.structured_outputs.validate()
        if self.n > 1:
            _check(not self.is_greedy, "n",
                   "must be 1 for greedy sampling (temperature=0): the n outputs would be identical",
                   self.n)

    def validate_against_vocab(self, vocab_size: int) -> None:
        """Bounds that need the model: every token id the params name must be in the vocab."""
        for name in ("stop_token_ids", "allowed_token_ids"):
            ids = getattr(self, name) or []
            bad = [t for t in ids if not 0 <= t < vocab_size]
            _check(not bad, name, f"token ids must be in [0, {vocab_size})", bad)
        if self.logit_bias:
            bad = [t for t in self.logit_bias if not 0 <= int(t) < vocab_size]
            _check(not bad, "logit_bias", f"token ids must be in [0, {vocab_size})", bad)
        if self.bad_words_token_ids:
            bad = [t for ids in self.bad_words_token_ids for t in ids if not 0 <= t < vocab_size]
            _check(not bad, "bad_words", f"token ids must be in [0, {vocab_size})", bad)

    def clone(self, **changes: Any) -> SamplingParams:
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values.update(changes)
        return SamplingParams(**values)


def _structured_from_dict(values: dict[str, Any]) -> StructuredOutputsParams:
    known = set(StructuredOutputsParams.__dataclass_fields__)
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"structured_outputs has unknown keys {unknown}; allowed: "
                         f"{sorted(known)}")
    return StructuredOutputsParams(**values)


def _check(ok: bool, name: str, bound: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{name} {bound}, got {_shown(value)}")


def _shown(value: object, limit: int = 200) -> str:
    """The offending value for an error message, cut short: a message must never carry an
    unbounded input (a gRPC status message has to fit the metadata limit)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f", {len(value)} items" if isinstance(value, list | dict | tuple | set) else ""  # type: ignore[arg-type]
    return f"{text[:limit]}... ({len(text)} characters{size})"
