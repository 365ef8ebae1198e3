"""SpeculativeConfig: vLLM's speculative_config dict for the "ngram" method, validated.

Plain data beside config.py, which validates EngineArgs.speculative_config with it; the
drafting itself is strand/engine_core/spec_decode/. Imports nothing from strand."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

METHODS = ("ngram",)
# vLLM's default n-gram length when neither prompt_lookup_min nor prompt_lookup_max is given.
DEFAULT_LOOKUP = 5
# A draft longer than this only adds rejected rows to each step.
MAX_SPECULATIVE_TOKENS = 32
_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
         "disable_by_batch_size")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int
    method: str = "ngram"
    # vLLM's: no drafts in a step while more requests than this run (a batch that size keeps
    # the machine busy without them, and drafts would only take rows from it). None: always.
    disable_by_batch_size: int | None = None

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> SpeculativeConfig:
        """vLLM's keys; ValueError naming the key and its bound for anything else."""
        if not isinstance(spec, dict):
            raise ValueError(f"speculative_config must be a JSON object, got "
                             f"{type(spec).__name__}")
        unknown = sorted(set(spec) - set(_KEYS))
        if unknown:
            raise ValueError(f"speculative_config.{unknown[0]} is not supported (keys: "
                             f"{', '.join(_KEYS)})")
        method = spec.get("method", "ngram")
        if method not in METHODS:
            raise ValueError(f"speculative_config.method must be one of {list(METHODS)} (prompt "
                             f"lookup; draft models are not supported), got {method!r}")
        k = _int(spec, "num_speculative_tokens", None)
        if k is None:
            raise ValueError("speculative_config.num_speculative_tokens is required")
        if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative_config.num_speculative_tokens must be in [1, "
                             f"{MAX_SPECULATIVE_TOKENS}], got {k}")
        low = _int(spec, "prompt_lookup_min", None)
        high = _int(spec, "prompt_lookup_max", None)
        # vLLM's rule: one given sets the other; neither given, both are 5.
        if low is None and high is None:
            low = high = DEFAULT_LOOKUP
        low = high if low is None else low
        high = low if high is None else high
        assert low is not None and high is not None
        if low < 1:
            raise ValueError(f"speculative_config.prompt_lookup_min must be >= 1, got {low}")
        if high < low:
            raise ValueError(f"speculative_config.prompt_lookup_max must be >= "
                             f"prompt_lookup_min ({low}), got {high}")
        limit = _int(spec, "disable_by_batch_size", None)
        if limit is not None and limit < 2:
            raise ValueError(f"speculative_config.disable_by_batch_size must be >= 2, got "
                             f"{limit}")
        return cls(k, low, high, method, limit)


def _int(spec: dict[str, Any], key: str, default: int | None) -> int | None:
    value = spec.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"speculative_config.{key} must be an integer, got {value!r}")
    return value
