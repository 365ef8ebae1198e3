"""Paged attention kernel time against torch SDPA on the same shapes.

SDPA runs on dense, contiguous K/V (no paging, no gather): a lower bound the paged kernel
should approach. On CUDA both are timed with CUDA events; on CPU the script says it needs
CUDA, times the pure-torch paged reference alone on a few small shapes, and exits 0.

    python -m benchmarks.kernels [--dtype bfloat16] [--num-heads 32] [--num-kv-heads 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if not __package__:
    # Run as a file, this script's folder would come first on sys.path and this file would
    # shadow the `kernels` package; the repository root must be searched instead.
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from strand.kernels.paged_attention_ref import paged_attention_ref  # noqa: E402


@dataclass(slots=True)
class Shape:
    name: str
    query_lens: list[int]
    context_lens: list[int]


CUDA_SHAPES = [
    Shape("decode bs=1 ctx=8k", [1], [8192]),
    Shape("decode bs=8 ctx=2k", [1] * 8, [2048] * 8),
    Shape("decode bs=64 ctx=1k", [1] * 64, [1024] * 64),
    Shape("decode bs=256 ctx=512", [1] * 256, [512] * 256),
    Shape("prefill 1x2048", [2048], [0]),
    Shape("prefill 4x512", [512] * 4, [0] * 4),
    Shape("chunk 512 on 3k prefix + 32 decodes", [512] + [1] * 32, [3072] + [1024] * 32),
]
CPU_SHAPES = [
    Shape("decode bs=4 ctx=256", [1] * 4, [256] * 4),
    Shape("prefill 1x128", [128], [0]),
]


@dataclass(slots=True)
class Problem:
    query: torch.Tensor  # [num_tokens, num_heads, head_dim]
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    dense_k: torch.Tensor  # [num_reqs, num_heads, max_seq_len, head_dim]
    dense_v: torch.Tensor
    dense_q: torch.Tensor  # [num_reqs, num_heads, max_query_len, head_dim]
    max_query_len: int
    max_seq_len: int


def build(shape: Shape, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
          dtype: torch.dtype, device: torch.device) -> Problem:
    seq_lens = [q + c for q, c in zip(shape.query_lens, shape.context_lens, strict=True)]
    max_blocks = -(-max(seq_lens) // block_size)
    num_reqs = len(seq_lens)
    num_blocks = 1 + num_reqs * max_blocks
    perm = torch.randperm(num_blocks - 1) + 1
    block_table = perm.view(num_reqs, max_blocks).to(torch.int32).to(device)
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim,
                           dtype=dtype, device=device)
    starts = [0]
    for q in shape.query_lens:
        starts.append(starts[-1] + q)
    group = num_heads // num_kv_heads
    # SDPA's equal-length dense batch: same total work as the paged problem.
    max_q, max_s = max(shape.query_lens), max(seq_lens)
    dense_k = torch.randn(num_reqs, num_heads // group, max_s, head_dim, dtype=dtype,
                          device=device).repeat_interleave(group, dim=1)
    return Problem(
        query=torch.randn(starts[-1], num_heads, head_dim, dtype=dtype, device=device),
        kv_cache=kv_cache,
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_table=block_table,
        dense_k=dense_k,
        dense_v=dense_k.clone(),
        dense_q=torch.randn(num_reqs, num_heads, max_q, head_dim, dtype=dtype, device=device),
        max_query_len=max_q,
        max_seq_len=max_s,
    )


def time_ms(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    fn()  # warm-up (and Triton compilation)
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) * 1e3 / iters
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / iters


def sdpa(p: Problem, scale: float) -> torch.Tensor:
    # Bottom-right causal: queries are the last max_query_len positions of the context.
    q_len, s_len = p.dense_q.shape[2], p.dense_k.shape[2]
    mask = None
    if q_len > 1:
        mask = torch.ones(q_len, s_len, dtype=torch.bool, device=p.dense_q.device).tril(s_len - q_len)
    return F.scaled_dot_product_attention(p.dense_q, p.dense_k, p.dense_v, attn_mask=mask,
                                          scale=scale)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    scale = args.head_dim**-0.5
    on_cuda = torch.cuda.is_available()
    device = torch.device("cuda" if on_cuda else "cpu")
    shapes = CUDA_SHAPES if on_cuda else CPU_SHAPES
    if not on_cuda:
        print("Triton paged attention vs torch SDPA needs CUDA. On a GPU this measures, per shape:")
        for s in CUDA_SHAPES:
            print(f"  {s.name}: triton paged_attention (auto split-KV), forced single pass, SDPA")
        print("Here: the pure-torch paged reference alone, float32, small shapes.\n")
        dtype = torch.float32
    print(f"{'shape':40s} {'ref ms' if not on_cuda else 'triton ms':>10s} "
          f"{'1-pass ms':>10s} {'sdpa ms':>10s} {'triton/sdpa':>12s}")
    for s in shapes:
        p = build(s, args.num_heads, args.num_kv_heads, args.head_dim, args.block_size, dtype,
                  device)
        print(f"{s.name:40s} {measure(p, scale, device, args.iters)}")


def measure(p: Problem, scale: float, device: torch.device, iters: int) -> str:
    """One table row (without the name): paged kernel(s) and SDPA, or the reference on CPU."""
    out = torch.empty_like(p.query)
    if device.type != "cuda":
        ms = time_ms(lambda: paged_attention_ref(
            p.query, p.kv_cache, p.query_start_loc, p.seq_lens, p.block_table, scale, out),
            device, max(1, iters // 10))
        return f"{ms:10.2f} {'-':>10s} {'-':>10s} {'-':>12s}"
    from strand.kernels.paged_attention import paged_attention

    def run(num_splits: int | None) -> torch.Tensor:
        return paged_attention(p.query, p.kv_cache, out, p.query_start_loc, p.seq_lens,
                               p.block_table, scale, p.max_query_len, p.max_seq_len,
                               num_splits=num_splits)

    auto_ms = time_ms(lambda: run(None), device, iters)
    one_ms = time_ms(lambda: run(1), device, iters)
    sdpa_ms = time_ms(lambda: sdpa(p, scale), device, iters)
    return f"{auto_ms:10.3f} {one_ms:10.3f} {sdpa_ms:10.3f} {auto_ms / sdpa_ms:12.2f}"

if __name__ == "__main__":
    main()
