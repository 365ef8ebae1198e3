"""RMSNorm as HF Llama computes it: the variance in float32, the weight applied after the cast.

With a residual it is the add before the norm as well (vLLM's fused form): the layer's input
plus the residual stream is both normed and returned as the next residual. On CPU float32 and
bfloat16 run the one-pass C++ kernel (strand/kernels/cpu_elementwise.py), on CUDA the one-pass Triton
kernel (strand/kernels/rms_norm.py: one launch and one read of the row where torch makes six); anything
else the torch reference.
"""

from __future__ import annotations

from typing import overload

import torch
from torch import nn

from strand.kernels import _triton, cpu_elementwise
from strand.kernels.rms_norm_ref import rms_norm_ref


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    @overload
    def forward(self, x: torch.Tensor, residual: None = None, *,
                in_place: bool = False) -> torch.Tensor: ...

    @overload
    def forward(self, x: torch.Tensor, residual: torch.Tensor, *,
                in_place: bool = False) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        residual: torch.Tensor | None = None,  # [num_tokens, hidden]
        *,
        in_place: bool = False,  # x and residual are not needed afterwards: may be overwritten
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without residual: norm(x). With it: (norm(x + residual), x + residual). in_place lets
        the CPU kernel store into x and residual (strand/kernels/cpu_elementwise.py says why)."""
        if cpu_elementwise.applies(x, self.weight) and x.dim() == 2 and x.stride(1) == 1:
            return cpu_elementwise.rms_norm(x, self.weight, self.eps, residual,
                                            in_place=in_place)
        if _triton.runs_triton(x):
            # Imported here: importing Triton maps its large native library, which a CPU process spares.
            from strand.kernels.rms_norm import rms_norm as triton_rms_norm

            return triton_rms_norm(x, self.weight, self.eps, residual)
        return rms_norm_ref(x, self.weight, self.eps, residual)
