"""benchmarks/grammar_overhead.py runs end to end and prints one row per configuration."""

from __future__ import annotations

import sys

import pytest

from benchmarks import grammar_overhead


def test_prints_compile_and_step_rows(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["grammar_overhead", "--batch-sizes", "1", "2",
                                      "--steps", "3"])
    grammar_overhead.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("vocab 512")
    step_rows = [line for line in lines
                 if line.count("|") == 5 and line.split("|")[2].strip().isdigit()]
    # One row per constraint and batch size, each with a positive time.
    assert len(step_rows) == len(grammar_overhead.CONSTRAINTS) * 2
    assert all(float(row.split("|")[3]) > 0 for row in step_rows)
