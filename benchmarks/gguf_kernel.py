"""The few-row GGUF kernel alone over a model's worth of packed layers, read from memory.

    python -m benchmarks.gguf_kernel [--qtype Q4_1|Q8_0|Q4_0] [--rows 1] [--threads 1]
        [--layers 30] [--hidden 576] [--intermediate 1536] [--repeats 15] [--layout tiles|rows]

Each layer's four linear weights (qkv, o, gate_up, down of a Llama-shaped model; SmolLM2-135M's
shapes by default) are random packed blocks, distinct per layer so that a pass reads them all
from memory, as a decode step does. Prints the best pass over --repeats: milliseconds and the
packed bytes read per second (the few-row product is a read of the weights). --layout rows
times the GGUF rows as the file has them (strand/kernels/csrc/gguf_linear.cpp), tiles (the default, what
GGUFLinear keeps on CPU) the same bytes in 16-row tiles (strand/kernels/csrc/gguf_tiled.cpp).
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import log


def random_blocks(n: int, k: int, qtype: int, g: torch.Generator) -> torch.Tensor:
    """[n, k / 32 * block bytes] random quants with float16 scales (and offsets) of a model's
    magnitude (random bytes there would be NaN or huge)."""
    from strand.kernels.gguf_linear_ref import BLOCK_BYTES, Q4_1

    blocks = torch.randint(0, 256, (n, k // 32, BLOCK_BYTES[qtype]), generator=g,
                           dtype=torch.uint8)
    blocks[..., :2] = (torch.rand(n, k // 32, 1, generator=g) * 0.05).half().view(torch.uint8)
    if qtype == Q4_1:
        blocks[..., 2:4] = ((torch.rand(n, k // 32, 1, generator=g) - 0.5) * 0.2
                            ).half().view(torch.uint8)
    return blocks.reshape(n, -1)


def main(argv: list[str] | None = None) -> None:
    from strand.kernels import cpu_gguf_linear
    from strand.kernels.cpu_linear import SMALL_M
    from strand.kernels.gguf_linear_ref import NAMES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qtype", default="Q4_1", choices=sorted(NAMES.values()))
    parser.add_argument("--rows", type=int, default=1, help=f"rows of x, 1..{SMALL_M}")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--intermediate", type=int, default=1536)
    parser.add_argument("--kv", type=int, default=192, help="k (and v) projection width")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--layout", default="tiles", choices=["tiles", "rows"])
    args = parser.parse_args(argv)
    if not 1 <= args.rows <= SMALL_M:
        parser.error(f"--rows must be in 1..{SMALL_M}, got {args.rows}")
    for name in ("threads", "layers", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    for name in ("hidden", "intermediate", "kv"):
        if getattr(args, name) < 32 or getattr(args, name) % 32:
            parser.error(f"--{name} must be a positive multiple of 32")
    if not cpu_gguf_linear.kernels_apply(torch.empty(0, dtype=torch.uint8)):
        parser.error("the CPU kernels are not built here (python -m strand.kernels.build)")
    qtype = {v: k for k, v in NAMES.items()}[args.qtype]
    torch.set_num_threads(args.threads)
    h, i = args.hidden, args.intermediate
    shapes = [(h + 2 * args.kv, h), (h, h), (2 * i, h), (h, i)] * args.layers
    g = torch.Generator().manual_seed(0)
    weights = [random_blocks(n, k, qtype, g) for n, k in shapes]
    if args.layout == "tiles":  # every width is a multiple of 32, so of the tiles' 16 rows
        weights = [cpu_gguf_linear.gguf_tile(w, qtype, k) for w, (_, k) in zip(weights, shapes,
                                                                                strict=True)]
    xs = {k: torch.randn(args.rows, k, generator=g) for k in (h, i)}
    total = sum(w.numel() for w in weights)
    log(f"{args.layers} layers, {total / 1e6:.0f} MB of {args.qtype} ({args.layout}), "
        f"{args.rows} row(s), {args.threads} thread(s)")

    def one_pass() -> None:
        for w, (_, k) in zip(weights, shapes, strict=True):
            cpu_gguf_linear.gguf_linear_small(xs[k], w, qtype)

    one_pass()
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        one_pass()
        best = min(best, time.perf_counter() - start)
    print(f"{args.qtype} {args.layout} rows={args.rows} threads={args.threads}: "
          f"{best * 1e3:.2f} ms a pass, "
          f"{total / best / 1e9:.1f} GB/s of packed weights")


if __name__ == "__main__":
    main()
