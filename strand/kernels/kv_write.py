"""Triton KV write: each token's K and V into the paged cache at its slot (-1 skips)."""

from __future__ import annotations

import torch

from strand.kernels._triton import lazy_jit, next_power_of_2

try:
    import triton.language as tl
except ImportError:  # the module stays importable; launching needs triton
    tl = None  # type: ignore[assignment]


@lazy_jit
def _write_kv_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_dim]
    value_ptr,  # [num_tokens, num_kv_heads, head_dim]
    kv_ptr,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping_ptr,  # [num_tokens]
    num_kv_heads,
    head_dim,
    block_size,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_kv_half,
    stride_kv_block,
    stride_kv_slot,
    stride_kv_head,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    DOWNCAST: tl.constexpr,  # the cache's dtype is narrower than the K/V's
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask = (offs_h[:, None] < num_kv_heads) & (offs_d[None, :] < head_dim)
    dst = (
        kv_ptr
        + (slot // block_size) * stride_kv_block
        + (slot % block_size) * stride_kv_slot
        + offs_h[:, None] * stride_kv_head
        + offs_d[None, :]
    )
    k = tl.load(
        key_ptr + tok * stride_k_tok + offs_h[:, None] * stride_k_head + offs_d[None, :], mask=mask)
    v = tl.load(
        value_ptr + tok * stride_v_tok + offs_h[:, None] * stride_v_head + offs_d[None, :],
        mask=mask)
    if DOWNCAST:  # float32 K/V into a bfloat16 cache (kv_cache_dtype): rounded as torch rounds
        k = k.to(kv_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
        v = v.to(kv_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
    else:
        k = k.to(kv_ptr.dtype.element_ty)
        v = v.to(kv_ptr.dtype.element_ty)
    tl.store(dst, k, mask=mask)
    tl.store(dst + stride_kv_half, v, mask=mask)


def write_kv(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int; -1 = padding, not written
) -> None:
    """Writes in place. key/value may be strided views (e.g. slices of a fused qkv output)."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(
            "kv_cache must be [2, num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {tuple(kv_cache.shape)}")
    expected = (slot_mapping.shape[0], kv_cache.shape[3], kv_cache.shape[4])
    for name, t in (("key", key), ("value", value)):
        if tuple(t.shape) != expected:
            raise ValueError(
                f"{name} must be [num_tokens={expected[0]}, num_kv_heads={expected[1]}, "
                f"head_dim={expected[2]}], got {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim (stride 1), got {t.stride(-1)}")
    if kv_cache.stride(-1) != 1:
        raise ValueError("kv_cache must be contiguous in head_dim")
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key, value, kv_cache, slot_mapping,
        kv_cache.shape[3], kv_cache.shape[4], kv_cache.shape[2],
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        HEADS_PAD=next_power_of_2(kv_cache.shape[3]),
        HEAD_DIM_PAD=next_power_of_2(kv_cache.shape[4]),
        DOWNCAST=kv_cache.element_size() < key.element_size(),
    )
