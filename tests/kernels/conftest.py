"""Builders for kernel tests: random paged batches with poisoned caches and outputs.

On CPU the Triton kernels run through the interpreter (TRITON_INTERPRET=1, set here before
anything compiles them); it has no bf16 dot, so bf16 is only tested on a GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from strand.engine_core.model_executor.attention.backend import AttentionMetadata  # noqa: E402

pytest.importorskip("triton", reason="Triton kernels need the triton package")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE.type == "cuda" else [])
# (atol, rtol) against an fp32 reference on the same (rounded) inputs.
TOLERANCE = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    # Other engineers' tests share the 2 cores.
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _poisoned_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """Buffers the kernels allocate start as NaN, so an element a kernel forgets to write fails."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t: torch.Tensor) -> torch.Tensor:
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poison(empty_like(*a, **k)))


@dataclass(slots=True)
class PagedBatch:
    query: torch.Tensor  # [num_tokens, num_heads, head_dim]
    new_keys: torch.Tensor  # [num_tokens, num_kv_heads, head_dim], this step's K
    new_values: torch.Tensor  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    seq_lens: torch.Tensor  # [num_reqs] int32
    block_table: torch.Tensor  # [num_reqs, max_num_blocks] int32
    slot_mapping: torch.Tensor  # [num_tokens] int64
    dense_keys: list[torch.Tensor]  # per request [seq_len, num_kv_heads, head_dim]
    dense_values: list[torch.Tensor]
    query_lens: list[int]
    block_size: int

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens.max())

    def metadata(self, num_padding_tokens: int = 0) -> AttentionMetadata:
        """Metadata for the batch; padding rows get slot -1 and belong to no request."""
        slot_mapping = self.slot_mapping
        if num_padding_tokens:
            pad = torch.full((num_padding_tokens,), -1, dtype=slot_mapping.dtype, device=DEVICE)
            slot_mapping = torch.cat([slot_mapping, pad])
        return AttentionMetadata(
            num_reqs=len(self.query_lens),
            num_actual_tokens=sum(self.query_lens),
            slot_mapping=slot_mapping,
            query_start_loc=self.query_start_loc,
            seq_lens=self.seq_lens,
            block_table=self.block_table,
            max_query_len=self.max_query_len,
            max_seq_len=self.max_seq_len,
            query_start_loc_cpu=self.query_start_loc.cpu(),
            seq_lens_cpu=self.seq_lens.cpu(),
            block_size=self.block_size,
        )


def make_paged_batch(
    query_lens: list[int],
    context_lens: list[int],
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 32,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    write_new_tokens: bool = True,
) -> PagedBatch:
    """Requests whose first context_len tokens are cached and next query_len are new.

    Blocks are scattered at random over the pool (block 0 stays the padding block); every
    cache slot no request owns is NaN, so a kernel that reads past a context fails.
    write_new_tokens=False leaves the new tokens' slots NaN too (a backend must write them).
    """
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [q + c for q, c in zip(query_lens, context_lens, strict=True)]
    blocks_per_req = [-(-s // block_size) for s in seq_lens]
    num_blocks = 1 + sum(blocks_per_req) + 3
    shuffled = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    max_blocks = max(blocks_per_req)
    block_table = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    kv_cache = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), float("nan"))
    dense_keys, dense_values, slots = [], [], []
    for r, (seq_len, q_len) in enumerate(zip(seq_lens, query_lens, strict=True)):
        blocks = [shuffled.pop() for _ in range(blocks_per_req[r])]
        block_table[r, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        k = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        dense_keys.append(k.to(DEVICE))
        dense_values.append(v.to(DEVICE))
        for pos in range(seq_len):
            block, offset = blocks[pos // block_size], pos % block_size
            if pos < seq_len - q_len or write_new_tokens:
                kv_cache[0, block, offset] = k[pos].float()
                kv_cache[1, block, offset] = v[pos].float()
            if pos >= seq_len - q_len:
                slots.append(block * block_size + offset)
    num_tokens = sum(query_lens)
    query = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype)
    starts = [0]
    for q_len in query_lens:
        starts.append(starts[-1] + q_len)
    new_keys = torch.cat([k[-q:] for k, q in zip(dense_keys, query_lens, strict=True) if q])
    new_values = torch.cat([v[-q:] for v, q in zip(dense_values, query_lens, strict=True) if q])
    return PagedBatch(
        query=query.to(DEVICE),
        new_keys=new_keys,
        new_values=new_values,
        kv_cache=kv_cache.to(dtype).to(DEVICE),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_table=block_table.to(DEVICE),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
        dense_keys=dense_keys,
        dense_values=dense_values,
        query_lens=list(query_lens),
        block_size=block_size,
    )


def dense_causal_attention(batch: PagedBatch, scale: float) -> torch.Tensor:
    """SDPA per request on the unpaged K/V, queries aligned to the end of each context."""
    outs = []
    group = batch.query.shape[1] // batch.dense_keys[0].shape[1]
    starts = batch.query_start_loc.tolist()
    for r, (k, v) in enumerate(zip(batch.dense_keys, batch.dense_values, strict=True)):
        q = batch.query[starts[r]: starts[r + 1]].float().transpose(0, 1)  # [H, q_len, D]
        q_len, seq_len = q.shape[1], k.shape[0]
        k = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, seq_len, D]
        v = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=DEVICE).unsqueeze(1)
        allowed = torch.arange(seq_len, device=DEVICE).unsqueeze(0) <= q_pos  # [q_len, seq_len]
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, float("nan"))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)
