"""vllm/sampling_params.py (and tests/v1/sample/test_sampling_params.py): construction,
normalisation and bounds of SamplingParams."""

from __future__ import annotations

import logging
import math

import pytest

from strand.engine_core.sampling_params import SamplingParams


def test_seed_minus_one_means_no_seed() -> None:
    assert SamplingParams(seed=-1).seed is None
    assert SamplingParams(seed=None).seed is None
    assert SamplingParams(seed=7).seed == 7
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=-2)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 0.0, -1.0])
def test_repetition_penalty_must_be_finite_and_positive(value: float) -> None:
    with pytest.raises(ValueError, match="repetition_penalty must be finite and > 0"):
        SamplingParams(repetition_penalty=value)


def test_temperature_below_max_temp_is_clamped(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="strand.engine_core.sampling_params"):
        params = SamplingParams(temperature=1e-3)
    assert params.temperature == 0.01
    assert not params.is_greedy  # a tiny temperature still samples
    assert "temperature" in caplog.text
    assert SamplingParams(temperature=0.01).temperature == 0.01
    assert SamplingParams(temperature=0.0).temperature == 0.0


def test_greedy_sampling_normalises_top_p_top_k_min_p() -> None:
    params = SamplingParams(temperature=0.0, top_p=0.5, top_k=5, min_p=0.3)
    assert (params.top_p, params.top_k, params.min_p) == (1.0, 0, 0.0)
    random_params = SamplingParams(temperature=0.7, top_p=0.5, top_k=5, min_p=0.3)
    assert (random_params.top_p, random_params.top_k, random_params.min_p) == (0.5, 5, 0.3)


def test_greedy_sampling_still_validates_bounds() -> None:
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(temperature=0.0, top_p=1.5)


def test_top_k_minus_one_disables() -> None:
    assert SamplingParams(top_k=-1).top_k == 0
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-2)


@pytest.mark.parametrize("name", ["logprobs", "prompt_logprobs"])
def test_logprobs_minus_one_is_the_whole_vocabulary(name: str) -> None:
    def make(value: int) -> SamplingParams:
        return SamplingParams(**{name: value})  # type: ignore[arg-type]

    assert getattr(make(-1), name) == -1
    # The engine's max_logprobs, not SamplingParams, caps the count.
    assert getattr(make(100), name) == 100
    with pytest.raises(ValueError, match=name):
        make(-2)


def test_n_gt_1_greedy_is_refused() -> None:
    with pytest.raises(ValueError, match="n must be 1 for greedy"):
        SamplingParams(n=2, temperature=0.0)


def test_min_tokens_above_max_tokens_is_refused() -> None:
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=5, max_tokens=4)


def test_stop_string_is_listed() -> None:
    assert SamplingParams(stop="x").stop == ["x"]  # type: ignore[arg-type]
