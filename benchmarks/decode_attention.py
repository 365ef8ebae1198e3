"""The CPU decode attention kernel alone over a model's worth of paged K/V, read from memory.

    python -m benchmarks.decode_attention [--context 256 1024] [--requests 1] [--threads 2]
        [--layers 64] [--heads 32] [--kv-heads 8] [--head-dim 64] [--dtype float32]
        [--repeats 15] [--copy-mib 256] [--out results.json]

Each layer has a paged cache of its own, its blocks scattered one apart in the pool (as a
running engine's are), so that a pass over the layers reads K and V from memory as a decode
step does; the defaults are Llama-3.2-1B's attention shape. Prints the best pass over
--repeats: microseconds a layer, and the K/V bytes read per second against this machine's copy
rate in the same run (strand/kernels/csrc/decode_attention.cpp reads each K and V row once).
One request splits into a task per kv head (decode_attention.cpp's run), a batch into a task per
request.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.common import format_table, log, write_json

BLOCK = 16


def layer_caches(context: int, requests: int, layers: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype) -> tuple[list[torch.Tensor], torch.Tensor]:
    """`layers` caches [2, blocks, 16, kv_heads, head_dim] and the block table they share:
    request r's block b is pool block 2 (r * per + b), every other block left unused."""
    per = (context + BLOCK - 1) // BLOCK
    g = torch.Generator().manual_seed(0)
    caches = [torch.randn(2, 2 * requests * per, BLOCK, kv_heads, head_dim, generator=g)
              .to(dtype) for _ in range(layers)]
    table = (2 * torch.arange(requests * per, dtype=torch.int32)).reshape(requests, per)
    return caches, table


def main(argv: list[str] | None = None) -> None:
    from benchmarks.roofline import measure_bandwidth
    from strand.kernels.cpu_decode_attention import decode_attention

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, nargs="+", default=[256, 1024],
                        help="tokens of K/V each request attends to")
    parser.add_argument("--requests", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=64,
                        help="distinct caches a pass reads (past the last-level cache)")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--copy-mib", type=int, default=256, help="the copy rate's buffer")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    for name in ("requests", "threads", "layers", "heads", "kv_heads", "head_dim", "repeats",
                 "copy_mib"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if min(args.context) < 1:
        parser.error("--context must be >= 1")
    if args.heads % args.kv_heads:
        parser.error(f"--heads ({args.heads}) must be a multiple of --kv-heads ({args.kv_heads})")
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    copy_rate = measure_bandwidth(args.copy_mib * 1024**2)
    log(f"copy rate {copy_rate / 1e9:.1f} GB/s at {args.threads} threads")
    rows, results = [], []
    for context in args.context:
        caches, table = layer_caches(context, args.requests, args.layers, args.kv_heads,
                                     args.head_dim, dtype)
        query = torch.randn(args.requests, args.heads, args.head_dim).to(dtype)
        lens = torch.full((args.requests,), context, dtype=torch.int32)
        scale = args.head_dim**-0.5
        for cache in caches:  # warm-up: the kernels built and loaded, every page touched
            decode_attention(query, cache, table, lens, scale)
        best = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            for cache in caches:
                decode_attention(query, cache, table, lens, scale)
            best = min(best, (time.perf_counter() - start) / args.layers)
        kv_bytes = 2 * args.requests * context * args.kv_heads * args.head_dim * dtype.itemsize
        rate = kv_bytes / best
        rows.append([str(context), str(args.requests), f"{best * 1e6:.1f}",
                     f"{rate / 1e9:.1f}", f"{rate / copy_rate:.0%}"])
        results.append({"context": context, "us_per_layer": best * 1e6,
                        "kv_bytes_per_s": rate})
    print(format_table(["context", "requests", "us/layer", "K/V GB/s", "of the copy rate"], rows))
    write_json(args.out, {"benchmark": "decode_attention", "threads": args.threads,
                          "dtype": args.dtype, "copy_bytes_per_s": copy_rate,
                          "shape": [args.heads, args.kv_heads, args.head_dim],
                          "results": results})


if __name__ == "__main__":
    main()
