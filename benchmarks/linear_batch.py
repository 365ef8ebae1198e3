"""The CPU kernels for a decode batch's linear layers side by side, on a model's weights cold, as
in a decode step: linear_batch on the dense weights (strand/kernels/cpu_linear_batch.py), Strand's GEMM
on float32 panels (strand/kernels/cpu_linear_panels.py), oneDNN's packed copy, and with
--dtype bfloat16 Strand's GEMM on bfloat16 panels (strand/kernels/cpu_linear_panels_bf16.py).

    [STRAND_CPU_ISA=avx2 ...] python -m benchmarks.linear_batch [--dtype float32|bfloat16]
        [--rows 8 16 32 64] [--threads 1] [--repeats 3]

Run it under benchmarks/isa_emulation.py's environment (isa_env) to measure an AVX2-only CPU.
One pass is SmolLM2-135M's shapes: 30 layers of qkv (960 x 576), o (576 x 576), gate_up
(3072 x 576) and down (576 x 1536), then the lm_head (49152 x 576), each layer its own random
weight, so a pass reads 538 MB of float32 weights from memory (270 MB in bfloat16), as a decode
step does: the same product with one weight repeated runs from cache and says little about a
step. linear_batch reads the weights as they are; the panels and oneDNN get a float32 copy
(bfloat16 layers have one where oneDNN has no bfloat16 kernels, as on AVX2), bfloat16 rows
widened and the sums rounded, as the layers do. Time: CPU time (time.thread_time) at one thread,
so waiting for a core on a shared machine is not counted; wall time at more. Best of --repeats
passes.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from benchmarks.common import format_table, log

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in) per layer
LAYERS, VOCAB, HIDDEN = 30, 49152, 576
COLUMNS = ("linear_batch", "panels", "oneDNN", "bf16 panels")


def _weights(dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    weights = [(torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
               for _ in range(LAYERS) for n, k in SHAPES]
    weights.append((torch.randn(VOCAB, HIDDEN, generator=g) / HIDDEN ** 0.5).to(dtype))
    return weights


def _best(run: Callable[[], None], repeats: int, threads: int) -> float:
    clock = time.thread_time if threads == 1 else time.perf_counter
    run()  # warm-up: allocations, oneDNN's primitive cache
    times = []
    for _ in range(repeats):
        start = clock()
        run()
        times.append(clock() - start)
    return min(times)


def measure(dtype: torch.dtype, rows: list[int], repeats: int,
            threads: int = 1) -> list[list[str]]:
    from strand.kernels import cpu_linear, cpu_linear_panels, cpu_linear_panels_bf16
    from strand.kernels._cpu_build import KERNELS
    from strand.platform.cpu_isa import probe

    module = KERNELS.require()
    torch.set_num_threads(threads)
    weights = _weights(dtype)
    panels = [cpu_linear_panels.pack(w.float()) for w in weights]
    bf16_panels = ([cpu_linear_panels_bf16.pack(w) for w in weights]
                   if dtype == torch.bfloat16 and cpu_linear_panels_bf16.chosen() else None)
    onednn = (None if cpu_linear.unavailable_reason(torch.float32) is not None else
              [torch.ops.mkldnn._reorder_linear_weight(w.float()) for w in weights])
    flops_per_row = sum(2 * w.shape[0] * w.shape[1] for w in weights)
    log(f"{dtype}, ISA {probe().level}, {threads} thread(s), "
        f"{sum(w.numel() * w.element_size() for w in weights) / 1e6:.0f} MB of weights a pass")
    g = torch.Generator().manual_seed(1)
    table = []
    for m in rows:
        xs = {k: torch.randn(m, k, generator=g).to(dtype) for k in {k for _, k in SHAPES}}
        outs = [torch.empty(m, w.shape[0], dtype=dtype) for w in weights]

        def dense(xs: dict[int, torch.Tensor] = xs, outs: list[torch.Tensor] = outs) -> None:
            for w, o in zip(weights, outs, strict=True):
                module.linear_batch(o, xs[w.shape[1]], w, None)

        def on_panels(xs: dict[int, torch.Tensor] = xs) -> None:
            for w, p in zip(weights, panels, strict=True):
                cpu_linear_panels.linear(xs[w.shape[1]].float(), p, None, w.shape[0]).to(dtype)

        def on_onednn(xs: dict[int, torch.Tensor] = xs) -> None:
            assert onednn is not None
            for w, p in zip(weights, onednn, strict=True):
                torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]].float(), p, None, "none", [],
                                                   "").to(dtype)

        def on_bf16_panels(xs: dict[int, torch.Tensor] = xs) -> None:
            assert bf16_panels is not None
            for w, p in zip(weights, bf16_panels, strict=True):
                cpu_linear_panels_bf16.linear(xs[w.shape[1]], p, None, w.shape[0])

        runs = {"linear_batch": dense, "panels": on_panels,
                "oneDNN": on_onednn if onednn is not None else None,
                "bf16 panels": on_bf16_panels if bf16_panels is not None else None}
        cells = []
        for name in COLUMNS:
            run = runs[name]
            if run is None:
                cells.append(f"({name} unavailable)" if name == "oneDNN" else "-")
                continue
            best = _best(run, repeats, threads)
            cells.append(f"{1e3 * best:.1f} ms, {m * flops_per_row / best / 1e9:.0f} GFLOP/s")
        table.append([str(m), *cells])
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.threads < 1 or any(not 1 <= m <= 4096 for m in args.rows):
        parser.error("--repeats and --threads must be >= 1 and every --rows value in [1, 4096]")
    table = measure(getattr(torch, args.dtype), args.rows, args.repeats, args.threads)
    print(format_table(["rows", *COLUMNS], table))


if __name__ == "__main__":
    main()
