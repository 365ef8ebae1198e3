"""The OpenAI-front benchmark: a run on the tiny model reports every round, and bad flags are
one-line errors."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from benchmarks import front_overhead
from tests.benchmarks.conftest import model_flags


def test_a_run_reports_both_sides_and_the_fronts_cpu(tiny_model_dir: Path,
                                                     tmp_path: Path) -> None:
    out = tmp_path / "front.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        front_overhead.main([*model_flags(tiny_model_dir), "--num-requests", "3", "--rounds",
                             "2", "--num-threads", "1", "--output-json", str(out)])
    data = json.loads(out.read_text())
    assert len(data["generate_ttft_p50_ms"]) == len(data["front_ttft_p50_ms"]) == 2
    assert all(t > 0 for t in data["generate_ttft_p50_ms"] + data["front_ttft_p50_ms"])
    assert data["front_added_ms"] == [f - g for g, f in zip(
        data["generate_ttft_p50_ms"], data["front_ttft_p50_ms"], strict=True)]
    assert all(c > 0 for c in data["front_cpu_ms_per_request"])  # the front did the work
    assert "front adds ms" in stdout.getvalue() and "median" in stdout.getvalue()


@pytest.mark.parametrize("flags, message", [(["--rounds", "0"], "--rounds must be >= 1"),
                                            (["--num-requests", "0"],
                                             "--num-requests must be >= 1"),
                                            (["--prompt-len", "0"], "--prompt-len must be >= 1"),
                                            (["--num-threads", "0"],
                                             "--num-threads must be >= 1, got 0")])
def test_bad_flags_are_one_line_errors(flags: list[str], message: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        front_overhead.main(flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
