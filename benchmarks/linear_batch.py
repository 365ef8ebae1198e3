"""The decode-batch linear kernel (kernels/cpu_linear_batch.py) against oneDNN's packed path, on
a model's linear layers with the weights cold, as in a decode step.

    STRAND_CPU_ISA=avx2 ... python -m benchmarks.linear_batch [--dtype float32|bfloat16]
        [--rows 8 16 32 64] [--repeats 3]

Run it under benchmarks/isa_emulation.py's environment (isa_env) to measure an AVX2-only CPU.
One thread; CPU time (time.thread_time) of one pass over SmolLM2-135M's shapes: 30 layers of
qkv (960 x 576), o (576 x 576), gate_up (3072 x 576) and down (576 x 1536), then the lm_head
(49152 x 576), each layer its own random weight, so a pass reads 538 MB of float32 weights from
memory (270 MB in bfloat16), as a decode step does: the same product with one weight repeated
runs from cache and says little about a step. oneDNN gets float32 packed weights (bfloat16 goes
through a float32 copy where oneDNN has no bfloat16 kernels, as the engine does on AVX2); the
kernel reads the weights as they are. Best of --repeats passes.
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import format_table, log

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in) per layer
LAYERS, VOCAB, HIDDEN = 30, 49152, 576


def measure(dtype: torch.dtype, rows: list[int], repeats: int) -> list[list[str]]:
    from kernels._cpu_build import KERNELS
    from kernels.cpu_isa import probe
    from kernels.cpu_linear import linear_packed, pack_weight

    module = KERNELS.module()
    if module is None:
        raise RuntimeError(f"the C++ kernels are needed: {KERNELS.unavailable_reason()}")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    weights = [(torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
               for _ in range(LAYERS) for n, k in SHAPES]
    weights.append((torch.randn(VOCAB, HIDDEN, generator=g) / HIDDEN ** 0.5).to(dtype))
    packed = [p for w in weights if (p := pack_weight(w.float())) is not None]
    if len(packed) != len(weights):
        raise RuntimeError("oneDNN linear is unavailable here (kernels/cpu_linear.py)")
    flops_per_row = sum(2 * w.shape[0] * w.shape[1] for w in weights)
    log(f"{dtype}, ISA {probe().level}, {sum(w.numel() * w.element_size() for w in weights) / 1e6:.0f}"
        f" MB of weights a pass")
    table = []
    for m in rows:
        xs = {k: torch.randn(m, k, generator=g).to(dtype) for k in {k for _, k in SHAPES}}
        outs = [torch.empty(m, w.shape[0], dtype=dtype) for w in weights]

        def kernel(xs: dict[int, torch.Tensor] = xs, outs: list[torch.Tensor] = outs) -> None:
            for w, o in zip(weights, outs, strict=True):
                module.linear_batch(o, xs[w.shape[1]], w, None)

        def onednn(xs: dict[int, torch.Tensor] = xs) -> None:
            for w, p in zip(weights, packed, strict=True):
                y = linear_packed(xs[w.shape[1]].float(), p, None, w.shape[0])
                if dtype != torch.float32:
                    y.to(dtype)

        best = {}
        for name, run in (("kernel", kernel), ("onednn", onednn)):
            run()  # warm-up: allocations, oneDNN's primitive cache
            times = []
            for _ in range(repeats):
                start = time.thread_time()
                run()
                times.append(time.thread_time() - start)
            best[name] = min(times)
        table.append([str(m), *(f"{1e3 * best[n]:.1f} ms, {m * flops_per_row / best[n] / 1e9:.0f} "
                                f"GFLOP/s" for n in ("kernel", "onednn")),
                      f"{best['onednn'] / best['kernel']:.2f}x"])
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.repeats < 1 or any(not 1 <= m <= 4096 for m in args.rows):
        raise ValueError("--repeats must be >= 1 and every --rows value in [1, 4096]")
    table = measure(getattr(torch, args.dtype), args.rows, args.repeats)
    print(format_table(["rows", "linear_batch", "oneDNN (packed)", "speed-up"], table))


if __name__ == "__main__":
    main()
