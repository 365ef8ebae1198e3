"""x @ w.T with w in GGUF blocks (Q8_0, Q4_0, Q4_1), for CUDA: a Triton kernel that reads the
packed rows as they are (the pure-torch reference is strand/kernels/gguf_linear_ref.py).

A decode step's product is a read of the weights, so the kernel's job is to read 3.8x (Q8_0) to
6.4x (Q4_1) fewer bytes than float32 weights: each program takes BLOCK_N weight rows and walks K
two GGUF blocks (64 weights) at a time, unpacking them to float32 in registers (quants, then the
block's float16 scale and Q4_1's offset, assembled from their bytes) and multiplying with tl.dot
against up to BLOCK_M rows of x. The sums are float32 and the activations are not rounded
(unlike the CPU kernel's int8 path): on a GPU the few-row product is bound by memory, not by the
unpacking. The engine takes it for up to MAX_M rows on CUDA (engine_core's GGUFLinear through
strand/kernels/cpu_gguf_linear.gguf_linear); larger batches unpack the weight and use cuBLAS.
"""

from __future__ import annotations

import torch

from strand.kernels._triton import lazy_jit
from strand.kernels.gguf_linear_ref import BLOCK_BYTES, Q4_0, Q4_1, Q8_0, row_bytes

TYPES = (Q4_0, Q4_1, Q8_0)

try:
    import triton.language as tl
except ImportError:  # the module stays importable; launching needs triton
    tl = None  # type: ignore[assignment]

MAX_M = 64  # rows of x up to which the engine takes this kernel on CUDA
BLOCK_N = 32  # weight rows per program
BLOCK_K = 64  # weights per step along K: two GGUF blocks


@lazy_jit
def _gguf_linear_kernel(
    out_ptr,  # [M, N], x's dtype
    x_ptr,  # [M, K]
    w_ptr,  # [N, row_bytes] uint8
    bias_ptr,  # [N] or a dummy
    M,
    N,
    K,
    row_bytes,
    stride_x,
    stride_out,
    QTYPE: tl.constexpr,
    BLOCK_BYTES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    rows = w_ptr + offs_n.to(tl.int64)[:, None] * row_bytes  # [BLOCK_N, 1]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K  # K % 32 == 0: a partial step holds whole blocks only
        mask_w = mask_n[:, None] & mask_k[None, :]
        block = rows + (offs_k // 32)[None, :] * BLOCK_BYTES  # [BLOCK_N, BLOCK_K] block starts
        j = offs_k % 32  # the weight's place in its block
        # The block's float16 scale d from its two bytes (little-endian).
        d_bits = (tl.load(block, mask=mask_w, other=0).to(tl.uint16)
                  | (tl.load(block + 1, mask=mask_w, other=0).to(tl.uint16) << 8))
        d = d_bits.to(tl.float16, bitcast=True).to(tl.float32)
        if QTYPE == 8:  # Q8_0: w = d * q, q int8
            q = tl.load(block + 2 + j[None, :], mask=mask_w, other=0).to(tl.int8, bitcast=True)
            w = d * q.to(tl.float32)
        else:  # 4-bit: weight j is the low nibble of byte j (j < 16), else the high one of j - 16
            head = 2 if QTYPE == 2 else 4
            byte = tl.load(block + head + (j % 16)[None, :], mask=mask_w, other=0).to(tl.int32)
            nib = ((byte >> ((j // 16) * 4)[None, :]) & 15).to(tl.float32)
            if QTYPE == 2:  # Q4_0: w = d * (q - 8)
                w = d * (nib - 8.0)
            else:  # Q4_1: w = d * q + m
                m_bits = (tl.load(block + 2, mask=mask_w, other=0).to(tl.uint16)
                          | (tl.load(block + 3, mask=mask_w, other=0).to(tl.uint16) << 8))
                w = d * nib + m_bits.to(tl.float16, bitcast=True).to(tl.float32)
        x = tl.load(x_ptr + offs_m[:, None] * stride_x + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & mask_k[None, :], other=0.0).to(tl.float32)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_out + offs_n[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & mask_n[None, :])


def gguf_linear_triton(x: torch.Tensor, packed: torch.Tensor, qtype: int,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ dequantize(packed).T + bias: [M, K] -> [M, N] in x's dtype, float32 sums."""
    if x.dim() != 2:
        raise ValueError(f"x must be [M, in_features], got {tuple(x.shape)}")
    m, k = x.shape
    if qtype not in TYPES:
        raise ValueError(f"qtype must be one of {sorted(TYPES)} (Q4_0, Q4_1, Q8_0: the types "
                         f"this kernel reads; the others are read over CPU tiles), got {qtype}")
    if packed.dtype != torch.uint8 or packed.dim() != 2 or packed.shape[1] != row_bytes(qtype, k):
        raise ValueError(f"packed must be [N, {row_bytes(qtype, k)}] uint8 for {k} weights a row, "
                         f"got {packed.dtype} {tuple(packed.shape)}")
    n = packed.shape[0]
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias must have {n} values, got {tuple(bias.shape)}")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    x, packed = x.contiguous(), packed.contiguous()
    block_m = 16  # tl.dot's smallest tile; a decode step's 1-4 rows are masked into it
    grid = (-(-n // BLOCK_N), -(-m // block_m))
    _gguf_linear_kernel[grid](
        out, x, packed, bias if bias is not None else out, m, n, k, packed.shape[1], x.stride(0),
        out.stride(0), QTYPE=qtype, BLOCK_BYTES=BLOCK_BYTES[qtype], HAS_BIAS=bias is not None,
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return out
