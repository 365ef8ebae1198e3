"""Triton paged attention over the engine's block tables (mixed prefill chunks and decodes).

One program per (query block of one request, kv head, kv split). A query block holds BLOCK_Q
query tokens times the QUERIES_PER_KV query heads that share one kv head, flattened into
BLOCK_M rows, so GQA reads each K/V tile once for the whole group. The context is walked in
tiles of TILE_N positions with an online softmax; each position's physical block is looked up
in the block table, so any block size works regardless of TILE_N.

The grid depends only on tensor shapes (num_tokens // BLOCK_Q + num_reqs query blocks), never
on the batch's contents: programs find their request by binary search over query_start_loc and
leave early when their block is past the request's query. No host sync, and replayable inside
a CUDA graph.

Split-KV: when few programs would run over long contexts, each program's tile range is cut
into NUM_SPLITS partitions that write partial (acc, max, sum) to a scratch buffer, and a
reduce kernel merges them.
"""

from __future__ import annotations

import torch

from strand.kernels._triton import lazy_jit, next_power_of_2

try:
    import triton.language as tl
except ImportError:  # the module stays importable; launching needs triton
    tl = None  # type: ignore[assignment]

_MIN_TILES_PER_SPLIT = 8
_MAX_SPLITS = 16


@lazy_jit
def _paged_attn_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim] (not split)
    part_acc_ptr,  # [num_tokens, num_heads, NUM_SPLITS, head_dim] fp32 (split)
    part_max_ptr,  # [num_tokens, num_heads, NUM_SPLITS] fp32 (split)
    part_sum_ptr,  # [num_tokens, num_heads, NUM_SPLITS] fp32 (split)
    q_ptr,  # [num_tokens, num_heads, head_dim]
    kv_ptr,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    query_start_loc_ptr,  # [num_reqs + 1]
    seq_lens_ptr,  # [num_reqs]
    block_table_ptr,  # [num_reqs, max_num_blocks]
    scale,
    num_reqs,
    num_heads,
    head_dim,
    block_size,
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_kv_half,
    stride_kv_block,
    stride_kv_slot,
    stride_kv_head,
    stride_bt_req,
    sliding_window,  # 0 = none
    softcap,  # 0.0 = none
    QUERIES_PER_KV: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE_N: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLIT_KV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
):
    q_block_global = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    # Request r owns query blocks from query_start_loc[r] // BLOCK_Q + r on: enough room for
    # ceil(query_len / BLOCK_Q) blocks without knowing the lengths when sizing the grid.
    # Both bounds start as int32 tensors: Triton turns an int argument equal to 1 into a
    # constant, and a loop-carried value must keep one type.
    lo = q_block_global * 0
    hi = lo + num_reqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_block <= q_block_global:
            lo = mid + 1
        else:
            hi = mid
    req = lo - 1

    q_start = tl.load(query_start_loc_ptr + req)
    query_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    q_block = q_block_global - (q_start // BLOCK_Q + req)
    if q_block * BLOCK_Q >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    context_len = seq_len - query_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_n = tl.arange(0, TILE_N)
    q_idx = q_block * BLOCK_Q + offs_m // QUERIES_PER_KV  # [BLOCK_M] index in the request
    head = kv_head * QUERIES_PER_KV + offs_m % QUERIES_PER_KV  # [BLOCK_M]
    row_valid = (offs_m // QUERIES_PER_KV < BLOCK_Q) & (q_idx < query_len)
    d_valid = offs_d < head_dim
    tok = (q_start + q_idx).to(tl.int64)
    q_pos = context_len + q_idx  # [BLOCK_M] position of each row in the context

    # [BLOCK_M, HEAD_DIM_PAD]
    q = tl.load(
        q_ptr + tok[:, None] * stride_q_tok + head[:, None] * stride_q_head + offs_d[None, :],
        mask=row_valid[:, None] & d_valid[None, :],
        other=0.0,
    )

    # Causality: this block's last row sees nothing past its own position.
    visible_end = tl.minimum(seq_len, context_len + (q_block + 1) * BLOCK_Q)
    num_tiles = tl.cdiv(visible_end, TILE_N)
    first_tile = split * 0
    if USE_WINDOW:
        # Tiles wholly before the block's first row's window hold nothing any row sees.
        first_visible = tl.maximum(context_len + q_block * BLOCK_Q - sliding_window + 1, 0)
        first_tile = first_visible // TILE_N
    if SPLIT_KV:
        tiles_per_split = tl.cdiv(num_tiles - first_tile, NUM_SPLITS)
        tile_start = first_tile + split * tiles_per_split
        tile_end = tl.minimum(tile_start + tiles_per_split, num_tiles)
    else:
        tile_start = first_tile
        tile_end = num_tiles

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    bt_row = block_table_ptr + req.to(tl.int64) * stride_bt_req
    k_base = kv_ptr + kv_head * stride_kv_head
    for t in range(tile_start, tile_end):
        kv_pos = t * TILE_N + offs_n  # [TILE_N]
        pos_valid = kv_pos < seq_len
        block_id = tl.load(bt_row + kv_pos // block_size, mask=pos_valid, other=0)
        slot_off = block_id.to(tl.int64) * stride_kv_block + (kv_pos % block_size) * stride_kv_slot
        # [HEAD_DIM_PAD, TILE_N]; a cache in another dtype than q (kv_cache_dtype="bfloat16"
        # under float32 weights) is widened as it is loaded.
        k = tl.load(
            k_base + slot_off[None, :] + offs_d[:, None],
            mask=pos_valid[None, :] & d_valid[:, None],
            other=0.0,
        ).to(q.dtype)
        # [TILE_N, HEAD_DIM_PAD]
        v = tl.load(
            k_base + stride_kv_half + slot_off[:, None] + offs_d[None, :],
            mask=pos_valid[:, None] & d_valid[None, :],
            other=0.0,
        ).to(q.dtype)
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * scale  # [BLOCK_M, TILE_N]
        if USE_SOFTCAP:
            # softcap * tanh(s / softcap), tanh through exp (no tanh in every Triton version);
            # the exponent is kept <= 0 so it cannot overflow.
            x = s / softcap
            e = tl.exp(-2.0 * tl.abs(x))
            tanh_abs = (1.0 - e) / (1.0 + e)
            s = softcap * tl.where(x < 0, -tanh_abs, tanh_abs)
        visible = (kv_pos[None, :] <= q_pos[:, None]) & row_valid[:, None]
        if USE_WINDOW:
            visible = visible & (kv_pos[None, :] > q_pos[:, None] - sliding_window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row with nothing visible yet keeps max -inf; shifting by 0 keeps exp() at 0, not NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_shift[:, None])
        alpha = tl.exp(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    if SPLIT_KV:
        part = (tok * num_heads + head) * NUM_SPLITS + split  # [BLOCK_M]
        tl.store(
            part_acc_ptr + part[:, None] * head_dim + offs_d[None, :],
            acc,
            mask=row_valid[:, None] & d_valid[None, :],
        )
        tl.store(part_max_ptr + part, m_i, mask=row_valid)
        tl.store(part_sum_ptr + part, l_i, mask=row_valid)
    else:
        # Every valid row sees at least its own position, so l_i > 0 there.
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        o = acc / l_safe[:, None]
        tl.store(
            out_ptr + tok[:, None] * stride_o_tok + head[:, None] * stride_o_head + offs_d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=row_valid[:, None] & d_valid[None, :],
        )


@lazy_jit
def _split_kv_reduce_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]
    part_acc_ptr,  # [num_tokens, num_heads, NUM_SPLITS, head_dim] fp32
    part_max_ptr,  # [num_tokens, num_heads, NUM_SPLITS] fp32
    part_sum_ptr,  # [num_tokens, num_heads, NUM_SPLITS] fp32
    query_start_loc_ptr,
    num_reqs,
    num_heads,
    head_dim,
    stride_o_tok,
    stride_o_head,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    tok = tl.program_id(0)
    head = tl.program_id(1)
    # Padding rows past the last request were never computed.
    if tok >= tl.load(query_start_loc_ptr + num_reqs):
        return
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    s_valid = offs_s < NUM_SPLITS
    d_valid = offs_d < head_dim
    base = (tok.to(tl.int64) * num_heads + head) * NUM_SPLITS + offs_s  # [SPLITS_PAD]
    m = tl.load(part_max_ptr + base, mask=s_valid, other=float("-inf"))
    l_s = tl.load(part_sum_ptr + base, mask=s_valid, other=0.0)
    # Some split holds the query's own position, which it always sees: m_max is finite.
    m_max = tl.max(m, axis=0)
    w = tl.exp(m - m_max)  # [SPLITS_PAD]; empty splits (max -inf) weigh 0
    acc = tl.load(
        part_acc_ptr + base[:, None] * head_dim + offs_d[None, :],
        mask=s_valid[:, None] & d_valid[None, :],
        other=0.0,
    )  # [SPLITS_PAD, HEAD_DIM_PAD]
    o = tl.sum(acc * w[:, None], axis=0) / tl.sum(l_s * w, axis=0)
    tl.store(
        out_ptr + tok.to(tl.int64) * stride_o_tok + head * stride_o_head + offs_d,
        o.to(out_ptr.dtype.element_ty),
        mask=d_valid,
    )


def choose_num_splits(
    num_reqs: int,
    num_kv_heads: int,
    num_q_blocks_per_req: int,
    max_seq_len: int,
    tile_n: int,
    device: torch.device,
) -> int:
    """How many KV partitions per program: >1 only when the grid alone cannot fill the device.

    A power of two (NUM_SPLITS is a compile-time constant; few values, few compilations).
    """
    if device.type == "cuda":
        target_programs = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        target_programs = 64
    programs = num_reqs * num_kv_heads * num_q_blocks_per_req
    max_by_length = -(-max_seq_len // tile_n) // _MIN_TILES_PER_SPLIT
    wanted = min(target_programs // max(programs, 1), max_by_length, _MAX_SPLITS)
    if wanted < 2:
        return 1
    return 1 << (wanted.bit_length() - 1)


def _check_inputs(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    out: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
) -> None:
    if query.dim() != 3:
        raise ValueError(f"query must be [num_tokens, num_heads, head_dim], got {tuple(query.shape)}")
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(
            "kv_cache must be [2, num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {tuple(kv_cache.shape)}")
    if out.shape != query.shape:
        raise ValueError(f"out must have query's shape {tuple(query.shape)}, got {tuple(out.shape)}")
    if kv_cache.shape[4] != query.shape[2]:
        raise ValueError(
            f"kv_cache head_dim ({kv_cache.shape[4]}) must equal query head_dim ({query.shape[2]})")
    if query.shape[1] % kv_cache.shape[3] != 0:
        raise ValueError(
            f"num_heads ({query.shape[1]}) must be a multiple of num_kv_heads ({kv_cache.shape[3]})")
    if kv_cache.dtype != query.dtype and (query.dtype, kv_cache.dtype) != (torch.float32,
                                                                           torch.bfloat16):
        raise ValueError(f"kv_cache dtype {kv_cache.dtype} must equal query dtype {query.dtype}, "
                         f"or be bfloat16 under a float32 query")
    num_reqs = seq_lens.shape[0]
    if query_start_loc.shape[0] != num_reqs + 1:
        raise ValueError(
            f"query_start_loc must have num_reqs + 1 = {num_reqs + 1} entries, "
            f"got {query_start_loc.shape[0]}")
    if block_table.dim() != 2 or block_table.shape[0] < num_reqs:
        raise ValueError(
            f"block_table must be [num_reqs >= {num_reqs}, max_num_blocks], "
            f"got {tuple(block_table.shape)}")
    for name, t in (("query", query), ("kv_cache", kv_cache), ("out", out)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim (stride 1), got {t.stride(-1)}")
    if block_table.stride(1) != 1:
        raise ValueError("block_table must be contiguous along max_num_blocks")


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    out: torch.Tensor,  # [num_tokens, num_heads, head_dim], written for rows < query_start_loc[-1]
    query_start_loc: torch.Tensor,  # [num_reqs + 1] int32
    seq_lens: torch.Tensor,  # [num_reqs] int32
    block_table: torch.Tensor,  # [num_reqs, max_num_blocks] int32
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    num_splits: int | None = None,
    tile_n: int | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention of each request's new tokens over its paged context; returns `out`.

    num_splits: None picks by heuristic (split-KV only when the grid is small and contexts
    long); 1 forces the single-pass kernel; >1 forces split-KV with that many partitions.
    tile_n: context positions per inner-loop tile (power of two >= 16); None picks.
    sliding_window: a query at position p sees only positions > p - sliding_window (None: all).
    softcap: scores become softcap * tanh(scores / softcap) before the softmax (Gemma 2).
    """
    _check_inputs(query, kv_cache, out, query_start_loc, seq_lens, block_table)
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if tile_n is not None and (tile_n < 16 or tile_n & (tile_n - 1)):
        raise ValueError(f"tile_n must be a power of two >= 16, got {tile_n}")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be > 0, got {softcap}")
    num_tokens, num_heads, head_dim = query.shape
    num_reqs = seq_lens.shape[0]
    num_kv_heads = kv_cache.shape[3]
    if num_tokens == 0 or num_reqs == 0:
        return out
    queries_per_kv = num_heads // num_kv_heads
    # tl.dot needs M >= 16; one row per (query token, head of the group).
    block_m = max(16, next_power_of_2(queries_per_kv))
    block_m = max(block_m, min(64, next_power_of_2(max(max_query_len, 1) * queries_per_kv)))
    block_q = block_m // queries_per_kv
    tile_n = tile_n or (32 if max_seq_len <= 32 else 64)
    head_dim_pad = max(16, next_power_of_2(head_dim))
    num_q_blocks = num_tokens // block_q + num_reqs
    if num_splits is None:
        num_splits = choose_num_splits(
            num_reqs, num_kv_heads, -(-max(max_query_len, 1) // block_q), max_seq_len, tile_n,
            query.device)
    split_kv = num_splits > 1
    # fp32 inputs would otherwise go through TF32 on NVIDIA; None keeps the default elsewhere.
    dot_precision = "ieee" if query.dtype == torch.float32 else None

    if split_kv:
        part_acc = torch.empty(
            (num_tokens, num_heads, num_splits, head_dim), dtype=torch.float32, device=query.device)
        part_max = torch.empty(
            (num_tokens, num_heads, num_splits), dtype=torch.float32, device=query.device)
        part_sum = torch.empty_like(part_max)
    else:
        # Unused by the single-pass kernel; any tensor of the right device fills the slots.
        part_acc = part_max = part_sum = out

    _paged_attn_kernel[(num_q_blocks, num_kv_heads, num_splits)](
        out, part_acc, part_max, part_sum,
        query, kv_cache, query_start_loc, seq_lens, block_table,
        scale, num_reqs, num_heads, head_dim, kv_cache.shape[2],
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        block_table.stride(0), sliding_window or 0, float(softcap or 0.0),
        QUERIES_PER_KV=queries_per_kv, BLOCK_Q=block_q, BLOCK_M=block_m, TILE_N=tile_n,
        HEAD_DIM_PAD=head_dim_pad, NUM_SPLITS=num_splits, SPLIT_KV=split_kv,
        DOT_PRECISION=dot_precision, USE_WINDOW=sliding_window is not None,
        USE_SOFTCAP=softcap is not None,
    )
    if split_kv:
        _split_kv_reduce_kernel[(num_tokens, num_heads)](
            out, part_acc, part_max, part_sum, query_start_loc,
            num_reqs, num_heads, head_dim, out.stride(0), out.stride(1),
            NUM_SPLITS=num_splits, SPLITS_PAD=max(2, next_power_of_2(num_splits)),
            HEAD_DIM_PAD=head_dim_pad,
        )
    return out
