"""Sample and prompt logprobs: of the raw model distribution, sampled token first, with ranks."""

from __future__ import annotations

import pytest
import torch

from strand.engine_core.model_executor.sampler import compute_prompt_logprobs
from tests.engine_core.model_executor.sampler_helpers import make_row, random_logits, sample


def test_logprobs_equal_log_softmax_of_the_raw_logits() -> None:
    torch.manual_seed(0)
    logits = random_logits(3, 50, seed=5)
    # Penalties, bias and temperature change the sampling, not the reported logprobs.
    rows = [make_row(logprobs=4, temperature=0.7, repetition_penalty=1.5, output=[1, 2]),
            make_row(logprobs=4, temperature=0.0, logit_bias={3: 10.0}),
            make_row(logprobs=4, top_k=3)]
    out = sample(logits, rows)
    assert out.logprobs is not None
    reference = torch.log_softmax(logits.double(), dim=-1)
    for i in range(3):
        ids = out.logprobs.logprob_token_ids[i]
        expected = reference[i, ids].tolist()
        assert out.logprobs.logprobs[i] == pytest.approx(expected, abs=1e-5)


def test_column_zero_is_the_sampled_token_then_the_top_k_descending() -> None:
    torch.manual_seed(0)
    logits = random_logits(2, 30, seed=6)
    out = sample(logits, [make_row(logprobs=3), make_row(logprobs=3)])
    assert out.logprobs is not None
    reference = torch.log_softmax(logits, dim=-1)
    for i in range(2):
        ids = out.logprobs.logprob_token_ids[i]
        assert ids[0] == int(out.sampled_token_ids[i])
        assert ids[1:] == reference[i].topk(3).indices.tolist()


def test_k_is_the_largest_number_asked_and_rows_align_with_the_batch() -> None:
    logits = random_logits(3, 30, seed=7)
    rows = [make_row(temperature=0.0, logprobs=1), make_row(temperature=0.0),
            make_row(temperature=0.0, logprobs=5)]
    out = sample(logits, rows)
    assert out.logprobs is not None
    assert [len(r) for r in out.logprobs.logprob_token_ids] == [6, 6, 6]
    assert [r[0] for r in out.logprobs.logprob_token_ids] == out.sampled_token_ids.tolist()


def test_no_logprobs_when_no_row_asks() -> None:
    out = sample(random_logits(2, 10), [make_row(), make_row(temperature=0.0)])
    assert out.logprobs is None


def test_zero_logprobs_returns_only_the_sampled_token() -> None:
    logits = random_logits(1, 10)
    out = sample(logits, [make_row(temperature=0.0, logprobs=0)])
    assert out.logprobs is not None
    assert out.logprobs.logprob_token_ids == [[int(logits.argmax())]]
    assert out.logprobs.sampled_token_ranks == [1]


def test_rank_counts_the_tokens_strictly_more_likely_than_the_sampled_one() -> None:
    # Forced to token 4, which ties with token 1 and trails tokens 0 and 2.
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0, 1.0, -1.0]])
    out = sample(logits, [make_row(temperature=0.0, logprobs=2, allowed_token_ids=[4])])
    assert out.sampled_token_ids.tolist() == [4]
    assert out.logprobs is not None
    assert out.logprobs.sampled_token_ranks == [3]
    assert out.logprobs.logprob_token_ids == [[4, 0, 2]]


def test_half_precision_logits_are_reported_in_float32() -> None:
    logits = random_logits(2, 40, seed=8).to(torch.bfloat16)
    out = sample(logits, [make_row(temperature=0.0, logprobs=2)] * 2)
    assert out.logprobs is not None
    reference = torch.log_softmax(logits.float(), dim=-1)
    for i in range(2):
        ids = out.logprobs.logprob_token_ids[i]
        assert out.logprobs.logprobs[i] == pytest.approx(reference[i, ids].tolist(), abs=1e-6)


def test_prompt_logprobs_score_the_next_prompt_token_at_each_position() -> None:
    logits = random_logits(4, 20, seed=9)
    targets = torch.tensor([3, 0, 19, 7])
    result = compute_prompt_logprobs(logits, targets, num_logprobs=2)
    reference = torch.log_softmax(logits.double(), dim=-1)
    assert [row[0] for row in result.logprob_token_ids] == targets.tolist()
    for i in range(4):
        ids = result.logprob_token_ids[i]
        assert ids[1:] == reference[i].topk(2).indices.tolist()
        assert result.logprobs[i] == pytest.approx(reference[i, ids].tolist(), abs=1e-5)
        expected_rank = int((reference[i] > reference[i, targets[i]]).sum()) + 1
        assert result.sampled_token_ranks[i] == expected_rank


def test_prompt_logprobs_reject_mismatched_targets() -> None:
    with pytest.raises(ValueError, match="target_token_ids"):
        compute_prompt_logprobs(random_logits(4, 20), torch.tensor([1, 2, 3]), num_logprobs=1)
