"""benchmarks/embed.py runs end to end: the real model packed, and a float32 directory beside HF
transformers (a tiny one here, under the name cpu_peers_setup gives SmolLM2's), with the
agreement checks it prints."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from benchmarks import embed
from tests.conftest import build_tiny_model


def test_rows_and_checks(smollm2_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                         capsys: pytest.CaptureFixture[str]) -> None:
    build_tiny_model(tmp_path / "smollm2-135m-f32-hf")
    monkeypatch.setattr(sys, "argv", ["embed", "--model", str(smollm2_gguf), "--prompts", "6",
                                      "--repeats", "1", "--bench-dir", str(tmp_path),
                                      "--gemm-size", "256"])
    embed.main()
    out = capsys.readouterr().out
    # The table's rows: the label, then columns two or more spaces apart.
    rows = {cells[0]: cells[1:] for cells in
            (re.split(r"\s{2,}", line.strip()) for line in out.splitlines())}
    assert {"Strand Q4_1", "Strand float32", "HF float32"} <= set(rows)
    assert float(rows["Strand Q4_1"][0]) > 0 and float(rows["HF float32"][0]) > 0
    assert 0 < float(rows["Strand float32"][2]) < 1  # a share of the machine's bound
    check = next(line for line in out.splitlines()
                 if line.startswith("Strand float32 / HF float32"))
    assert float(check.rsplit(" ", 1)[1]) < 1e-5  # the same embeddings, float32 rounding apart


def test_sentences_are_seeded() -> None:
    assert embed.sentences(3) == embed.sentences(3)
    assert all(8 <= len(s.split()) <= 48 for s in embed.sentences(50))
