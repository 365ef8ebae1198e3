"""A linear layer whose weight stays in a GGUF file's blocks (Q8_0, Q4_0, Q4_1): EngineArgs
quantization="gguf" (strand/engine_core/model_executor/gguf/quantized.py puts them in place).

On CPU the blocks are regrouped at load into 16-row tiles (the same bytes) that the kernel
reads 16 rows a vector instruction (strand/kernels/csrc/gguf_tiled.cpp), with the input rounded to int8
blocks for integer dot products as llama.cpp does (strand/kernels/cpu_gguf_linear.py): a decode step
reads 3.8x (Q8_0) to 6.4x (Q4_1) fewer bytes than float32, and a decode batch or a prefill reads
each tile once for all its rows. A weight whose rows are not a multiple of 16 stays in GGUF rows:
up to 16 rows take 4 at a time, more unpack the weight to float32 once per call. On CUDA up to 64
rows take a Triton kernel over the blocks (strand/kernels/gguf_linear_triton.py); elsewhere (or without
the C++ kernels) the weight is unpacked by the pure-torch reference, per call.

A fused layer whose parts the file holds in different types (a Q4_K_M file's q and k in Q4_K, its
v in Q6_K) keeps each run of parts in its own type (`more`): the output's columns are the
parts' products one after another, each part in 16-row tiles. Rewriting them all into one type
that holds both took 11 bits a weight (Q8_F) against Q4_K's 4.5.
"""

from __future__ import annotations

import torch
from torch import nn

from strand.kernels.cpu_gguf_linear import (
    gguf_linear,
    gguf_tile,
    kernels_apply,
    out_features,
    tiles_apply,
)
from strand.kernels.gguf_linear_ref import BLOCK, BLOCK_BYTES, NAMES, TILE_ROWS, row_bytes


def _layout(packed: torch.Tensor, qtype: int, in_features: int) -> torch.Tensor:
    """GGUF rows, regrouped into 16-row tiles where the CPU kernels read them; tiles already
    made (gguf/quantized.py tiles a large weight as it reads it: never the rows and the tiles
    both whole) are kept as they are."""
    if packed.dtype == torch.uint8 and packed.dim() == 3:
        return _tiles(packed, qtype, in_features)
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(f"packed must be a 2-D uint8 tensor (or 3-D tiles), got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    if packed.shape[1] != row_bytes(qtype, in_features):
        raise ValueError(f"a {NAMES[qtype]} row of {in_features} weights takes "
                         f"{row_bytes(qtype, in_features)} bytes, got {packed.shape[1]}")
    packed = packed.contiguous()
    if tiles_apply(packed):  # the same bytes in 16-row tiles: the CPU decode kernel's layout
        packed = gguf_tile(packed, qtype, in_features)
    return packed


def _tiles(tiles: torch.Tensor, qtype: int, in_features: int) -> torch.Tensor:
    """16-row tiles [N / 16, in_features / 32, 16 * block bytes] (gguf_tile's), checked."""
    row_bytes(qtype, in_features)  # ValueError for a type or row length not packed
    want = (in_features // BLOCK, TILE_ROWS * BLOCK_BYTES[qtype])
    if tuple(tiles.shape[1:]) != want or not kernels_apply(tiles):
        raise ValueError(f"16-row tiles of {in_features}-weight {NAMES[qtype]} rows are [tiles, "
                         f"{want[0]}, {want[1]}] on CPU with the C++ kernels, got "
                         f"{tuple(tiles.shape)} on {tiles.device}")
    return tiles.contiguous()


class GGUFLinear(nn.Module):
    def __init__(self, packed: torch.Tensor, qtype: int, in_features: int,
                 bias: torch.Tensor | None = None,
                 more: list[tuple[torch.Tensor, int]] | None = None) -> None:
        super().__init__()
        self.in_features, self.qtype = in_features, qtype
        # [out_features, in_features / 32 * block bytes]: row n holds weight row n's blocks; or on
        # CPU [out_features / 16, in_features / 32, 16 * block bytes] (strand/kernels/gguf_linear_ref.py).
        self.packed: torch.Tensor
        self.register_buffer("packed", _layout(packed, qtype, in_features))
        # The rows after packed's, in other types: buffers more_1, more_2, ... and their types.
        self.more_types: list[int] = []
        for i, (rows, rows_type) in enumerate(more or [], start=1):
            self.register_buffer(f"more_{i}", _layout(rows, rows_type, in_features))
            self.more_types.append(rows_type)
        if self.more_types and any(p.dim() != 3 for p, _ in self.parts()):
            raise ValueError("a layer of parts in different types needs every part in 16-row "
                             "tiles (the CPU kernels, and rows a multiple of 16)")
        self.out_features = sum(out_features(p) for p, _ in self.parts())
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def parts(self) -> list[tuple[torch.Tensor, int]]:
        """(blocks, GGML type) of each run of rows in one type, in the output's order."""
        return [(self.packed, self.qtype)] + [
            (getattr(self, f"more_{i}"), t) for i, t in enumerate(self.more_types, start=1)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, in] -> [num_tokens, out]
        if not self.more_types:
            return gguf_linear(x, self.packed, self.qtype, self.in_features, self.bias)
        outs, col = [], 0
        for packed, qtype in self.parts():
            rows = out_features(packed)
            bias = None if self.bias is None else self.bias[col:col + rows]
            outs.append(gguf_linear(x, packed, qtype, self.in_features, bias))
            col += rows
        return torch.cat(outs, dim=-1)

    def extra_repr(self) -> str:
        types = "+".join(NAMES[t] for _, t in self.parts())
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"qtype={types}, bias={self.bias is not None}, "
                f"tiled={self.packed.dim() == 3}")
