"""Prefix cache benchmark: many shared prefixes that do not all fit the device pool.

Each request is one of --num-prefixes shared prefixes plus a random suffix. The device pool holds
the in-flight requests and only about --device-prefix-fraction of the prefixes, so prefixes are
evicted between their uses. Three engines run the same closed-loop workload (--concurrency
requests in flight, a new one added as soon as one finishes):
  - offload:   prefix caching + the CPU offload tier (--kv-connector offload)
  - device:    prefix caching on the device pool only
  - no-cache:  prefix caching off
Throughput (requests/s, prompt+output tokens/s), TTFT (first token - added) and the share of
prompt tokens served from a cache are printed per engine; greedy outputs must agree across all.

    python -m benchmarks.prefix_cache                                   # standard CPU model
    python -m benchmarks.prefix_cache --num-layers 2 --hidden-size 128 --num-requests 32  # quick
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import (
    add_model_args,
    format_table,
    log,
    percentiles,
    resolve_model,
    set_threads,
    write_json,
)
from strand.engine_core.outputs import RequestOutput

ENGINES = ("offload", "device", "no-cache")


@dataclass(slots=True)
class Workload:
    prompts: list[list[int]]
    max_tokens: int


@dataclass(slots=True)
class EngineResult:
    engine: str
    elapsed_s: float = 0.0
    num_requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: dict[str, float] = field(default_factory=dict)
    outputs: list[list[int]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        total = self.prompt_tokens + self.output_tokens
        return {
            "engine": self.engine,
            "elapsed_s": self.elapsed_s,
            "requests_per_s": self.num_requests / self.elapsed_s if self.elapsed_s else 0.0,
            "total_tokens_per_s": total / self.elapsed_s if self.elapsed_s else 0.0,
            "cached_prompt_fraction": (self.cached_tokens / self.prompt_tokens
                                       if self.prompt_tokens else 0.0),
            "ttft_s": self.ttft_s,
        }


def make_workload(args: argparse.Namespace, vocab_size: int) -> Workload:
    rng = random.Random(args.seed)
    # Token 0..2 are often special: keep prompts to ordinary ids.
    prefixes = [[rng.randrange(3, vocab_size) for _ in range(args.prefix_len)]
                for _ in range(args.num_prefixes)]
    prompts = [rng.choice(prefixes) + [rng.randrange(3, vocab_size)
                                       for _ in range(args.suffix_len)]
               for _ in range(args.num_requests)]
    return Workload(prompts, args.max_tokens)


def num_device_blocks(args: argparse.Namespace) -> int:
    """The in-flight requests' blocks plus room for a fraction of the prefixes."""
    bs = args.block_size
    per_request = -(-(args.prefix_len + args.suffix_len + args.max_tokens) // bs)
    prefix_blocks = args.num_prefixes * (args.prefix_len // bs)
    return 1 + args.concurrency * per_request + int(prefix_blocks * args.device_prefix_fraction)


def engine_args(name: str, args: argparse.Namespace, model_dir: Path) -> Any:
    from strand.engine_core import EngineArgs

    extra: dict[str, Any] = {}
    if name == "offload":
        extra["kv_connector"] = "offload"
        if args.kv_offload_bytes:
            extra["kv_offload_bytes"] = args.kv_offload_bytes
        else:  # room for every prefix twice over: the tier never evicts in this workload
            cpu_blocks = 2 * args.num_prefixes * -(-args.prefix_len // args.block_size)
            extra["kv_connector_config"] = {"num_cpu_blocks": cpu_blocks}
    return EngineArgs(model=str(model_dir), dtype=args.dtype, device=args.device,
                      block_size=args.block_size, enable_prefix_caching=name != "no-cache",
                      num_gpu_blocks_override=num_device_blocks(args),
                      max_num_seqs=args.concurrency, seed=0, **extra)


def run_engine(name: str, args: argparse.Namespace, model_dir: Path,
               workload: Workload) -> EngineResult:
    from strand.engine_core import LLMEngine, SamplingParams

    engine = LLMEngine.from_engine_args(engine_args(name, args, model_dir))
    params = SamplingParams(max_tokens=workload.max_tokens, temperature=0.0, ignore_eos=True)
    # Warm-up (first-call allocations, kernel selection), then forget it: no engine is timed
    # cold and none starts with a cache.
    engine.add_request("warmup", {"prompt_token_ids": workload.prompts[0]}, params)
    while engine.has_unfinished_requests():
        engine.step()
    if not engine.reset_prefix_cache(reset_connector=True):
        raise RuntimeError("the warm-up left blocks in use: cannot start from an empty cache")
    result = EngineResult(name, num_requests=len(workload.prompts))
    outputs: dict[int, list[int]] = {}
    added_at: dict[str, float] = {}
    ttfts: list[float] = []
    next_index = 0
    start = time.perf_counter()
    while len(outputs) < len(workload.prompts):
        while (next_index < len(workload.prompts)
               and engine.get_num_unfinished_requests() < args.concurrency):
            req_id = str(next_index)
            added_at[req_id] = time.perf_counter()
            engine.add_request(req_id, {"prompt_token_ids": workload.prompts[next_index]},
                               params)
            next_index += 1
        for out in engine.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            completion = out.outputs[0]
            if out.request_id in added_at and completion.token_ids:
                ttfts.append(time.perf_counter() - added_at.pop(out.request_id))
            if out.finished:
                outputs[int(out.request_id)] = list(completion.token_ids)
                result.prompt_tokens += len(out.prompt_token_ids)
                result.output_tokens += len(completion.token_ids)
                result.cached_tokens += out.num_cached_tokens
    result.elapsed_s = time.perf_counter() - start
    result.ttft_s = percentiles(ttfts)
    result.outputs = [outputs[i] for i in range(len(workload.prompts))]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    parser.add_argument("--num-prefixes", type=int, default=16)
    parser.add_argument("--prefix-len", type=int, default=256)
    parser.add_argument("--suffix-len", type=int, default=16)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--device-prefix-fraction", type=float, default=0.25,
                        help="share of the prefixes' blocks the device pool has room for")
    parser.add_argument("--kv-offload-bytes", type=int, default=0,
                        help="CPU tier size; default: room for every prefix")
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help=f"comma-separated subset of {','.join(ENGINES)}")
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-json", type=Path, default=None)
    args = parser.parse_args(argv)
    for name in ("num_prefixes", "prefix_len", "num_requests", "max_tokens", "concurrency"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(args, name)}")
    if not 0.0 <= args.device_prefix_fraction <= 1.0:
        raise ValueError("device_prefix_fraction must be in [0, 1], got "
                         f"{args.device_prefix_fraction}")
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise ValueError(f"engines must be among {list(ENGINES)}, got {unknown}")

    threads = set_threads(args.num_threads)
    model_dir = resolve_model(args)
    from strand.engine_core.model_executor.model_config import load_model_config

    vocab_size = load_model_config(str(model_dir), args.dtype).vocab_size
    workload = make_workload(args, vocab_size)
    log(f"{len(workload.prompts)} requests over {args.num_prefixes} prefixes of "
        f"{args.prefix_len} tokens; device pool {num_device_blocks(args)} blocks of "
        f"{args.block_size}; {threads} threads")
    results = []
    for name in names:
        log(f"running {name} ...")
        results.append(run_engine(name, args, model_dir, workload))
    agree = all(r.outputs == results[0].outputs for r in results)

    rows = []
    for r in results:
        s = r.summary()
        rows.append([r.engine, f"{s['elapsed_s']:.2f}", f"{s['requests_per_s']:.2f}",
                     f"{s['total_tokens_per_s']:.0f}", f"{r.ttft_s['mean'] * 1e3:.1f}",
                     f"{r.ttft_s['p50'] * 1e3:.1f}", f"{r.ttft_s['p90'] * 1e3:.1f}",
                     f"{s['cached_prompt_fraction']:.2f}"])
    print(format_table(["engine", "elapsed s", "req/s", "tok/s", "TTFT mean ms",
                        "TTFT p50 ms", "TTFT p90 ms", "cached"], rows))
    print(f"greedy outputs identical across engines: {agree}")
    write_json(args.output_json, {"settings": {k: str(v) for k, v in vars(args).items()},
                                  "outputs_agree": agree,
                                  "results": [r.summary() for r in results]})
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
