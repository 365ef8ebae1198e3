"""Random sampling: the distribution it draws from, the tokens truncation masks, and seeds."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from scipy import stats

from tests.engine_core.model_executor.sampler_helpers import make_row, random_logits, sample

NUM_SAMPLES = 20_000
LOGITS_8 = torch.tensor([1.0, 0.5, 0.0, -0.5, 2.0, -1.0, 0.3, 1.2])
# A distribution whose truncation sets are easy to read off.
PROBS_5 = [0.4, 0.3, 0.15, 0.1, 0.05]
LOGITS_5 = torch.tensor([math.log(p) for p in PROBS_5])


def _draw(logits_row: torch.Tensor, num: int = NUM_SAMPLES, **params: Any) -> torch.Tensor:
    """num independent samples in one batched call: the row repeated num times."""
    torch.manual_seed(1234)
    rows = [make_row(**params) for _ in range(num)]
    return sample(logits_row.unsqueeze(0).repeat(num, 1), rows).sampled_token_ids


def _chi_square_p(samples: torch.Tensor, expected_probs: list[float]) -> float:
    counts = torch.bincount(samples, minlength=len(expected_probs))[: len(expected_probs)]
    expected = [p * samples.numel() for p in expected_probs]
    return float(stats.chisquare(counts.tolist(), expected).pvalue)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_samples_follow_softmax_of_logits_over_temperature(temperature: float) -> None:
    samples = _draw(LOGITS_8, temperature=temperature)
    expected = torch.softmax(LOGITS_8.double() / temperature, dim=0).tolist()
    assert _chi_square_p(samples, expected) > 1e-3


def test_chi_square_check_rejects_the_wrong_temperature() -> None:
    # The check above has power: samples at T=0.5 are far from softmax(logits / 1).
    samples = _draw(LOGITS_8, temperature=0.5)
    assert _chi_square_p(samples, torch.softmax(LOGITS_8.double(), dim=0).tolist()) < 1e-6


def test_top_k_keeps_exactly_the_k_most_likely_tokens_renormalized() -> None:
    samples = _draw(LOGITS_5, top_k=2)
    assert set(samples.tolist()) == {0, 1}
    assert _chi_square_p(samples, [0.4 / 0.7, 0.3 / 0.7]) > 1e-3


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    # 0.4 + 0.3 = 0.7 < 0.8, so the nucleus needs 0.15 too.
    samples = _draw(LOGITS_5, top_p=0.8)
    assert set(samples.tolist()) == {0, 1, 2}
    assert _chi_square_p(samples, [p / 0.85 for p in PROBS_5[:3]]) > 1e-3


def test_min_p_drops_tokens_below_min_p_times_the_top_probability() -> None:
    # Threshold 0.2 * 0.4 = 0.08: 0.1 survives, 0.05 does not.
    samples = _draw(LOGITS_5, min_p=0.2)
    assert set(samples.tolist()) == {0, 1, 2, 3}


def test_top_p_applies_to_the_top_k_survivors() -> None:
    # top_k=3 leaves [0.4, 0.3, 0.15] / 0.85; top_p=0.7 then drops 0.15/0.85 = 0.18.
    samples = _draw(LOGITS_5, top_k=3, top_p=0.7)
    assert set(samples.tolist()) == {0, 1}


def test_each_row_is_truncated_by_its_own_parameters() -> None:
    torch.manual_seed(7)
    groups: list[dict[str, Any]] = [dict(top_k=2), dict(top_p=0.8), dict(min_p=0.2), dict(), dict(temperature=0.0)]
    allowed = [{0, 1}, {0, 1, 2}, {0, 1, 2, 3}, {0, 1, 2, 3, 4}, {0}]
    reps = 1000
    rows = [make_row(**params) for params in groups for _ in range(reps)]
    samples = sample(LOGITS_5.unsqueeze(0).repeat(len(rows), 1), rows).sampled_token_ids
    for g, expected in enumerate(allowed):
        assert set(samples[g * reps:(g + 1) * reps].tolist()) == expected


@pytest.mark.parametrize("params", [dict(top_k=5), dict(top_p=0.5), dict(min_p=0.3),
                                    dict(top_k=8, top_p=0.6, min_p=0.1)])
def test_truncation_never_emits_a_masked_token_on_random_logits(params: dict[str, Any]) -> None:
    torch.manual_seed(3)
    num_rows, vocab = 2000, 32
    logits = random_logits(num_rows, vocab, seed=4) * 0.5  # flat-ish: masked tokens are likely
    samples = sample(logits, [make_row(**params) for _ in range(num_rows)]).sampled_token_ids
    probs = torch.softmax(logits.double(), dim=-1)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if "top_k" in params:
        keep &= probs >= probs.topk(params["top_k"], dim=-1).values[:, -1:]
    if "top_p" in params:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep a token while the mass strictly before it is below p.
        before = sorted_probs.cumsum(dim=-1) - sorted_probs
        renorm = (sorted_probs * keep.gather(1, order)).sum(dim=-1, keepdim=True)
        in_nucleus = before < params["top_p"] * renorm
        keep &= torch.zeros_like(keep).scatter(1, order, in_nucleus)
    if "min_p" in params:
        kept = torch.where(keep, probs, 0.0)
        keep &= kept >= params["min_p"] * kept.amax(dim=-1, keepdim=True)
    assert keep.gather(1, samples.unsqueeze(1)).all()


def _seeded_run(companions: list[dict[str, Any]], position: int, steps: int = 6) -> list[int]:
    """Sample `steps` tokens for a seeded row placed at `position` among other rows."""
    vocab = 64
    logits_seeded = random_logits(1, vocab, seed=9)
    seeded = make_row(seed=42, top_k=40, top_p=0.95)
    rows = [make_row(**params) for params in companions]
    rows.insert(position, seeded)
    got = []
    for step in range(steps):
        logits = random_logits(len(rows), vocab, seed=100 + step)
        logits[position] = logits_seeded[0]
        got.append(int(sample(logits, rows).sampled_token_ids[position]))
    return got


def test_a_seeded_request_repeats_exactly_inside_different_batches() -> None:
    torch.manual_seed(0)
    alone = _seeded_run([], 0)
    torch.manual_seed(1)
    crowded = _seeded_run([dict(), dict(temperature=0.0), dict(seed=7, min_p=0.1)], 2)
    torch.manual_seed(2)
    other = _seeded_run([dict(temperature=0.3, repetition_penalty=1.2)] * 4, 4)
    assert alone == crowded == other
    assert len(set(alone)) > 1  # it is sampling, not collapsing to the argmax


def test_different_seeds_draw_different_sequences() -> None:
    vocab = 64
    logits = torch.zeros(2, vocab)  # uniform: any difference comes from the seeds
    rows = [make_row(seed=1), make_row(seed=2)]
    steps = [sample(logits, rows).sampled_token_ids.tolist() for _ in range(6)]
    assert [s[0] for s in steps] != [s[1] for s in steps]
