"""Online serving (like `vllm bench serve`): requests arrive (Poisson or all at once) and stream
through the gateway's Generate; TTFT, TPOT, ITL and E2E at p50/p90/p99, throughput, failures.

    python -m benchmarks.serving --request-rate 4 --max-concurrency 16 --output-json results/serving.json
    python -m benchmarks.serving --gateway 127.0.0.1:50051     # a running stack (strand serve --auto-step)

Without --gateway a stack is started here with an auto-stepping gateway. The model and dataset
flags are offline.py's; the defaults are the standard CPU workload.
"""

from __future__ import annotations

import argparse
import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.common import (
    DTYPE_BYTES,
    add_model_args,
    format_table,
    load_config,
    log,
    percentiles,
    resolve_device,
    resolve_model,
    set_threads,
    write_json,
)
from benchmarks.datasets import SampleRequest, add_dataset_args, dataset_from_args, describe_dataset
from benchmarks.strand_backends import StrandSettings, kv_cache_bytes, stack_for


@dataclass(slots=True)
class RequestTiming:
    """One request as the client saw it; times in seconds from when it was sent."""

    prompt_len: int
    expected_output_len: int
    success: bool = False
    error: str | None = None
    ttft: float = 0.0
    e2e: float = 0.0
    output_tokens: int = 0
    itls: list[float] = field(default_factory=list)  # gaps between successive chunks

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def arrival_times(num_requests: int, request_rate: float, seed: int = 0) -> list[float]:
    """Offsets (s) at which requests are sent: all at 0 for an infinite rate (a burst), else
    a Poisson process (exponential gaps with mean 1 / rate)."""
    if request_rate <= 0:
        raise ValueError(f"request_rate must be > 0 (inf for a burst), got {request_rate}")
    if math.isinf(request_rate):
        return [0.0] * num_requests
    rng = random.Random(seed)
    offsets, now = [], 0.0
    for _ in range(num_requests):
        offsets.append(now)
        now += rng.expovariate(request_rate)
    return offsets


def send_one(client: Any, index: int, request: SampleRequest) -> RequestTiming:
    from strand.engine_core import SamplingParams
    from strand.engine_core.sampling_params import RequestOutputKind

    timing = RequestTiming(request.prompt_len, request.output_len)
    params = SamplingParams(temperature=0.0, max_tokens=request.output_len, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    start = last = time.perf_counter()
    try:
        for out in client.generate({"prompt_token_ids": request.prompt_token_ids}, params,
                                   request_id=f"serve-{index}"):
            now = time.perf_counter()
            new = len(out.outputs[0].token_ids) if out.outputs else 0
            if new:
                if timing.output_tokens == 0:
                    timing.ttft = now - start
                else:
                    timing.itls.append(now - last)
                timing.output_tokens += new
                last = now
            if out.finished:
                if out.error is not None:
                    timing.error = out.error
                break
        timing.e2e = time.perf_counter() - start
        if timing.error is None and timing.output_tokens != request.output_len:
            timing.error = (f"got {timing.output_tokens} output tokens, "
                            f"expected {request.output_len}")
        timing.success = timing.error is None
    except Exception as exc:  # noqa: BLE001 - a failed request is a result, counted below
        timing.error = f"{type(exc).__name__}: {exc}"
        timing.e2e = time.perf_counter() - start
    return timing


def run_load(client: Any, requests: list[SampleRequest], request_rate: float,
             max_concurrency: int | None, seed: int) -> tuple[list[RequestTiming], float]:
    """Send every request at its arrival time (waiting for a free slot under max_concurrency)
    and return the timings in dataset order with the wall time of the whole run."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    offsets = arrival_times(len(requests), request_rate, seed)
    slots = threading.Semaphore(max_concurrency or len(requests))
    bar = tqdm(total=len(requests), desc="serving", unit="req", leave=False)

    def task(i: int) -> RequestTiming:
        with slots:
            timing = send_one(client, i, requests[i])
        bar.update(1)
        return timing

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        futures = []
        for i, offset in enumerate(offsets):
            delay = start + offset - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(task, i))
        timings = [f.result() for f in futures]
    duration = time.perf_counter() - start
    bar.close()
    return timings, duration


def summarize(timings: list[RequestTiming], duration: float) -> dict[str, Any]:
    ok = [t for t in timings if t.success]
    output_tokens = sum(t.output_tokens for t in ok)
    prompt_tokens = sum(t.prompt_len for t in ok)

    def ms(values: list[float]) -> dict[str, float]:
        return {k: 1000.0 * v for k, v in percentiles(values).items()}

    return {
        "duration_s": duration,
        "completed": len(ok),
        "failed": len(timings) - len(ok),
        "errors": sorted({t.error for t in timings if t.error})[:10],
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_token_throughput": output_tokens / duration if duration > 0 else 0.0,
        "total_token_throughput":
            (prompt_tokens + output_tokens) / duration if duration > 0 else 0.0,
        "ttft_ms": ms([t.ttft for t in ok]),
        "tpot_ms": ms([tp for t in ok if (tp := t.tpot) is not None]),
        "itl_ms": ms([gap for t in ok for gap in t.itls]),
        "e2e_ms": ms([t.e2e for t in ok]),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    add_dataset_args(parser)
    group = parser.add_argument_group("load")
    group.add_argument("--request-rate", type=float, default=math.inf,
                       help="requests/s of a Poisson process; inf (default): all at once")
    group.add_argument("--max-concurrency", type=int, default=None)
    group.add_argument("--gateway", default=None,
                       help="address of a running auto-step gateway; default: start a stack")
    group.add_argument("--max-num-seqs", type=int, default=256)
    group.add_argument("--max-num-batched-tokens", type=int, default=2048)
    group.add_argument("--no-prefix-caching", action="store_true")
    group.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--output-json", type=Path, default=None)
    return parser


def run(args: argparse.Namespace) -> dict[str, Any]:
    threads = set_threads(args.num_threads)
    device = resolve_device(args.device)
    model_dir = resolve_model(args)
    config = load_config(model_dir)
    requests = dataset_from_args(args, config["vocab_size"])
    settings = StrandSettings(dtype=args.dtype, device=device, max_num_seqs=args.max_num_seqs,
                              max_num_batched_tokens=args.max_num_batched_tokens,
                              enable_prefix_caching=not args.no_prefix_caching,
                              kv_cache_memory=kv_cache_bytes(config, requests,
                                                             DTYPE_BYTES[args.dtype]))
    data: dict[str, Any] = {
        "benchmark": "serving", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": str(model_dir), "dtype": args.dtype, "device": device, "num_threads": threads,
        "dataset": describe_dataset(args, requests),
        "request_rate": "inf" if math.isinf(args.request_rate) else args.request_rate,
        "max_concurrency": args.max_concurrency,
        "gateway": args.gateway or "launched here (--auto-step)",
    }
    try:
        from strand.services.client import EngineClient
    except ImportError as exc:
        data["status"] = f"unavailable: services not built ({exc})"
        return data
    with stack_for(str(model_dir), settings, args.gateway, threads, ["--auto-step"]) as target:
        with EngineClient(target, timeout=None) as client:
            if not client.get_server_info().get("auto_step"):
                data["status"] = ("unavailable: the gateway does not step itself; start it "
                                  "with --auto-step")
                return data
            log("warming up")
            send_one(client, -1, SampleRequest(requests[0].prompt_token_ids, 4))
            client.reset_prefix_cache()
            log(f"sending {len(requests)} requests at rate {data['request_rate']}, "
                f"max concurrency {args.max_concurrency or 'unlimited'}")
            timings, duration = run_load(client, requests, args.request_rate,
                                         args.max_concurrency, args.seed)
    data["status"] = "ok"
    data.update(summarize(timings, duration))
    return data


def summary_table(data: dict[str, Any]) -> str:
    if data.get("status") != "ok":
        return f"serving: {data.get('status')}"
    rows = [[name, *(f"{data[key][p]:.1f}" for p in ("mean", "p50", "p90", "p99"))]
            for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"),
                              ("E2E", "e2e_ms"))]
    lines = [format_table(["ms", "mean", "p50", "p90", "p99"], rows),
             f"completed {data['completed']}, failed {data['failed']} in "
             f"{data['duration_s']:.1f}s: {data['request_throughput']:.2f} req/s, "
             f"{data['output_token_throughput']:.1f} output tok/s, "
             f"{data['total_token_throughput']:.1f} total tok/s"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    data = run(args)
    write_json(args.output_json, data)
    print(summary_table(data))


if __name__ == "__main__":
    main()
