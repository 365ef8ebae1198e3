"""Smoke test: the soak tool drives concurrent Generate streams, some cancelled, through a real
stack and accounts for every one of them (nothing lost, nothing left behind)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import soak
from tests.benchmarks.conftest import model_flags, services_available

NUM_STREAMS = 40


@pytest.fixture(scope="module")
def soak_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not services_available():
        pytest.skip("services (gateway, launch) are not built")
    out = tmp_path_factory.mktemp("soak") / "soak.json"
    soak.main([*model_flags(tiny_model_dir), "--streams", str(NUM_STREAMS),
               "--cancel-fraction", "0.25", "--cancel-within", "0.2", "--max-tokens", "6",
               "--timeout", "120", "--output-json", str(out)])
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def test_every_stream_is_accounted_for_and_nothing_leaks(soak_run: dict[str, Any]) -> None:
    cancelled = soak_run["cancelled_by_client"]
    assert 0 < cancelled < NUM_STREAMS
    # A stream cancelled after its end counts as completed too; none is lost or unexplained.
    assert soak_run["completed"] >= NUM_STREAMS - cancelled
    assert soak_run["silent_losses"] == 0
    assert soak_run["finish_error"] == 0
    assert soak_run["errors_by_status"] == {}
    assert soak_run["leaked_gateway"] == 0 and soak_run["leaked_engine"] == 0


def test_latency_and_every_stages_memory_are_reported(soak_run: dict[str, Any]) -> None:
    lat = soak_run["latency_s"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"]
    assert set(soak_run["rss_peak_mib"]) == {"tokenizer", "engine", "detokenizer", "gateway"}
    assert all(v > 10 for v in soak_run["rss_peak_mib"].values())
    assert set(soak_run["rss_start_mib"]) == set(soak_run["rss_peak_mib"])
    assert all(10 < soak_run["rss_start_mib"][name] <= peak
               for name, peak in soak_run["rss_peak_mib"].items())
