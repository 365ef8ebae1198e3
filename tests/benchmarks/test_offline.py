"""Smoke test: the offline benchmark runs every backend on a tiny workload and reports them."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import offline
from benchmarks.strand_backends import StrandSettings, run_gateway
from tests.benchmarks.conftest import TINY_BOUND, TINY_WORKLOAD, model_flags, services_available

NUM_PROMPTS, OUTPUT_LEN = 4, 8


@pytest.fixture(scope="module")
def offline_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                ) -> tuple[dict[str, Any], list[str]]:
    backends = ["strand", "hf-static", "hf-continuous"]
    if services_available():
        backends.insert(1, "strand-gateway")
    out = tmp_path_factory.mktemp("offline") / "offline.json"
    argv = [*model_flags(tiny_model_dir), *TINY_WORKLOAD, *TINY_BOUND,
            "--backends", ",".join(backends), "--hf-batch-size", "2", "--output-json", str(out)]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        offline.main(argv)
    data = json.loads(out.read_text())
    data["_printed"] = stdout.getvalue()  # the table, kept beside the JSON for one test
    return data, backends


def test_every_backend_runs_the_whole_workload(offline_run: tuple[dict[str, Any], list[str]],
                                               ) -> None:
    data, backends = offline_run
    assert list(data["backends"]) == backends
    for name, result in data["backends"].items():
        assert result["status"] == "ok", name
        assert result["num_requests"] == NUM_PROMPTS
        assert result["num_failed"] == 0
        assert result["output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
        assert result["prompt_tokens"] == data["dataset"]["total_prompt_tokens"]
        assert result["output_tokens_per_s"] > 0 and result["requests_per_s"] > 0
        assert result["total_tokens_per_s"] > result["output_tokens_per_s"]


def test_greedy_tokens_agree_across_backends(offline_run: tuple[dict[str, Any], list[str]],
                                             ) -> None:
    data, _ = offline_run
    for name, result in data["backends"].items():
        assert result["same_tokens_as"] == {"strand": 1.0}, name


def test_each_backend_is_compared_with_each_peer(offline_run: tuple[dict[str, Any], list[str]],
                                                 ) -> None:
    data, backends = offline_run
    strand = data["backends"]["strand"]
    hf = data["backends"]["hf-static"]
    assert set(strand["vs"]) == set(backends) - {"strand"}
    assert strand["vs"]["hf-static"] == pytest.approx(
        strand["output_tokens_per_s"] / hf["output_tokens_per_s"])


def test_the_bound_and_the_fraction_achieved_are_reported(
        offline_run: tuple[dict[str, Any], list[str]]) -> None:
    data, _ = offline_run
    bound = data["bound"]
    assert bound["machine"]["gemm_flops_per_s"] > 0
    assert bound["machine"]["memory_bytes_per_s"] > 0
    assert bound["bound_total_tokens_per_s"] <= bound["compute_bound_total_tokens_per_s"]
    strand = data["backends"]["strand"]
    assert strand["fraction_of_compute_bound"] == pytest.approx(
        bound["compute_time_s"] / strand["elapsed_s"])


def test_goals_are_judged_when_both_sides_ran(offline_run: tuple[dict[str, Any], list[str]],
                                              ) -> None:
    data, backends = offline_run
    judged = {g["goal"] for g in data["goals"]}
    assert "strand output tokens/s >= 2.0x hf-static" in judged
    assert "strand output tokens/s >= 3.0x hf-continuous" in judged
    assert "strand >= 50% of the compute bound" in judged
    assert ("strand-gateway output tokens/s >= 0.9x strand" in judged) == (
        "strand-gateway" in backends)


def test_settings_record_the_thread_count(offline_run: tuple[dict[str, Any], list[str]]) -> None:
    data, _ = offline_run
    assert data["machine"]["num_threads"] == 1
    assert {r["settings"]["num_threads"] for r in data["backends"].values()} == {1}
    assert data["backends"]["hf-static"]["settings"]["batch_size"] == 2


def test_the_table_printed_last_lists_every_backend(
        offline_run: tuple[dict[str, Any], list[str]]) -> None:
    data, backends = offline_run
    table = data["_printed"]
    assert table.splitlines()[0].split()[:4] == ["backend", "status", "req/s", "out"]
    for name in backends:
        assert any(line.startswith(name + " ") for line in table.splitlines()), name
    assert "machine: GEMM" in table


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="backends must be a non-empty list from"):
        offline.parse_backends("strand,vllm")


def test_gateway_backend_reports_unavailable_without_services(
        monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path) -> None:
    monkeypatch.setitem(sys.modules, "strand.services.client", None)  # import now raises ImportError
    result = run_gateway(str(tiny_model_dir), [], StrandSettings())
    assert result.status.startswith("unavailable: services not built")
    assert not result.ok
