"""benchmarks/rerank.py runs end to end: the real model packed as a yes/no reranker, and a
float32 directory beside HF transformers (a tiny one here, under the name cpu_peers_setup gives
SmolLM2's, scored on two of its own tokens) also through a real stack's /rerank, with the
agreement checks it prints."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from benchmarks import rerank
from tests.conftest import build_tiny_model


def test_rows_and_checks(smollm2_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> None:
    build_tiny_model(tmp_path / "smollm2-135m-f32-hf")
    # The tiny tokenizer has no "no" or "yes": single letters stand in (the real file has both,
    # and both rows read the same two names).
    monkeypatch.setattr(sys, "argv", ["rerank", "--model", str(smollm2_gguf), "--queries", "2",
                                      "--docs", "3", "--repeats", "1", "--tokens", "a", "b",
                                      "--served", "--bench-dir", str(tmp_path),
                                      "--gemm-size", "256"])
    rerank.main()
    out = capsys.readouterr().out
    rows = {cells[0]: cells[1:] for cells in
            (re.split(r"\s{2,}", line.strip()) for line in out.splitlines())}
    assert {"Strand Q4_1", "Strand float32", "Strand float32 cached", "HF float32",
            "Strand float32 served"} <= set(rows)
    assert all(float(rows[label][0]) > 0 for label in ("Strand Q4_1", "HF float32"))
    assert 0 < float(rows["Strand float32"][2]) < 1  # a share of the machine's bound
    for label in ("Strand float32 / HF float32", "Strand float32 cached / HF float32",
                  "Strand float32 served / Strand float32"):
        check = next(line for line in out.splitlines() if line.startswith(label))
        assert float(check.rsplit(" ", 1)[1]) < 1e-5  # the same scores, float32 rounding apart


def test_each_round_asks_new_queries_of_the_same_documents() -> None:
    first, second = rerank.workload(2, 3, 0), rerank.workload(2, 3, 1)
    assert len(first) == 6 and first == rerank.workload(2, 3, 0)
    assert {q for q, _ in first}.isdisjoint({q for q, _ in second})
    assert {d for _, d in first} == {d for _, d in second}
