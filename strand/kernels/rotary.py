"""Triton rotary embedding for q and k in one launch (one program per token).

Math in fp32, rounded once to the input dtype. Dims past rot_dim (partial rotary) are copied.
"""

from __future__ import annotations

import torch

from strand.kernels._triton import lazy_jit, next_power_of_2

try:
    import triton.language as tl
except ImportError:  # the module stays importable; launching needs triton
    tl = None  # type: ignore[assignment]


@lazy_jit
def _rotary_kernel(
    q_out_ptr,  # [num_tokens, num_heads, head_dim] contiguous
    k_out_ptr,  # [num_tokens, num_kv_heads, head_dim] contiguous
    q_ptr,
    k_ptr,
    positions_ptr,  # [num_tokens]
    cos_sin_ptr,  # [max_position, rot_dim]
    num_heads,
    num_kv_heads,
    head_dim,
    rot_dim,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    stride_cs_pos,
    IS_NEOX: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr,
    TAIL_PAD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + tok).to(tl.int64)
    half = rot_dim // 2
    offs_i = tl.arange(0, HALF_PAD)
    i_valid = offs_i < half
    cos = tl.load(cos_sin_ptr + pos * stride_cs_pos + offs_i, mask=i_valid, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cs_pos + half + offs_i, mask=i_valid, other=0.0)
    cos = cos.to(tl.float32)[None, :]  # [1, HALF_PAD]
    sin = sin.to(tl.float32)[None, :]
    if IS_NEOX:  # pair i is (i, i + half)
        d1 = offs_i
        d2 = offs_i + half
    else:  # pair i is (2i, 2i + 1)
        d1 = 2 * offs_i
        d2 = 2 * offs_i + 1
    offs_h = tl.arange(0, HEADS_PAD)

    # q then k: the same work on two tensors.
    for which in tl.static_range(2):
        if which == 0:
            src = q_ptr + tok * stride_q_tok + offs_h[:, None] * stride_q_head
            dst = q_out_ptr + (tok * num_heads + offs_h[:, None]) * head_dim
            h_valid = offs_h[:, None] < num_heads
        else:
            src = k_ptr + tok * stride_k_tok + offs_h[:, None] * stride_k_head
            dst = k_out_ptr + (tok * num_kv_heads + offs_h[:, None]) * head_dim
            h_valid = offs_h[:, None] < num_kv_heads
        mask = h_valid & i_valid[None, :]  # [HEADS_PAD, HALF_PAD]
        x1 = tl.load(src + d1[None, :], mask=mask, other=0.0)
        x2 = tl.load(src + d2[None, :], mask=mask, other=0.0)
        x1f = x1.to(tl.float32)
        x2f = x2.to(tl.float32)
        tl.store(dst + d1[None, :], (x1f * cos - x2f * sin).to(x1.dtype), mask=mask)
        tl.store(dst + d2[None, :], (x2f * cos + x1f * sin).to(x1.dtype), mask=mask)
        if TAIL_PAD > 0:
            offs_t = rot_dim + tl.arange(0, TAIL_PAD)
            t_valid = offs_t < head_dim
            tail_mask = h_valid & t_valid[None, :]
            tail = tl.load(src + offs_t[None, :], mask=tail_mask, other=0.0)
            tl.store(dst + offs_t[None, :], tail, mask=tail_mask)


def apply_rotary(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    positions: torch.Tensor,  # [num_tokens] int
    cos_sin_cache: torch.Tensor,  # [max_position, rot_dim]: cos in the first half, sin after
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns new (q, k), rotated by position; q and k are not modified.

    is_neox: pairs are (i, i + rot_dim/2), as HF Llama's rotate_half; else GPT-J's (2i, 2i+1).
    """
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(
            f"q and k must be [num_tokens, heads, head_dim], got {tuple(q.shape)}, {tuple(k.shape)}")
    num_tokens, num_heads, head_dim = q.shape
    if k.shape[0] != num_tokens or k.shape[2] != head_dim:
        raise ValueError(
            f"k must be [num_tokens={num_tokens}, num_kv_heads, head_dim={head_dim}], "
            f"got {tuple(k.shape)}")
    if positions.shape != (num_tokens,):
        raise ValueError(f"positions must be [num_tokens={num_tokens}], got {tuple(positions.shape)}")
    rot_dim = cos_sin_cache.shape[-1]
    if cos_sin_cache.dim() != 2 or rot_dim % 2 or rot_dim > head_dim:
        raise ValueError(
            f"cos_sin_cache must be [max_position, rot_dim] with even rot_dim <= head_dim "
            f"({head_dim}), got {tuple(cos_sin_cache.shape)}")
    for name, t in (("q", q), ("k", k), ("cos_sin_cache", cos_sin_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim, got stride {t.stride(-1)}")
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if num_tokens == 0:
        return q_out, k_out
    tail = head_dim - rot_dim
    _rotary_kernel[(num_tokens,)](
        q_out, k_out, q, k, positions, cos_sin_cache,
        num_heads, k.shape[1], head_dim, rot_dim,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        IS_NEOX=is_neox,
        HEADS_PAD=next_power_of_2(max(num_heads, k.shape[1])),
        HALF_PAD=next_power_of_2(rot_dim // 2),
        TAIL_PAD=next_power_of_2(tail) if tail > 0 else 0,
    )
    return q_out, k_out
