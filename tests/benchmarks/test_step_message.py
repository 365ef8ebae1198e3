"""benchmarks/step_message.py times the engine's per-step message on a realistic decode step and
checks that it converts back to the same outputs."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from benchmarks import step_message


def test_a_decode_step_carries_the_rare_fields_on_a_few_outputs() -> None:
    step = step_message.decode_step(64, 3)
    assert [len(o.new_token_ids) for o in step.outputs] == [1] * 64
    assert sum(o.finished for o in step.outputs) == 4
    assert sum(o.first_scheduled_time is not None for o in step.outputs) == 4


def test_a_run_reports_each_batch_size(tmp_path: Path) -> None:
    out = tmp_path / "step.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        step_message.main(["--batch-sizes", "4,32", "--steps", "5", "--output-json", str(out)])
    rows = json.loads(out.read_text())
    assert [r["batch"] for r in rows] == [4, 32]
    assert all(r["encode_us"] > 0 and r["decode_us"] > 0 for r in rows)
    assert rows[1]["bytes"] > rows[0]["bytes"] > 0
    assert "us/request" in stdout.getvalue()


@pytest.mark.parametrize("argv", [["--batch-sizes", "0"], ["--batch-sizes", "8,x"],
                                  ["--steps", "0"]])
def test_bad_arguments_are_refused_with_a_one_line_error(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        step_message.main(argv)
    assert exc.value.code == 2
