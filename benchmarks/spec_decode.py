"""Prompt-lookup speculative decoding (speculative_config method "ngram") at bs=1, beside
llama.cpp's llama-lookup on the same GGUF file, in one run.

    python -m benchmarks.spec_decode [--model smollm2|FILE.gguf] [--quantization gguf|none]
        [--threads 2] [--tokens 128] [--repeats 3] [--k 4] [--lookup-min 1] [--lookup-max 4]
        [--llama-cpp DIR] [--out results.json]

Workloads, each a chat prompt rendered with the model's template, answered greedily up to
--tokens or the end-of-text token:
  edit   a Python function to return renamed: much of the answer is in the prompt, the case
         prompt lookup is for (code edits, rewrites, extraction, RAG quotes); how much of it a
         model copies is the model's (SmolLM2-135M rewrites the body too);
  free   an open question: little of the answer is in the prompt, so drafts are mostly
         rejected and the rows spent verifying them are the method's cost.
Rows per workload: Strand one token a step; Strand with drafts (greedy, so the two outputs
must be equal: the run fails otherwise); and with --llama-cpp, llama-lookup (its n-gram cache
over the prompt and output, n 1..4, drafts of up to --k tokens) and the same binary with no
draft (--spec-draft-n-max 0) as its baseline. decode tok/s = (tokens - 1) / time after the
first token, median of --repeats after a warm-up, the runs with and without drafts alternated;
tokens/step = tokens / steps after the first (1 + accepted drafts per step). llama.cpp tokenizes
the rendered text itself and its int8 rounding may part from Strand's at a near-tie; its tok/s
is over the tokens it made.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.common import format_table, log, write_json

EDIT = '''Rename the function to merge_ranges. Answer with the whole function.

```python
def merge_intervals(intervals):
    """Merge overlapping intervals and return them sorted by start."""
    if not intervals:
        return []
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = [list(ordered[0])]
    for start, end in ordered[1:]:
        last = merged[-1]
        if start <= last[1]:
            last[1] = max(last[1], end)
        else:
            merged.append([start, end])
    return [tuple(pair) for pair in merged]
```'''
FREE = "Write a short story about a lighthouse keeper who finds a message in a bottle."
WORKLOADS = {"edit": EDIT, "free": FREE}


def _engine(model: str, quantization: str | None, threads: int,
            spec: dict[str, Any] | None) -> Any:
    import torch

    from strand.engine_core import EngineArgs, LLMEngine

    torch.set_num_threads(threads)
    return LLMEngine.from_engine_args(EngineArgs(
        model=model, dtype="float32", device="cpu", quantization=quantization,
        max_model_len=2048, speculative_config=spec))


def _decode(engine: Any, prompt: str, tokens: int) -> tuple[list[int], float, int]:
    """(token ids, seconds after the first token, steps after it) of one greedy request."""
    from strand.engine_core import SamplingParams

    engine.add_request("r", prompt, SamplingParams(temperature=0.0, max_tokens=tokens))
    first_at = None
    steps = 0
    out_ids: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            out_ids = list(out.outputs[0].token_ids)
        if first_at is None and out_ids:
            first_at = time.perf_counter()
        elif first_at is not None:
            steps += 1
    assert first_at is not None
    return out_ids, time.perf_counter() - first_at, steps


def strand_rows(args: argparse.Namespace, model: str, prompts: dict[str, str]
                ) -> dict[str, dict[str, Any]]:
    """Both engines loaded at once and their runs alternated, so a slow phase of a shared
    machine lands on both."""
    quantization = None if args.quantization == "none" else args.quantization
    spec = {"method": "ngram", "num_speculative_tokens": args.k,
            "prompt_lookup_min": args.lookup_min, "prompt_lookup_max": args.lookup_max}
    engines = {label: _engine(model, quantization, args.threads, s)
               for label, s in (("Strand", None), ("Strand + ngram", spec))}
    rows: dict[str, dict[str, Any]] = {}
    for name, prompt in prompts.items():
        rates: dict[str, list[float]] = {label: [] for label in engines}
        per_step: dict[str, list[float]] = {label: [] for label in engines}
        outputs: dict[str, list[int]] = {}
        for engine in engines.values():
            _decode(engine, prompt, 8)  # warm-up
        for _ in range(args.repeats):
            for label, engine in engines.items():
                ids, seconds, steps = _decode(engine, prompt, args.tokens)
                rates[label].append((len(ids) - 1) / seconds)
                per_step[label].append((len(ids) - 1) / max(steps, 1))
                outputs[label] = ids
        if outputs["Strand"] != outputs["Strand + ngram"]:
            raise AssertionError(f"{name}: greedy tokens with drafts differ from without")
        for label in engines:
            row = {"decode_tok_s": statistics.median(rates[label]),
                   "tokens_per_step": statistics.median(per_step[label]),
                   "samples": rates[label]}
            rows[f"{name}: {label}"] = row
            log(f"{name}: {label}: {row['decode_tok_s']:.1f} tok/s, "
                f"{row['tokens_per_step']:.2f} tokens/step")
    for engine in engines.values():
        engine.shutdown()
    return rows


_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACCEPT = re.compile(r"n_accept\s*=\s*(\d+)")


def llama_lookup(bin_dir: Path, gguf: Path, prompt: str, args: argparse.Namespace,
                 k: int) -> tuple[float, float]:
    """(decode tok/s, tokens per step) of one llama-lookup run; k = 0: no drafts."""
    cmd = [str(bin_dir / "llama-lookup"), "-m", str(gguf), "-p", prompt, "-n", str(args.tokens),
           "--temp", "0", "-t", str(args.threads), "-c", "2048", "--spec-draft-n-max", str(k)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    text = done.stdout + done.stderr
    decoded = _DECODED.search(text)
    accepted = _ACCEPT.search(text)
    if done.returncode != 0 or decoded is None or accepted is None:
        raise RuntimeError(f"llama-lookup failed ({done.returncode}): {text[-2000:]}")
    n, seconds = int(decoded.group(1)), float(decoded.group(2))
    steps = max(n - int(accepted.group(1)), 1)
    return n / seconds, n / steps


def llama_rows(args: argparse.Namespace, gguf: Path, prompts: dict[str, str]
               ) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for name, prompt in prompts.items():
        llama_lookup(args.llama_cpp, gguf, prompt, args, 0)  # warm-up (page cache)
        runs: dict[int, list[tuple[float, float]]] = {0: [], args.k: []}
        for _ in range(args.repeats):
            for k in runs:  # alternated, as Strand's
                runs[k].append(llama_lookup(args.llama_cpp, gguf, prompt, args, k))
        for k, results in runs.items():
            label = f"{name}: llama.cpp" + (" lookup" if k else "")
            rows[label] = {"decode_tok_s": statistics.median(r[0] for r in results),
                           "tokens_per_step": statistics.median(r[1] for r in results),
                           "samples": [r[0] for r in results]}
            log(f"{label}: {rows[label]['decode_tok_s']:.1f} tok/s, "
                f"{rows[label]['tokens_per_step']:.2f} tokens/step")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="a .gguf file, or smollm2")
    parser.add_argument("--quantization", default="gguf", choices=("gguf", "none"),
                        help="gguf: Strand reads the file's blocks as llama.cpp does")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=256, help="max_tokens (a reply may end "
                        "sooner, at its end-of-text token)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--lookup-min", type=int, default=1)
    parser.add_argument("--lookup-max", type=int, default=4)
    parser.add_argument("--llama-cpp", type=Path, default=None,
                        help="llama.cpp's bin directory (llama-lookup)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from strand.engine_core.model_hub import pull
    from strand.engine_core.processing.tokenizer import Tokenizer

    gguf = pull(args.model) if not args.model.endswith(".gguf") else Path(args.model)
    from strand.engine_core.default_model import resolve_model_dir

    tokenizer = Tokenizer.from_dir(resolve_model_dir(str(gguf)))
    prompts = {name: tokenizer.apply_chat_template([{"role": "user", "content": text}])
               for name, text in WORKLOADS.items()}
    rows = strand_rows(args, str(gguf), prompts)
    if args.llama_cpp is not None:
        rows.update(llama_rows(args, gguf, prompts))
    table = [[label, f"{r['decode_tok_s']:.1f}", f"{r['tokens_per_step']:.2f}"]
             for label, r in rows.items()]
    print(format_table(["row", "decode tok/s", "tokens/step"], table))
    for name in prompts:
        base, spec = rows[f"{name}: Strand"], rows[f"{name}: Strand + ngram"]
        line = f"{name}: drafts speed Strand up {spec['decode_tok_s'] / base['decode_tok_s']:.2f}x"
        peer = rows.get(f"{name}: llama.cpp lookup")
        if peer is not None:
            line += (f"; Strand + ngram / llama.cpp lookup "
                     f"{spec['decode_tok_s'] / peer['decode_tok_s']:.2f}x, Strand / llama.cpp "
                     f"{base['decode_tok_s'] / rows[f'{name}: llama.cpp']['decode_tok_s']:.2f}x")
        print(line)
    write_json(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows})


if __name__ == "__main__":
    main()
