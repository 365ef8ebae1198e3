"""bfloat16 linear kernels side by side at Llama-3.2-1B's shapes, weights cold: Strand's GEMM on
bfloat16 panels (strand/kernels/cpu_linear_panels_bf16.py), oneDNN's packed bfloat16 copy
(torch.ops.mkldnn's reorder and linear, as cpu_linear runs it), the few-row dense kernel linear_small (M <= 4), and
the float32 panels on a float32 copy (x widened, the sums rounded to bfloat16, as the layers do).

    [STRAND_CPU_ISA=avx2 ...] python -m benchmarks.linear_panels_bf16 [--rows 1 4 32 512]
        [--threads 2] [--layers 8] [--repeats 3]

Each shape gets --layers weights of its own, cycled in one pass, so a pass reads them from
memory as a model's step does (one weight repeated runs from cache). The kernels take turns
within each repeat (A, B, C, A, B, C, ...), so that load from other processes falls on all of
them alike; the best pass of each is reported (wall time, perf_counter).
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable

import torch

from benchmarks.common import format_table, log

SHAPES = [(8192, 2048), (2048, 8192), (2048, 2048)]  # (out, in): gate/up, down, q/o
COLUMNS = ("bf16 panels", "oneDNN bf16", "linear_small", "f32 panels")


def _runs(weights: list[torch.Tensor], m: int) -> dict[str, Callable[[], None] | None]:
    from strand.kernels import cpu_linear, cpu_linear_panels, cpu_linear_panels_bf16

    n, k = weights[0].shape
    x = torch.randn(m, k).bfloat16()
    panels = [cpu_linear_panels_bf16.pack(w) for w in weights]
    onednn = ([torch.ops.mkldnn._reorder_linear_weight(w) for w in weights]
              if cpu_linear.unavailable_reason(torch.bfloat16) is None else None)
    f32 = ([cpu_linear_panels.pack(w.float()) for w in weights]
           if cpu_linear_panels.chosen() else None)

    def ours() -> None:
        for p in panels:
            cpu_linear_panels_bf16.linear(x, p, None, n)

    def on_onednn() -> None:
        assert onednn is not None
        for p in onednn:
            torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")

    def small() -> None:
        for w in weights:
            cpu_linear.linear_small(x, w, None)

    def on_f32() -> None:
        assert f32 is not None
        for p in f32:
            cpu_linear_panels.linear(x.float(), p, None, n).bfloat16()

    return {"bf16 panels": ours,
            "oneDNN bf16": on_onednn if onednn is not None else None,
            "linear_small": small if m <= cpu_linear.SMALL_M else None,
            "f32 panels": on_f32 if f32 is not None else None}


def measure(rows: list[int], layers: int, repeats: int, threads: int) -> list[list[str]]:
    from strand.kernels import cpu_linear_panels_bf16
    from strand.platform.cpu_isa import probe

    torch.set_num_threads(threads)
    log(f"ISA {probe().level}, VDPBF16PS {cpu_linear_panels_bf16.uses_dpbf16()}, "
        f"{threads} thread(s), {layers} weights a shape")
    g = torch.Generator().manual_seed(0)
    table = []
    for n, k in SHAPES:
        weights = [(torch.randn(n, k, generator=g) / k ** 0.5).bfloat16() for _ in range(layers)]
        for m in rows:
            runs = _runs(weights, m)
            best = {name: float("inf") for name, run in runs.items() if run is not None}
            for name in best:  # warm-up: allocations, oneDNN's primitive cache
                runs[name]()  # type: ignore[misc]
            for _ in range(repeats):
                for name in best:
                    start = time.perf_counter()
                    runs[name]()  # type: ignore[misc]
                    best[name] = min(best[name], time.perf_counter() - start)
            flops = 2 * m * n * k * layers
            cells = [f"{1e3 * best[c] / layers:.2f} ms, {flops / best[c] / 1e9:.0f} GF/s"
                     if c in best else "-" for c in COLUMNS]
            table.append([f"{n}x{k}", str(m), *cells])
            del runs
            gc.collect()
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 32, 512])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if min(args.repeats, args.threads, args.layers, *args.rows) < 1:
        parser.error("--rows, --layers, --threads and --repeats must be >= 1")
    table = measure(args.rows, args.layers, args.repeats, args.threads)
    print(format_table(["out x in", "rows", *(f"{c} (a weight)" for c in COLUMNS)], table))


if __name__ == "__main__":
    main()
