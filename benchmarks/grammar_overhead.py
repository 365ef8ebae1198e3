"""Structured-output overhead: grammar compile time, and microseconds per step that a batch of
constrained rows adds to sampling (fill the bitmask, apply it, advance each matcher).

No model: logits are random, so the grammar does the choosing, as on the tiny test model. Each
row restarts its matcher when its grammar ends, so every step has the full batch constrained.

    python -m benchmarks.grammar_overhead [--model HF_DIR] [--batch-sizes 1 8 32] [--steps 200]

Without --model the tiny test tokenizer (512 tokens) is used; a real vocabulary (SmolLM2's
49152, `strand pull smollm2` caches its HF directory under ~/.cache/strand/gguf/) shows what
a real engine pays.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.structured_output.bitmask import apply_grammar_mask, build_grammar_mask
from strand.engine_core.structured_output.grammar import GrammarCache, tokenizer_info
from strand.engine_core.structured_output.params import StructuredOutputsParams

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4}},
    "required": ["name", "age", "tags"],
}
CONSTRAINTS = {
    "json": StructuredOutputsParams(json=SCHEMA),
    "regex": StructuredOutputsParams(regex=r"[a-z]{1,8}(-[0-9]{1,4}){1,3}"),
    "choice": StructuredOutputsParams(choice=["positive", "negative", "neutral"]),
}


def _tokenizer(model: str | None) -> Tokenizer:
    if model is not None:
        return Tokenizer.from_dir(model)
    from strand.testing.tiny_tokenizer import write_tiny_tokenizer

    out = Path(tempfile.mkdtemp(prefix="grammar-bench-"))
    write_tiny_tokenizer(out, 512)
    return Tokenizer.from_dir(out)


def compile_ms(tokenizer: Tokenizer, vocab_size: int) -> dict[str, tuple[float, float]]:
    """Per kind: (first compile, cached) in milliseconds, on a fresh cache."""
    cache = GrammarCache(tokenizer_info(tokenizer, vocab_size, tokenizer.eos_token_id))
    result = {}
    for kind, params in CONSTRAINTS.items():
        t0 = time.perf_counter()
        cache.compile(params)
        t1 = time.perf_counter()
        cache.compile(params)
        t2 = time.perf_counter()
        result[kind] = ((t1 - t0) * 1e3, (t2 - t1) * 1e3)
    return result


def step_us(tokenizer: Tokenizer, vocab_size: int, kind: str, batch: int, steps: int) -> float:
    """Mean microseconds per step of mask + apply + accept for `batch` constrained rows."""
    eos = tokenizer.eos_token_id
    cache = GrammarCache(tokenizer_info(tokenizer, vocab_size, eos))
    matchers = [cache.new_matcher(CONSTRAINTS[kind], eos) for _ in range(batch)]
    eos_ids = [eos] * batch
    generator = torch.Generator().manual_seed(0)
    total = 0.0
    for _ in range(steps):
        logits = torch.randn(batch, vocab_size, generator=generator)  # outside the timing
        t0 = time.perf_counter()
        mask = build_grammar_mask(list(matchers), eos_ids, vocab_size)
        assert mask is not None
        tokens = apply_grammar_mask(logits, mask).argmax(dim=-1).tolist()
        for matcher, token in zip(matchers, tokens, strict=True):
            matcher.accept_token(token)
        total += time.perf_counter() - t0
        for matcher in matchers:
            if matcher.is_terminated():
                matcher.reset()
    return total / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="HF directory with tokenizer.json")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    tokenizer = _tokenizer(args.model)
    vocab_size = tokenizer.vocab_size
    print(f"vocab {vocab_size} ({args.model or 'tiny test tokenizer'})")
    print("| constraint | compile ms | cached ms |")
    print("|---|---|---|")
    for kind, (first, cached) in compile_ms(tokenizer, vocab_size).items():
        print(f"| {kind} | {first:.1f} | {cached:.3f} |")
    print("| constraint | batch | us/step | us/row |")
    print("|---|---|---|---|")
    for kind in CONSTRAINTS:
        for batch in args.batch_sizes:
            us = step_us(tokenizer, vocab_size, kind, batch, args.steps)
            print(f"| {kind} | {batch} | {us:.0f} | {us / batch:.0f} |")


if __name__ == "__main__":
    main()
