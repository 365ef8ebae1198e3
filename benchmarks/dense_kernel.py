"""The few-row dense linear kernel alone over a model's worth of weights, read from memory.

    python -m benchmarks.dense_kernel [--dtype bfloat16|float32] [--isa native|avx2] [--rows 1]
        [--threads 1] [--layers 30] [--hidden 576] [--intermediate 1536] [--vocab 49152]
        [--repeats 15] [--layout heap|huge|both]

Each layer's four linear weights (qkv, o, gate_up, down of a Llama-shaped model; SmolLM2-135M's
shapes by default) and an lm_head are random, distinct per layer so that a pass reads them all
from memory, as a bs=1 decode step does (strand/kernels/csrc/linear_small.cpp). Prints the best pass
over --repeats by wall and by CPU time of the calling thread (at one thread every part runs on
it, so waiting for a core on a shared machine is not counted): milliseconds and weight bytes
read per second. --isa avx2 times the AVX2-only build on a wider CPU (benchmarks/isa_emulation.py).
--layout: where the weights lie: `heap`, each its own torch tensor (4 KiB pages here: the engine's
allocator keeps large blocks in the heap); `huge`, one block of 2 MiB pages in read order, as the
engine gathers them after loading (strand/engine_core/model_executor/layers/weight_arena.py); `both`,
the two copies in one process, their passes alternating (the same load meets both).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from benchmarks.common import log


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--isa", default="native", choices=["native", "avx2"])
    parser.add_argument("--rows", type=int, default=1, help="rows of x, 1..4")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--kv", type=int, default=192, help="k (and v) projection width")
    parser.add_argument("--vocab", type=int, default=49152, help="lm_head rows (0: none)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--layout", default="both", choices=["heap", "huge", "both"])
    args = parser.parse_args(argv)
    if not 1 <= args.rows <= 4:
        parser.error(f"--rows must be in 1..4, got {args.rows}")
    for name in ("threads", "layers", "repeats", "hidden", "intermediate", "kv"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.vocab < 0:
        parser.error(f"--vocab must be >= 0, got {args.vocab}")
    # Read once by torch and the kernel build at first use: set before they are imported.
    from benchmarks.isa_emulation import isa_env

    os.environ.update(isa_env(args.isa))
    import torch

    from strand.kernels._cpu_build import KERNELS
    from strand.platform.cpu_isa import probe

    module = KERNELS.module()
    if module is None:
        parser.error(f"the CPU kernels are unavailable: {KERNELS.unavailable_reason()}")
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(args.threads)
    h, i = args.hidden, args.intermediate
    shapes = [(h + 2 * args.kv, h), (h, h), (2 * i, h), (h, i)] * args.layers
    shapes += [(args.vocab, h)] if args.vocab else []
    g = torch.Generator().manual_seed(0)
    heap = [(torch.randn(n, k, generator=g) * 0.05).to(dtype) for n, k in shapes]
    xs = {k: torch.randn(args.rows, k, generator=g).to(dtype) for k in (h, i)}
    outs = [torch.empty(args.rows, n, dtype=dtype) for n, _ in shapes]
    total = sum(w.numel() * w.element_size() for w in heap)
    layouts: dict[str, list[torch.Tensor]] = {}
    if args.layout in ("heap", "both"):
        layouts["heap"] = heap
    if args.layout in ("huge", "both"):
        layouts["huge"] = _in_huge_pages(heap)
    log(f"{args.layers} layers + lm_head {args.vocab}, {total / 1e6:.0f} MB of {args.dtype}, "
        f"{args.rows} row(s), {args.threads} thread(s), kernels built for {probe().level}")

    def one_pass(weights: list[torch.Tensor]) -> None:
        for w, out, (_, k) in zip(weights, outs, shapes, strict=True):
            module.linear_small(out, xs[k], w, None)

    best = {name: [float("inf"), float("inf")] for name in layouts}
    for weights in layouts.values():
        one_pass(weights)
    for _ in range(args.repeats):
        for name, weights in layouts.items():
            wall, cpu = time.perf_counter(), time.thread_time()
            one_pass(weights)
            best[name][0] = min(best[name][0], time.perf_counter() - wall)
            best[name][1] = min(best[name][1], time.thread_time() - cpu)
    for name, (best_wall, best_cpu) in best.items():
        print(f"{args.dtype} isa={args.isa} rows={args.rows} threads={args.threads} "
              f"layout={name}: wall {best_wall * 1e3:.2f} ms ({total / best_wall / 1e9:.1f} GB/s), "
              f"thread CPU {best_cpu * 1e3:.2f} ms ({total / best_cpu / 1e9:.1f} GB/s)")


def _in_huge_pages(weights: list[Any]) -> list[Any]:
    """Copies of the weights in one block of 2 MiB pages, in order, as the engine lays them out."""
    from strand.engine_core.model_executor.layers.weight_arena import (
        huge_page_block,
        huge_page_bytes,
    )

    align = 4096
    sizes = [-(-w.numel() * w.element_size() // align) * align for w in weights]
    block = huge_page_block(sum(sizes))
    copies, offset = [], 0
    for w, size in zip(weights, sizes, strict=True):
        view = block[offset:offset + w.numel() * w.element_size()].view(w.dtype).view(w.shape)
        view.copy_(w)
        copies.append(view)
        offset += size
    log(f"huge layout: {(huge_page_bytes(block) or 0) >> 20} of {sum(sizes) >> 20} MiB "
        "on 2 MiB pages")
    return copies


if __name__ == "__main__":
    main()
