"""Pure-torch reference of the GGUF block formats the CPU kernel reads packed
(kernels/csrc/gguf_linear.cpp): Q8_0, Q4_0 and Q4_1, llama.cpp's layouts.

A packed weight is [N, K / 32 * block bytes] uint8: each row its K weights as K / 32 blocks of 32.
Q8_0 (34 bytes): float16 d, 32 int8 q; w = d * q. Q4_0 (18 bytes): float16 d, 16 bytes of
nibbles; w = d * (q - 8). Q4_1 (20 bytes): float16 d, float16 m, 16 bytes of nibbles; w = d * q + m.
A block's first 16 weights are its bytes' low nibbles, the last 16 their high nibbles.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 32
# GGML's type numbers (gguf.GGMLQuantizationType) -> name and bytes per block of 32.
Q4_0, Q4_1, Q8_0 = 2, 3, 8
NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0"}
BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q8_0: 34}


def row_bytes(qtype: int, in_features: int) -> int:
    """Bytes of one packed row of `in_features` weights; ValueError for what cannot be packed."""
    if qtype not in BLOCK_BYTES:
        raise ValueError(f"qtype must be one of {sorted(NAMES)} ({', '.join(NAMES.values())}), "
                         f"got {qtype}")
    if in_features <= 0 or in_features % BLOCK:
        raise ValueError(f"in_features must be a positive multiple of {BLOCK}, got {in_features}")
    return in_features // BLOCK * BLOCK_BYTES[qtype]


def _half(b: torch.Tensor) -> torch.Tensor:  # [..., 2] uint8 -> [..., 1] float32
    return b.contiguous().view(torch.float16).float()


def _nibbles(b: torch.Tensor) -> torch.Tensor:  # [..., 16] uint8 -> [..., 32] float32
    return torch.cat([b & 15, b >> 4], dim=-1).float()


def dequantize_ref(packed: torch.Tensor, qtype: int) -> torch.Tensor:
    """[N, row bytes] uint8 -> [N, K] float32."""
    n = packed.shape[0]
    blocks = packed.reshape(n, -1, BLOCK_BYTES[qtype])  # [N, K / 32, block bytes]
    d = _half(blocks[..., :2])
    if qtype == Q8_0:
        w = d * blocks[..., 2:].contiguous().view(torch.int8).float()
    elif qtype == Q4_0:
        w = d * (_nibbles(blocks[..., 2:]) - 8)
    else:
        w = d * _nibbles(blocks[..., 4:]) + _half(blocks[..., 2:4])
    return w.reshape(n, -1)


def gguf_linear_ref(x: torch.Tensor, packed: torch.Tensor, qtype: int,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ dequantize(packed).T + bias in float32: [M, K] -> [M, N]."""
    return F.linear(x.float(), dequantize_ref(packed, qtype),
                    None if bias is None else bias.float())
