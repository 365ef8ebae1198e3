from __future__ import annotations

import pytest

from benchmarks.datasets import (
    FIRST_ORDINARY_TOKEN,
    STANDARD_INPUT_LEN,
    STANDARD_RANGE_RATIO,
    length_bounds,
    prefix_repetition_dataset,
    random_dataset,
)


def test_standard_range_is_16_to_512_tokens() -> None:
    assert length_bounds(STANDARD_INPUT_LEN, STANDARD_RANGE_RATIO) == (16, 512)


def test_random_prompts_stay_within_the_length_bounds() -> None:
    requests = random_dataset(200, 100, 10, vocab_size=1000, range_ratio=0.5, seed=1)
    lengths = [r.prompt_len for r in requests]
    assert min(lengths) >= 50 and max(lengths) <= 150
    assert len(set(lengths)) > 20  # lengths really vary


def test_random_output_len_is_fixed_without_an_output_range() -> None:
    requests = random_dataset(20, 100, 128, vocab_size=1000, range_ratio=0.5)
    assert {r.output_len for r in requests} == {128}


def test_prompts_avoid_special_tokens_and_stay_in_vocab() -> None:
    requests = random_dataset(50, 64, 4, vocab_size=40, seed=3)
    tokens = {t for r in requests for t in r.prompt_token_ids}
    assert min(tokens) == FIRST_ORDINARY_TOKEN and max(tokens) == 39


def test_same_seed_gives_the_same_workload() -> None:
    a = random_dataset(8, 32, 4, vocab_size=500, range_ratio=0.3, seed=7)
    b = random_dataset(8, 32, 4, vocab_size=500, range_ratio=0.3, seed=7)
    assert [r.prompt_token_ids for r in a] == [r.prompt_token_ids for r in b]


def test_prefix_repetition_shares_exactly_num_prefixes_prefixes() -> None:
    requests = prefix_repetition_dataset(12, prefix_len=16, suffix_len=8, num_prefixes=3,
                                         output_len=5, vocab_size=1000)
    assert {r.prompt_len for r in requests} == {24}
    prefixes = {tuple(r.prompt_token_ids[:16]) for r in requests}
    assert len(prefixes) == 3
    counts = sorted(sum(1 for r in requests if tuple(r.prompt_token_ids[:16]) == p)
                    for p in prefixes)
    assert counts == [4, 4, 4]


def test_range_ratio_of_one_or_more_is_refused() -> None:
    with pytest.raises(ValueError, match="range_ratio must be in \\[0, 1\\)"):
        random_dataset(4, 32, 4, vocab_size=500, range_ratio=1.0)


def test_more_prefixes_than_prompts_is_refused() -> None:
    with pytest.raises(ValueError, match="num_prefixes must be in \\[1, num_prompts=2\\]"):
        prefix_repetition_dataset(2, 8, 8, num_prefixes=3, output_len=4, vocab_size=500)


def test_zero_prompts_is_refused() -> None:
    with pytest.raises(ValueError, match="num_prompts must be >= 1"):
        random_dataset(0, 32, 4, vocab_size=500)
