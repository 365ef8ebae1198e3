"""Smoke test of benchmarks/prefix_cache.py: all three engines run and agree (no timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import prefix_cache
from tests.benchmarks.conftest import model_flags


def test_prefix_cache_benchmark_runs_every_engine_and_outputs_agree(tiny_model_dir: Path,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "prefix.json"
    rc = prefix_cache.main([*model_flags(tiny_model_dir), "--num-prefixes", "4",
                            "--prefix-len", "32", "--suffix-len", "4", "--num-requests", "8",
                            "--max-tokens", "2", "--num-threads", "1", "--output-json", str(out)])
    data = json.loads(out.read_text())
    assert rc == 0 and data["outputs_agree"] is True
    assert len(data["results"]) == len(prefix_cache.ENGINES)
    by_engine = {r["engine"]: r for r in data["results"]}
    assert by_engine["no-cache"]["cached_prompt_fraction"] == 0.0
    assert by_engine["device"]["cached_prompt_fraction"] > 0.0
    assert by_engine["offload"]["cached_prompt_fraction"] >= by_engine["device"][
        "cached_prompt_fraction"]
