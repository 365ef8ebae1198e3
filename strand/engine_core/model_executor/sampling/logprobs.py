"""Logprobs of the raw model distribution: the chosen token first, then the top-k, with ranks."""

from __future__ import annotations

import torch

from strand.engine_core.core.runner_output import LogprobsLists


def gather_logprobs(
    logprobs: torch.Tensor,  # [num_rows, vocab] float32 log_softmax of the raw logits
    token_ids: torch.Tensor,  # [num_rows] int64: the sampled (or next prompt) token
    num_logprobs: int,
) -> LogprobsLists:
    if num_logprobs < -1:
        raise ValueError(f"num_logprobs must be >= -1 (-1: the whole vocabulary), "
                         f"got {num_logprobs}")
    if num_logprobs == -1:  # vLLM: -1 asks for every token of the vocabulary
        num_logprobs = logprobs.shape[1]
    token_ids = token_ids.to(torch.int64).unsqueeze(1)  # [num_rows, 1]
    token_logprobs = logprobs.gather(1, token_ids)  # [num_rows, 1]
    # Rank 1 = best; ties with the chosen token do not push it down.
    ranks = (logprobs > token_logprobs).sum(dim=-1) + 1  # [num_rows]
    ids, values = token_ids, token_logprobs
    if num_logprobs > 0:
        k = min(num_logprobs, logprobs.shape[1])
        top_values, top_ids = logprobs.topk(k, dim=-1)  # [num_rows, k]
        ids = torch.cat([token_ids, top_ids], dim=1)
        values = torch.cat([token_logprobs, top_values], dim=1)
    # One host transfer per tensor, not one per row.
    return LogprobsLists(
        logprob_token_ids=ids.tolist(),
        logprobs=values.tolist(),
        sampled_token_ranks=ranks.tolist(),
    )


def compute_prompt_logprobs(
    logits: torch.Tensor,  # [num_positions, vocab]
    target_token_ids: torch.Tensor,  # [num_positions] the next prompt token at each position
    num_logprobs: int,
) -> LogprobsLists:
    if logits.dim() != 2 or target_token_ids.shape != (logits.shape[0],):
        raise ValueError(
            f"target_token_ids must have shape [{logits.shape[0]}] matching the logits rows, "
            f"got {tuple(target_token_ids.shape)} for logits {tuple(logits.shape)}")
    logprobs = torch.log_softmax(logits.to(torch.float32), dim=-1)
    return gather_logprobs(logprobs, target_token_ids.to(logits.device), num_logprobs)
