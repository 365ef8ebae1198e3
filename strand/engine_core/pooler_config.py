"""PoolerConfig and the runners: how a pooling engine pools (vLLM's pooler_config), validated.

Plain data beside config.py, which validates EngineArgs.runner and pooler_config with it;
pooling itself is strand/engine_core/pooling/. Imports nothing from strand."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POOLING_TYPES = ("LAST", "MEAN", "CLS")
RUNNERS = ("generate", "pooling")


@dataclass(frozen=True, slots=True)
class PoolerConfig:
    pooling_type: str = "LAST"
    normalize: bool = True
    # Set by the engine from the model (not a pooler_config key): a classifier's label count;
    # 0 for a model that embeds.
    num_labels: int = 0
    activation: str = "softmax"  # a classifier's: "sigmoid" | "softmax" | "identity"
    # Matryoshka embeddings (config.json's is_matryoshka / matryoshka_dimensions, which
    # hf_overrides may set): whether PoolingParams.dimensions may shorten the vector, to which
    # widths (empty: any up to hidden_size), and the full width.
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()
    hidden_size: int = 0

    @property
    def task(self) -> str:
        """What the model's pooler does for a request that names no task."""
        return "classify" if self.num_labels else "embed"

    @staticmethod
    def from_dict(values: dict[str, Any] | None) -> PoolerConfig:
        """ValueError naming pooler_config.<key> for an unknown key or a bad value."""
        values = dict(values or {})
        unknown = sorted(set(values) - {"pooling_type", "normalize"})
        if unknown:
            raise ValueError(f"pooler_config has unknown keys {unknown}; allowed: "
                             "['normalize', 'pooling_type']")
        kind = values.get("pooling_type", "LAST")
        if not isinstance(kind, str) or kind.upper() not in POOLING_TYPES:
            raise ValueError(f"pooler_config.pooling_type must be one of {list(POOLING_TYPES)}, "
                             f"got {kind!r}")
        normalize = values.get("normalize", True)
        if not isinstance(normalize, bool):
            raise ValueError(f"pooler_config.normalize must be a bool, got {normalize!r}")
        return PoolerConfig(kind.upper(), normalize)

    @property
    def needs_every_row(self) -> bool:
        """Whether pooling reads hidden states of positions before the last: such a request
        must compute its whole prompt (no prefix-cache or connector hit skips a position)."""
        return self.pooling_type != "LAST"
