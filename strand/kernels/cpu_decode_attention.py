"""Decode attention straight from the paged KV cache on CPU: a C++ kernel built on first use.

The pure-torch backend gathers every decode's context out of the paged cache into a padded batch
before SDPA, which per layer and step copies the whole context twice (K and V). This kernel reads
each K/V block where it lies, once, parallel over requests with ATen's thread pool, in 16-float
vectors. At 64 decodes of 24-640 tokens (8 heads, 4 kv heads, head_dim 64) it reads K/V at
about three quarters of a plain read's rate of that much memory; a scalar-reduction version took
twice its time, gather + SDPA more than twice that.
Its reference is strand/kernels/paged_attention_ref.py (tests/kernels/test_cpu_decode_attention.py).

The C++ is strand/kernels/csrc/decode_attention.cpp, built once with the other CPU kernels (strand/kernels/_cpu_build.py). Where
that fails, or with STRAND_DISABLE_CPU_KERNELS=1, the caller keeps the pure-torch path;
`unavailable_reason()` says why.
"""

from __future__ import annotations

import torch

from strand.kernels._cpu_build import KERNELS as _EXTENSION

# What the kernel reads and writes; bfloat16 is computed in float32 and rounded once, at the end.
DTYPES = (torch.float32, torch.bfloat16)
# (query, cache) dtypes it takes: one dtype, or float32 activations over a bfloat16 cache
# (kv_cache_dtype="bfloat16"), whose rows are widened as they are loaded.
PAIRS = ((torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
         (torch.float32, torch.bfloat16))


def takes(query_dtype: torch.dtype, cache_dtype: torch.dtype) -> bool:
    """Whether the attention kernels (decode and prefill) take this query and cache dtype."""
    return (query_dtype, cache_dtype) in PAIRS


def is_available() -> bool:
    """Builds (once, with the other CPU kernels) on the first call."""
    return _EXTENSION.module() is not None


def unavailable_reason() -> str | None:
    return _EXTENSION.unavailable_reason()


def decode_attention(
    query: torch.Tensor,  # [num_reqs, num_heads, head_dim] float32/bfloat16, one token each
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim] (takes())
    block_table: torch.Tensor,  # [num_reqs, max_num_blocks] int32, covering seq_lens
    seq_lens: torch.Tensor,  # [num_reqs] int32, each >= 1
    scale: float,
) -> torch.Tensor:  # [num_reqs, num_heads, head_dim]
    module = _EXTENSION.module()
    if module is None:
        raise RuntimeError(f"CPU decode attention kernel unavailable: {unavailable_reason()}")
    if not takes(query.dtype, kv_cache.dtype):
        raise ValueError(f"decode_attention needs float32 or bfloat16 query and kv_cache of "
                         f"one dtype, or a float32 query and a bfloat16 kv_cache, got "
                         f"{query.dtype} and {kv_cache.dtype}")
    if query.shape[1] % kv_cache.shape[3]:
        raise ValueError(f"num_heads ({query.shape[1]}) must be a multiple of num_kv_heads "
                         f"({kv_cache.shape[3]})")
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache must be contiguous")
    out = torch.empty_like(query)
    module.decode_attention(out, query.contiguous(), kv_cache[0], kv_cache[1],
                            block_table.to(torch.int32).contiguous(),
                            seq_lens.to(torch.int32).contiguous(), float(scale))
    return out
