"""The torch attention backend: what CPU users run, and the fallback on any device.

No per-request Python loop: each request's context K/V is gathered from the paged cache in one
advanced index into a padded batch, one boolean mask encodes causality and context lengths, and
scaled_dot_product_attention runs once per group. Decodes (one query token) and prefill chunks are
two groups, so a long prefill does not pad every decode to its query length.
The gather indices and masks depend only on the metadata (and the layer's sliding window), so they
are built once per step and window (on the first such layer) and reused by the others.
Layers with a sliding window shorter than the batch's longest context, or with attention-logit
soft-capping, take the masked gather path (the C++ kernels know neither); softcapped scores are
computed explicitly since SDPA cannot cap them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from strand.engine_core.model_executor.attention.backend import AttentionBackend, AttentionMetadata
from strand.kernels import cpu_elementwise
from strand.kernels.cpu_decode_attention import decode_attention
from strand.kernels.cpu_decode_attention import is_available as cpu_decode_kernel_available
from strand.kernels.cpu_decode_attention import takes as cpu_attention_takes
from strand.kernels.cpu_prefill_attention import amx_applies as cpu_prefill_amx_applies
from strand.kernels.cpu_prefill_attention import is_available as cpu_prefill_kernel_available
from strand.kernels.cpu_prefill_attention import prefill_attention
from strand.platform.cpu_isa import probe


@dataclass(slots=True)
class _Group:
    """Requests attended together: padded to the group's longest query and context."""

    # [num_group_reqs, max_query_len] rows of q (padding rows repeat a valid row of the request).
    query_rows: torch.Tensor
    # [num_valid_tokens]: positions in query_rows.flatten() that are real tokens ...
    valid: torch.Tensor | None  # None when every entry is real (decodes)
    # ... and the q rows they belong to: out[token_rows] = result.flatten()[valid].
    token_rows: torch.Tensor
    # True when query_rows is 0..num_tokens-1 in order (all decodes, or one prefill): the
    # gather of q and the scatter of the output are skipped.
    is_whole_batch: bool
    # [num_group_reqs, num_blocks] cache blocks of each request's context (0 past the end):
    # gathering whole blocks copies block_size rows per index instead of one.
    context_blocks: torch.Tensor
    # [num_group_reqs, 1, max_query_len, num_blocks * block_size] True = may attend; None when
    # every member is a fresh prefill (query = whole context): plain top-left causal attention
    # is then exact for every real row, and lets SDPA skip the masked half instead of scoring it.
    mask: torch.Tensor | None
    num_ctx: int  # num_blocks * block_size: context rows gathered per request


@dataclass(slots=True)
class _Decodes:
    """Decodes handed to the CPU kernel, which reads the paged cache in place (no gather)."""

    rows: torch.Tensor  # [num_decodes] rows of q (and of the output)
    block_table: torch.Tensor  # [num_decodes, max_num_blocks] int32
    seq_lens: torch.Tensor  # [num_decodes] int32
    is_whole_batch: bool  # rows == 0..num_tokens-1: every token of the step is a decode


@dataclass(slots=True)
class _Prefills:
    """Requests of more than one new token handed to the CPU prefill kernel (no padding)."""

    block_table: torch.Tensor  # [num_prefills, max_num_blocks] int32
    q_starts: torch.Tensor  # [num_prefills] int32: first row of each in q (and the output)
    q_lens: torch.Tensor  # [num_prefills] int32
    seq_lens: torch.Tensor  # [num_prefills] int32


@dataclass(slots=True)
class _Plan:
    metadata: AttentionMetadata
    groups: list[_Group]
    decodes: _Decodes | None
    prefills: _Prefills | None
    # (first row, length) of each fresh prefill (no cached context) that attends over its own
    # new K/V with SDPA instead of the C++ kernel: bfloat16 where oneDNN has bfloat16 GEMMs.
    fresh: list[tuple[int, int]]


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    # A bfloat16 cache under float32 weights: the C++ kernels widen its rows as they load them,
    # the SDPA path casts what it gathers.
    converts_kv_dtype = True

    def __init__(self, use_cpu_kernel: bool = True) -> None:
        # One plan per sliding window (None = full attention) for the current step's metadata.
        self._plans: dict[int | None, _Plan] = {}
        # The C++ decode and prefill kernels (strand/kernels/cpu_decode_attention.py,
        # strand/kernels/cpu_prefill_attention.py) for float32 and bfloat16 on CPU; False keeps every
        # request on the gather + SDPA path.
        self.use_cpu_kernel = use_cpu_kernel

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        logit_softcap: float | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        n = metadata.num_actual_tokens
        num_kv_heads, head_dim = kv_cache.shape[3], kv_cache.shape[4]
        write_kv_cache(key[:n], value[:n], kv_cache, metadata.slot_mapping[:n])
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
        if sliding_window is not None and sliding_window >= metadata.max_seq_len:
            sliding_window = None  # every context fits in the window: plain causal attention
        plan = self._plan_for(metadata, query.dtype, kv_cache, sliding_window,
                              logit_softcap is not None)
        groups = plan.groups
        d = plan.decodes
        if len(plan.fresh) == 1 and plan.fresh[0] == (0, query.shape[0]) and not groups:
            # One fresh prompt is the whole step (a long prompt's prefill): no copy into `out`.
            return fresh_prefill_attention(query, key, value, scale)
        if d is not None and d.is_whole_batch and n == query.shape[0]:
            # A pure decode step (the common one): the kernel's output is the whole answer.
            return decode_attention(query, kv_cache, d.block_table, d.seq_lens, scale)
        out = query.new_empty(query.shape)
        out[n:] = 0  # padding rows, if any; every row below n belongs to a request
        if d is not None:
            out[d.rows] = decode_attention(query[d.rows], kv_cache, d.block_table, d.seq_lens,
                                           scale)
        for start, length in plan.fresh:
            out[start:start + length] = fresh_prefill_attention(
                query[start:start + length], key[start:start + length],
                value[start:start + length], scale)
        p = plan.prefills
        if p is not None:
            prefill_attention(out, query, kv_cache, p.block_table, p.q_starts, p.q_lens,
                              p.seq_lens, scale)
        for group in groups:
            if group.is_whole_batch:
                q = query[:n].view(*group.query_rows.shape, *query.shape[1:])
            else:
                q = query[group.query_rows]  # [reqs, max_q, heads, head_dim]
            num_ctx = group.num_ctx
            # [reqs, num_blocks * block_size, kv_heads, head_dim]
            # index_select on dim 0 is a plain row copy; advanced indexing takes a generic path
            # several times slower, and this gather is the largest cost of a CPU decode step.
            blocks = group.context_blocks.view(-1)
            k = kv_cache[0].index_select(0, blocks).view(-1, num_ctx, num_kv_heads, head_dim)
            v = kv_cache[1].index_select(0, blocks).view(-1, num_ctx, num_kv_heads, head_dim)
            k, v = k.to(query.dtype), v.to(query.dtype)  # a cache in kv_cache_dtype: widened
            if logit_softcap is not None:
                assert group.mask is not None  # softcapped plans always carry a mask
                o = softcapped_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         group.mask, scale, logit_softcap)
            else:
                o = F.scaled_dot_product_attention(  # [reqs, heads, max_q, head_dim]
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                    attn_mask=group.mask, is_causal=group.mask is None, scale=scale,
                    enable_gqa=q.shape[2] != k.shape[2])
            o = o.transpose(1, 2).reshape(-1, query.shape[1], head_dim)
            if group.is_whole_batch and n == query.shape[0]:
                return o
            if group.is_whole_batch:
                out[:n] = o
            else:
                out[group.token_rows] = o if group.valid is None else o[group.valid]
        return out

    def _plan_for(self, metadata: AttentionMetadata, query_dtype: torch.dtype,
                  kv_cache: torch.Tensor, window: int | None, softcap: bool) -> _Plan:
        # Softcapped layers need explicit masks; windowed ones already have them. The key keeps
        # the two plans of one window apart (-1 - window: never a valid window).
        key = window if not softcap else -1 - (window or 0)
        plan = self._plans.get(key)
        if plan is None or plan.metadata is not metadata:
            if any(p.metadata is not metadata for p in self._plans.values()):
                self._plans.clear()  # a new step: drop the previous step's plans
            # The C++ kernels have no window and no softcap: such layers stay on the torch path.
            kernels = (self.use_cpu_kernel and kv_cache.device.type == "cpu"
                       and cpu_attention_takes(query_dtype, kv_cache.dtype)
                       and window is None and not softcap)
            if kernels:
                check_block_table(metadata, num_blocks=kv_cache.shape[1])
            plan = build_plan(metadata,
                              decode_kernel=kernels and cpu_decode_kernel_available(),
                              prefill_kernel=kernels and cpu_prefill_kernel_available(),
                              window=window, need_mask=softcap,
                              fresh_sdpa=kernels and query_dtype == kv_cache.dtype
                              and fresh_sdpa_applies(kv_cache.dtype, kv_cache.shape[4]))
            self._plans[key] = plan
        return plan


def check_block_table(md: AttentionMetadata, num_blocks: int) -> None:
    """The C++ kernels read the cache through the block table unchecked: a table that does not
    cover a context, or names a block past the pool, would read outside it. Once per step."""
    n = md.num_reqs
    seq_lens = md.seq_lens_cpu[:n]
    query_lens = md.query_start_loc_cpu[1:n + 1] - md.query_start_loc_cpu[:n]
    if n and int(seq_lens.max()) > md.block_table.shape[1] * md.block_size:
        raise ValueError(f"block_table covers {md.block_table.shape[1] * md.block_size} tokens "
                         f"per request, seq_lens reach {int(seq_lens.max())}")
    if n and bool((query_lens > seq_lens).any()):
        raise ValueError("each request's query_len must be <= its seq_len")
    table = md.block_table[:n]
    if table.numel() and (int(table.max()) >= num_blocks or int(table.min()) < 0):
        raise ValueError(f"block_table entries must be in [0, {num_blocks}), got "
                         f"{int(table.min())}..{int(table.max())}")


def write_kv_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64
) -> None:
    if cpu_elementwise.writes_kv(key, value, kv_cache):
        cpu_elementwise.write_kv(key, value, kv_cache, slot_mapping)  # one pass, no index tensors
        return
    flat = kv_cache.view(2, -1, kv_cache.shape[3], kv_cache.shape[4])
    flat[0].index_copy_(0, slot_mapping, key.to(kv_cache.dtype))
    flat[1].index_copy_(0, slot_mapping, value.to(kv_cache.dtype))


def softcapped_attention(
    q: torch.Tensor,  # [reqs, heads, max_q, head_dim]
    k: torch.Tensor,  # [reqs, kv_heads, ctx, head_dim]
    v: torch.Tensor,  # [reqs, kv_heads, ctx, head_dim]
    mask: torch.Tensor,  # [reqs, 1, max_q, ctx] True = may attend
    scale: float,
    softcap: float,
) -> torch.Tensor:  # [reqs, heads, max_q, head_dim]
    """Gemma 2's eager attention: cap * tanh(scores / cap), then the mask, then a float32
    softmax rounded back to q's dtype."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


def fresh_sdpa_applies(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether fresh prefills in `dtype` go to SDPA over their own K/V rather than the C++
    prefill kernel. In bfloat16 with AMX the kernel runs on AMX tiles
    (strand/kernels/csrc/prefill_attention_amx.cpp) and is faster than SDPA. On an Intel CPU
    without AMX but with oneDNN's bfloat16 kernels (AVX-512 BF16), SDPA measured well ahead of
    the kernel when the kernel widened each bfloat16 element at every use (it now widens a
    chunk's K/V rows once; not re-measured there). On an AMD CPU with AVX-512 BF16 and no AMX,
    SDPA (whose bfloat16 path there is oneDNN's) took several times the kernel's time, so only
    Intel CPUs take SDPA (an Intel CPU with AVX512_BF16 and no AMX, Cooper Lake, was not
    measured). In float32 the C++ kernel is the faster, and without oneDNN bfloat16 (AVX2)
    torch's bfloat16 products are slow, so both stay on the kernel."""
    isa = probe()
    return (dtype == torch.bfloat16 and isa.onednn_bf16 and isa.vendor == "GenuineIntel"
            and not cpu_prefill_amx_applies(dtype, head_dim))


def fresh_prefill_attention(
    query: torch.Tensor,  # [q_len, num_heads, head_dim]: one request's new tokens
    key: torch.Tensor,  # [q_len, num_kv_heads, head_dim]
    value: torch.Tensor,  # [q_len, num_kv_heads, head_dim]
    scale: float,
) -> torch.Tensor:  # [q_len, num_heads, head_dim]
    """Causal attention of a prompt with no cached context over its own keys: those are the
    ones just written to the cache, so SDPA reads them from the projection, not the cache."""
    o = F.scaled_dot_product_attention(
        query.transpose(0, 1).unsqueeze(0), key.transpose(0, 1).unsqueeze(0),
        value.transpose(0, 1).unsqueeze(0), is_causal=True, scale=scale,
        enable_gqa=query.shape[1] != key.shape[1])  # [1, heads, q_len, head_dim]
    return o[0].transpose(0, 1)


def build_plan(md: AttentionMetadata, decode_kernel: bool = False,
               prefill_kernel: bool = False, window: int | None = None,
               need_mask: bool = False, fresh_sdpa: bool = False) -> _Plan:
    """Which requests go to which kernel; what is left is grouped for SDPA. With fresh_sdpa,
    prefills with no cached context (seq_len == query_len) are listed apart for
    fresh_prefill_attention."""
    device = md.block_table.device
    starts = md.query_start_loc_cpu[:md.num_reqs].to(torch.int64)
    query_lens = md.query_start_loc_cpu[1:md.num_reqs + 1].to(torch.int64) - starts
    seq_lens = md.seq_lens_cpu[:md.num_reqs].to(torch.int64)
    groups = []
    is_decode = query_lens == 1
    is_prefill = ~is_decode & (query_lens > 0)
    decodes = prefills = None
    fresh: list[tuple[int, int]] = []
    if fresh_sdpa and window is None and not need_mask:
        is_fresh = is_prefill & (query_lens == seq_lens)
        fresh = [(int(starts[i]), int(query_lens[i])) for i in is_fresh.nonzero().flatten()]
        is_prefill = is_prefill & ~is_fresh
    if prefill_kernel and bool(is_prefill.any()):
        members = is_prefill.nonzero().flatten()
        prefills = _Prefills(
            block_table=md.block_table[members.to(device)].to(torch.int32).contiguous(),
            q_starts=starts[members].to(torch.int32), q_lens=query_lens[members].to(torch.int32),
            seq_lens=seq_lens[members].to(torch.int32))
        is_prefill = torch.zeros_like(is_prefill)
    if decode_kernel and bool(is_decode.any()):
        members = is_decode.nonzero().flatten()
        decodes = _Decodes(
            rows=starts[members].to(device),
            block_table=md.block_table[members.to(device)].to(torch.int32).contiguous(),
            seq_lens=seq_lens[members].to(torch.int32).to(device),
            is_whole_batch=len(members) == md.num_reqs == md.num_actual_tokens)
        is_decode = torch.zeros_like(is_decode)
    for members in (*_length_buckets(is_decode, query_lens, seq_lens),
                    *_length_buckets(is_prefill, query_lens, seq_lens)):
        if members.numel():
            groups.append(_build_group(md, members, starts[members], query_lens[members],
                                       seq_lens[members], device, window, need_mask))
    return _Plan(md, groups, decodes, prefills, fresh)


def _length_buckets(selected: torch.Tensor, query_lens: torch.Tensor,
                    seq_lens: torch.Tensor) -> list[torch.Tensor]:
    """The selected requests grouped by the power of two of their query and context lengths.

    A group pads every member to its longest query and context: one group of a 16-token and a
    512-token prompt would spend 32x the short one's work on padding, and decodes pay the same
    in gathered K/V for the longest context. Buckets bound that waste below 2x per dimension at
    the cost of a few more (still batched) attention calls.
    """
    members = selected.nonzero().flatten()
    if members.numel() <= 1:
        return [members]
    q_bucket = torch.ceil(torch.log2(query_lens[members].double())).to(torch.int64)
    s_bucket = torch.ceil(torch.log2(seq_lens[members].double())).to(torch.int64)
    keys = q_bucket * 64 + s_bucket
    return [members[keys == key] for key in torch.unique(keys).tolist()]


def _build_group(md: AttentionMetadata, members: torch.Tensor, starts: torch.Tensor,
                 query_lens: torch.Tensor, seq_lens: torch.Tensor,
                 device: torch.device, window: int | None = None,
                 need_mask: bool = False) -> _Group:
    # Built on the host from host tensors (no device sync), then moved in one copy each.
    max_q = int(query_lens.max())
    max_s = int(seq_lens.max())
    q_off = torch.arange(max_q)  # [max_q]
    valid_q = q_off.unsqueeze(0) < query_lens.unsqueeze(1)  # [reqs, max_q]
    # Padding rows point at the request's first token so they compute something finite.
    query_rows = starts.unsqueeze(1) + torch.where(valid_q, q_off.unsqueeze(0), 0)
    token_rows = query_rows[valid_q]
    valid = None if bool(valid_q.all()) else valid_q.flatten().nonzero().flatten().to(device)

    block_size = md.block_size
    num_blocks = -(-max_s // block_size)
    # With a window, blocks wholly before every member's earliest visible key are not gathered.
    first_block = 0
    if window is not None:
        first_visible = int((seq_lens - query_lens).min()) - window + 1
        first_block = max(first_visible, 0) // block_size
    max_s = (num_blocks - first_block) * block_size  # whole blocks; the mask hides the tail
    pos = torch.arange(first_block * block_size, num_blocks * block_size)  # [max_s]
    in_context = pos.unsqueeze(0) < seq_lens.unsqueeze(1)  # [reqs, max_s]
    used = in_context[:, ::block_size].to(device)  # [reqs, num_blocks - first_block]
    blocks = md.block_table[members.to(device), first_block:num_blocks].to(torch.int64)
    context_blocks = torch.where(used, blocks, 0)

    # Query token i of a request sits at position seq_len - query_len + i.
    q_pos = (seq_lens - query_lens).unsqueeze(1) + q_off.unsqueeze(0)  # [reqs, max_q]
    mask = (pos.view(1, 1, max_s) <= q_pos.unsqueeze(2)) & in_context.unsqueeze(1)
    if window is not None:
        mask &= pos.view(1, 1, max_s) > q_pos.unsqueeze(2) - window
    num_tokens = md.num_actual_tokens
    is_whole_batch = (valid is None and len(members) == md.num_reqs
                      and query_rows.numel() == num_tokens)
    fresh = (bool((query_lens == seq_lens).all()) and max_q > 1 and window is None
             and not need_mask)
    return _Group(query_rows=query_rows.to(device), valid=valid, token_rows=token_rows.to(device),
                  is_whole_batch=is_whole_batch, context_blocks=context_blocks,
                  mask=None if fresh else mask.unsqueeze(1).to(device), num_ctx=max_s)
