"""A linear layer whose weight stays in a GGUF file's blocks (Q8_0, Q4_0, Q4_1): EngineArgs
quantization="gguf" (engine_core/model_executor/gguf/quantized.py puts them in place).

A decode step of up to SMALL_M rows reads the blocks as they are (kernels/cpu_gguf_linear.py),
its input rounded to int8 blocks for integer dot products as llama.cpp does; on CPU the blocks
are regrouped at load into 16-row tiles (the same bytes) that the kernel reads 16 rows a vector
instruction (kernels/csrc/gguf_tiled.cpp). The step is a read of the weights, and this is 3.8x
(Q8_0) to 6.4x (Q4_1) fewer bytes than float32; up to 16 rows take 4 at a time. More rows unpack the weight to float32 once per call
for the GEMM library. On CUDA up to 64 rows take a Triton kernel over the blocks
(kernels/gguf_linear_triton.py); elsewhere (or without the C++ kernels) the weight is unpacked by
the pure-torch reference, per call.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.cpu_gguf_linear import gguf_linear, gguf_tile, tiles_apply
from kernels.gguf_linear_ref import NAMES, row_bytes


class GGUFLinear(nn.Module):
    def __init__(self, packed: torch.Tensor, qtype: int, in_features: int,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if packed.dtype != torch.uint8 or packed.dim() != 2:
            raise ValueError(f"packed must be a 2-D uint8 tensor, got {packed.dtype} "
                             f"{tuple(packed.shape)}")
        if packed.shape[1] != row_bytes(qtype, in_features):
            raise ValueError(f"a {NAMES[qtype]} row of {in_features} weights takes "
                             f"{row_bytes(qtype, in_features)} bytes, got {packed.shape[1]}")
        self.in_features, self.out_features, self.qtype = in_features, packed.shape[0], qtype
        packed = packed.contiguous()
        if tiles_apply(packed):  # the same bytes in 16-row tiles: the CPU decode kernel's layout
            packed = gguf_tile(packed, qtype, in_features)
        # [out_features, in_features / 32 * block bytes]: row n holds weight row n's blocks; or on
        # CPU [out_features / 16, in_features / 32, 16 * block bytes] (kernels/gguf_linear_ref.py).
        self.packed: torch.Tensor
        self.register_buffer("packed", packed)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, in] -> [num_tokens, out]
        return gguf_linear(x, self.packed, self.qtype, self.in_features, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"qtype={NAMES[self.qtype]}, bias={self.bias is not None}, "
                f"tiled={self.packed.dim() == 3}")
