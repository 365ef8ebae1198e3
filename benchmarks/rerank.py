"""Reranking (LLM.score on a yes/no reranker) beside HF transformers, on the same weights and
precision, in one run.

    python -m benchmarks.rerank [--model smollm2] [--threads 2] [--queries 8] [--docs 16]
        [--repeats 3] [--tokens no yes] [--served] [--bench-dir DIR] [--out results.json]

The model: the real SmolLM2 read as a causal reranker the way vLLM serves Qwen3-Reranker
(hf_overrides: LlamaForSequenceClassification from the LM head's "no" and "yes" rows,
from_2_way_softmax), so a pair's score is softmax([no, yes])[yes] at its last token. The
workload: --queries questions against --docs documents each (seeded sentences of 8 to 48
words), every (query, document) pair one prompt, all handed over at once; each repeat asks new
queries, so nothing a repeat computed is cached for the next. Rows (pairs/s and prompt
tokens/s, median of --repeats after a warm-up):
  Strand Q4_1            the GGUF file's blocks read packed (quantization="gguf"), no prefix
                         cache;
  Strand float32         the same weights dequantized (cpu_peers_setup's HF directory), no
                         prefix cache: the forward HF computes;
  Strand float32 cached  the same with the prefix cache on: a query's pairs share its blocks
                         (what a server gains; HF has no such cache);
  HF float32             transformers' causal LM on that directory, pairs in batches of 16
                         padded on the left, the model card's yes/no logits at the last token;
  Strand float32 served  (--served) the float32 row through a real stack (tokenizer, engine,
                         detokenizer, gateway, OpenAI front, auto-stepping, no prefix cache):
                         one /rerank request a query, all of a round's at once.
Checks printed with the rates: the largest score difference between Strand's and HF's float32
rows, and between Strand's Q4_1 and float32. The uncached float32 rows also get their share of
the machine's bound (benchmarks/roofline.py, as benchmarks/embed.py counts it; the cached row
computes fewer tokens than the bound counts). llama.cpp reranks
only files converted with a rank head (Qwen3-Reranker, BERT cross-encoders), which this model
has not; benchmarks/embed.py times llama-embedding on the same file, the same forward.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.common import format_table, log, write_json
from benchmarks.embed import add_bound_shares, sentences


def reranker(tokens: list[str]) -> dict[str, Any]:
    """hf_overrides reading a causal Llama as a yes/no reranker on these [no, yes] tokens."""
    return {"architectures": ["LlamaForSequenceClassification"],
            "classifier_from_token": tokens, "method": "from_2_way_softmax"}


def workload(queries: int, docs: int, round_index: int) -> list[tuple[str, str]]:
    """Every (query, document) pair of one round; each round has its own queries."""
    asked = sentences(queries, seed=1000 + round_index)
    documents = sentences(docs, seed=0)
    return [(f"Question: {q}", f" Document: {d}") for q in asked for d in documents]


def strand_run(model: str, quantization: str | None, prefix_cache: bool,
               rounds: list[list[tuple[str, str]]], threads: int, tokens: list[str]
               ) -> tuple[list[float], list[float], int]:
    """(seconds per round after the first, the last round's scores, its prompt tokens)."""
    import torch

    from strand.engine_core import LLM

    torch.set_num_threads(threads)
    llm = LLM(model, runner="pooling", dtype="float32", device="cpu", hf_overrides=reranker(tokens),
              quantization=quantization, max_num_seqs=256, max_num_batched_tokens=2048,
              enable_prefix_caching=prefix_cache)
    times: list[float] = []
    outputs: list[Any] = []
    for pairs in rounds:  # the first is the warm-up
        start = time.perf_counter()
        outputs = llm.score([q for q, _ in pairs], [d for _, d in pairs], use_tqdm=False)
        times.append(time.perf_counter() - start)
    return (times[1:], [o.outputs.score for o in outputs],
            sum(len(o.prompt_token_ids) for o in outputs))


def served_run(model_dir: Path, rounds: list[list[tuple[str, str]]], threads: int,
               tokens: list[str]) -> tuple[list[float], list[float]]:
    """The Strand float32 row through the stack's /rerank, a request a query, all at once; the
    scores in pair order."""
    from concurrent.futures import ThreadPoolExecutor

    from benchmarks.strand_backends import StrandSettings, bench_log_dir, stage_threads
    from strand.services.launch import StackConfig, launch_stack

    settings = StrandSettings(enable_prefix_caching=False)
    flags = [*settings.engine_flags(), "--runner", "pooling",
             "--hf-overrides", json.dumps(reranker(tokens))]
    with stage_threads(threads):
        stack = launch_stack(StackConfig(model=str(model_dir), engine_args=flags,
                                         gateway_args=["--auto-step"], openai_port=0,
                                         log_dir=bench_log_dir()))
    url = f"http://{stack.address('openai')}/rerank"

    def rerank(query: str, documents: list[str]) -> list[float]:
        body = json.dumps({"query": query, "documents": documents}).encode()
        request = urllib.request.Request(url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as resp:
            results = json.loads(resp.read())["results"]
        by_index = {r["index"]: r["relevance_score"] for r in results}
        return [by_index[i] for i in range(len(documents))]

    times: list[float] = []
    scores: list[float] = []
    try:
        for pairs in rounds:
            queries = list(dict.fromkeys(q for q, _ in pairs))
            documents = [d for q, d in pairs if q == queries[0]]
            start = time.perf_counter()
            with ThreadPoolExecutor(len(queries)) as pool:
                answers = list(pool.map(rerank, queries, [documents] * len(queries)))
            times.append(time.perf_counter() - start)
            scores = [s for answer in answers for s in answer]
    finally:
        stack.stop()
    return times[1:], scores


def hf_run(model_dir: Path, rounds: list[list[tuple[str, str]]], threads: int,
           tokens: list[str], batch: int = 16) -> tuple[list[float], list[float]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    no, yes = (tokenizer.convert_tokens_to_ids(t) for t in tokens)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def score_all(pairs: list[tuple[str, str]]) -> list[float]:
        scores: list[float] = []
        for i in range(0, len(pairs), batch):
            part = pairs[i:i + batch]
            enc = tokenizer([q for q, _ in part], [d for _, d in part], padding=True,
                            return_tensors="pt")
            with torch.inference_mode():
                logits = model(**enc).logits[:, -1, [no, yes]]
            scores += logits.float().softmax(-1)[:, 1].tolist()
        return scores

    times: list[float] = []
    scores: list[float] = []
    for pairs in rounds:
        start = time.perf_counter()
        scores = score_all(pairs)
        times.append(time.perf_counter() - start)
    return times[1:], scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="a .gguf file, or smollm2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--queries", type=int, default=8)
    parser.add_argument("--docs", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", nargs=2, default=["no", "yes"],
                        help="the [no, yes] tokens whose LM head rows make the score")
    parser.add_argument("--served", action="store_true",
                        help="also the float32 row through a real stack's /rerank")
    parser.add_argument("--bench-dir", type=Path, default=Path.home() / ".cache/strand/bench",
                        help="where benchmarks.cpu_peers_setup put the float32 HF directory")
    parser.add_argument("--gemm-size", type=int, default=2048,
                        help="the float32 GEMM that measures the machine's bound (size^3)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from strand.engine_core.model_hub import pull

    gguf = pull(args.model) if not args.model.endswith(".gguf") else Path(args.model)
    hf_dir = args.bench_dir / "smollm2-135m-f32-hf"
    rounds = [workload(args.queries, args.docs, r) for r in range(args.repeats + 1)]
    num_pairs = len(rounds[-1])
    rows: dict[str, dict[str, Any]] = {}
    scores: dict[str, list[float]] = {}
    num_tokens = 0

    def record(label: str, times: list[float], got: list[float]) -> None:
        seconds = statistics.median(times)
        rows[label] = {"seconds": seconds, "samples": times, "pairs_s": num_pairs / seconds,
                       "prompt_tok_s": num_tokens / seconds}
        scores[label] = got
        log(f"{label}: {num_pairs / seconds:.1f} pairs/s, {num_tokens / seconds:.0f} prompt "
            f"tok/s")

    times, got, num_tokens = strand_run(str(gguf), "gguf", False, rounds, args.threads,
                                        args.tokens)
    record("Strand Q4_1", times, got)
    if hf_dir.is_dir():
        for label, cached in (("Strand float32", False), ("Strand float32 cached", True)):
            times, got, _ = strand_run(str(hf_dir), None, cached, rounds, args.threads,
                                       args.tokens)
            record(label, times, got)
        record("HF float32", *hf_run(hf_dir, rounds, args.threads, args.tokens))
        if args.served:
            record("Strand float32 served", *served_run(hf_dir, rounds, args.threads,
                                                        args.tokens))
        # Not the cached row: the bound counts every prompt token, and it computes fewer.
        add_bound_shares(rows, ("Strand float32", "HF float32"), hf_dir, num_tokens, num_pairs,
                         args.gemm_size)
    print(format_table(["row", "pairs/s", "prompt tok/s", "of the f32 bound"],
                       [[label, f"{r['pairs_s']:.1f}", f"{r['prompt_tok_s']:.0f}",
                         f"{r['fraction_of_bound']:.2f}" if "fraction_of_bound" in r else "-"]
                        for label, r in rows.items()]))
    checks: dict[str, float] = {}
    for ours, peer in (("Strand float32", "HF float32"), ("Strand float32 cached", "HF float32"),
                       ("Strand Q4_1", "Strand float32"),
                       ("Strand float32 served", "Strand float32")):
        if ours in rows and peer in rows:
            ratio = rows[ours]["pairs_s"] / rows[peer]["pairs_s"]
            checks[f"{ours} / {peer}"] = ratio
            diff = max(abs(a - b) for a, b in zip(scores[ours], scores[peer], strict=True))
            print(f"{ours} / {peer}: {ratio:.2f}x; largest score difference {diff:.2e}")
    write_json(args.out, {"args": {k: str(v) for k, v in vars(args).items()},
                          "pairs": num_pairs, "prompt_tokens": num_tokens, "rows": rows,
                          "ratios": checks})


if __name__ == "__main__":
    main()
