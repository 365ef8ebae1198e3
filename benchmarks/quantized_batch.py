"""A batch of requests over a GGUF model with its weights kept packed, against llama.cpp's
llama-batched-bench on the same file, in one run.

    python -m benchmarks.quantized_batch [--model smollm2|FILE.gguf] [--requests 32]
        [--prompt 128] [--tokens 64] [--threads 2] [--repeats 3] [--llama-cpp DIR]
        [--kv-cache-dtype auto|bfloat16] [--isa native|avx2] [--out results.json]

The workload is llama-batched-bench's (-npp PROMPT -ntg TOKENS -npl REQUESTS): REQUESTS
requests of PROMPT random tokens each, all added at once, each decoding TOKENS greedy tokens.
Strand runs them in one LLMEngine (EngineArgs quantization="gguf", max_num_seqs=REQUESTS, its
default chunked prefill of 2048 tokens a step, a KV cache that holds every request at once as
llama-batched-bench's -c does), add_request for all then step() until done, as vLLM's
LLM.generate does. Three figures each, medians of --repeats after a warm-up:
  total    (prompt + output tokens) / wall time: llama-batched-bench's S t/s
  prefill  prompt tokens / time until every request has its first token (llama.cpp: S_PP)
  decode   output tokens after that / the time after it (llama.cpp: S_TG, all its
           REQUESTS x TOKENS over its T_TG)
With --llama-cpp the two take turns: one llama-batched-bench run after each of Strand's timed
rounds, so that each pair meets the machine at the same moment (on a shared machine the memory
speed can drift from one minute to the next); a "turn by turn" row gives the median and range
of Strand's rate over llama.cpp's within each turn, beside the ratio of the medians.
The bounds are what the linear layers' multiply-adds take at this machine's best int8 GEMM
rate (torch._int_mm, oneDNN's VNNI kernel where the CPU has it, at the same thread count):
a decode step also reads every weight once, so its bound is the larger of that and the weights'
bytes at the measured copy rate. Attention and everything outside the linear layers are left
out, so the bounds are optimistic (above any achievable rate). llama.cpp keeps its KV cache in
float16, Strand in the model's dtype (float32 here) unless --kv-cache-dtype bfloat16: 16 bits a
value as llama.cpp's (the decode step's attention reads half the bytes). --isa avx2 measures an AVX2-only
CPU on a wider one (benchmarks/isa_emulation.py; --llama-cpp must then be a build without
AVX-512).
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import isa_emulation
from benchmarks.common import blocks_holding, format_table, log, write_json
from benchmarks.quantized import bandwidth_bound, turn_ratios, weight_bytes_per_token
from strand.engine_core.outputs import RequestOutput

RATES = ("total_tok_s", "prefill_tok_s", "decode_tok_s")


def linear_macs(model: Any) -> tuple[int, int]:
    """(multiply-adds of the decoder layers' linears per token, of the lm_head per token)."""
    from strand.engine_core.model_executor.layers.gguf_embedding import GGUFEmbedding
    from strand.engine_core.model_executor.layers.gguf_linear import GGUFLinear
    from strand.engine_core.model_executor.layers.linear import Linear

    # A GGUF embedding's table is looked up, not multiplied (where tied, it is the lm_head).
    tables = {id(m.table) for m in model.modules() if isinstance(m, GGUFEmbedding)}
    layers = head = 0
    for module in model.modules():
        if module is model.lm_head:
            head += module.in_features * module.out_features
        elif isinstance(module, GGUFLinear | Linear) and id(module) not in tables:
            layers += module.in_features * module.out_features
    return layers, head


def int8_gemm_rate(threads: int, size: int = 2048, repeats: int = 3) -> float:
    """Best int8 multiply-adds a second of a [size, size] x [size, size] product (torch._int_mm:
    oneDNN's int8 GEMM) at `threads` threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randint(-128, 128, (size, size), dtype=torch.int8, generator=g)
        b = torch.randint(-128, 128, (size, size), dtype=torch.int8, generator=g)
        torch._int_mm(a, b)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch._int_mm(a, b)
            best = min(best, time.perf_counter() - start)
        return size**3 / best
    finally:
        torch.set_num_threads(before)


def measure_strand(path: str, args: argparse.Namespace,
                   between: Callable[[], None] | None = None) -> dict[str, Any]:
    """Strand's rounds: a warm-up, then --repeats timed ones, `between` called after each
    timed one (the peer's turn)."""
    from strand.engine_core import EngineArgs, LLMEngine, SamplingParams

    n, p, t = args.requests, args.prompt, args.tokens
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=path, dtype="float32", quantization="gguf", cpu_threads=args.threads,
        max_model_len=p + t + 8, enable_prefix_caching=False, max_num_seqs=n,
        num_gpu_blocks_override=blocks_holding([p + t] * n), kv_cache_dtype=args.kv_cache_dtype))
    vocab = engine.engine_core.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=t, ignore_eos=True)
    runs: list[dict[str, float]] = []
    for rep in range(args.repeats + 1):  # the first is the warm-up
        rng = random.Random(rep)
        for i in range(n):
            engine.add_request(f"r{rep}-{i}", {"prompt_token_ids": [
                rng.randrange(100, vocab - 1) for _ in range(p)]}, params)
        seen: dict[str, int] = {}
        start, all_first, tokens_then = time.perf_counter(), 0.0, 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                assert isinstance(out, RequestOutput)  # a generating engine's
                if out.outputs[0].token_ids:  # a request whose prompt is in, its first token out
                    seen[out.request_id] = len(out.outputs[0].token_ids)
            if not all_first and len(seen) == n:
                all_first, tokens_then = time.perf_counter(), sum(seen.values())
        end = time.perf_counter()
        if rep:
            runs.append({"total_tok_s": n * (p + t) / (end - start),
                         "prefill_tok_s": n * p / (all_first - start),
                         "decode_tok_s": (n * t - tokens_then) / (end - all_first)})
        log(f"  Strand round {rep}: {n * t / (end - start):.0f} output tok/s")
        if rep and between is not None:
            between()
    model = engine.engine_core.runner.model
    result = _medians(runs)
    result["macs"] = linear_macs(model)
    result["weight_bytes"] = weight_bytes_per_token(model)
    del engine
    return result


def parse_batched_row(text: str) -> dict[str, float]:
    """llama-batched-bench's result row (|PP|TG|B|N_KV|T_PP s|S_PP t/s|T_TG s|S_TG t/s|T s|S t/s|)
    as this benchmark's three rates."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[0].isdigit():
            return {"prefill_tok_s": float(cells[5]), "decode_tok_s": float(cells[7]),
                    "total_tok_s": float(cells[9])}
    raise ValueError("no result row in llama-batched-bench's output")


def llama_turn(bin_dir: Path, path: str, args: argparse.Namespace,
               runs: list[dict[str, float]]) -> None:
    """One llama-batched-bench run of the same workload on the same file, added to `runs`."""
    n, p, t = args.requests, args.prompt, args.tokens
    cmd = [str(bin_dir / "llama-batched-bench"), "-m", path, "-t", str(args.threads),
           "-npp", str(p), "-ntg", str(t), "-npl", str(n), "-c", str(n * (p + t) + 64)]
    run = subprocess.run(cmd, capture_output=True, text=True, check=True)
    runs.append(parse_batched_row(run.stdout + run.stderr))
    log(f"  llama.cpp round {len(runs)}: {runs[-1]['decode_tok_s']:.0f} decode tok/s")


def _medians(runs: list[dict[str, float]]) -> dict[str, Any]:
    return {**{k: statistics.median(r[k] for r in runs) for k in runs[0]}, "runs": runs}


def bounds(strand: dict[str, Any], args: argparse.Namespace) -> dict[str, float]:
    """Tokens a second the linears allow: prefill (prompt rows through the layers, one lm_head
    row a request), decode (a step of every request) and the whole workload."""
    layers, head = strand["macs"]
    n, p, t = args.requests, args.prompt, args.tokens
    rate, copy = int8_gemm_rate(args.threads, args.gemm_size), bandwidth_bound(args.threads)
    prefill_s = (n * p * layers + n * head) / rate
    step_s = max(n * (layers + head) / rate, strand["weight_bytes"] / copy)
    decode_s = (t - 1) * step_s
    return {"int8_macs_s": rate, "copy_bytes_s": copy, "prefill_tok_s": n * p / prefill_s,
            "decode_tok_s": n / step_s, "total_tok_s": n * (p + t) / (prefill_s + decode_s)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="a .gguf file or a short name")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens a request")
    parser.add_argument("--tokens", type=int, default=64, help="output tokens a request")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--llama-cpp", type=Path, default=None,
                        help="directory holding llama-batched-bench: llama.cpp on the same file")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "bfloat16"],
                        help="Strand's KV cache: the model's dtype, or 16 bits as llama.cpp's")
    parser.add_argument("--isa", default="native", choices=list(isa_emulation.ISAS),
                        help="avx2: every library capped at AVX2 (benchmarks/isa_emulation.py)")
    parser.add_argument("--gemm-size", type=int, default=2048,
                        help="the int8 GEMM that measures the bound (size^3; on a CPU without "
                             "VNNI one 2048^3 product takes ~27 s on a thread)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    isa_emulation.run_capped(args.isa, "benchmarks.quantized_batch", argv)
    for name in ("requests", "prompt", "tokens", "threads", "repeats", "gemm_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.tokens < 2:
        parser.error("--tokens must be >= 2 (the decode rate is of the tokens after the first)")
    if args.llama_cpp is not None:
        if not (args.llama_cpp / "llama-batched-bench").is_file():
            parser.error(f"--llama-cpp must be a directory holding llama-batched-bench, got "
                         f"{args.llama_cpp}")
        isa_emulation.check_llama_cpp(args.llama_cpp, args.isa)
    from strand.engine_core.default_model import gguf_file

    source = gguf_file(args.model)
    if source is None:
        parser.error(f"--model must name a .gguf file, got {args.model!r}")
    log(f"Strand, {args.requests} requests of {args.prompt} + {args.tokens} tokens, "
        f"{args.threads} threads, KV cache {args.kv_cache_dtype}: {Path(source).name}")
    peer: list[dict[str, float]] = []
    turn = None
    if args.llama_cpp is not None:
        log("  taking turns with llama.cpp's llama-batched-bench on the same file")
        turn = functools.partial(llama_turn, args.llama_cpp, source, args, peer)
    results: dict[str, Any] = {"strand": measure_strand(source, args, turn)}
    if peer:
        results["llama.cpp"] = _medians(peer)
    log("the bounds: int8 GEMM and copy rates")
    bound = bounds(results["strand"], args)
    rows = []
    for name, r in results.items():
        row = [name]
        for key in RATES:
            row.append(f"{r[key]:.0f} ({r[key] / bound[key]:.0%})")
        rows.append(row)
    if "llama.cpp" in results:
        s, lc = results["strand"], results["llama.cpp"]
        rows.append(["Strand / llama.cpp"] + [f"{s[k] / lc[k]:.2f}x" for k in RATES])
        turns = {k: turn_ratios([r[k] for r in s["runs"]], [r[k] for r in lc["runs"]])
                 for k in RATES}
        s["turn_ratios"] = turns
        rows.append(["turn by turn"] + [
            f"{statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})" for r in turns.values()])
    rows.append(["bound (linears only)"] + [f"{bound[k]:.0f}" for k in RATES])
    print(format_table(["", "total tok/s (of bound)", "prefill tok/s", "decode tok/s"], rows))
    print(f"\nint8 GEMM {bound['int8_macs_s'] / 1e9:.0f} GMAC/s, copy "
          f"{bound['copy_bytes_s'] / 1e9:.1f} GB/s at {args.threads} threads")
    if args.isa != "native":
        print(f"Strand, torch, oneDNN and MKL restricted to {args.isa} "
              f"(benchmarks/isa_emulation.py); ran at {isa_emulation.observed()}")
    write_json(args.out, {"benchmark": "quantized_batch", "model": source,
                          "requests": args.requests, "prompt": args.prompt,
                          "tokens": args.tokens, "threads": args.threads, "isa": args.isa,
                          "kv_cache_dtype": args.kv_cache_dtype,
                          "results": results, "bounds": bound})


if __name__ == "__main__":
    main()
