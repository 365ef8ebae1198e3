"""Smoke test: the serving benchmark streams a tiny workload through a real gateway."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import serving
from tests.benchmarks.conftest import TINY_WORKLOAD, model_flags, services_available

NUM_PROMPTS, OUTPUT_LEN = 4, 8


@pytest.fixture(scope="module")
def serving_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                ) -> dict[str, Any]:
    if not services_available():
        pytest.skip("services (gateway, launch) are not built")
    out = tmp_path_factory.mktemp("serving") / "serving.json"
    serving.main([*model_flags(tiny_model_dir), *TINY_WORKLOAD, "--request-rate", "50",
                  "--max-concurrency", "2", "--output-json", str(out)])
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def test_every_request_completes(serving_run: dict[str, Any]) -> None:
    assert serving_run["status"] == "ok"
    assert serving_run["completed"] == NUM_PROMPTS
    assert serving_run["failed"] == 0
    assert serving_run["output_tokens"] == NUM_PROMPTS * OUTPUT_LEN


def test_latencies_are_reported_at_p50_p90_p99(serving_run: dict[str, Any]) -> None:
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        stats = serving_run[key]
        assert 0 < stats["p50"] <= stats["p90"] <= stats["p99"], key
    assert serving_run["ttft_ms"]["p99"] <= serving_run["e2e_ms"]["p99"]


def test_throughput_counts_completed_requests(serving_run: dict[str, Any]) -> None:
    assert serving_run["request_throughput"] == pytest.approx(
        NUM_PROMPTS / serving_run["duration_s"])
    assert serving_run["output_token_throughput"] == pytest.approx(
        NUM_PROMPTS * OUTPUT_LEN / serving_run["duration_s"])


def test_infinite_rate_sends_everything_at_once() -> None:
    assert serving.arrival_times(5, math.inf) == [0.0] * 5


def test_poisson_arrivals_increase_with_the_given_mean_gap() -> None:
    offsets = serving.arrival_times(2000, request_rate=10.0, seed=1)
    assert offsets == sorted(offsets) and offsets[0] == 0.0
    assert offsets[-1] / 1999 == pytest.approx(0.1, rel=0.1)


def test_non_positive_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="request_rate must be > 0"):
        serving.arrival_times(3, 0.0)


def test_tpot_excludes_the_first_token() -> None:
    timing = serving.RequestTiming(prompt_len=4, expected_output_len=3, ttft=0.5, e2e=1.5,
                                   output_tokens=3)
    assert timing.tpot == pytest.approx(0.5)
