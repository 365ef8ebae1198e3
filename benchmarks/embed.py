"""Embeddings (runner="pooling") beside HF transformers and llama.cpp's llama-embedding, on the
same weights and precision, in one run.

    python -m benchmarks.embed [--model smollm2] [--threads 2] [--prompts 128] [--repeats 3]
        [--llama-cpp DIR] [--bench-dir DIR] [--out results.json]

The workload: --prompts sentences of 8 to 48 words (seeded), each embedded as vLLM pools a
decoder model (the last token's final-norm hidden state, L2-normalised), all handed over at once.
Rows (prompt tokens/s and embeddings/s, median of --repeats after a warm-up):
  Strand Q4_1          the GGUF file's blocks read packed (quantization="gguf");
  llama.cpp Q4_1       llama-embedding --pooling last on the same file;
  Strand float32       the same weights dequantized (the HF directory cpu_peers_setup made);
  HF float32           transformers' AutoModel on that directory, batches of 16 padded on the
                       right, each pooled at its last real token;
  llama.cpp F32        llama-embedding on the F32 GGUF of that directory.
Strand runs without its prefix cache (every repeat embeds the same texts; the peers recompute
them). llama.cpp's time is from its log's first batch_decode line to its exit (the load before
it is left out); it tokenizes the text itself; its prompts go in batches of up to 1024 tokens
(-c/-b/-ub 1024: the fastest of 256, 512, 1024, 2048 and its 8192 default on 128 prompts of the
Q4_1 file, on an AVX2-only CPU). Checks printed with the rates: the largest difference
between Strand's and HF's float32 embeddings, and the smallest cosine between Strand's and
llama.cpp's (same file, another rounding). The float32 rows also get their share of the
machine's bound (benchmarks/roofline.py: the prompt's linear and attention FLOPs at the measured
float32 GEMM rate; the LM head, which pooling skips, is counted for one token a prompt).
"""

from __future__ import annotations

import argparse
import math
import random
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import format_table, log, write_json

WORDS = ("the", "river", "engine", "quietly", "carried", "seven", "lanterns", "across", "a",
         "frozen", "market", "while", "old", "machines", "hummed", "about", "distant", "tides",
         "and", "every", "window", "held", "one", "small", "light", "for", "travellers", "who",
         "never", "arrived", "before", "dawn", "under", "copper", "bridges", "paper", "birds")
_BATCH_LINE = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) I batch_decode", re.MULTILINE)


def sentences(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 48))).capitalize() + "."
            for _ in range(count)]


def strand_run(model: str, quantization: str | None, texts: list[str], threads: int,
               repeats: int) -> tuple[list[float], list[list[float]], int]:
    """(seconds per run, embeddings, prompt tokens) of LLM.embed over every text at once."""
    import torch

    from strand.engine_core import LLM

    torch.set_num_threads(threads)
    # No prefix cache: every repeat embeds the same texts, and a cached prompt would skip most
    # of its forward, which the peers recompute.
    llm = LLM(model, runner="pooling", dtype="float32", device="cpu",
              quantization=quantization, max_num_seqs=256, max_num_batched_tokens=2048,
              enable_prefix_caching=False)
    llm.embed(texts[:8], use_tqdm=False)  # warm-up
    times: list[float] = []
    outputs: list[Any] = []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = llm.embed(texts, use_tqdm=False)
        times.append(time.perf_counter() - start)
    return (times, [o.outputs.embedding for o in outputs],
            sum(len(o.prompt_token_ids) for o in outputs))


def hf_run(model_dir: Path, texts: list[str], threads: int, repeats: int,
           batch: int = 16) -> tuple[list[float], list[list[float]]]:
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()

    def embed_all() -> list[list[float]]:
        result: list[list[float]] = []
        for i in range(0, len(texts), batch):
            enc = tokenizer(texts[i:i + batch], return_tensors="pt", padding=True)
            with torch.inference_mode():
                hidden = model(**enc).last_hidden_state
            last = enc["attention_mask"].sum(dim=1) - 1
            pooled = hidden[torch.arange(hidden.shape[0]), last]
            result += torch.nn.functional.normalize(pooled, dim=-1).tolist()
        return result

    embed_all()  # warm-up
    times, vectors = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        vectors = embed_all()
        times.append(time.perf_counter() - start)
    return times, vectors


def llama_run(bin_dir: Path, gguf: Path, texts: list[str], threads: int,
              repeats: int) -> tuple[list[float], list[list[float]]]:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(texts))
        prompts = f.name
    cmd = [str(bin_dir / "llama-embedding"), "-m", str(gguf), "-f", prompts, "--pooling",
           "last", "--embd-normalize", "2", "--embd-output-format", "raw", "-t", str(threads),
           "-c", "1024", "-b", "1024", "-ub", "1024"]
    times: list[float] = []
    vectors: list[list[float]] = []
    for _ in range(repeats + 1):  # the first warms the page cache
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - start
        first = _BATCH_LINE.search(done.stderr)
        if done.returncode != 0 or first is None:
            raise RuntimeError(f"llama-embedding failed ({done.returncode}): "
                               f"{done.stderr[-2000:]}")
        # llama.cpp's log stamps: minutes.seconds.milliseconds.microseconds since its start.
        minutes, seconds, millis, micros = (int(g) for g in first.groups())
        logged = minutes * 60 + seconds + millis / 1e3 + micros / 1e6
        times.append(wall - logged)
        vectors = [[float(x) for x in line.split()] for line in done.stdout.splitlines()
                   if line.strip()]
    return times[1:], vectors


def add_bound_shares(rows: dict[str, dict[str, Any]], labels: tuple[str, ...], hf_dir: Path,
                     num_tokens: int, num_prompts: int, gemm_size: int) -> None:
    """Each float32 row's share of the machine's bound (benchmarks/roofline.py): num_prompts
    prompts of num_tokens in all, their FLOPs at the measured float32 GEMM rate."""
    import json

    from benchmarks.datasets import SampleRequest
    from benchmarks.roofline import ModelShape, fractions, measure_machine, workload_bound

    shape = ModelShape.from_config(json.loads((hf_dir / "config.json").read_text()))
    rates = measure_machine(gemm_size, 256 * 1024**2, "float32")
    requests = [SampleRequest([0] * (num_tokens // num_prompts), 1) for _ in range(num_prompts)]
    bound = workload_bound(rates, shape, requests, num_prompts)
    for label in labels:
        if label in rows:
            rows[label].update(fractions(bound, rows[label]["seconds"]))


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for u, v in zip(a, b, strict=True) for x, y in zip(u, v, strict=True))


def _min_cosine(a: list[list[float]], b: list[list[float]]) -> float:
    def cos(u: list[float], v: list[float]) -> float:
        dot = sum(x * y for x, y in zip(u, v, strict=True))
        return dot / math.sqrt(sum(x * x for x in u) * sum(y * y for y in v))
    return min(cos(u, v) for u, v in zip(a, b, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="a .gguf file, or smollm2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--llama-cpp", type=Path, default=None,
                        help="llama.cpp's bin directory (llama-embedding)")
    parser.add_argument("--bench-dir", type=Path, default=Path.home() / ".cache/strand/bench",
                        help="where benchmarks.cpu_peers_setup put the float32 HF directory and "
                             "F32 GGUF")
    parser.add_argument("--gemm-size", type=int, default=2048,
                        help="the float32 GEMM that measures the machine's bound (size^3)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from strand.engine_core.model_hub import pull

    gguf = pull(args.model) if not args.model.endswith(".gguf") else Path(args.model)
    hf_dir, f32_gguf = args.bench_dir / "smollm2-135m-f32-hf", args.bench_dir / "smollm2-135m-f32.gguf"
    texts = sentences(args.prompts)
    rows: dict[str, dict[str, Any]] = {}
    vectors: dict[str, list[list[float]]] = {}

    def record(label: str, times: list[float], embeddings: list[list[float]]) -> None:
        seconds = statistics.median(times)
        rows[label] = {"seconds": seconds, "samples": times,
                       "prompt_tok_s": num_tokens / seconds, "embeddings_s": len(texts) / seconds}
        vectors[label] = embeddings
        log(f"{label}: {num_tokens / seconds:.0f} prompt tok/s, {len(texts) / seconds:.1f} "
            f"embeddings/s")

    times, embeddings, num_tokens = strand_run(str(gguf), "gguf", texts, args.threads,
                                               args.repeats)
    record("Strand Q4_1", times, embeddings)
    if args.llama_cpp is not None:
        record("llama.cpp Q4_1", *llama_run(args.llama_cpp, gguf, texts, args.threads,
                                            args.repeats))
    if hf_dir.is_dir():
        times, embeddings, _ = strand_run(str(hf_dir), None, texts, args.threads, args.repeats)
        record("Strand float32", times, embeddings)
        record("HF float32", *hf_run(hf_dir, texts, args.threads, args.repeats))
        if args.llama_cpp is not None and f32_gguf.is_file():
            record("llama.cpp F32", *llama_run(args.llama_cpp, f32_gguf, texts, args.threads,
                                               args.repeats))
        add_bound_shares(rows, ("Strand float32", "HF float32", "llama.cpp F32"), hf_dir,
                         num_tokens, len(texts), args.gemm_size)

    print(format_table(["row", "prompt tok/s", "embeddings/s", "of the f32 bound"],
                       [[label, f"{r['prompt_tok_s']:.0f}", f"{r['embeddings_s']:.1f}",
                         f"{r['fraction_of_bound']:.2f}" if "fraction_of_bound" in r else "-"]
                        for label, r in rows.items()]))
    checks: dict[str, float] = {}
    for ours, peer in (("Strand Q4_1", "llama.cpp Q4_1"), ("Strand float32", "HF float32"),
                       ("Strand float32", "llama.cpp F32")):
        if ours in rows and peer in rows:
            ratio = rows[ours]["prompt_tok_s"] / rows[peer]["prompt_tok_s"]
            checks[f"{ours} / {peer}"] = ratio
            print(f"{ours} / {peer}: {ratio:.2f}x; smallest cosine "
                  f"{_min_cosine(vectors[ours], vectors[peer]):.5f}, largest difference "
                  f"{_max_diff(vectors[ours], vectors[peer]):.2e}")
    write_json(args.out, {"args": {k: str(v) for k, v in vars(args).items()},
                          "prompt_tokens": num_tokens, "rows": rows, "ratios": checks})


if __name__ == "__main__":
    main()
