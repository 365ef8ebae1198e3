"""What the OpenAI-compatible front adds to a lone request: TTFT over the front against the
gateway's own Generate, and the front's CPU per request, on one stack in one run.

One request at a time (nothing else in flight), `--num-requests` each side, in `--rounds`
alternating rounds (this VM's speed drifts within minutes): a streamed `/v1/completions` with
token ids until its first `data:` event, against `EngineClient.generate` until its first output
with a token. Both go through the same auto-stepping ring, so the difference of the medians is
the front's own time (HTTP, JSON, its gateway client); the front's CPU seconds come from
/proc/PID/task/*/schedstat.

    python -m benchmarks.front_overhead --num-requests 60 --rounds 2
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    add_model_args,
    format_table,
    load_config,
    log,
    resolve_model,
    set_threads,
    write_json,
)
from benchmarks.cpu_accounting import ThreadClock, thread_times_since
from benchmarks.ring_overhead import ttft_over_ring
from benchmarks.strand_backends import StrandSettings, bench_log_dir, stage_threads


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    parser.add_argument("--num-requests", type=int, default=60,
                        help="sequential single requests timed per side and round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (>= 1)")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--output-json", type=Path, default=None)
    return parser


def ttft_over_front(address: str, model: str, prompt: list[int], n: int) -> list[float]:
    """Seconds to the first streamed event of n sequential completions (2 tokens each)."""
    host, port = address.rsplit(":", 1)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0,
                       "ignore_eos": True, "stream": True})
    times = []
    for _ in range(n):
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            start = time.perf_counter()
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                raise RuntimeError(f"the front answered {response.status}: "
                                   f"{response.read()[:200]!r}")
            first = None
            for line in response:
                if first is None and line.startswith(b"data: {"):
                    first = time.perf_counter() - start
            if first is None:
                raise RuntimeError("the front streamed no completion event")
            times.append(first)
        finally:
            conn.close()
    return times


def run(args: argparse.Namespace) -> dict[str, Any]:
    from strand.services.client import EngineClient
    from strand.services.launch import StackConfig, launch_stack

    threads = set_threads(args.num_threads)
    model_dir = resolve_model(args)
    config = load_config(model_dir)
    settings = StrandSettings(dtype=args.dtype, device="cpu", max_num_seqs=256,
                              max_num_batched_tokens=2048, enable_prefix_caching=False,
                              kv_cache_memory=1 << 28)
    prompt = [1 + (7 * i) % (config["vocab_size"] - 2) for i in range(args.prompt_len)]
    log("starting an auto-stepping stack with the OpenAI front")
    with stage_threads(threads):
        stack = launch_stack(StackConfig(model=str(model_dir),
                                         engine_args=settings.engine_flags(),
                                         gateway_args=["--auto-step"], openai_port=0,
                                         log_dir=bench_log_dir()))
    front_pid = stack.processes["openai"].pid
    grpc_ms: list[float] = []
    front_ms: list[float] = []
    cpu_ms: list[float] = []
    try:
        with EngineClient(stack.gateway_address, timeout=None) as client:
            ttft_over_ring(client, prompt, 3)  # warm-up: connections, first steps
            ttft_over_front(stack.address("openai"), str(model_dir), prompt, 3)
            for i in range(args.rounds):
                log(f"round {i + 1}/{args.rounds}: Generate, then the front")
                grpc_ms.append(1e3 * statistics.median(
                    ttft_over_ring(client, prompt, args.num_requests)))
                clock = ThreadClock(front_pid)
                front_ms.append(1e3 * statistics.median(ttft_over_front(
                    stack.address("openai"), str(model_dir), prompt, args.num_requests)))
                cpu_ms.append(1e3 * thread_times_since(clock).cpu_s / args.num_requests)
    finally:
        stack.stop()
    added = [f - g for g, f in zip(grpc_ms, front_ms, strict=True)]
    return {"benchmark": "front_overhead", "model": str(model_dir), "num_threads": threads,
            "num_requests": args.num_requests, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "generate_ttft_p50_ms": grpc_ms, "front_ttft_p50_ms": front_ms,
            "front_added_ms": added, "front_added_median_ms": statistics.median(added),
            "front_cpu_ms_per_request": cpu_ms}


def summary_table(data: dict[str, Any]) -> str:
    rows = [[str(i + 1), f"{g:.2f}", f"{f:.2f}", f"{a:.2f}", f"{c:.2f}"]
            for i, (g, f, a, c) in enumerate(zip(
                data["generate_ttft_p50_ms"], data["front_ttft_p50_ms"], data["front_added_ms"],
                data["front_cpu_ms_per_request"], strict=True))]
    rows.append(["median", "", "", f"{data['front_added_median_ms']:.2f}", ""])
    return format_table(["round", "TTFT p50 Generate ms", "TTFT p50 front ms", "front adds ms",
                         "front CPU ms/request"], rows)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    for flag, value in (("--num-requests", args.num_requests), ("--prompt-len", args.prompt_len),
                        ("--num-threads", 1 if args.num_threads is None else args.num_threads)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    data = run(args)
    write_json(args.output_json, data)
    print(summary_table(data))


if __name__ == "__main__":
    main()
