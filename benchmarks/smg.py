"""One stack, one workload, two OpenAI fronts side by side: smg (`smg launch`, in front of the
stack's vllm.grpc.engine.VllmEngine front) against Strand's own OpenAI front.

`--num-requests` streamed `/v1/completions` at once per side and round, each with the same
`--prompt-len` token ids and exactly `--output-len` tokens out (min_tokens = max_tokens,
ignore_eos, greedy). Rounds alternate the sides (a VM's speed drifts within minutes). Reported
per side: output tokens/s (every request's tokens over the wall time of its batch), TTFT p50/p99
(to the first streamed text), and the p50 gap between streamed text events.

    python -m benchmarks.smg --num-requests 16 --prompt-len 64 --output-len 64 --rounds 2
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import (
    add_model_args,
    format_table,
    log,
    percentiles,
    resolve_device,
    resolve_model,
    set_threads,
    write_json,
)
from benchmarks.served_peers import read_stream
from benchmarks.strand_backends import StrandSettings, bench_log_dir, stage_threads
from strand.testing.smg import launch_smg

SIDES = ("strand-openai", "smg")
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while")


@dataclass(slots=True)
class Stream:
    ttft_s: float = 0.0
    gaps_s: list[float] = field(default_factory=list)  # between successive text events
    num_tokens: int = 0  # the final usage's completion_tokens
    num_prompt_tokens: int = 0
    error: str | None = None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(parser)
    parser.add_argument("--num-requests", type=int, default=16, help="concurrent streams")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (>= 1)")
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--output-json", type=Path, default=None)
    return parser


def stream_completion(address: str, body: str) -> Stream:
    """One streamed completion: when each text event came, and the usage at the end."""
    host, port = address.rsplit(":", 1)
    result = Stream()
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    try:
        start = time.perf_counter()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            result.error = f"HTTP {response.status}: {response.read()[:200]!r}"
            return result
        read_stream(response, result, start)
    except (OSError, ValueError) as exc:
        result.error = repr(exc)
    finally:
        conn.close()
    return result


def text_prompt(model_dir: Path, num_tokens: int) -> str:
    """Words until the tokenizer makes num_tokens of them (without special tokens): smg's
    /v1/completions takes text only, and adds no BOS where Strand's front does."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    words: list[str] = []
    while len(tokenizer.encode(" ".join(words), add_special_tokens=False).ids) < num_tokens:
        words.append(WORDS[len(words) % len(WORDS)])
    return " ".join(words)


def completion_body(model: str, prompt: str, output_len: int) -> str:
    """Exactly output_len tokens, greedy, streamed, with the usage last."""
    return json.dumps({"model": model, "prompt": prompt, "max_tokens": output_len,
                       "min_tokens": output_len, "ignore_eos": True, "temperature": 0.0,
                       "stream": True, "stream_options": {"include_usage": True}})


def run_batch(address: str, body: str, n: int) -> tuple[list[Stream], float]:
    """n streams at once, one thread each: their results and the batch's wall time."""
    streams: list[Stream] = [Stream() for _ in range(n)]

    def one(i: int) -> None:
        streams[i] = stream_completion(address, body)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return streams, time.perf_counter() - start


def summarize(streams: list[Stream], elapsed_s: float, output_len: int) -> dict[str, Any]:
    ok = [s for s in streams if s.error is None and s.num_tokens == output_len]
    ttft = percentiles([1e3 * s.ttft_s for s in ok], (50, 99))
    gaps = percentiles([1e3 * g for s in ok for g in s.gaps_s], (50,))
    errors = sorted({s.error or f"{s.num_tokens} tokens" for s in streams if s not in ok})
    if errors:
        log(f"{len(streams) - len(ok)} stream(s) failed: {errors[:3]}")
    return {"num_ok": len(ok), "num_failed": len(streams) - len(ok),
            "prompt_tokens": max((s.num_prompt_tokens for s in ok), default=0),
            "output_tokens": sum(s.num_tokens for s in ok), "elapsed_s": elapsed_s,
            "output_tok_s": sum(s.num_tokens for s in ok) / elapsed_s,
            "ttft_p50_ms": ttft["p50"], "ttft_p99_ms": ttft["p99"], "itl_p50_ms": gaps["p50"]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from strand.services.launch import StackConfig, launch_stack

    threads = set_threads(args.num_threads)
    model_dir = resolve_model(args)
    prompt = text_prompt(model_dir, args.prompt_len)
    body = completion_body(str(model_dir), prompt, args.output_len)
    settings = StrandSettings(dtype=args.dtype, device=resolve_device(args.device),
                              enable_prefix_caching=False, kv_cache_memory=1 << 28)
    log("starting an auto-stepping stack with the OpenAI and VllmEngine fronts")
    with stage_threads(threads):
        stack = launch_stack(StackConfig(model=str(model_dir), engine_args=settings.engine_flags(),
                                         gateway_args=["--auto-step"], openai_port=0,
                                         vllm_grpc_port=0, log_dir=bench_log_dir()))
    rounds: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    try:
        with launch_smg([f"grpc://{stack.address('vllm_grpc')}"],
                        bench_log_dir() / "smg.log") as smg:
            addresses = {"strand-openai": stack.address("openai"),
                         "smg": smg.removeprefix("http://")}
            warm = completion_body(str(model_dir), prompt, 2)
            for side in SIDES:  # connections, tokenizer download, first steps
                run_batch(addresses[side], warm, 2)
            for i in range(args.rounds):
                order = SIDES if i % 2 == 0 else SIDES[::-1]
                for side in order:
                    log(f"round {i + 1}/{args.rounds}: {side}")
                    streams, elapsed = run_batch(addresses[side], body, args.num_requests)
                    rounds[side].append(summarize(streams, elapsed, args.output_len))
    finally:
        stack.stop()
    return {"benchmark": "smg", "model": str(model_dir), "num_threads": threads,
            "num_requests": args.num_requests, "prompt_len": args.prompt_len,
            "output_len": args.output_len, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "rounds": rounds}


def summary_table(data: dict[str, Any]) -> str:
    rows = []
    keys = ("output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms")
    for side in SIDES:
        rounds = data["rounds"][side]
        for i, r in enumerate(rounds):
            rows.append([side, str(i + 1), f"{r['num_ok']}/{r['num_ok'] + r['num_failed']}",
                         str(r["prompt_tokens"]), *_cells([r[k] for k in keys])])
        if len(rounds) > 1:
            rows.append([side, "median", "", "",
                         *_cells([statistics.median(r[k] for r in rounds) for k in keys])])
    return format_table(["front", "round", "ok", "prompt tok", "output tok/s", "TTFT p50 ms", "TTFT p99 ms",
                         "ITL p50 ms"], rows)


def _cells(values: list[float]) -> list[str]:
    tok_s, ttft_p50, ttft_p99, itl_p50 = values
    return [f"{tok_s:.1f}", f"{ttft_p50:.1f}", f"{ttft_p99:.1f}", f"{itl_p50:.2f}"]


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag, value in (("--num-requests", args.num_requests), ("--prompt-len", args.prompt_len),
                        ("--output-len", args.output_len), ("--rounds", args.rounds),
                        ("--num-threads", 1 if args.num_threads is None else args.num_threads)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    data = run(args)
    write_json(args.output_json, data)
    print(summary_table(data))


if __name__ == "__main__":
    main()
