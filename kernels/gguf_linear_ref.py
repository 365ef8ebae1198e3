"""Pure-torch reference of the GGUF block formats the CPU kernel reads packed
(kernels/csrc/gguf_linear.cpp): Q8_0, Q4_0 and Q4_1, llama.cpp's layouts, and two of Strand's own
that llama.cpp's other types are rewritten into at load, exactly (kernels/gguf_transcode.py).

A packed weight is [N, K / 32 * block bytes] uint8: each row its K weights as K / 32 blocks of 32.
Q8_0 (34 bytes): float16 d, 32 int8 q; w = d * q. Q4_0 (18 bytes): float16 d, 16 bytes of
nibbles; w = d * (q - 8). Q4_1 (20 bytes): float16 d, float16 m, 16 bytes of nibbles; w = d * q + m.
A block's first 16 weights are its bytes' low nibbles, the last 16 their high nibbles.
Strand's: Q4_F (24 bytes): float32 d, float32 m, 16 bytes of nibbles; w = d * q + m (Q4_1 with
float32 d and m, which hold a K-quant's per-32 scale d * sc and offset -dmin * m exactly).
Q8_F (44 bytes): float32 d_lo, float32 d_hi, float32 m, 32 int8 q; w_j = d * q_j + m with d_lo for
the block's first 16 weights and d_hi for the last 16 (Q6_K's scales are per 16 weights).

On CPU the decode kernel reads the same bytes regrouped into tiles of 16 rows
(kernels/csrc/gguf_tiled.cpp): [N / 16, K / 32, 16 * block bytes], tile t block b holding the
quants of rows 16t..16t+15's block b as chunks of 64 bytes (chunk c: each row's quant bytes
4c..4c+3, row after row), then the 16 rows' d, then (Q4_1) their m, each field as 16 values
(Q4_F: d, m; Q8_F: d_lo, d_hi, m, 16 float32 values each). tile_ref and untile_ref state that
layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 32
# GGML's type numbers (gguf.GGMLQuantizationType) -> name and bytes per block of 32.
Q4_0, Q4_1, Q8_0 = 2, 3, 8
# Strand's own (no GGML number; outside GGML's range so that neither is ever taken for one).
Q4_F, Q8_F = 1003, 1008
NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0", Q4_F: "Q4_F", Q8_F: "Q8_F"}
BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q8_0: 34, Q4_F: 24, Q8_F: 44}


def row_bytes(qtype: int, in_features: int) -> int:
    """Bytes of one packed row of `in_features` weights; ValueError for what cannot be packed."""
    if qtype not in BLOCK_BYTES:
        raise ValueError(f"qtype must be one of {sorted(NAMES)} ({', '.join(NAMES.values())}), "
                         f"got {qtype}")
    if in_features <= 0 or in_features % BLOCK:
        raise ValueError(f"in_features must be a positive multiple of {BLOCK}, got {in_features}")
    return in_features // BLOCK * BLOCK_BYTES[qtype]


TILE_ROWS = 16
# A block's head before its quants: (fields, bytes each): d (and m; Q8_F d_lo, d_hi, m).
_HEAD = {Q4_0: (1, 2), Q4_1: (2, 2), Q8_0: (1, 2), Q4_F: (2, 4), Q8_F: (3, 4)}


def tile_ref(packed: torch.Tensor, qtype: int) -> torch.Tensor:
    """[N, row bytes] uint8 (N a multiple of 16) -> [N / 16, K / 32, 16 * block bytes]."""
    n, (fields, width), size = packed.shape[0], _HEAD[qtype], BLOCK_BYTES[qtype]
    head = fields * width
    blocks = packed.reshape(n // TILE_ROWS, TILE_ROWS, -1, size)  # [T, 16, nb, bytes]
    nb = blocks.shape[2]
    quants = blocks[..., head:].reshape(n // TILE_ROWS, TILE_ROWS, nb, -1, 4)  # [T, 16, nb, c, 4]
    parts = [quants.permute(0, 2, 3, 1, 4).reshape(n // TILE_ROWS, nb, -1)]
    for h in range(0, head, width):  # each field: [T, 16, nb, width] -> [T, nb, 16 * width]
        parts.append(blocks[..., h:h + width].permute(0, 2, 1, 3).reshape(n // TILE_ROWS, nb, -1))
    return torch.cat(parts, dim=-1).contiguous()


def untile_ref(tiles: torch.Tensor, qtype: int) -> torch.Tensor:
    """tile_ref's inverse: [N / 16, K / 32, 16 * block bytes] -> [N, row bytes]."""
    t, nb, _ = tiles.shape
    (fields, width), size = _HEAD[qtype], BLOCK_BYTES[qtype]
    head = fields * width
    quant_bytes = TILE_ROWS * (size - head)
    quants = tiles[..., :quant_bytes].reshape(t, nb, -1, TILE_ROWS, 4).permute(0, 3, 1, 2, 4)
    heads = [tiles[..., quant_bytes + TILE_ROWS * h:quant_bytes + TILE_ROWS * (h + width)]
             .reshape(t, nb, TILE_ROWS, width).permute(0, 2, 1, 3) for h in range(0, head, width)]
    blocks = torch.cat([*heads, quants.reshape(t, TILE_ROWS, nb, -1)], dim=-1)
    return blocks.reshape(t * TILE_ROWS, nb * size).contiguous()


def _half(b: torch.Tensor) -> torch.Tensor:  # [..., 2] uint8 -> [..., 1] float32
    return b.contiguous().view(torch.float16).float()


def _float(b: torch.Tensor) -> torch.Tensor:  # [..., 4] uint8 -> [..., 1] float32
    return b.contiguous().view(torch.float32)


def _nibbles(b: torch.Tensor) -> torch.Tensor:  # [..., 16] uint8 -> [..., 32] float32
    return torch.cat([b & 15, b >> 4], dim=-1).float()


def dequantize_ref(packed: torch.Tensor, qtype: int) -> torch.Tensor:
    """[N, row bytes] uint8 -> [N, K] float32."""
    n = packed.shape[0]
    blocks = packed.reshape(n, -1, BLOCK_BYTES[qtype])  # [N, K / 32, block bytes]
    if qtype == Q8_0:
        w = _half(blocks[..., :2]) * blocks[..., 2:].contiguous().view(torch.int8).float()
    elif qtype == Q4_0:
        w = _half(blocks[..., :2]) * (_nibbles(blocks[..., 2:]) - 8)
    elif qtype == Q4_1:
        w = _half(blocks[..., :2]) * _nibbles(blocks[..., 4:]) + _half(blocks[..., 2:4])
    elif qtype == Q4_F:
        w = _float(blocks[..., :4]) * _nibbles(blocks[..., 8:]) + _float(blocks[..., 4:8])
    else:  # Q8_F: d_lo for weights 0..15, d_hi for 16..31
        q = blocks[..., 12:].contiguous().view(torch.int8).float().reshape(n, -1, 2, 16)
        d = _float(blocks[..., :8]).reshape(n, -1, 2, 1)
        w = (d * q).reshape(n, -1, BLOCK) + _float(blocks[..., 8:12])
    return w.reshape(n, -1)


def gguf_linear_ref(x: torch.Tensor, packed: torch.Tensor, qtype: int,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ dequantize(packed).T + bias in float32: [M, K] -> [M, N]."""
    return F.linear(x.float(), dequantize_ref(packed, qtype),
                    None if bias is None else bias.float())


def quantize_rows_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K a multiple of 32) -> (q [M, K] int8, d [M, K / 32] float32): each block of 32
    as d * q, d = max|x| / 127, q = round(x / d) (ties to even), as the C++ kernel rounds the
    activations of a few-row product (llama.cpp's Q8_0 for activations). Same float32 ops in the
    same order as the kernel (x times 1 / d), so q is equal bit for bit."""
    m, k = x.shape
    blocks = x.float().reshape(m, k // BLOCK, BLOCK)
    d = blocks.abs().amax(dim=-1) / 127.0  # [M, K / 32]
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv[..., None]).to(torch.int8)
    return q.reshape(m, k), d


def gguf_linear_int8_ref(x: torch.Tensor, packed: torch.Tensor, qtype: int,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """What the few-row kernel computes, in float64: x rounded to int8 blocks
    (quantize_rows_ref) times the dequantized weight: [M, K] -> [M, N] float64."""
    q, d = quantize_rows_ref(x)
    m, k = q.shape
    xq = (q.double().reshape(m, k // BLOCK, BLOCK) * d.double()[..., None]).reshape(m, k)
    return F.linear(xq, dequantize_ref(packed, qtype).double(),
                    None if bias is None else bias.double())


def int8_rounding_bound(x: torch.Tensor, packed: torch.Tensor, qtype: int) -> torch.Tensor:
    """[M, N] bound on |int8-activation product - float product|: each value of x moves by at
    most d / 2 of its block, so an output moves by at most sum_b (d_b / 2) * sum_j |w_bj|."""
    _, d = quantize_rows_ref(x)
    w = dequantize_ref(packed, qtype).double()
    n, k = w.shape
    w_abs = w.abs().reshape(n, k // BLOCK, BLOCK).sum(dim=-1)  # [N, K / 32]
    return (d.double() / 2) @ w_abs.T
