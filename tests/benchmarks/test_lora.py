"""benchmarks/lora.py on the tiny model: every configuration decodes to the end, LoRA on leaves
the base model's tokens alone, and the adapters really change them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks.common import add_model_args
from benchmarks.lora import main, run
from tests.benchmarks.conftest import model_flags


def test_lora_benchmark_reports_each_configuration(
        tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "lora.json"
    main([*model_flags(tiny_model_dir), "--batch-size", "3", "--prompt-len", "6",
          "--output-len", "4", "--num-adapters", "2", "--rank", "4", "--num-threads", "1",
          "--repeats", "2",
          "--adapter-dir", str(tmp_path / "adapters"), "--output-json", str(out)])
    rows = json.loads(out.read_text())["results"]
    assert [r["config"] for r in rows] == ["LoRA off", "base, LoRA on", "1 adapter",
                                           "2 adapters mixed"]
    for row in rows:  # the prefill step samples token 1, then 3 decode steps of the batch
        assert row["decode_steps"] == 3 and row["decode_tokens"] == 9
    assert "vs LoRA off" in capsys.readouterr().out


def test_adapters_change_the_tokens(tiny_model_dir: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_model_args(parser)
    args = parser.parse_args(model_flags(tiny_model_dir))
    for name, value in (("batch_size", 2), ("prompt_len", 5), ("output_len", 3),
                        ("num_adapters", 2), ("rank", 4), ("num_threads", 1), ("repeats", 1),
                        ("adapter_dir", str(tmp_path / "adapters"))):
        setattr(args, name, value)
    outputs = {r["config"]: r["outputs"] for r in run(args)["results"]}
    assert outputs["base, LoRA on"] == outputs["LoRA off"]
    assert outputs["1 adapter"] != outputs["LoRA off"]
    assert outputs["2 adapters mixed"][0] == outputs["1 adapter"][0]  # request 0: adapter 0
    assert outputs["2 adapters mixed"][1] != outputs["1 adapter"][1]  # request 1: adapter 1
