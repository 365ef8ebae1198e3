"""The machine's bound for a model and workload: measured GEMM rate and memory bandwidth.

    python -m benchmarks.roofline [--model DIR | --num-layers 8 --hidden-size 512 ...]

Work the workload needs at least (every backend does at least this much):
  linear FLOPs    = 2 * P_layers * (prompt + output - 1 tokens fed) + 2 * P_lm_head * output tokens
  attention FLOPs = 4 * layers * q_size * (keys attended), summed over every token fed
  weight bytes    = bytes of every matmul weight, read once per forward step
  KV bytes        = 2 * layers * kv_size * dtype bytes per key attended
Time bounds: compute = FLOPs / GEMM rate (the fastest library measured; for bfloat16 and
float16 the float32 rate too, with the weights converted, where the CPU has no instructions for
the narrow type and its libraries emulate them slower than float32 runs); memory = (steps *
weight bytes + KV bytes) / bandwidth, where steps >= output tokens / batch. The bound is the larger time; tokens/s bounds divide the
workload's tokens by it. The fraction a backend achieves is bound time / its elapsed time.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from benchmarks.common import (
    add_model_args,
    load_config,
    log,
    resolve_device,
    resolve_model,
    set_threads,
)
from benchmarks.datasets import SampleRequest, add_dataset_args, dataset_from_args
from strand.kernels import cpu_linear, cpu_linear_panels

SLOW_PRODUCT_S = 2.0
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(slots=True)
class MachineRates:
    gemm_flops_per_s: float
    memory_bytes_per_s: float
    gemm_size: int
    copy_bytes: int
    dtype: str
    num_threads: int
    gemm_library: str = ""  # which library and precision gave gemm_flops_per_s


@dataclass(slots=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        return cls(num_layers=config["num_hidden_layers"], hidden_size=hidden, num_heads=heads,
                   num_kv_heads=config.get("num_key_value_heads") or heads,
                   head_dim=config.get("head_dim") or hidden // heads,
                   intermediate_size=config["intermediate_size"],
                   vocab_size=config["vocab_size"])

    @property
    def layer_params(self) -> int:
        """Matmul weights of all decoder layers: q, k, v, o and the gated MLP."""
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        per_layer = (self.hidden_size * (q_size + 2 * kv_size) + q_size * self.hidden_size
                     + 3 * self.hidden_size * self.intermediate_size)
        return self.num_layers * per_layer

    @property
    def lm_head_params(self) -> int:
        # Counted even when tied to the embedding: the matmul happens either way.
        return self.vocab_size * self.hidden_size


def measure_gemm(size: int = 2048, dtype: str = "float32", repeats: int = 3,
                 device: str = "cpu") -> float:
    """Best FLOP/s of a [size, size] x [size, size] product (2 * size^3 FLOPs each), by every
    library at hand: torch.matmul, and on CPU oneDNN's linear as well (plain and with the weight
    packed, as the engine runs it). torch's CPU matmul is
    MKL, which runs AVX2 code on AMD processors; oneDNN uses AVX-512 there (strand/kernels/cpu_linear.py),
    and a bound measured with the slower library alone would flatter every backend."""
    return fastest_gemm(size, dtype, repeats, device)[0]


def fastest_gemm(size: int = 2048, dtype: str = "float32", repeats: int = 3,
                 device: str = "cpu") -> tuple[float, str]:
    """(FLOP/s, library) of the fastest way measured to do a dtype GEMM's work."""
    return max(measure_gemm_by_library(size, dtype, repeats, device))


def measure_gemm_by_library(size: int = 2048, dtype: str = "float32", repeats: int = 3,
                            device: str = "cpu") -> list[tuple[float, str]]:
    """(FLOP/s, library) for each library measured. A narrow dtype on CPU is measured in float32
    as well (libraries labelled "... float32"): on a CPU without bfloat16 dot instructions
    (AVX2) oneDNN emulates a bfloat16 GEMM at a tenth of the float32 rate, and a backend that
    converts the weights to float32 once at load does the same work at the float32 rate, so that
    rate bounds what the machine can do (the bound is the fastest way, not the dtype's kernel)."""
    if size < 16:
        raise ValueError(f"gemm size must be >= 16, got {size}")
    if dtype not in _DTYPES:
        raise ValueError(f"gemm dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    rates = _rates_by_library(size, _DTYPES[dtype], repeats, device, "")
    if device == "cpu" and dtype != "float32":
        rates += _rates_by_library(size, torch.float32, repeats, device, " float32")
    return rates


def _rates_by_library(size: int, dtype: torch.dtype, repeats: int, device: str,
                      suffix: str) -> list[tuple[float, str]]:
    a = torch.randn(size, size).to(device=device, dtype=dtype)
    b = torch.randn(size, size).to(device=device, dtype=dtype)
    products: list[tuple[str, Callable[[], object]]] = [("torch.matmul",
                                                         lambda: torch.matmul(a, b))]
    # oneDNN only where it has kernels for the dtype: elsewhere cpu_linear.linear falls back to
    # torch's F.linear, which would be timed again under oneDNN's name (minutes of emulated
    # bfloat16 under AVX2).
    if device == "cpu" and cpu_linear.unavailable_reason(dtype) is None:
        products.append(("onednn", lambda: cpu_linear.linear(a, b, None)))
        packed = cpu_linear.pack_weight(b)  # the engine's own layout (layers/linear.py)
        if packed is not None:
            name = "panels" if cpu_linear_panels.is_panels(packed) else "onednn-packed"
            products.append((name, lambda: cpu_linear.linear_packed(a, packed, None, size)))
    rates = []
    for library, product in products:
        with torch.inference_mode():
            _sync(device)
            start = time.perf_counter()
            product()  # warm-up: first call allocates and picks the kernel
            _sync(device)
            best = time.perf_counter() - start
            # A first call past SLOW_PRODUCT_S is not repeated: its time stands (a GEMM that slow
            # is never the fastest; torch's emulated bfloat16 matmul under AVX2 runs at 0.5
            # GFLOP/s, a minute a 2048^3 product).
            for _ in range(repeats if best <= SLOW_PRODUCT_S else 0):
                _sync(device)
                start = time.perf_counter()
                product()
                _sync(device)
                best = min(best, time.perf_counter() - start)
        rates.append((2.0 * size**3 / best, library + suffix))
    return rates


def measure_bandwidth(num_bytes: int = 256 * 1024**2, repeats: int = 5,
                      device: str = "cpu") -> float:
    """Best bytes/s of a large tensor copy; a copy reads and writes, so 2 * size bytes move."""
    if num_bytes < 1024**2:
        raise ValueError(f"bandwidth bytes must be >= 1 MiB, got {num_bytes}")
    src = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: touches every page of dst
    best = math.inf
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2.0 * src.numel() * 4 / best


def _sync(device: str) -> None:
    # CUDA launches return at once; without a sync the clock would time the launch alone.
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure_machine(gemm_size: int, copy_bytes: int, dtype: str,
                    previous: MachineRates | None = None, device: str = "cpu") -> MachineRates:
    """Measure now; with `previous` (an earlier measurement in the same run) keep the better of
    the two, since a busy machine only ever makes a measurement slower and the bound lower."""
    log(f"measuring the machine: {dtype} GEMM {gemm_size}^3, copy {copy_bytes / 1024**2:.0f} MiB"
        f" on {device}")
    by_library = measure_gemm_by_library(gemm_size, dtype, device=device)
    log("  GEMM " + ", ".join(f"{library} {rate / 1e9:.0f} GFLOP/s" for rate, library in by_library))
    flops, library = max(by_library)
    bandwidth = measure_bandwidth(copy_bytes, device=device)
    if previous is not None:
        flops, library = max((flops, library),
                             (previous.gemm_flops_per_s, previous.gemm_library))
        bandwidth = max(bandwidth, previous.memory_bytes_per_s)
    return MachineRates(flops, bandwidth, gemm_size, copy_bytes, dtype, torch.get_num_threads(),
                        library)


def workload_bound(rates: MachineRates, shape: ModelShape, requests: list[SampleRequest],
                   batch_size: int) -> dict[str, Any]:
    """The bound for running `requests` (at most batch_size at a time) on this machine."""
    dtype_bytes = torch.empty((), dtype=_DTYPES[rates.dtype]).element_size()
    q_size = shape.num_heads * shape.head_dim
    kv_size = shape.num_kv_heads * shape.head_dim
    fed = attended = 0
    for r in requests:
        n = r.prompt_len + r.output_len - 1  # the last output token is never fed back
        fed += n
        attended += n * (n + 1) // 2  # token at position p attends to p + 1 keys
    prompt_tokens = sum(r.prompt_len for r in requests)
    output_tokens = sum(r.output_len for r in requests)
    flops = (2.0 * shape.layer_params * fed + 2.0 * shape.lm_head_params * output_tokens
             + 4.0 * shape.num_layers * q_size * attended)
    weight_bytes = (shape.layer_params + shape.lm_head_params) * dtype_bytes
    kv_bytes = 2.0 * shape.num_layers * kv_size * dtype_bytes * attended
    steps = math.ceil(output_tokens / max(1, batch_size))
    compute_s = flops / rates.gemm_flops_per_s
    memory_s = (steps * weight_bytes + kv_bytes) / rates.memory_bytes_per_s
    bound_s = max(compute_s, memory_s)
    total = prompt_tokens + output_tokens
    return {
        "machine": asdict(rates),
        "model": {**asdict(shape), "layer_params": shape.layer_params,
                  "lm_head_params": shape.lm_head_params, "weight_bytes": weight_bytes},
        "workload": {"flops": flops, "kv_bytes_read": kv_bytes, "min_steps": steps,
                     "batch_size": batch_size, "prompt_tokens": prompt_tokens,
                     "output_tokens": output_tokens},
        "compute_time_s": compute_s,
        "memory_time_s": memory_s,
        "bound_time_s": bound_s,
        "limited_by": "compute" if compute_s >= memory_s else "memory",
        "compute_bound_total_tokens_per_s": total / compute_s,
        "memory_bound_total_tokens_per_s": total / memory_s,
        "bound_total_tokens_per_s": total / bound_s,
        "bound_output_tokens_per_s": output_tokens / bound_s,
        # The rule of thumb (2 FLOPs per parameter per token, no attention): for comparison only.
        "simple_compute_bound_tokens_per_s":
            rates.gemm_flops_per_s / (2.0 * (shape.layer_params + shape.lm_head_params)),
    }


def fractions(bound: dict[str, Any], elapsed_s: float) -> dict[str, float]:
    """Share of the compute bound and of the roofline bound a run achieved (1.0 = at the bound)."""
    if elapsed_s <= 0:
        return {"fraction_of_compute_bound": 0.0, "fraction_of_bound": 0.0}
    return {"fraction_of_compute_bound": bound["compute_time_s"] / elapsed_s,
            "fraction_of_bound": bound["bound_time_s"] / elapsed_s}


def add_roofline_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("machine bound")
    group.add_argument("--gemm-size", type=int, default=2048)
    group.add_argument("--copy-mib", type=int, default=256, help="tensor size for bandwidth")
    group.add_argument("--no-bound", action="store_true", help="skip measuring the machine")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    add_dataset_args(parser)
    add_roofline_args(parser)
    parser.add_argument("--batch-size", type=int, default=256, help="max sequences at once")
    parser.add_argument("--num-threads", type=int, default=None)
    args = parser.parse_args(argv)
    set_threads(args.num_threads)
    model_dir = resolve_model(args)
    config = load_config(model_dir)
    requests = dataset_from_args(args, config["vocab_size"])
    rates = measure_machine(args.gemm_size, args.copy_mib * 1024**2, args.dtype,
                            device=resolve_device(args.device))
    bound = workload_bound(rates, ModelShape.from_config(config), requests, args.batch_size)
    print(f"GEMM {rates.gemm_flops_per_s / 1e9:.1f} GFLOP/s ({rates.gemm_library}), copy "
          f"{rates.memory_bytes_per_s / 1e9:.1f} GB/s, {rates.num_threads} threads")
    print(f"bound: {bound['bound_total_tokens_per_s']:.0f} total tokens/s, "
          f"{bound['bound_output_tokens_per_s']:.0f} output tokens/s "
          f"(limited by {bound['limited_by']})")


if __name__ == "__main__":
    main()
