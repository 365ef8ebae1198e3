"""nn.Linear whose CPU forward goes through oneDNN (kernels/cpu_linear.py explains why)."""

from __future__ import annotations

import torch
from torch import nn

from kernels.cpu_linear import linear


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, in] -> [num_tokens, out]
        return linear(x, self.weight, self.bias)
