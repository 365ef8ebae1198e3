"""Pure-torch RMSNorm as HF Llama computes it, with the fused residual add before it."""

from __future__ import annotations

from typing import overload

import torch


@overload
def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: None = None) -> torch.Tensor: ...


@overload
def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]: ...


def rms_norm_ref(
    x: torch.Tensor,  # [..., hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [..., hidden]
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Without residual: the normed x. With it: (norm(x + residual), x + residual)."""
    if residual is not None:
        x = x + residual
        residual = x
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * h.to(x.dtype)
    if residual is None:
        return out
    return out, residual
