"""Gemma's RMSNorm: the checkpoint stores w and the norm scales by (1 + w), in float32.

HF Gemma computes norm(x.float()) * (1 + w.float()) and rounds once at the end (Llama rounds
before its multiply). In float32 that is the Llama kernel with weight 1 + w; other dtypes take
the float32 torch path so the single rounding matches.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from strand.kernels import cpu_elementwise


class GemmaRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., hidden] -> same shape
        scale = 1.0 + self.weight.float()  # [hidden]; tiny next to the activations
        if (x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1
                and cpu_elementwise.applies(x, scale)):
            return cast(torch.Tensor, cpu_elementwise.rms_norm(x, scale, self.eps))
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * scale).to(x.dtype)
