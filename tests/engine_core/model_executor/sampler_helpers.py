"""Builders for the sampler tests (the directory's conftest belongs to the model runner)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from strand.engine_core.model_executor.sampler import Sampler, SamplerOutput
from strand.engine_core.model_executor.sampling_metadata import (
    SamplingMetadata,
    SamplingRow,
    build_sampling_metadata,
    make_generator,
)
from strand.engine_core.sampling_params import SamplingParams

CPU = torch.device("cpu")


def make_row(
    prompt: Sequence[int] = (0,),
    output: Sequence[int] = (),
    eos: int | None = None,
    **params: Any,
) -> SamplingRow:
    """A row as the runner builds it: the generator comes from params.seed."""
    sampling_params = SamplingParams(**params)
    return SamplingRow(
        params=sampling_params,
        prompt_token_ids=list(prompt),
        output_token_ids=list(output),
        generator=make_generator(sampling_params.seed, CPU),
        eos_token_id=eos,
    )


def make_metadata(rows: list[SamplingRow], vocab_size: int) -> SamplingMetadata:
    return build_sampling_metadata(rows, vocab_size, CPU)


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> SamplerOutput:
    return Sampler()(logits, make_metadata(rows, logits.shape[1]))


def random_logits(num_rows: int, vocab_size: int, seed: int = 0) -> torch.Tensor:
    """Distinct values with a wide spread, so no threshold sits on a tie."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(num_rows, vocab_size, generator=generator) * 2.0


def reference_penalties(
    logits: torch.Tensor,  # [num_reqs, vocab]
    rows: list[SamplingRow],
) -> torch.Tensor:
    """vLLM's penalties written as the plain per-token loop, to check the batched version."""
    out = logits.clone().to(torch.float64)
    for i, row in enumerate(rows):
        p = row.params
        seen = set(row.prompt_token_ids) | set(row.output_token_ids)
        for token in seen:
            value = out[i, token]
            out[i, token] = value / p.repetition_penalty if value > 0 else (
                value * p.repetition_penalty)
        for token in set(row.output_token_ids):
            count = row.output_token_ids.count(token)
            out[i, token] -= p.frequency_penalty * count + p.presence_penalty
    return out
