"""Served, against llama-server: the same OpenAI-API load on llama.cpp's server and on Strand's
OpenAI front (the whole gRPC stack behind it), on the same GGUF file, in one run:

    python -m benchmarks.served_peers --gguf FILE.gguf --llama-cpp BIN_DIR [--threads 2]
        [--dtype float32] [--quantization none|gguf] [--slots 32] [--burst 32]
        [--rates 1 2 4] [--requests-per-rate 32] [--prompt-tokens 128] [--output-tokens 128]
        [--rounds 1] [--out results.json]

One server at a time is up (started, warmed up, driven, stopped; with --rounds > 1 the order
alternates between rounds, and the table gives each figure's median over the rounds):
  llama-server  -m FILE -np SLOTS -c SLOTS x (prompt + output + 16) -t/-tb THREADS (continuous
                batching is its default; its K/V cache is its default float16);
  strand        `strand serve`'s stack: the tokenizer, engine and detokenizer stages, the
                auto-stepping gateway and the OpenAI front, the engine with --cpu-threads THREADS
                (OMP_NUM_THREADS for every stage), --max-num-seqs SLOTS, --dtype, --quantization
                and a K/V cache of SLOTS x (prompt + output + 16) tokens.
Workloads, each on fresh prompts: an all-at-once burst of --burst requests, then for each of
--rates a Poisson stream of --requests-per-rate requests at that many requests/s. Every request
is a streamed /v1/completions with a prompt of --prompt-tokens random token ids (both servers
take a list of ids; the same ids on both, from --seed), max_tokens = --output-tokens, ignore_eos,
temperature 0 and the usage in the last event. Per workload and server: output tokens/s and
requests/s (over the wall time from the first request sent to the last one done), TTFT p50/p99
(to the first streamed text), ITL p50/p99 (gaps between streamed text events) and failures (an
error, or fewer tokens than asked); and Strand over llama-server: the throughput ratio and the
p99 TTFT ratio. Issue #55's goals: SmolLM2 >= 2x llama-server's throughput; the 1B shape >= 1.5x
at <= 0.7x its p99 TTFT.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from benchmarks.common import format_table, log, percentiles, write_json
from benchmarks.llama_server import LlamaServer, get_json
from benchmarks.strand_backends import bench_log_dir, stage_threads

BACKENDS = ("llama-server", "strand")
CTX_MARGIN = 16  # tokens per slot beyond prompt + output
WARMUP_REQUESTS = 2
WARMUP_TOKENS = 4
# Token ids of prompts come from [FIRST_ID, min(vocab, LAST_ID)): clear of the special tokens at
# either end of the vocabularies in use (SmolLM2's 0-16, Llama 3's 128000 and above).
FIRST_ID = 1000
LAST_ID = 32000


@dataclass(slots=True)
class Request:
    """One streamed completion. Times in seconds, from its workload's start."""

    sent_s: float = 0.0
    ttft_s: float = 0.0  # from sent to the first streamed text
    done_s: float = 0.0
    gaps_s: list[float] = field(default_factory=list)  # between successive text events
    num_tokens: int = 0  # the final usage's completion_tokens
    num_prompt_tokens: int = 0
    error: str | None = None


# --- prompts, arrivals and streams ---------------------------------------------------------


def make_prompts(seed: int, count: int, num_tokens: int, vocab_size: int) -> list[list[int]]:
    """`count` prompts of `num_tokens` token ids each, the same for every call with the same
    arguments (so both servers get the same ones)."""
    high = min(vocab_size, LAST_ID)
    if high <= FIRST_ID:
        raise ValueError(f"vocab_size must exceed {FIRST_ID}, got {vocab_size}")
    rng = random.Random(seed)
    return [[rng.randrange(FIRST_ID, high) for _ in range(num_tokens)] for _ in range(count)]


def poisson_offsets(rate: float, count: int, seed: int) -> list[float]:
    """Send times (s from the start) of `count` Poisson arrivals at `rate` per second; the first
    at 0. rate <= 0 or inf: all at once."""
    if rate <= 0 or rate == float("inf"):
        return [0.0] * count
    rng = random.Random(seed)
    offsets, now = [], 0.0
    for i in range(count):
        if i:
            now += rng.expovariate(rate)
        offsets.append(now)
    return offsets


def completion_body(model: str, prompt: list[int], max_tokens: int) -> str:
    return json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "ignore_eos": True, "temperature": 0.0, "stream": True,
                       "stream_options": {"include_usage": True}})


class StreamTimes(Protocol):
    """What read_stream fills: Request here, benchmarks/smg.py's Stream."""

    ttft_s: float
    gaps_s: list[float]
    num_tokens: int
    num_prompt_tokens: int


def read_stream(lines: Iterable[bytes], request: StreamTimes, sent: float,
                clock: Any = time.perf_counter) -> None:
    """Fill `request` from a completion's server-sent events: when each text event came (from
    `sent`, a `clock()` reading), and the usage at the end."""
    last = sent
    for line in lines:
        if not line.startswith(b"data: {"):
            continue
        event = json.loads(line[6:])
        now = clock()
        if any(choice.get("text") for choice in event.get("choices") or []):
            if request.ttft_s == 0.0:
                request.ttft_s = now - sent
            else:
                request.gaps_s.append(now - last)
            last = now
        if event.get("usage"):
            request.num_tokens = int(event["usage"]["completion_tokens"])
            request.num_prompt_tokens = int(event["usage"]["prompt_tokens"])


def stream_completion(address: str, body: str, request: Request, t0: float,
                      timeout: float) -> None:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        sent = time.perf_counter()
        request.sent_s = sent - t0
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            request.error = f"HTTP {response.status}: {response.read()[:200]!r}"
            return
        read_stream(response, request, sent)
    except (OSError, ValueError) as exc:
        request.error = repr(exc)
    finally:
        request.done_s = time.perf_counter() - t0
        conn.close()


def run_workload(address: str, model: str, prompts: list[list[int]], offsets: list[float],
                 max_tokens: int, timeout: float) -> list[Request]:
    """Each prompt sent at its offset (s from now), one thread each; their results."""
    requests = [Request() for _ in prompts]
    t0 = time.perf_counter()

    def one(i: int) -> None:
        delay = t0 + offsets[i] - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        stream_completion(address, completion_body(model, prompts[i], max_tokens), requests[i],
                          t0, timeout)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return requests


# --- statistics ----------------------------------------------------------------------------


def summarize(requests: list[Request], output_tokens: int) -> dict[str, Any]:
    """A workload's figures: throughput over the wall time from the first send to the last
    done; TTFT and ITL percentiles (ms) over the requests that got every token asked for."""
    ok = [r for r in requests if r.error is None and r.num_tokens == output_tokens]
    failed = [r for r in requests if r not in ok]
    if requests:
        elapsed = max(r.done_s for r in requests) - min(r.sent_s for r in requests)
    else:
        elapsed = 0.0
    ttft = percentiles([1e3 * r.ttft_s for r in ok], (50, 99))
    itl = percentiles([1e3 * g for r in ok for g in r.gaps_s], (50, 99))
    tokens = sum(r.num_tokens for r in ok)
    return {"num_requests": len(requests), "num_ok": len(ok), "num_failed": len(failed),
            "errors": sorted({r.error or f"{r.num_tokens} tokens" for r in failed})[:3],
            "prompt_tokens": max((r.num_prompt_tokens for r in ok), default=0),
            "output_tokens": tokens, "elapsed_s": elapsed,
            "output_tok_s": tokens / elapsed if elapsed > 0 else 0.0,
            "requests_per_s": len(ok) / elapsed if elapsed > 0 else 0.0,
            "ttft_p50_ms": ttft["p50"], "ttft_p99_ms": ttft["p99"],
            "itl_p50_ms": itl["p50"], "itl_p99_ms": itl["p99"]}


METRICS = ("output_tok_s", "requests_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
           "itl_p99_ms")


def median_over_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each metric's median over the rounds; failures summed."""
    merged: dict[str, Any] = {k: statistics.median(r[k] for r in rounds) for k in METRICS}
    merged["num_failed"] = sum(r["num_failed"] for r in rounds)
    merged["num_requests"] = sum(r["num_requests"] for r in rounds)
    merged["prompt_tokens"] = max(r["prompt_tokens"] for r in rounds)
    return merged


def ratios(strand: dict[str, Any], llama: dict[str, Any]) -> dict[str, float | None]:
    """Strand over llama-server: throughput (higher is better), p99 TTFT (lower is better)."""
    def ratio(a: float, b: float) -> float | None:
        return a / b if b > 0 else None

    return {"throughput": ratio(strand["output_tok_s"], llama["output_tok_s"]),
            "ttft_p99": ratio(strand["ttft_p99_ms"], llama["ttft_p99_ms"])}


def workload_names(burst: int, rates: list[float]) -> list[str]:
    return ([f"burst {burst}"] if burst > 0 else []) + [f"rate {rate:g}/s" for rate in rates]


def summary_table(data: dict[str, Any]) -> str:
    headers = ["workload", "server", "ok", "prompt tok", "output tok/s", "req/s", "TTFT p50 ms",
               "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "tput ratio", "TTFT p99 ratio"]
    rows = []
    for name, entry in data["workloads"].items():
        for backend in BACKENDS:
            if backend not in entry["median"]:
                continue
            m = entry["median"][backend]
            rat = entry.get("ratios") if backend == "strand" else None
            rows.append([name, backend, f"{m['num_requests'] - m['num_failed']}/{m['num_requests']}",
                         str(m["prompt_tokens"]), f"{m['output_tok_s']:.1f}",
                         f"{m['requests_per_s']:.2f}", f"{m['ttft_p50_ms']:.0f}",
                         f"{m['ttft_p99_ms']:.0f}", f"{m['itl_p50_ms']:.1f}",
                         f"{m['itl_p99_ms']:.1f}", _ratio_cell(rat, "throughput"),
                         _ratio_cell(rat, "ttft_p99")])
    return format_table(headers, rows)


def _ratio_cell(rat: dict[str, float | None] | None, key: str) -> str:
    if not rat or rat.get(key) is None:
        return ""
    return f"{rat[key]:.2f}x"


# --- the machine and the servers -----------------------------------------------------------


ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


def cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def cpu_isa(cpuinfo: str) -> list[str]:
    """Which of ISA_FLAGS the first CPU's flags hold."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return [f for f in ISA_FLAGS if f in flags]
    return []


def machine() -> dict[str, Any]:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        cpuinfo = ""
    root = Path(__file__).resolve().parent.parent

    def git(*argv: str) -> str:
        done = subprocess.run(["git", *argv], cwd=root, capture_output=True, text=True,
                              check=False)
        return done.stdout.strip()

    return {"cpu": cpu_model(cpuinfo), "isa": cpu_isa(cpuinfo), "cpus": os.cpu_count(),
            "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "commit": git("rev-parse", "--short", "HEAD"),
            "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no"))}


def ctx_per_slot(prompt_tokens: int, output_tokens: int) -> int:
    return prompt_tokens + output_tokens + CTX_MARGIN


def strand_engine_flags(dtype: str, quantization: str, slots: int, threads: int, ctx: int,
                        kv_bytes_per_token: int) -> list[str]:
    flags = ["--dtype", dtype, "--device", "cpu", "--cpu-threads", str(threads),
             "--max-num-seqs", str(slots), "--max-model-len", str(ctx),
             "--kv-cache-memory", str(slots * (ctx + 16) * kv_bytes_per_token)]
    if quantization != "none":
        flags += ["--quantization", quantization]
    return flags


def gguf_config(gguf: Path) -> dict[str, Any]:
    from strand.engine_core.model_executor.gguf.convert import gguf_to_hf_dir

    config: dict[str, Any] = json.loads((gguf_to_hf_dir(gguf) / "config.json").read_text())
    return config


def kv_bytes_per_token(config: dict[str, Any], dtype: str) -> int:
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    value_bytes = 4 if dtype == "float32" else 2
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * value_bytes


def _llama_server(args: argparse.Namespace, ctx: int) -> LlamaServer:
    return LlamaServer(args.llama_cpp, args.gguf, args.slots, args.threads, ctx,
                       args.start_timeout)


class StrandServer:
    def __init__(self, args: argparse.Namespace, ctx: int, config: dict[str, Any]) -> None:
        from strand.services.launch import StackConfig, launch_stack

        flags = strand_engine_flags(args.dtype, args.quantization, args.slots, args.threads, ctx,
                                    kv_bytes_per_token(config, args.dtype))
        log(f"  strand stack: {' '.join(flags)} (gateway --auto-step, OpenAI front)")
        with stage_threads(args.threads):
            self.stack = launch_stack(
                StackConfig(model=str(args.gguf), engine_args=flags, gateway_args=["--auto-step"],
                            openai_port=0, log_dir=bench_log_dir()),
                timeout=args.start_timeout)
        try:
            self.address = self.stack.address("openai")
            self.model = get_json(f"http://{self.address}/v1/models")["data"][0]["id"]
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self.stack.stop()


def run_backend(backend: str, args: argparse.Namespace, ctx: int, config: dict[str, Any],
                workloads: dict[str, tuple[list[list[int]], list[float]]],
                warm_prompts: list[list[int]]) -> dict[str, dict[str, Any]]:
    log(f"starting {backend}")
    server: LlamaServer | StrandServer = (_llama_server(args, ctx) if backend == "llama-server"
                                          else StrandServer(args, ctx, config))
    results: dict[str, dict[str, Any]] = {}
    try:
        run_workload(server.address, server.model, warm_prompts, [0.0] * len(warm_prompts),
                     WARMUP_TOKENS, args.request_timeout)
        for name, (prompts, offsets) in workloads.items():
            log(f"  {backend}: {name} ({len(prompts)} requests)")
            requests = run_workload(server.address, server.model, prompts, offsets,
                                    args.output_tokens, args.request_timeout)
            results[name] = summarize(requests, args.output_tokens)
            r = results[name]
            log(f"    {r['output_tok_s']:.1f} tok/s, TTFT p50 {r['ttft_p50_ms']:.0f} ms "
                f"p99 {r['ttft_p99_ms']:.0f} ms, ITL p50 {r['itl_p50_ms']:.1f} ms, "
                f"{r['num_failed']} failed {r['errors']}")
    finally:
        server.stop()
        log(f"stopped {backend}")
    return results


def run(args: argparse.Namespace) -> dict[str, Any]:
    config = gguf_config(args.gguf)
    ctx = ctx_per_slot(args.prompt_tokens, args.output_tokens)
    vocab = int(config["vocab_size"])
    names = workload_names(args.burst, args.rates)
    workloads: dict[str, tuple[list[list[int]], list[float]]] = {}
    for i, name in enumerate(names):
        if name.startswith("burst"):
            count, rate = args.burst, 0.0
        else:
            count, rate = args.requests_per_rate, args.rates[i - (1 if args.burst > 0 else 0)]
        workloads[name] = (make_prompts(args.seed + 1 + i, count, args.prompt_tokens, vocab),
                           poisson_offsets(rate, count, args.seed + 1 + i))
    warm = make_prompts(args.seed, WARMUP_REQUESTS, args.prompt_tokens, vocab)
    info = machine()
    log(f"{info['cpu']} ({' '.join(info['isa'])}), {info['cpus']} CPUs, load average "
        f"{info['load_average']}")
    backends = [b for b in BACKENDS if b in args.backends]
    per_round: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {b: [] for b in backends} for name in names}
    for round_index in range(args.rounds):
        order = backends if round_index % 2 == 0 else backends[::-1]
        for backend in order:
            log(f"round {round_index + 1}/{args.rounds}")
            for name, result in run_backend(backend, args, ctx, config, workloads, warm).items():
                per_round[name][backend].append(result)
    report: dict[str, Any] = {}
    for name in names:
        median = {b: median_over_rounds(per_round[name][b]) for b in backends}
        entry: dict[str, Any] = {"rounds": per_round[name], "median": median}
        if len(median) == 2:
            entry["ratios"] = ratios(median["strand"], median["llama-server"])
        report[name] = entry
    return {"benchmark": "served_peers", "gguf": str(args.gguf), "dtype": args.dtype,
            "quantization": args.quantization, "threads": args.threads, "slots": args.slots,
            "burst": args.burst, "rates": args.rates, "requests_per_rate": args.requests_per_rate,
            "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
            "rounds": args.rounds, "seed": args.seed, "machine": info,
            "load_average_after": os.getloadavg(), "workloads": report}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.served_peers",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--llama-cpp", type=Path, default=None,
                        help="directory holding llama-server (cpu_peers_setup builds it)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--quantization", default="none", choices=("none", "gguf"))
    parser.add_argument("--slots", type=int, default=32,
                        help="llama-server's -np; Strand's --max-num-seqs")
    parser.add_argument("--burst", type=int, default=32, help="requests at once (0: none)")
    parser.add_argument("--rates", type=float, nargs="*", default=[1.0, 2.0, 4.0],
                        help="Poisson request rates, per second")
    parser.add_argument("--requests-per-rate", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1,
                        help="each server this many times, alternating the order")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--request-timeout", type=float, default=1800.0)
    parser.add_argument("--out", "--output-json", dest="out", type=Path, default=None)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag, value in (("--threads", args.threads), ("--slots", args.slots),
                        ("--requests-per-rate", args.requests_per_rate),
                        ("--prompt-tokens", args.prompt_tokens),
                        ("--output-tokens", args.output_tokens), ("--rounds", args.rounds)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if args.burst < 0 or any(rate <= 0 for rate in args.rates):
        parser.error("--burst must be >= 0 and every --rates > 0")
    if args.burst == 0 and not args.rates:
        parser.error("nothing to run: --burst 0 and no --rates")
    if not args.gguf.is_file():
        parser.error(f"--gguf {args.gguf} is not a file")
    if "llama-server" in args.backends:
        if args.llama_cpp is None or not (args.llama_cpp / "llama-server").is_file():
            parser.error("--llama-cpp must be a directory holding llama-server (python -m "
                         "benchmarks.cpu_peers_setup builds one)")
    data = run(args)
    write_json(args.out, data)
    print(summary_table(data))


if __name__ == "__main__":
    main()
