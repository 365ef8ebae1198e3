"""PoolingParams and PoolerConfig: what an embedding request asks, and how the model pools.

vLLM's names and defaults: a decoder model served with runner="pooling" embeds a prompt as the
final-norm hidden state of its last token ("LAST"), L2-normalised. pooler_config may ask for the
mean over the prompt's tokens ("MEAN") or its first token ("CLS") instead, and normalize=False.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine_core.sampling_params import RequestOutputKind, SamplingParams

if TYPE_CHECKING:  # the tokenizer and detokenizer stages load no torch
    import torch

POOLING_TYPES = ("LAST", "MEAN", "CLS")
RUNNERS = ("generate", "pooling")


@dataclass(frozen=True, slots=True)
class PoolerConfig:
    pooling_type: str = "LAST"
    normalize: bool = True

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


@dataclass(slots=True)
class PoolingParams:
    """vLLM's PoolingParams for LLM.embed and /v1/embeddings."""

    # Keep only the last k prompt tokens (-1: the last max_model_len), as SamplingParams' own.
    truncate_prompt_tokens: int | None = None
    # Matryoshka output width: refused, as vLLM refuses it for a model not trained for it.
    dimensions: int | None = None
    # None: the engine's pooler_config.normalize.
    normalize: bool | None = None
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY

    def __post_init__(self) -> None:
        keep = self.truncate_prompt_tokens
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int)
                                 or (keep < 1 and keep != -1)):
            raise ValueError(f"truncate_prompt_tokens must be >= 1 or -1, got {keep!r}")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be a bool or None, got {self.normalize!r}")
        if self.dimensions is not None:
            raise ValueError(f"dimensions must be unset: the model does not support matryoshka "
                             f"representation, and changing the output dimensions "
                             f"({self.dimensions}) would give poor embeddings")

    def finish(self, embedding: torch.Tensor) -> torch.Tensor:
        """The pooled embedding as the request asked: L2-normalised unless normalize is False
        (the engine resolved None to its pooler_config's)."""
        if self.normalize is False:
            return embedding
        return embedding / embedding.norm().clamp_min(1e-12)  # torch's F.normalize

    def clone(self) -> PoolingParams:
        return PoolingParams(self.truncate_prompt_tokens, self.dimensions, self.normalize,
                             self.output_kind)

    def carrier(self) -> SamplingParams:
        """What the request carries through the scheduler's and runner's sampling paths: one
        step past its prompt at most, never sampled (the runner pools its rows instead), never
        detokenized."""
        return SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                              truncate_prompt_tokens=self.truncate_prompt_tokens,
                              output_kind=RequestOutputKind.FINAL_ONLY)


def check_runner_fits(pooling_params: PoolingParams | None, runner: str) -> None:
    """ValueError when a request's kind is not what the engine's runner does."""
    if runner == "pooling" and pooling_params is None:
        raise ValueError("params must be a PoolingParams: this engine's runner is 'pooling', "
                         "which embeds prompts (LLM.embed); start one with runner='generate' "
                         "to generate")
    if runner != "pooling" and pooling_params is not None:
        raise ValueError(f"params is a PoolingParams, but this engine's runner is {runner!r}: "
                         "start it with runner='pooling' (--runner pooling) to embed")
