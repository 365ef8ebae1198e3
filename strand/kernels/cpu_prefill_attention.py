"""Prefill attention straight from the paged KV cache on CPU: a C++ kernel built on first use.

The pure-torch backend pads the prompts of a step to a common length, gathers each one's context
out of the paged cache, and runs SDPA per length bucket: the padding and the copies cost as much
as the attention. This kernel reads each request's K/V blocks where they lie and does exactly its
causal work (a cached prefix included), in tiles of 48 rows (32 without AVX-512) spread over
ATen's threads longest first. Its reference is strand/kernels/paged_attention_ref.py (tests/kernels/test_cpu_prefill_attention.py).

bfloat16 on a CPU with AMX (and at the avx512 level) runs strand/kernels/csrc/prefill_attention_amx.cpp
instead: the same requests and arguments, products on AMX tiles (amx_applies() says where). Without
AMX but with AVX512_BF16 (Zen 4, Cooper Lake) the products of the same kernel go through
VDPBF16PS, 32 bfloat16 products an instruction (pairs_applies()).

The C++ is strand/kernels/csrc/prefill_attention.cpp, built once with the other CPU kernels (strand/kernels/_cpu_build.py). Where
that fails, or with STRAND_DISABLE_CPU_KERNELS=1, the caller keeps the pure-torch path;
`unavailable_reason()` says why.
"""

from __future__ import annotations

import torch

from strand.kernels._cpu_build import KERNELS as _EXTENSION
from strand.kernels.cpu_decode_attention import takes
from strand.platform.cpu_isa import probe

# What the kernel reads and writes; bfloat16 is computed in float32 and rounded once, at the end
# (on AMX and with VDPBF16PS the probabilities are rounded to bfloat16 for P.V as well, as torch's
# flash kernel does).
DTYPES = (torch.float32, torch.bfloat16)


def is_available() -> bool:
    """Builds (once, with the other CPU kernels) on the first call."""
    return _EXTENSION.module() is not None


def amx_applies(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether prefill_attention runs `dtype` on AMX tiles (strand/kernels/csrc/prefill_attention_amx.cpp):
    bfloat16, head_dim a multiple of 32 up to 256, the avx512 level with AMX-BF16 (cpu_isa), and
    Linux granting the tile state. There a 512-token SmolLM2 layer takes well under SDPA's
    time."""
    if dtype != torch.bfloat16 or head_dim % 32 or head_dim > 256 or not probe().amx_bf16:
        return False
    module = _EXTENSION.module()
    return module is not None and bool(module.prefill_attention_amx_available())


def pairs_applies(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether prefill_attention runs `dtype`'s products by VDPBF16PS: bfloat16, an even
    head_dim, the avx512 level with AVX512_BF16 (cpu_isa) and no AMX (which is faster still).
    It measured faster than widening each bfloat16 element to float32 (SmolLM2's 512-token
    layer, one thread)."""
    if dtype != torch.bfloat16 or head_dim % 2 or not probe().avx512_bf16:
        return False
    module = _EXTENSION.module()
    return module is not None and bool(module.prefill_attention_pairs_available())


def unavailable_reason() -> str | None:
    return _EXTENSION.unavailable_reason()


def prefill_attention(
    out: torch.Tensor,  # [num_tokens, num_heads, head_dim]: the requests' rows are written
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim] float32/bfloat16, rows may be strided
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim] (takes())
    block_table: torch.Tensor,  # [num_reqs, max_num_blocks] int32, covering seq_lens
    q_starts: torch.Tensor,  # [num_reqs] int32: first row of each request in query and out
    q_lens: torch.Tensor,  # [num_reqs] int32, each >= 1
    seq_lens: torch.Tensor,  # [num_reqs] int32, each >= its q_len
    scale: float,
) -> None:
    """Request r's rows q_starts[r] .. + q_lens[r] of `out`, causal over its seq_len positions."""
    module = _EXTENSION.module()
    if module is None:
        raise RuntimeError(f"CPU prefill attention kernel unavailable: {unavailable_reason()}")
    if query.dtype not in DTYPES:
        raise ValueError(f"prefill_attention needs float32 or bfloat16 query, got {query.dtype}")
    if out.dtype != query.dtype:
        raise ValueError(f"prefill_attention needs out in the query's dtype ({query.dtype}), "
                         f"got {out.dtype}")
    if not takes(query.dtype, kv_cache.dtype):
        raise ValueError(f"prefill_attention needs kv_cache in the query's dtype ({query.dtype}) "
                         f"or bfloat16 under a float32 query, got {kv_cache.dtype}")
    if query.shape[1] % kv_cache.shape[3]:
        raise ValueError(f"num_heads ({query.shape[1]}) must be a multiple of num_kv_heads "
                         f"({kv_cache.shape[3]})")
    if out.shape != query.shape:
        raise ValueError(f"out shape {tuple(out.shape)} must equal query shape "
                         f"{tuple(query.shape)}")
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache must be contiguous")
    # Each token's heads must be one dense [num_heads, head_dim] run; tokens may be strided
    # (q is a view of the fused qkv projection).
    if query[0].stride() != (query.shape[2], 1):
        query = query.contiguous()
    if out[0].stride() != (out.shape[2], 1):
        raise ValueError("out rows must be dense [num_heads, head_dim]")
    if amx_applies(query.dtype, query.shape[2]):
        run = module.prefill_attention_amx
    elif pairs_applies(query.dtype, query.shape[2]):
        run = module.prefill_attention_pairs
    else:
        run = module.prefill_attention
    run(out, query, kv_cache[0], kv_cache[1], block_table.to(torch.int32).contiguous(),
        q_starts.to(torch.int32).contiguous(), q_lens.to(torch.int32).contiguous(),
        seq_lens.to(torch.int32).contiguous(), float(scale))
