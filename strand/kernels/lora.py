"""Triton batched LoRA for CUDA (punica's bgmv): y[t] += B[slot[t]] @ (A[slot[t]] @ x[t]).

Two launches over (token, block of the output): shrink writes each token's [width] activation
in float32, expand adds B's product to the token's output row. Every token reads its own
adapter, so one launch serves a batch mixing any adapters; rows of base-model tokens
(slot -1) are never stored to. On CPU, strand/engine_core/lora/punica.py groups tokens by adapter
instead (two GEMMs per adapter); strand/kernels/lora_ref.py is the reference for both.
"""

from __future__ import annotations

import torch

from strand.kernels._triton import lazy_jit, next_power_of_2

try:
    import triton.language as tl
except ImportError:  # the module stays importable; launching needs triton
    tl = None  # type: ignore[assignment]

BLOCK_K = 64  # input features per loop step of the shrink
BLOCK_O = 64  # output features per program of the expand


@lazy_jit
def _shrink_kernel(
    h_ptr,  # [num_tokens, width] float32
    x_ptr,  # [num_tokens, in_features]
    a_ptr,  # [num_slots, width, in_features]
    slots_ptr,  # [num_tokens] int64
    in_features,
    width,
    stride_x,
    BLOCK_W: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token)
    # A base-model token reads nothing: its bound is 0 (a scalar mask term would do the same).
    k_bound = tl.where(slot >= 0, in_features, 0)
    a_base = a_ptr + tl.maximum(slot, 0) * width * in_features
    offs_w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    acc = tl.zeros((BLOCK_W,), dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + token * stride_x + offs_k, mask=offs_k < k_bound,
                    other=0.0).to(tl.float32)
        mask = (offs_w[:, None] < width) & (offs_k[None, :] < k_bound)
        a = tl.load(a_base + offs_w[:, None] * in_features + offs_k[None, :], mask=mask,
                    other=0.0).to(tl.float32)
        acc += tl.sum(a * x[None, :], axis=1)
    tl.store(h_ptr + token * width + offs_w, acc, mask=offs_w < width)


@lazy_jit
def _expand_kernel(
    out_ptr,  # [num_tokens, out_features]
    h_ptr,  # [num_tokens, width] float32
    b_ptr,  # [num_slots, out_features, width]
    slots_ptr,  # [num_tokens] int64
    out_features,
    width,
    stride_out,
    BLOCK_O: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token)
    # A base-model token's row is neither read nor written: its bound is 0.
    o_bound = tl.where(slot >= 0, out_features, 0)
    b_base = b_ptr + tl.maximum(slot, 0) * out_features * width
    offs_o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
    delta = tl.zeros((BLOCK_O,), dtype=tl.float32)
    for w0 in range(0, width, BLOCK_W):  # width = slices x max_lora_rank: loop, not one tile
        offs_w = w0 + tl.arange(0, BLOCK_W)
        h = tl.load(h_ptr + token * width + offs_w, mask=offs_w < width, other=0.0)
        mask = (offs_o[:, None] < o_bound) & (offs_w[None, :] < width)
        b = tl.load(b_base + offs_o[:, None] * width + offs_w[None, :], mask=mask,
                    other=0.0).to(tl.float32)
        delta += tl.sum(b * h[None, :], axis=1)
    row = out_ptr + token * stride_out + offs_o
    keep = offs_o < o_bound
    y = tl.load(row, mask=keep, other=0.0).to(tl.float32)
    tl.store(row, (y + delta).to(out_ptr.dtype.element_ty), mask=keep)


def add_lora_triton(
    out: torch.Tensor,  # [num_tokens, out_features], updated in place
    x: torch.Tensor,  # [num_tokens, in_features]
    lora_a: torch.Tensor,  # [num_slots, width, in_features]
    lora_b: torch.Tensor,  # [num_slots, out_features, width]
    token_slots: torch.Tensor,  # [num_tokens] int64; -1: no adapter
) -> torch.Tensor:
    num_tokens, in_features = x.shape
    num_slots, width, _ = lora_a.shape
    out_features = out.shape[1]
    if lora_b.shape != (num_slots, out_features, width) or lora_a.shape[2] != in_features:
        raise ValueError(f"lora_a must be [slots, width, {in_features}] and lora_b [slots, "
                         f"{out_features}, width], got {list(lora_a.shape)} and "
                         f"{list(lora_b.shape)}")
    if token_slots.shape != (num_tokens,) or token_slots.dtype != torch.int64:
        raise ValueError(f"token_slots must be [{num_tokens}] int64, got "
                         f"{list(token_slots.shape)} {token_slots.dtype}")
    if num_tokens == 0:
        return out
    if out.stride(1) != 1:
        raise ValueError("out's rows must be contiguous (it is updated in place)")
    x, lora_a, lora_b = x.contiguous(), lora_a.contiguous(), lora_b.contiguous()
    shrunk = torch.empty(num_tokens, width, dtype=torch.float32, device=x.device)
    block_w = min(next_power_of_2(width), 64)
    _shrink_kernel[(num_tokens, -(-width // block_w))](
        shrunk, x, lora_a, token_slots, in_features, width, x.stride(0),
        BLOCK_W=block_w, BLOCK_K=BLOCK_K)
    _expand_kernel[(num_tokens, -(-out_features // BLOCK_O))](
        out, shrunk, lora_b, token_slots, out_features, width, out.stride(0),
        BLOCK_O=BLOCK_O, BLOCK_W=block_w)
    return out
