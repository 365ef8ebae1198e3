"""Truncation of the distribution: top_k, top_p (nucleus) and min_p, on logits after temperature.

Masked tokens get -inf, so softmax gives them exactly zero probability.
"""

from __future__ import annotations

import torch

_NEG_INF = float("-inf")


def apply_top_k_top_p(
    logits: torch.Tensor,  # [num_reqs, vocab] float32
    top_k: torch.Tensor | None,  # [num_reqs] int64 in [1, vocab]; vocab = off
    max_top_k: int,
    top_p: torch.Tensor | None,  # [num_reqs] float32 in (0, 1]; 1 = off
) -> torch.Tensor:
    if top_p is None:
        if top_k is None:
            return logits
        return _apply_top_k_only(logits, top_k, max_top_k)
    # Stable sort: ties keep one order whatever else is in the batch (seeded rows repeat).
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False, stable=True)
    vocab_size = logits.shape[1]
    if top_k is not None:
        # Ascending order: the k-th largest value sits at index vocab - k.
        kth = logits_sort.gather(1, (vocab_size - top_k).unsqueeze(1))  # [num_reqs, 1]
        logits_sort.masked_fill_(logits_sort < kth, _NEG_INF)
    probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)  # [num_reqs, vocab]
    # Drop the low tail whose mass stays within 1 - p; the most likely token always survives.
    top_p_mask = probs_sum <= 1.0 - top_p.unsqueeze(1)
    top_p_mask[:, -1] = False
    logits_sort.masked_fill_(top_p_mask, _NEG_INF)
    return torch.empty_like(logits).scatter_(1, logits_idx, logits_sort)


def _apply_top_k_only(
    logits: torch.Tensor,  # [num_reqs, vocab] float32
    top_k: torch.Tensor,  # [num_reqs] int64
    max_top_k: int,
) -> torch.Tensor:
    """topk(max_k) instead of a full sort: much cheaper when k is small next to the vocab."""
    vocab_size = logits.shape[1]
    no_top_k = top_k >= vocab_size  # [num_reqs] bool
    top_values = logits.topk(max_top_k, dim=1).values  # [num_reqs, max_top_k], descending
    kth = top_values.gather(1, (top_k.clamp(max=max_top_k) - 1).unsqueeze(1))  # [num_reqs, 1]
    kth = kth.masked_fill(no_top_k.unsqueeze(1), _NEG_INF)
    return logits.masked_fill(logits < kth, _NEG_INF)


def apply_min_p(
    logits: torch.Tensor,  # [num_reqs, vocab] float32
    min_p: torch.Tensor,  # [num_reqs] float32 in [0, 1]; 0 = off
) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times that of the most likely token."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)  # [num_reqs, 1]
    return logits.masked_fill(probs < threshold, _NEG_INF)
