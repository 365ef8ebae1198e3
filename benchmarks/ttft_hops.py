"""Where a lone request's time to first token goes along the ring, from the stages' own spans.

Starts an OTLP/gRPC trace receiver and an auto-stepping stack that exports to it, sends
`--num-requests` single Generate streams one after another (nothing else in flight), and for
every span name reports the median of its start and end relative to the gateway's Generate
span of the same trace, plus the client's time to first token. Read down the table: the gaps
between one stage's span ending and the next stage's starting are the hops (a gRPC message and
an event-loop wake-up each), the spans themselves the work. The engine's steps and the
detokenizer's work on them are traces of their own (a step serves every request in it): each
request is given the first of each that started after its engine add.

    python -m benchmarks.ttft_hops --num-requests 30 [--num-layers 2 --hidden-size 64 ...]

Tracing itself costs each stage a little (spans are batched and exported on a thread), so the
client's TTFT here is somewhat above ring_overhead.py's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections import defaultdict
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from benchmarks.common import (
    add_model_args,
    format_table,
    load_config,
    log,
    resolve_model,
    set_threads,
    write_json,
)

ROOT_SPAN = "strand.v1.Inference/Generate"


class SpanTimes(trace_service_pb2_grpc.TraceServiceServicer):
    """Every exported span's (trace, service, name, start ns, end ns)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, str, int, int]] = []
        self._lock = threading.Lock()

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest,
               context: grpc.ServicerContext) -> trace_service_pb2.ExportTraceServiceResponse:
        got = []
        for resource_spans in request.resource_spans:
            service = next((a.value.string_value for a in resource_spans.resource.attributes
                            if a.key == "service.name"), "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    got.append((span.trace_id.hex(), service, span.name,
                                span.start_time_unix_nano, span.end_time_unix_nano))
        with self._lock:
            self.spans.extend(got)
        return trace_service_pb2.ExportTraceServiceResponse()

    def by_trace(self) -> dict[str, list[tuple[str, str, int, int]]]:
        traces: dict[str, list[tuple[str, str, int, int]]] = defaultdict(list)
        with self._lock:
            for trace_id, service, name, start, end in self.spans:
                traces[trace_id].append((service, name, start, end))
        return traces


ENGINE_ADD = "strand.v1.Engine/add"
# An auto-stepping engine's steps, and the detokenizer's work on each, are traces of their own
# (a step serves many requests): a request's are the first of each to start after its add did.
STEP_SPANS = ("engine_step", "strand.v1.Detokenizer/process_outputs")
AFTER_ADD = " (the first after the add)"


def span_offsets(traces: dict[str, list[tuple[str, str, int, int]]]
                 ) -> dict[tuple[str, str], tuple[list[float], list[float]]]:
    """Per (service, span name): starts and ends in ms after the trace's Generate span began
    (the first of each name per trace: a lone request's first step is the one that matters),
    and the engine's first step after the trace's add (FIRST_STEP)."""
    out: dict[tuple[str, str], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    steps = sorted((start, end, service, name) for spans in traces.values()
                   for service, name, start, end in spans if name in STEP_SPANS)
    for spans in traces.values():
        roots = [s for s in spans if s[1] == ROOT_SPAN]
        if not roots:
            continue
        t0 = roots[0][2]
        first: dict[tuple[str, str], tuple[int, int]] = {}
        for service, name, start, end in sorted(spans, key=lambda s: s[2]):
            first.setdefault((service, name), (start, end))
        add = next((start for service, name, start, _ in spans if name == ENGINE_ADD), None)
        for step_name in STEP_SPANS:
            step = next((s for s in steps if add is not None and s[0] >= add
                         and s[3] == step_name), None)
            if step is not None:
                first[(step[2], step_name + AFTER_ADD)] = (step[0], step[1])
        for key, (start, end) in first.items():
            out[key][0].append((start - t0) / 1e6)
            out[key][1].append((end - t0) / 1e6)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams
    from strand.services.client import EngineClient
    from strand.services.launch import StackConfig, launch_stack

    threads = set_threads(args.num_threads)
    model_dir = resolve_model(args)
    vocab = load_config(model_dir)["vocab_size"]
    receiver = SpanTimes()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    prompt = [1 + (7 * i) % (vocab - 2) for i in range(args.prompt_len)]
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    log("starting an auto-stepping stack that exports its spans here")
    os.environ["OMP_NUM_THREADS"] = str(threads)  # the stages' threads, as in process
    stack = launch_stack(StackConfig(
        model=str(model_dir), engine_args=["--kv-cache-memory", str(64 * 1024**2)],
        gateway_args=["--auto-step"], otlp_traces_endpoint=f"http://127.0.0.1:{port}",
        log_dir=Path("/tmp/strand-bench-logs")))
    ttft: list[float] = []
    try:
        with EngineClient(stack.gateway_address, timeout=None) as client:
            for i in range(args.num_requests + 3):
                start = time.perf_counter()
                first = None
                for out in client.generate({"prompt_token_ids": prompt}, params):
                    if first is None and out.outputs and out.outputs[0].token_ids:
                        first = time.perf_counter() - start
                if i >= 3 and first is not None:  # the first ones warm the stages up
                    ttft.append(1e3 * first)
                time.sleep(0.05)  # nothing in flight between requests
        log("waiting for the stages' span exports")
        time.sleep(args.export_wait)
    finally:
        stack.stop()
        server.stop(grace=1)
    offsets = span_offsets(receiver.by_trace())
    rows = sorted(((service, name, statistics.median(starts), statistics.median(ends),
                    len(starts)) for (service, name), (starts, ends) in offsets.items()),
                  key=lambda r: r[2])
    return {"benchmark": "ttft_hops", "model": str(model_dir), "num_threads": threads,
            "prompt_len": args.prompt_len, "client_ttft_ms_p50": statistics.median(ttft),
            "spans": [{"service": s, "name": n, "start_ms_p50": a, "end_ms_p50": b, "count": c}
                      for s, n, a, b, c in rows]}


def summary_table(data: dict[str, Any]) -> str:
    rows = [[s["service"], s["name"], f"{s['start_ms_p50']:.2f}", f"{s['end_ms_p50']:.2f}",
             str(s["count"])] for s in data["spans"]]
    return (format_table(["service", "span", "start ms (p50)", "end ms (p50)", "traces"], rows)
            + f"\nclient TTFT p50: {data['client_ttft_ms_p50']:.2f} ms, "
              f"{data['num_threads']} threads")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    parser.add_argument("--num-requests", type=int, default=30)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--export-wait", type=float, default=8.0,
                        help="seconds to let the stages' batched span exports arrive")
    parser.add_argument("--output-json", type=Path, default=None)
    args = parser.parse_args(argv)
    data = run(args)
    write_json(args.output_json, data)
    print(summary_table(data))


if __name__ == "__main__":
    main()
