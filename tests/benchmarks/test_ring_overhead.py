"""The ring-overhead benchmark: its CPU accounting reads the clock the kernel keeps, and a run on
the tiny model reports every part."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from pathlib import Path

from benchmarks import ring_overhead
from benchmarks.ring_overhead import cpu_seconds
from tests.benchmarks.conftest import TINY_WORKLOAD, model_flags


def test_cpu_seconds_of_this_process_follow_its_own_times() -> None:
    start = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # burn 0.3 s of CPU, bounded
        pass
    spent = cpu_seconds(os.getpid()) - start
    assert 0.2 <= spent <= 1.0
    times = os.times()
    assert abs(cpu_seconds(os.getpid()) - (times.user + times.system)) < 0.1


def test_a_run_reports_ttft_cpu_and_alternating_throughput_pairs(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ring.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        ring_overhead.main([*model_flags(tiny_model_dir), *TINY_WORKLOAD, "--num-ttft", "3",
                            "--throughput-repeats", "2", "--output-json", str(out)])
    data = json.loads(out.read_text())
    assert data["ttft_ms"]["ring_p50"] > 0 and data["ttft_ms"]["in_process_p50"] > 0
    assert set(data["cpu_s_per_1000_tokens"]) == {"tokenizer", "engine", "detokenizer",
                                                  "gateway"}
    pairs = data["throughput"]
    assert len(pairs["ratios"]) == 2
    assert pairs["ratios"] == [b / a for a, b in zip(pairs["in_process_tok_s"],
                                                     pairs["ring_tok_s"], strict=True)]
    assert "median" in stdout.getvalue()
