"""Token masks applied first: logit_bias, allowed_token_ids, min_tokens (stop ids and EOS)."""

from __future__ import annotations

import torch

from strand.engine_core.model_executor.sampling_metadata import TokenMasks


def apply_token_masks(
    logits: torch.Tensor,  # [num_reqs, vocab] float32, edited in place
    masks: TokenMasks,
) -> torch.Tensor:
    if masks.bias_rows is not None:
        assert masks.bias_cols is not None and masks.bias_values is not None
        logits.index_put_((masks.bias_rows, masks.bias_cols), masks.bias_values, accumulate=True)
    # Masks after the bias, so a bias cannot bring a banned token back.
    if masks.disallowed is not None:
        logits.masked_fill_(masks.disallowed, float("-inf"))
    if masks.banned_rows is not None:
        assert masks.banned_cols is not None
        logits[masks.banned_rows, masks.banned_cols] = float("-inf")
    return logits
