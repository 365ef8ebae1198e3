"""Sampler: one token per request row from the model's logits, vectorized across the batch.

Order (vLLM's): the grammar bitmask (structured outputs) -> token masks (logit_bias, allowed_token_ids, min_tokens) -> penalties ->
greedy rows take the argmax -> random rows: temperature, top_k, top_p, min_p, softmax, and the
exponential race. Logprobs are of the raw model distribution, before any of this.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from strand.engine_core.core.runner_output import LogprobsLists
from strand.engine_core.model_executor.sampling.logits_processor import (
    LogitsProcessor,
    LogitsProcessors,
)
from strand.engine_core.model_executor.sampling.logprobs import (
    compute_prompt_logprobs,
    gather_logprobs,
)
from strand.engine_core.model_executor.sampling.masks import apply_token_masks
from strand.engine_core.model_executor.sampling.penalties import apply_penalties
from strand.engine_core.model_executor.sampling.top_k_top_p import apply_min_p, apply_top_k_top_p
from strand.engine_core.model_executor.sampling_metadata import (
    SamplingMetadata,
    SamplingRow,
    build_sampling_metadata,
    make_generator,
)
from strand.kernels import cpu_elementwise

__all__ = [
    "Sampler",
    "SamplerOutput",
    "SamplingMetadata",
    "SamplingRow",
    "build_sampling_metadata",
    "compute_prompt_logprobs",
    "make_generator",
]


@dataclass(slots=True)
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [num_reqs] int64
    # Rows aligned with the batch when any row asked for logprobs: column 0 = the sampled
    # token, then the top-k (k = the largest asked), of the raw model distribution.
    logprobs: LogprobsLists | None


class Sampler:
    def __init__(self, logits_processors: Sequence[LogitsProcessor] = ()) -> None:
        # Custom processors (EngineArgs.logits_processors), applied in vLLM v1's places.
        self.logits_processors = LogitsProcessors(logits_processors)

    def __call__(
        self,
        logits: torch.Tensor,  # [num_reqs, vocab] any float dtype
        metadata: SamplingMetadata,
    ) -> SamplerOutput:
        expected = (metadata.num_reqs, metadata.vocab_size)
        if logits.dim() != 2 or tuple(logits.shape) != expected:
            raise ValueError(
                f"logits must have shape [num_reqs, vocab_size] = {list(expected)}, "
                f"got {list(logits.shape)}")
        raw_logprobs = None
        if metadata.max_num_logprobs is not None:
            raw_logprobs = torch.log_softmax(logits.to(torch.float32), dim=-1)
        sampled = self._sample(self.processed_logits(logits, metadata), metadata)

        logprobs = None
        if raw_logprobs is not None:
            assert metadata.max_num_logprobs is not None
            logprobs = gather_logprobs(raw_logprobs, sampled, metadata.max_num_logprobs)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)

    def processed_logits(
        self,
        logits: torch.Tensor,  # [num_reqs, vocab] any float dtype, as the model made them
        metadata: SamplingMetadata,
    ) -> torch.Tensor:  # [num_reqs, vocab] float32: a greedy row's token is its argmax
        """The logits after the grammar, the token masks, custom processors and penalties."""
        custom = self.logits_processors
        # Masks edit in place: copy so the caller's logits stay as the model produced them.
        logits = logits.to(torch.float32, copy=not metadata.masks.is_empty or bool(custom)
                           or metadata.grammar is not None)
        if metadata.grammar is not None:
            # First, as vLLM applies it before the sampler: no bias can revive a banned token.
            from strand.engine_core.structured_output.bitmask import apply_grammar_mask

            logits = apply_grammar_mask(logits, metadata.grammar)
        logits = apply_token_masks(logits, metadata.masks)
        if custom:
            custom.update_state(metadata.rows)
            for processor in custom.non_argmax_invariant:
                logits = processor.apply(logits)
        if metadata.penalties is not None:
            logits = apply_penalties(logits, metadata.penalties)
        return logits

    def random_probs(
        self,
        logits: torch.Tensor,  # [num_reqs, vocab] float32 from processed_logits
        metadata: SamplingMetadata,  # not all greedy
    ) -> torch.Tensor:  # [num_reqs, vocab] float32
        """The distribution a random row draws from: temperature, top-k, top-p, min-p."""
        assert metadata.temperature is not None
        logits = logits / metadata.temperature.unsqueeze(1)
        for processor in self.logits_processors.argmax_invariant:
            logits = processor.apply(logits)
        logits = apply_top_k_top_p(logits, metadata.top_k, metadata.max_top_k, metadata.top_p)
        if metadata.min_p is not None:
            logits = apply_min_p(logits, metadata.min_p)
        return logits.softmax(dim=-1)

    def _sample(
        self,
        logits: torch.Tensor,  # [num_reqs, vocab] float32 after masks and penalties
        metadata: SamplingMetadata,
    ) -> torch.Tensor:  # [num_reqs] int64
        greedy = None
        if not metadata.all_random:
            greedy = argmax_tokens(logits)
            if metadata.all_greedy:
                return greedy
        sampled = exponential_race(self.random_probs(logits, metadata), metadata.generators)
        if greedy is None:
            return sampled
        assert metadata.greedy_mask is not None
        return torch.where(metadata.greedy_mask, greedy, sampled)


def argmax_tokens(logits: torch.Tensor) -> torch.Tensor:  # [num_reqs, vocab] -> [num_reqs]
    """Each row's first maximum (NaN counting as the maximum), as the sampler takes a greedy
    row's token: the runner calls it alone for a batch of argmax_only rows."""
    logits = logits.to(torch.float32)
    if cpu_elementwise.applies(logits) and logits.stride(1) == 1:
        return cpu_elementwise.argmax(logits)
    return logits.argmax(dim=-1)


def exponential_race(
    probs: torch.Tensor,  # [num_reqs, vocab] float32
    generators: dict[int, torch.Generator],
) -> torch.Tensor:  # [num_reqs] int64
    """argmax(p / q) with q ~ Exp(1) picks token i with probability p_i (Gumbel-max in disguise)
    and needs no host sync, unlike torch.multinomial."""
    q = torch.empty_like(probs)
    if len(generators) != probs.shape[0]:
        q.exponential_()  # every unseeded row in one call
    # Seeded rows redraw their own row, so their sample depends only on their own generator.
    for row, generator in generators.items():
        q[row].exponential_(generator=generator)
    # q = 0 would turn a masked token's 0/0 into NaN, which argmax would pick.
    q.clamp_min_(torch.finfo(q.dtype).tiny)
    return probs.div_(q).argmax(dim=-1)
