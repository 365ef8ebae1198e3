"""Smoke test of benchmarks/router.py: every policy serves every turn; kv-aware hits more."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import router as bench


def test_router_benchmark_minimal(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "router.json"
    rc = bench.main(["--model", str(tiny_model_dir), "--num-sessions", "4", "--num-turns", "3",
                     "--system-len", "32", "--user-len", "4", "--output-len", "2",
                     "--block-size", "4", "--num-blocks", "40", "--num-threads", "1",
                     "--output-json", str(out)])
    data = json.loads(out.read_text())
    by = {r["policy"]: r for r in data["results"]}
    assert rc == 0 and set(by) == {"kv-aware", "least-load", "round-robin"}
    for r in by.values():
        assert r["requests"] == 12 and sum(r["requests_per_replica"]) == 12
        assert 0.0 <= r["prefix_hit_rate"] <= 1.0
    # Sessions return to the replica holding their conversation: more of each prompt is cached.
    assert by["kv-aware"]["prefix_hit_rate"] > by["round-robin"]["prefix_hit_rate"]
