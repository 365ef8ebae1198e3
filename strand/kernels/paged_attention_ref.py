"""Pure-torch paged attention: one request at a time, dense math, written for obviousness."""

from __future__ import annotations

import torch


def paged_attention_ref(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    query_start_loc: torch.Tensor,  # [num_reqs + 1]
    seq_lens: torch.Tensor,  # [num_reqs]
    block_table: torch.Tensor,  # [num_reqs, max_num_blocks]
    scale: float,
    out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention of each request's new tokens over its whole context in the paged cache.

    The new tokens of request r are the last query_len_r positions of its seq_len_r context, so
    query token i sits at position seq_len_r - query_len_r + i and sees positions <= that.
    Rows past query_start_loc[-1] (padding) are left as they were in `out`.
    sliding_window: a query at position p sees only positions > p - sliding_window.
    softcap: scores become softcap * tanh(scores / softcap) before masking.
    """
    if out is None:
        out = torch.zeros_like(query)
    num_heads = query.shape[1]
    block_size = kv_cache.shape[2]
    num_kv_heads = kv_cache.shape[3]
    group = num_heads // num_kv_heads
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for r, seq_len in enumerate(lens):
        q_start, q_end = starts[r], starts[r + 1]
        query_len = q_end - q_start
        if query_len == 0:
            continue
        num_blocks = -(-seq_len // block_size)
        blocks = block_table[r, :num_blocks].long()
        # [seq_len, num_kv_heads, head_dim]
        k = kv_cache[0, blocks].reshape(-1, num_kv_heads, kv_cache.shape[4])[:seq_len]
        v = kv_cache[1, blocks].reshape(-1, num_kv_heads, kv_cache.shape[4])[:seq_len]
        # [num_heads, seq_len, head_dim]: query head h reads kv head h // group
        k = k.float().repeat_interleave(group, dim=1).transpose(0, 1)
        v = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
        q = query[q_start:q_end].float().transpose(0, 1)  # [num_heads, query_len, head_dim]
        scores = torch.matmul(q, k.transpose(1, 2)) * scale  # [num_heads, query_len, seq_len]
        q_pos = torch.arange(seq_len - query_len, seq_len, device=query.device).unsqueeze(1)
        k_pos = torch.arange(seq_len, device=query.device).unsqueeze(0)
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        hidden = k_pos > q_pos
        if sliding_window is not None:
            hidden |= k_pos <= q_pos - sliding_window
        scores = scores.masked_fill(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_start:q_end] = torch.matmul(probs, v).transpose(0, 1).to(out.dtype)
    return out
