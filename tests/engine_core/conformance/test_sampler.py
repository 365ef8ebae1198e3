"""tests/v1/sample/test_sampler.py: the sampler on hand-made logits (no model): min_tokens,
penalties, allowed_token_ids, bad words, logit_bias, greedy normalisation, all logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from strand.engine_core.model_executor.sampler import Sampler
from strand.engine_core.model_executor.sampling_metadata import SamplingRow
from tests.engine_core.model_executor.sampler_helpers import make_metadata, make_row

VOCAB = 32


def _sample(rows: list[SamplingRow], logits: torch.Tensor) -> list[int]:
    return Sampler()(logits, make_metadata(rows, VOCAB)).sampled_token_ids.tolist()


def _peaked(best: int, num_rows: int = 1) -> torch.Tensor:
    logits = torch.zeros(num_rows, VOCAB)
    logits[:, best] = 10.0
    return logits


def test_sampler_min_tokens() -> None:
    rows = [make_row(output=[1, 2], eos=5, min_tokens=3, temperature=0.0, stop_token_ids=[6]),
            make_row(output=[1, 2, 3], eos=5, min_tokens=3, temperature=0.0)]
    logits = _peaked(5, 2)
    logits[:, 6] = 9.0
    logits[:, 7] = 8.0
    # Row 0 is below min_tokens: EOS and the stop id are banned; row 1 may stop.
    assert _sample(rows, logits) == [7, 5]


@pytest.mark.parametrize("penalty", ["presence_penalty", "frequency_penalty"])
def test_sampler_presence_and_frequency_penalty(penalty: str) -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 3], logits[0, 4] = 1.0, 0.9
    row = make_row(output=[3, 3], temperature=0.0, **{penalty: 1.0})  # type: ignore[arg-type]
    assert _sample([row], logits.clone()) == [4]  # the repeated token is pushed below
    assert _sample([make_row(output=[3, 3], temperature=0.0)], logits.clone()) == [3]


def test_sampler_repetition_penalty() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 3], logits[0, 4] = 1.0, 0.9
    row = make_row(prompt=[3], temperature=0.0, repetition_penalty=2.0)  # prompt counts too
    assert _sample([row], logits) == [4]


def test_sampler_allowed_token_ids() -> None:
    rows = [make_row(allowed_token_ids=[8, 9], temperature=0.0), make_row(temperature=0.0)]
    assert _sample(rows, _peaked(2, 2)) == [8, 2]


def test_sampler_bad_words() -> None:
    words = [[7], [10, 11]]  # a one-token word, and a two-token word
    rows = [make_row(output=[1, 10], temperature=0.0, bad_words_token_ids=words),
            make_row(output=[1, 12], temperature=0.0, bad_words_token_ids=words),
            make_row(output=[], temperature=0.0, bad_words_token_ids=words)]
    logits = torch.zeros(3, VOCAB)
    logits[:, 7], logits[:, 11], logits[:, 4] = 10.0, 9.0, 8.0
    # 7 is always banned; 11 only right after 10.
    assert _sample(rows, logits) == [4, 11, 11]


def test_sampler_logit_bias() -> None:
    rows = [make_row(logit_bias={9: 20.0}, temperature=0.0), make_row(temperature=0.0)]
    assert _sample(rows, _peaked(2, 2)) == [9, 2]


def test_sampler_greedy_ignores_top_p_top_k_min_p() -> None:
    row = make_row(temperature=0.0, top_p=0.1, top_k=1, min_p=0.9)
    assert (row.params.top_p, row.params.top_k, row.params.min_p) == (1.0, 0, 0.0)
    assert make_metadata([row], VOCAB).all_greedy


def test_sampler_all_logprobs() -> None:
    out = Sampler()(_peaked(3), make_metadata([make_row(logprobs=-1, temperature=0.0)], VOCAB))
    assert out.logprobs is not None
    ids = out.logprobs.logprob_token_ids[0]
    assert ids[0] == 3 and sorted(ids[1:]) == list(range(VOCAB))
    assert math.isclose(sum(math.exp(v) for v in out.logprobs.logprobs[0][1:]), 1.0,
                        rel_tol=1e-5)


def test_sampler_tiny_temperature_is_clamped_not_greedy() -> None:
    row = make_row(temperature=1e-4, seed=0)
    assert row.params.temperature == 0.01 and not make_metadata([row], VOCAB).all_greedy
