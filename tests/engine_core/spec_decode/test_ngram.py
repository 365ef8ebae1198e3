"""The prompt-lookup proposer drafts what vLLM's does: the tokens after the first earlier
occurrence of the longest suffix n-gram (vLLM's tests/v1/spec_decode/test_ngram.py cases)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from strand.engine_core.spec_decode.ngram import NgramProposer, find_match
from strand.engine_core.speculative_config import SpeculativeConfig


def draft(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    proposer = NgramProposer(SpeculativeConfig(k, min_n, max_n))
    return proposer.propose("r", tokens, k)


@pytest.mark.parametrize(("tokens", "min_n", "max_n", "k", "want"), [
    ([1, 2, 3, 4, 1, 2, 3, 5, 6], 2, 2, 2, []),  # the suffix 5 6 never occurred
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),  # a draft may run into the suffix itself
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 2, [4, 1]),
    ([1, 2, 3, 4, 1, 2, 3], 1, 1, 3, [4, 1, 2]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 1, 1, 2, [6, 2]),  # the first occurrence, not the latest
    ([1, 2, 3, 4, 5], 2, 2, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 4, 4, 2, []),  # no 4-gram
    ([1, 2, 3, 4, 1, 2, 3], 3, 4, 2, [4, 1]),  # no 4-gram, a 3-gram
    ([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4], 3, 4, 2, [1, 2]),  # the 4-gram wins over [5, 1]
    ([3, 4, 5, 2, 3, 4, 1, 2, 3, 4], 2, 4, 2, [1, 2]),  # the 3-gram wins over [5, 2]
    ([1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3], 3, 3, 2, [100, 1]),
    ([7], 1, 1, 2, []),
    ([7, 7], 1, 1, 3, [7]),  # the draft stops at the end of what is known
])
def test_drafts_as_vllm(tokens: list[int], min_n: int, max_n: int, k: int,
                        want: list[int]) -> None:
    assert draft(tokens, min_n, max_n, k) == want


def brute_force(tokens: list[int], min_n: int, max_n: int) -> int:
    """The draft's start by definition: longest n first, then the first occurrence."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        for end in range(n - 1, length - 1):
            if tokens[end - n + 1:end + 1] == suffix:
                return end + 1
    return -1


def test_find_match_equals_the_definition_on_random_histories() -> None:
    rng = random.Random(3)
    checked = found = 0
    for _ in range(400):
        length = rng.randrange(1, 60)
        tokens = [rng.randrange(0, 4) for _ in range(length)]  # few ids: many matches
        min_n = rng.randrange(1, 4)
        max_n = min_n + rng.randrange(0, 4)
        want = brute_force(tokens, min_n, max_n)
        assert find_match(np.array(tokens), min_n, max_n) == want, (tokens, min_n, max_n)
        checked += 1
        found += want >= 0
    assert found > checked // 4  # the cases were not all misses


def test_the_mirror_grows_with_the_request_and_is_dropped() -> None:
    proposer = NgramProposer(SpeculativeConfig(3, 2, 2))
    tokens = [5, 6, 7, 8]
    assert proposer.propose("a", tokens, 3) == []
    for token in (9, 5, 6):  # grows a few tokens a step, as a decode does
        tokens.append(token)
    assert proposer.propose("a", tokens, 3) == [7, 8, 9]
    tokens += list(range(100, 300)) + [7, 8]  # past the first buffer's size
    assert proposer.propose("a", tokens, 3) == [9, 5, 6]
    assert proposer.propose("a", tokens, 1) == [9]  # capped by the caller
    assert proposer.propose("a", tokens, 0) == []
    proposer.drop("a")
    assert "a" not in proposer._tokens
    # Another request with the same id later starts from its own tokens.
    assert proposer.propose("a", [1, 2, 1], 3) == []
