"""Decode throughput at fixed batch sizes, and its share of the memory-bandwidth bound.

    python -m benchmarks.decode [--preset llama-3.2-1b --dtype bfloat16] [--batch-sizes 1,8,64,256]
        [--kv-cache-dtype bfloat16]

Per batch size: that many requests of --prompt-len random tokens are added and prefilled (not
timed), then every decode step until each has --output-len tokens is timed. A decode step must
at least read every matmul weight once and each request's K/V so far, so

    bound time = (decode steps * weight bytes + K/V bytes read) / measured copy bandwidth

(the bandwidth as `benchmarks/roofline.py` measures it: on CUDA, HBM), the K/V in the cache's
dtype (--kv-cache-dtype bfloat16: half of float32's bytes under float32 weights). fraction = bound time /
measured time: 1.0 would be a decode limited by memory alone. The engine runs as configured
(CUDA graphs on CUDA unless --enforce-eager), greedy, `ignore_eos`.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import (
    DTYPE_BYTES,
    add_model_args,
    format_table,
    load_config,
    log,
    resolve_device,
    resolve_model,
    set_threads,
    write_json,
)
from benchmarks.roofline import ModelShape, measure_bandwidth


@dataclass(slots=True)
class DecodeResult:
    batch_size: int
    decode_steps: int
    decode_tokens: int
    elapsed_s: float
    tokens_per_s: float
    ms_per_step: float
    bound_ms_per_step: float
    fraction_of_bound: float


def parse_batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ValueError(f"batch_sizes must be a comma-separated list of integers >= 1, "
                         f"got {text!r}")
    return sizes


def kv_bytes_per_key(shape: ModelShape, dtype_bytes: int) -> int:
    """K and V of one position in every layer."""
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * dtype_bytes


def weight_bytes(shape: ModelShape, dtype_bytes: int) -> int:
    return (shape.layer_params + shape.lm_head_params) * dtype_bytes


@dataclass(slots=True)
class TimedDecode:
    steps: int
    seconds: float
    tokens: int
    keys_read: int  # sum over every token decoded of the positions it attended to


def run_batch(engine: Any, batch_size: int, prompt_len: int, output_len: int, vocab_size: int,
              seed: int) -> TimedDecode:
    from strand.engine_core import SamplingParams
    from strand.engine_core.sampling_params import RequestOutputKind

    rng = random.Random(seed)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    for i in range(batch_size):
        prompt = [rng.randrange(3, vocab_size) for _ in range(prompt_len)]
        engine.add_request(f"b{batch_size}-{seed}-{i}", {"prompt_token_ids": prompt}, params)
    generated: dict[str, int] = {}
    while len(generated) < batch_size:  # prefill: not timed
        for out in engine.step():
            generated[out.request_id] = len(out.outputs[0].token_ids)
    steps = tokens = keys = 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        # A step returns once its tokens are on the host: nothing is left queued on a GPU.
        outputs = engine.step()
        steps += 1
        for out in outputs:
            # The token fed at position prompt_len + n - 1 attends to prompt_len + n keys.
            keys += prompt_len + generated[out.request_id]
            new = len(out.outputs[0].token_ids)
            generated[out.request_id] += new
            tokens += new
    return TimedDecode(steps, time.perf_counter() - start, tokens, keys)


def run(args: argparse.Namespace) -> dict[str, Any]:
    batch_sizes = parse_batch_sizes(args.batch_sizes)
    if args.prompt_len < 1 or args.output_len < 2:
        raise ValueError(f"prompt_len must be >= 1 and output_len >= 2, got {args.prompt_len} "
                         f"and {args.output_len}")
    threads = set_threads(args.num_threads)
    device = resolve_device(args.device)
    model_dir = resolve_model(args)
    config = load_config(model_dir)
    shape = ModelShape.from_config(config)
    dtype_bytes = DTYPE_BYTES[args.dtype]
    kv_bytes = dtype_bytes if args.kv_cache_dtype == "auto" else DTYPE_BYTES[args.kv_cache_dtype]
    from strand.engine_core import EngineArgs, LLMEngine

    max_batch = max(batch_sizes)
    max_len = args.prompt_len + args.output_len
    # Every prompt of a batch in one prefill step, so all of them decode together to the end.
    engine_args = EngineArgs(
        model=str(model_dir), dtype=args.dtype, device=device, max_num_seqs=max_batch,
        max_model_len=max_len, max_num_batched_tokens=max(2048, max_batch * args.prompt_len),
        enforce_eager=args.enforce_eager, enable_prefix_caching=False,
        kv_cache_dtype=args.kv_cache_dtype,
        kv_cache_memory=int(1.25 * max_batch * max_len * kv_bytes_per_key(shape, kv_bytes))
        + 64 * 1024**2)
    log(f"decode: batch sizes {batch_sizes}, prompts of {args.prompt_len} tokens, "
        f"{args.output_len} output tokens; model {model_dir} ({args.dtype}, K/V cache "
        f"{args.kv_cache_dtype}) on {device}, "
        f"{threads} threads")
    engine = LLMEngine.from_engine_args(engine_args)
    # Measured before and after the sweep, the better kept: a busy moment must not make the
    # bound look easy.
    bandwidth = measure_bandwidth(args.copy_mib * 1024**2, device=device)
    run_batch(engine, 1, args.prompt_len, 4, config["vocab_size"], seed=-1)  # warm-up
    timings = []
    for batch_size in batch_sizes:
        timed = run_batch(engine, batch_size, args.prompt_len, args.output_len,
                          config["vocab_size"], seed=batch_size)
        timings.append((batch_size, timed))
        log(f"  batch {batch_size}: {timed.tokens / timed.seconds:.1f} decode tok/s")
    bandwidth = max(bandwidth, measure_bandwidth(args.copy_mib * 1024**2, device=device))
    log(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    results = []
    for batch_size, timed in timings:
        bound_s = (timed.steps * weight_bytes(shape, dtype_bytes)
                   + timed.keys_read * kv_bytes_per_key(shape, kv_bytes)) / bandwidth
        results.append(DecodeResult(
            batch_size=batch_size, decode_steps=timed.steps, decode_tokens=timed.tokens,
            elapsed_s=timed.seconds, tokens_per_s=timed.tokens / timed.seconds,
            ms_per_step=1e3 * timed.seconds / timed.steps,
            bound_ms_per_step=1e3 * bound_s / timed.steps,
            fraction_of_bound=bound_s / timed.seconds))
    return {
        "benchmark": "decode",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {"path": str(model_dir), "dtype": args.dtype, "preset": args.preset,
                  "kv_cache_dtype": args.kv_cache_dtype,
                  **asdict(shape), "weight_bytes": weight_bytes(shape, dtype_bytes)},
        "device": device, "num_threads": threads, "enforce_eager": args.enforce_eager,
        "prompt_len": args.prompt_len, "output_len": args.output_len,
        "copy_bytes_per_s": bandwidth,
        "results": [asdict(r) for r in results],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    parser.add_argument("--batch-sizes", default="1,8,64,256")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "bfloat16"),
                        help="what the KV cache holds (EngineArgs.kv_cache_dtype)")
    parser.add_argument("--copy-mib", type=int, default=256, help="tensor size for bandwidth")
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--output-json", type=Path, default=None)
    args = parser.parse_args(argv)
    data = run(args)
    write_json(args.output_json, data)
    rows = [[str(r["batch_size"]), f"{r['tokens_per_s']:.1f}", f"{r['ms_per_step']:.2f}",
             f"{r['bound_ms_per_step']:.2f}", f"{100 * r['fraction_of_bound']:.0f}%"]
            for r in data["results"]]
    print(format_table(["batch", "decode tok/s", "ms/step", "bound ms/step", "% of bound"],
                       rows))
    print(f"copy bandwidth {data['copy_bytes_per_s'] / 1e9:.1f} GB/s on {data['device']}; "
          f"weights {data['model']['weight_bytes'] / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
