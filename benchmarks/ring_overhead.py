"""What the services cost over in-process: TTFT added at low load, and CPU seconds per stage.

Two measurements on the same model, engine flags and thread count, in one run:

1. TTFT at low load: one request at a time (nothing else in flight), `--num-ttft` times, each
   after `--ttft-gap-ms` of idle (a user's think time; the floor's gap below). In process:
   `LLMEngine.add_request` then `step()` until the first output token. Over the ring:
   a `Generate` stream on an auto-stepping stack, until its first output with a token. The
   difference of the medians is what the tokenizer -> engine -> detokenizer -> gateway hops add.
2. CPU seconds per 1000 output tokens for each process of the stack (user + system time from
   /proc, read before and after), under the benchmark's workload sent as concurrent Generate
   streams: where the services spend the machine's cores besides the engine. Also each
   process's CPU milliseconds per lone request of step 1.
3. Throughput over the ring against in process, as offline.py measures it (the whole workload
   at once, FINAL_ONLY outputs: LLMEngine's add-all-then-step loop against one Generate stream
   per request on the auto-stepping stack), `--throughput-repeats` pairs, the order within a pair
   alternating (in process first, then the ring first): this VM's speed drifts by 5-20% within
   minutes, so one run of each cannot tell 0.94x from 0.98x; the median of the per-pair ratios
   over an even number of pairs can.
   Around each run, where the CPU went (benchmarks/ring_throughput.py): each process's CPU
   seconds, and the engine's threads' time waiting for a core. On a machine whose engine uses
   every core, the ring's run loses about the CPU seconds spent outside the engine.

4. The floor under TTFT added, between bare processes after the idle a lone request finds
   (benchmarks/grpc_hop.py): the client's new gRPC call answered once (its first and last
   hops), and one stream message for each of the four hops between stages, over the local link
   (the stages are on one host) or gRPC under STRAND_STAGE_TRANSPORT=grpc. What the ring adds
   beyond it is Strand's own code.

With `--engine-cpus 0` the engine runs on CPU 0 in both runs (the in-process loop, and the
engine stage) and the other stages and the client on the remaining CPUs (benchmarks/cpu_pinning.py):
the engine's compute is held equal, so the ratio is the ring's own cost rather than the share of
the engine's cores that the services and the client take on a small machine.

    python -m benchmarks.ring_overhead --num-prompts 32 --output-len 64
"""

from __future__ import annotations

import argparse
import os
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
from benchmarks.cpu_accounting import ThreadClock, cpu_seconds, thread_times_since
from benchmarks.cpu_pinning import parse_cpu_list, pin_process, split_cpus
from benchmarks.datasets import SampleRequest, add_dataset_args, dataset_from_args
from benchmarks.gateway_streams import generate_all
from benchmarks.grpc_hop import measure_hops
from benchmarks.ring_throughput import Placement, pairs_table, pairs_to_json, throughput_pairs
from benchmarks.strand_backends import StrandSettings, kv_cache_bytes
from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams
from strand.services import grpc_tuning
from strand.services.common.stage_link import transport

# Messages between processes on a first token's way: client -> gateway (the Generate call),
# gateway -> tokenizer, tokenizer -> engine, engine -> detokenizer, detokenizer -> gateway,
# gateway -> client. The first and the last are the client's gRPC call; these four are between
# stages.
STAGE_HOPS = 4


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                          output_kind=RequestOutputKind.DELTA)


def ttft_in_process(engine: Any, prompt: list[int], n: int, gap_s: float = 0.0) -> list[float]:
    times = []
    for i in range(n):
        time.sleep(gap_s)
        start = time.perf_counter()
        engine.add_request(f"ttft-{i}", {"prompt_token_ids": prompt}, _params(2))
        first = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                if first is None and out.outputs and out.outputs[0].token_ids:
                    first = time.perf_counter() - start
        assert first is not None, "no token came back"
        times.append(first)
    return times


def ttft_over_ring(client: Any, prompt: list[int], n: int, gap_s: float = 0.0) -> list[float]:
    times = []
    for _ in range(n):
        time.sleep(gap_s)
        start = time.perf_counter()
        first = None
        for out in client.generate({"prompt_token_ids": prompt}, _params(2)):
            if first is None and out.outputs and out.outputs[0].token_ids:
                first = time.perf_counter() - start
        assert first is not None, "no token came back"
        times.append(first)
    return times


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def stream_workload(target: str, requests: list[SampleRequest]) -> int:
    """Every request as its own concurrent DELTA Generate stream; the output tokens received."""
    run = generate_all(target, requests, RequestOutputKind.DELTA, desc="DELTA streams")
    if run.num_failed:
        raise RuntimeError(f"{run.num_failed} of the workload's streams failed")
    return sum(len(tokens) for tokens in run.outputs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    add_dataset_args(parser)
    parser.add_argument("--num-ttft", type=int, default=20,
                        help="sequential single requests timed for TTFT, each side")
    parser.add_argument("--ttft-prompt-len", type=int, default=32)
    parser.add_argument("--ttft-gap-ms", type=float, default=20.0,
                        help="idle time before each lone request, both sides, and between the "
                             "floor's messages (0: back to back, where nothing has gone idle)")
    parser.add_argument("--throughput-repeats", type=int, default=4,
                        help="in-process / ring throughput pairs, each the other way round from "
                             "the one before (0: skip; an even count cancels a steady drift)")
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--add-hold-ms", type=float, default=None,
                        help="the engine stage's --add-hold-ms (default: the stage's own)")
    parser.add_argument("--spare-core", choices=("auto", "off"), default="auto",
                        help="the engine stage's --spare-core (default: %(default)s)")
    parser.add_argument("--engine-cpus", default=None,
                        help="a CPU list (e.g. 0 or 0-1): the engine on these CPUs in both runs, "
                             "the other stages and the client on the rest (threads default to "
                             "their count)")
    parser.add_argument("--hop-messages", type=int, default=300,
                        help="messages timed for the bare gRPC hop (the floor); 0: skip")
    parser.add_argument("--output-json", type=Path, default=None)
    return parser


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    pinned = split_cpus(parse_cpu_list(args.engine_cpus)) if args.engine_cpus else None
    own_cpus, own_threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        return _run(args, pinned)
    finally:
        if pinned is not None:  # this process (a test's, say) goes on where and as it was
            pin_process(os.getpid(), own_cpus)
            torch.set_num_threads(own_threads)


def _run(args: argparse.Namespace, pinned: tuple[set[int], set[int]] | None) -> dict[str, Any]:
    from strand.engine_core.config import EngineArgs
    from strand.engine_core.llm_engine import LLMEngine
    from strand.services.client import EngineClient
    from strand.services.launch import StackConfig, launch_stack

    if pinned is not None:
        pin_process(os.getpid(), pinned[0])  # every thread, an OpenMP pool already started too
    threads = set_threads(args.num_threads if args.num_threads or pinned is None
                          else len(pinned[0]))
    model_dir = resolve_model(args)
    config = load_config(model_dir)
    requests = dataset_from_args(args, config["vocab_size"])
    kv_memory = kv_cache_bytes(config, requests, 4)
    settings = StrandSettings(dtype=args.dtype, device="cpu", max_num_seqs=256,
                              max_num_batched_tokens=2048, enable_prefix_caching=False,
                              kv_cache_memory=kv_memory)
    prompt = [1 + (7 * i) % (config["vocab_size"] - 2) for i in range(args.ttft_prompt_len)]
    data: dict[str, Any] = {"benchmark": "ring_overhead", "model": str(model_dir),
                            "num_threads": threads, "num_prompts": len(requests),
                            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                            "engine_cpus": sorted(pinned[0]) if pinned else None,
                            "ttft_gap_ms": args.ttft_gap_ms,
                            # The stack's stages are on this host: they link unless told not to.
                            "stage_transport": "grpc" if transport() == "grpc" else "link"}

    log("in process: TTFT of single requests")
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=str(model_dir), dtype=args.dtype, max_num_seqs=256, max_num_batched_tokens=2048,
        enable_prefix_caching=False, kv_cache_memory=kv_memory))
    ttft_in_process(engine, prompt, 3)  # warm-up: first steps allocate and pick kernels
    gap_s = args.ttft_gap_ms / 1e3
    local = ttft_in_process(engine, prompt, args.num_ttft, gap_s)

    log("starting an auto-stepping stack")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    hold = [] if args.add_hold_ms is None else ["--add-hold-ms", str(args.add_hold_ms)]
    hold += ["--spare-core", args.spare_core]
    data["add_hold_ms"] = args.add_hold_ms
    data["spare_core"] = args.spare_core
    stack = launch_stack(StackConfig(model=str(model_dir), engine_args=settings.engine_flags(),
                                     engine_stage_args=hold,
                                     gateway_args=["--auto-step"],
                                     log_dir=Path("/tmp/strand-bench-logs")))
    stages = {name: proc.pid for name, proc in stack.processes.items()}
    place = Placement(pinned, stages)
    place.client_side()
    try:
        with EngineClient(stack.gateway_address, timeout=None) as client:
            ttft_over_ring(client, prompt, 3)
            pids = {**stages, "client (this benchmark)": os.getpid()}
            log("over the ring: TTFT of single requests")
            clocks = {name: ThreadClock(pid) for name, pid in pids.items()}
            remote = ttft_over_ring(client, prompt, args.num_ttft, gap_s)
            fine = {name: thread_times_since(clock).cpu_s for name, clock in clocks.items()}
            # A lone request's CPU in each process (2 tokens): on a machine whose stages share
            # the engine's cores, much of it lies on the way to the first token.
            data["cpu_ms_per_lone_request"] = {name: 1e3 * spent / args.num_ttft
                                               for name, spent in fine.items()}
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            log(f"over the ring: {len(requests)} concurrent Generate streams")
            start = time.perf_counter()
            tokens = stream_workload(stack.gateway_address, requests)
            duration = time.perf_counter() - start
            after = {name: cpu_seconds(pid) for name, pid in pids.items()}
            pairs = throughput_pairs(engine, client, requests, args.throughput_repeats,
                                     stages, stack.gateway_address, place)
    finally:
        stack.stop()
    data["ttft_ms"] = {"in_process_p50": 1e3 * statistics.median(local),
                       "ring_p50": 1e3 * statistics.median(remote),
                       "added_p50": 1e3 * (statistics.median(remote) - statistics.median(local)),
                       # The tail: a first step that runs long shows here, not in the median.
                       "in_process_p90": 1e3 * _p90(local), "ring_p90": 1e3 * _p90(remote)}
    data["workload"] = {"output_tokens": tokens, "duration_s": duration,
                        "output_tok_per_s": tokens / duration}
    data["cpu_s_per_1000_tokens"] = {name: 1000 * (after[name] - before[name]) / max(tokens, 1)
                                     for name in pids}
    if args.hop_messages > 0:
        log("the floor: one bare stream message after an idle gap")
        hops = measure_hops(args.hop_messages, gap_ms=args.ttft_gap_ms)
        data["grpc_hop_ms"] = hops
        # The hop on the TCP path the stages ran on (strand/services/grpc_tuning.py).
        iomgr = os.environ.get(grpc_tuning.ENV) == grpc_tuning.IOMGR_TCP
        stage_hop = hops["link_after_gap_ms" if data["stage_transport"] == "link" else
                         "grpc_iomgr_after_gap_ms" if iomgr else "grpc_after_gap_ms"]
        # The client's two hops are one new call: its round trip on a bare server.
        data["ttft_ms"]["floor"] = hops["grpc_new_call_ms"] + STAGE_HOPS * stage_hop
    if pairs:
        data["throughput"] = pairs_to_json(pairs)
    return data


def summary_table(data: dict[str, Any]) -> str:
    ttft = data["ttft_ms"]
    floor = f"{ttft['floor']:.2f}" if "floor" in ttft else "-"
    stage_hops = "link" if data.get("stage_transport") == "link" else "gRPC"
    gap = data.get("ttft_gap_ms", 0.0)
    lines = [format_table([f"TTFT p50 ms, after {gap:g} ms idle", "in process", "ring", "added",
                           f"floor (a bare gRPC call + {STAGE_HOPS} {stage_hops} hops)"],
                          [["", f"{ttft['in_process_p50']:.2f}", f"{ttft['ring_p50']:.2f}",
                            f"{ttft['added_p50']:.2f}", floor]])]
    if "ring_p90" in ttft:
        lines.append(f"TTFT p90 ms: {ttft['in_process_p90']:.2f} in process, "
                     f"{ttft['ring_p90']:.2f} over the ring")
    if "grpc_hop_ms" in data:
        hop = data["grpc_hop_ms"]
        lines.append(f"one bare gRPC stream message: {hop['grpc_after_gap_ms']:.3f} ms after "
                     f"{hop['gap_ms']:g} ms idle, {hop['grpc_busy_ms']:.3f} ms back to back "
                     f"(its iomgr TCP path: {hop['grpc_iomgr_after_gap_ms']:.3f} and "
                     f"{hop['grpc_iomgr_busy_ms']:.3f} ms); a plain socket after the idle: "
                     f"{hop['socket_after_gap_ms']:.3f} ms, the stages' local link "
                     f"{hop['link_after_gap_ms']:.3f} ms; the client's round trips after the "
                     f"idle: {hop['grpc_new_call_ms']:.3f} ms a new call (Generate's), "
                     f"{hop['grpc_stream_round_trip_ms']:.3f} ms a message on an open stream")
    cpu, lone = data["cpu_s_per_1000_tokens"], data["cpu_ms_per_lone_request"]
    lines.append(format_table(["process", "CPU s / 1000 output tokens",
                               "CPU ms / lone request"],
                              [[name, f"{value:.3f}", f"{lone[name]:.2f}"]
                               for name, value in cpu.items()]))
    if "throughput" in data:
        lines.append(pairs_table(data["throughput"]))
    work = data["workload"]
    lines.append(f"{work['output_tokens']} output tokens in {work['duration_s']:.1f}s "
                 f"({work['output_tok_per_s']:.1f} tok/s), {data['num_threads']} threads"
                 + (f", engine on CPUs {data['engine_cpus']}, the rest elsewhere"
                    if data.get("engine_cpus") else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.hop_messages < 0:
        parser.error(f"--hop-messages must be >= 0, got {args.hop_messages}")
    if not 0 <= args.ttft_gap_ms <= 10_000:
        parser.error(f"--ttft-gap-ms must be in [0, 10000], got {args.ttft_gap_ms:g}")
    if args.engine_cpus:
        try:
            split_cpus(parse_cpu_list(args.engine_cpus))
        except ValueError as exc:
            parser.error(str(exc).replace("engine_cpus", "--engine-cpus", 1))
    data = run(args)
    write_json(args.output_json, data)
    print(summary_table(data))


if __name__ == "__main__":
    main()
