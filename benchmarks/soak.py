"""Load/soak: N concurrent Generate streams against a stack, a fraction of them cancelled early.

    python -m benchmarks.soak --streams 1000                       # a fresh tiny-model stack
    python -m benchmarks.soak --streams 4000 --cancel-fraction 0.3 --output-json soak.json
    python -m benchmarks.soak --gateway 127.0.0.1:50051 --streams 200   # an existing stack

Reports what an operator asks after a storm: how many streams completed, errors by gRPC status
(overload should be RESOURCE_EXHAUSTED, never a bare CANCELLED), finish_reason "error" endings,
silent losses (a stream that ended OK without a final output), latency p50/p90/p99 of the
completed ones, each stage's RSS (before, peak and after), and leaked requests: what the gateway (for
this tool's client) and the engine still hold once every stream has ended.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from benchmarks.common import add_model_args, format_table, log, percentiles, resolve_model
from benchmarks.common import write_json as write_json_file
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import engine_pb2_grpc, inference_pb2_grpc
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.gateway.clients import CLIENT_METADATA

CLIENT_LABEL = "strand-soak"
STREAMS_PER_CHANNEL = 250  # HTTP/2 connections the streams are spread over
SETTLE_S = 30.0  # after the last stream: how long requests may take to leave every stage


@dataclass(slots=True)
class StreamResult:
    cancelled: bool = False  # by this tool, on purpose
    status: str = "OK"  # the call's gRPC status
    finish_reason: str | None = None  # of the final output, if one came
    latency_s: float | None = None  # start to final output
    details: str = ""  # the status's message, when not OK
    elapsed_s: float = 0.0  # start to the call's end
    admitted: bool = True  # the gateway added it (false: refused or never reached a handler)


@dataclass(slots=True)
class SoakReport:
    streams: int
    cancel_fraction: float
    results: list[StreamResult]
    wall_s: float
    rss_start_mib: dict[str, float] = field(default_factory=dict)  # before the first stream
    rss_peak_mib: dict[str, float] = field(default_factory=dict)
    rss_end_mib: dict[str, float] = field(default_factory=dict)
    leaked_gateway: int | None = None
    leaked_engine: int | None = None

    def summary(self) -> dict[str, Any]:
        done = [r for r in self.results if r.finish_reason in ("stop", "length")]
        statuses = Counter(r.status for r in self.results if r.status != "OK" and not r.cancelled)
        lost = [r for r in self.results
                if not r.cancelled and r.status == "OK" and r.finish_reason is None]
        return {
            "streams": self.streams, "cancel_fraction": self.cancel_fraction,
            "wall_s": round(self.wall_s, 1),
            "completed": len(done),
            "cancelled_by_client": sum(r.cancelled for r in self.results),
            "errors_by_status": dict(statuses),
            # One message per status: what a client was told.
            "error_examples": {r.status: f"{r.details[:200]} (after {r.elapsed_s:.1f}s)"
                               for r in self.results if r.status != "OK" and not r.cancelled},
            # CANCELLED by the server before any handler ran (gRPC C-core sheds streams it
            # cannot hand to the application fast enough; see docs/load.md).
            "cancelled_unadmitted": sum(r.status == "CANCELLED" and not r.admitted
                                        and not r.cancelled for r in self.results),
            "finish_error": sum(r.finish_reason == "error" for r in self.results),
            "finish_abort": sum(r.finish_reason == "abort" for r in self.results),
            "silent_losses": len(lost),
            "latency_s": percentiles([r.latency_s for r in done if r.latency_s is not None]),
            "rss_start_mib": self.rss_start_mib,
            "rss_peak_mib": self.rss_peak_mib, "rss_end_mib": self.rss_end_mib,
            "leaked_gateway": self.leaked_gateway, "leaked_engine": self.leaked_engine,
        }


async def _one_stream(stub: inference_pb2_grpc.InferenceStub, index: int, rng: random.Random,
                      args: argparse.Namespace, metadata: tuple[tuple[str, str], ...],
                      open_at: float) -> StreamResult:
    result = StreamResult(cancelled=rng.random() < args.cancel_fraction)
    cancel_after = rng.uniform(0.0, args.cancel_within)
    if open_at > 0:
        await asyncio.sleep(open_at)
    params = pb.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    start = time.monotonic()
    call = stub.Generate(gpb.GenerateRequest(
        request_id=f"soak-{index}", prompt=pb.Prompt(text=f"soak stream {index} says"),
        params=params), metadata=metadata, timeout=args.timeout)
    if result.cancelled:
        asyncio.get_running_loop().call_later(cancel_after, call.cancel)
    try:
        async for output in call:
            if output.finished:
                reasons = [c.finish_reason for c in output.outputs]
                result.finish_reason = "error" if "error" in reasons else reasons[0]
                result.latency_s = time.monotonic() - start
    except grpc.aio.AioRpcError as exc:
        result.status = exc.code().name
        result.details = exc.details() or ""
        # Whether the gateway took it (its initial metadata names the request) before the end.
        result.admitted = any(k == "strand-request-id" for k, _ in
                              (await call.initial_metadata() or ()))
    except asyncio.CancelledError:
        result.status = "CANCELLED"
    result.elapsed_s = time.monotonic() - start
    return result


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def _sample_rss(pids: dict[str, int], peak: dict[str, float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        for name, pid in pids.items():
            peak[name] = max(peak.get(name, 0.0), _rss_mib(pid))
        await asyncio.sleep(0.5)


def _engine_unfinished(address: str, token: str) -> int:
    with grpc.insecure_channel(address) as channel:
        responses = engine_pb2_grpc.EngineStub(channel).Session(
            iter([epb.EngineRequest(seq=1, query=epb.EngineQuery())]), timeout=30,
            metadata=(("authorization", f"Bearer {token}"),))
        return int(next(iter(responses)).state.num_unfinished_requests)


async def soak(gateway: str, args: argparse.Namespace, pids: dict[str, int],
               engine: tuple[str, str] | None) -> SoakReport:
    """engine: (address, stage token) to ask the engine what it still holds; None: unknown."""
    rng = random.Random(args.seed)
    # Each stream's opening time: all at once, or --open-rate streams a second.
    opens = [i / args.open_rate if args.open_rate > 0 else 0.0 for i in range(args.streams)]
    metadata = ((CLIENT_METADATA, CLIENT_LABEL),
                *((("authorization", f"Bearer {args.api_key}"),) if args.api_key else ()))
    num_channels = max(1, -(-args.streams // STREAMS_PER_CHANNEL))
    channels = [grpc.aio.insecure_channel(gateway, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(num_channels)]
    stubs = [inference_pb2_grpc.InferenceStub(c) for c in channels]
    rss_start = {name: _rss_mib(pid) for name, pid in pids.items()}
    peak: dict[str, float] = {}
    stop = asyncio.Event()
    sampler = asyncio.ensure_future(_sample_rss(pids, peak, stop))
    start = time.monotonic()
    try:
        results = await asyncio.gather(*(
            _one_stream(stubs[i % num_channels], i, rng, args, metadata, opens[i])
            for i in range(args.streams)))
        wall = time.monotonic() - start
        log(f"all {args.streams} streams ended after {wall:.1f}s; settling")
        leaked_gateway: int | None = None
        leaked_engine: int | None = None
        deadline = time.monotonic() + SETTLE_S
        count_call = stubs[0].GetNumUnfinishedRequests
        while True:
            leaked_gateway = (await count_call(gpb.GetNumUnfinishedRequestsRequest(),
                                               metadata=metadata, timeout=30)).value
            if engine is not None:
                leaked_engine = await asyncio.to_thread(_engine_unfinished, *engine)
            if (not leaked_gateway and not leaked_engine) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        await sampler
        for channel in channels:
            await channel.close()
    return SoakReport(streams=args.streams, cancel_fraction=args.cancel_fraction,
                      results=list(results), wall_s=wall, rss_start_mib=rss_start,
                      rss_peak_mib=peak,
                      rss_end_mib={name: _rss_mib(pid) for name, pid in pids.items()},
                      leaked_gateway=leaked_gateway, leaked_engine=leaked_engine)


def _print_table(summary: dict[str, Any]) -> None:
    lat = summary["latency_s"]
    errors = ", ".join(f"{k}={v}" for k, v in sorted(summary["errors_by_status"].items()))
    print(format_table(
        ["streams", "completed", "cancelled", "errors by status", "CANCELLED unadmitted",
         "finish error", "silent lost",
         "p50 s", "p90 s", "p99 s", "leaked gw/engine", "wall s"],
        [[str(summary["streams"]), str(summary["completed"]),
          str(summary["cancelled_by_client"]), errors or "-",
          str(summary["cancelled_unadmitted"]), str(summary["finish_error"]),
          str(summary["silent_losses"]), f"{lat.get('p50', 0):.2f}", f"{lat.get('p90', 0):.2f}",
          f"{lat.get('p99', 0):.2f}",
          f"{summary['leaked_gateway']}/{summary['leaked_engine']}", str(summary["wall_s"])]]))
    print(format_table(["stage", "RSS before MiB", "RSS peak MiB", "RSS after MiB"],
                       [[name, f"{summary['rss_start_mib'].get(name, 0):.0f}", f"{peak:.0f}",
                         f"{summary['rss_end_mib'].get(name, 0):.0f}"]
                        for name, peak in sorted(summary["rss_peak_mib"].items())]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--cancel-fraction", type=float, default=0.2,
                        help="share of the streams cancelled by the client (default: %(default)s)")
    parser.add_argument("--cancel-within", type=float, default=0.5,
                        help="a cancelled stream is cancelled 0..this many seconds in")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=600.0, help="each stream's deadline")
    parser.add_argument("--open-rate", type=float, default=0.0,
                        help="streams opened per second (default: all at once)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gateway", default=None,
                        help="host:port of a running gateway (default: start a stack)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--engine-args", default="--max-num-seqs 64 --kv-cache-memory 67108864",
                        help="EngineArgs flags for a started stack (default: %(default)s)")
    parser.add_argument("--output-json", type=Path, default=None)
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="a started stack's logs, one file per service (default: stderr)")
    add_model_args(parser)
    # The tests' tiny model (2 layers, hidden 64, vocab 512) unless told otherwise: the soak
    # loads the serving path, not the model.
    parser.set_defaults(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                        vocab_size=512)
    args = parser.parse_args(argv)
    if args.streams < 1:
        parser.error(f"--streams must be >= 1, got {args.streams}")
    if not 0.0 <= args.cancel_fraction <= 1.0:
        parser.error(f"--cancel-fraction must be in [0, 1], got {args.cancel_fraction}")
    if args.gateway:
        report = asyncio.run(soak(args.gateway, args, {}, None))
    else:
        from strand.services.launch import StackConfig, launch_stack

        model = resolve_model(args)
        config = StackConfig(model=str(model), engine_args=shlex.split(args.engine_args),
                             gateway_args=["--auto-step"], log_dir=args.log_dir)
        log(f"starting a stack on {model}")
        with launch_stack(config) as stack:
            pids = {name: p.pid for name, p in stack.processes.items()}
            report = asyncio.run(soak(stack.gateway_address, args, pids,
                                      (stack.address("engine"), stack.stage_token)))
    summary = report.summary()
    write_json_file(args.output_json, summary)
    log(json.dumps(summary))
    _print_table(summary)


if __name__ == "__main__":
    main()
