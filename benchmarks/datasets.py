"""Benchmark workloads as token ids: random lengths, and prompts that share a few prefixes.

Prompts are token ids, not text, so every backend (strand, HF static, HF continuous batching)
receives exactly the same input with no tokenizer in between.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

# The tiny tokenizer's <unk>, <s>, </s>: never inside a prompt, so no backend stops or skips early.
FIRST_ORDINARY_TOKEN = 3
# The standard workload: 64 prompts of 16-512 tokens (mean 264), 128 output tokens.
STANDARD_INPUT_LEN = 264
STANDARD_RANGE_RATIO = 248 / 264
STANDARD_OUTPUT_LEN = 128
STANDARD_NUM_PROMPTS = 64


@dataclass(slots=True)
class SampleRequest:
    prompt_token_ids: list[int]
    output_len: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


def length_bounds(length: int, range_ratio: float) -> tuple[int, int]:
    """vLLM's random dataset: lengths uniform in [length * (1 - r), length * (1 + r)]."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    low = max(1, round(length * (1.0 - range_ratio)))
    high = max(low, round(length * (1.0 + range_ratio)))
    return low, high


def random_dataset(num_prompts: int, input_len: int, output_len: int, vocab_size: int,
                   range_ratio: float = 0.0, output_range_ratio: float = 0.0,
                   seed: int = 0) -> list[SampleRequest]:
    _check_common(num_prompts, output_len, vocab_size)
    rng = random.Random(seed)
    in_low, in_high = length_bounds(input_len, range_ratio)
    out_low, out_high = length_bounds(output_len, output_range_ratio)
    return [SampleRequest(_random_tokens(rng, rng.randint(in_low, in_high), vocab_size),
                          rng.randint(out_low, out_high))
            for _ in range(num_prompts)]


def prefix_repetition_dataset(num_prompts: int, prefix_len: int, suffix_len: int,
                              num_prefixes: int, output_len: int, vocab_size: int,
                              seed: int = 0) -> list[SampleRequest]:
    """num_prefixes shared prefixes, each followed by a fresh suffix; shuffled so requests that
    share a prefix are not always neighbours (as vLLM's prefix_repetition dataset)."""
    _check_common(num_prompts, output_len, vocab_size)
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
    if suffix_len < 1:
        raise ValueError(f"suffix_len must be >= 1, got {suffix_len}")
    if not 1 <= num_prefixes <= num_prompts:
        raise ValueError(f"num_prefixes must be in [1, num_prompts={num_prompts}], "
                         f"got {num_prefixes}")
    rng = random.Random(seed)
    prefixes = [_random_tokens(rng, prefix_len, vocab_size) for _ in range(num_prefixes)]
    requests = [SampleRequest(prefixes[i % num_prefixes] + _random_tokens(rng, suffix_len,
                                                                          vocab_size),
                              output_len)
                for i in range(num_prompts)]
    rng.shuffle(requests)
    return requests


def add_dataset_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("dataset")
    group.add_argument("--dataset", choices=("random", "prefix-repetition"), default="random")
    group.add_argument("--num-prompts", type=int, default=STANDARD_NUM_PROMPTS)
    group.add_argument("--input-len", type=int, default=STANDARD_INPUT_LEN,
                       help="random: mean prompt length")
    group.add_argument("--range-ratio", type=float, default=STANDARD_RANGE_RATIO,
                       help="random: prompt lengths uniform in input_len * [1 - r, 1 + r] "
                            "(default: 16-512)")
    group.add_argument("--output-len", type=int, default=STANDARD_OUTPUT_LEN)
    group.add_argument("--output-range-ratio", type=float, default=0.0,
                       help="random: output lengths uniform in output_len * [1 - r, 1 + r]")
    group.add_argument("--prefix-len", type=int, default=256, help="prefix-repetition")
    group.add_argument("--suffix-len", type=int, default=64, help="prefix-repetition")
    group.add_argument("--num-prefixes", type=int, default=4, help="prefix-repetition")
    group.add_argument("--seed", type=int, default=0)


def dataset_from_args(args: argparse.Namespace, vocab_size: int) -> list[SampleRequest]:
    if args.dataset == "random":
        return random_dataset(args.num_prompts, args.input_len, args.output_len, vocab_size,
                              args.range_ratio, args.output_range_ratio, args.seed)
    return prefix_repetition_dataset(args.num_prompts, args.prefix_len, args.suffix_len,
                                     args.num_prefixes, args.output_len, vocab_size, args.seed)


def describe_dataset(args: argparse.Namespace, requests: list[SampleRequest]) -> dict[str, object]:
    prompt_lens = [r.prompt_len for r in requests]
    output_lens = [r.output_len for r in requests]
    info: dict[str, object] = {
        "name": args.dataset, "num_prompts": len(requests), "seed": args.seed,
        "prompt_len_min": min(prompt_lens), "prompt_len_max": max(prompt_lens),
        "prompt_len_mean": sum(prompt_lens) / len(prompt_lens),
        "output_len_min": min(output_lens), "output_len_max": max(output_lens),
        "total_prompt_tokens": sum(prompt_lens), "total_output_tokens": sum(output_lens),
    }
    if args.dataset == "random":
        info.update(input_len=args.input_len, range_ratio=args.range_ratio,
                    output_len=args.output_len, output_range_ratio=args.output_range_ratio)
    else:
        info.update(prefix_len=args.prefix_len, suffix_len=args.suffix_len,
                    num_prefixes=args.num_prefixes, output_len=args.output_len)
    return info


def _random_tokens(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    return [rng.randrange(FIRST_ORDINARY_TOKEN, vocab_size) for _ in range(n)]


def _check_common(num_prompts: int, output_len: int, vocab_size: int) -> None:
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    if output_len < 1:
        raise ValueError(f"output_len must be >= 1, got {output_len}")
    if vocab_size <= FIRST_ORDINARY_TOKEN:
        raise ValueError(f"vocab_size must be > {FIRST_ORDINARY_TOKEN}, got {vocab_size}")
