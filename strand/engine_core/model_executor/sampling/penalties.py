"""Presence, frequency and repetition penalties (vLLM's semantics), batched with scatter_add."""

from __future__ import annotations

import torch

from strand.engine_core.model_executor.sampling_metadata import PenaltyMetadata


def token_counts(
    token_ids: torch.Tensor,  # [num_reqs, max_len] int64, padded with vocab_size
    vocab_size: int,
) -> torch.Tensor:  # [num_reqs, vocab_size] int64
    """How often each token occurs in each row; the pad id lands in a column that is dropped."""
    counts = torch.zeros(token_ids.shape[0], vocab_size + 1, dtype=torch.int64,
                         device=token_ids.device)
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids))
    return counts[:, :vocab_size]


def apply_penalties(
    logits: torch.Tensor,  # [num_reqs, vocab] float32
    penalties: PenaltyMetadata,
) -> torch.Tensor:  # [num_reqs, vocab] float32
    vocab_size = logits.shape[1]
    output_counts = token_counts(penalties.output_token_ids, vocab_size)
    output_seen = output_counts > 0  # [num_reqs, vocab] bool
    if penalties.prompt_token_ids is not None:
        seen = output_seen | (token_counts(penalties.prompt_token_ids, vocab_size) > 0)
        # Penalty 1.0 where a token was never seen, so the division/multiplication is a no-op.
        rep = torch.where(seen, penalties.repetition.unsqueeze(1), 1.0)  # [num_reqs, vocab]
        logits = torch.where(logits > 0, logits / rep, logits * rep)
    logits = logits - penalties.frequency.unsqueeze(1) * output_counts
    logits = logits - penalties.presence.unsqueeze(1) * output_seen
    return logits
