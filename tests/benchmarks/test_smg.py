"""The smg benchmark: a run on the tiny model reports both fronts for every round, every stream
with exactly the tokens asked for; bad flags are one-line errors."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

from benchmarks import smg
from tests.benchmarks.conftest import model_flags


def test_a_run_reports_both_fronts_for_every_round(tiny_model_dir: Path, tmp_path: Path) -> None:
    if shutil.which("smg") is None:
        pytest.skip("smg is not installed (pip install smg)")
    out = tmp_path / "smg.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        smg.main([*model_flags(tiny_model_dir), "--num-requests", "2", "--prompt-len", "8",
                  "--output-len", "4", "--rounds", "1", "--num-threads", "1",
                  "--output-json", str(out)])
    data = json.loads(out.read_text())
    for side in smg.SIDES:
        (result,) = data["rounds"][side]
        assert (result["num_ok"], result["num_failed"], result["output_tokens"]) == (2, 0, 8)
        assert result["output_tok_s"] > 0 and result["ttft_p99_ms"] >= result["ttft_p50_ms"] > 0
        assert side in stdout.getvalue()
    # smg tokenizes completions without BOS; Strand's front adds it.
    assert data["rounds"]["strand-openai"][0]["prompt_tokens"] == \
        data["rounds"]["smg"][0]["prompt_tokens"] + 1 >= 9


def test_the_text_prompt_has_the_tokens_asked_for(tiny_model_dir: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    prompt = smg.text_prompt(tiny_model_dir, 20)
    num_tokens = len(tokenizer.encode(prompt, add_special_tokens=False).ids)
    assert 20 <= num_tokens < 20 + len(max(smg.WORDS, key=len)) + 1


@pytest.mark.parametrize("flags, message", [(["--rounds", "0"], "--rounds must be >= 1"),
                                            (["--num-requests", "0"],
                                             "--num-requests must be >= 1"),
                                            (["--output-len", "0"], "--output-len must be >= 1"),
                                            (["--prompt-len", "0"], "--prompt-len must be >= 1")])
def test_bad_flags_are_one_line_errors(flags: list[str], message: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        smg.main(flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
