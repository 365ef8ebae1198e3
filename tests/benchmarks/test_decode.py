"""benchmarks/decode.py on a tiny model: every batch decodes to the end, the bound is sane."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.decode import main, parse_batch_sizes
from benchmarks.roofline import ModelShape
from tests.benchmarks.conftest import model_flags


@pytest.mark.parametrize(("kv_cache_dtype", "kv_bytes"), [("auto", 4), ("bfloat16", 2)])
def test_decode_sweep_reports_each_batch_against_the_memory_bound(
        tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        kv_cache_dtype: str, kv_bytes: int) -> None:
    out = tmp_path / "decode.json"
    main([*model_flags(tiny_model_dir), "--batch-sizes", "1,3", "--prompt-len", "6",
          "--output-len", "5", "--copy-mib", "4", "--num-threads", "1",
          "--kv-cache-dtype", kv_cache_dtype, "--output-json", str(out)])
    data = json.loads(out.read_text())
    rows = {r["batch_size"]: r for r in data["results"]}
    assert sorted(rows) == [1, 3]
    shape = ModelShape.from_config(json.loads((tiny_model_dir / "config.json").read_text()))
    weights = (shape.layer_params + shape.lm_head_params) * 4
    assert data["model"]["weight_bytes"] == weights
    # The K/V read in the cache's dtype: float32, or bfloat16 with --kv-cache-dtype bfloat16.
    assert data["model"]["kv_cache_dtype"] == kv_cache_dtype
    kv_per_key = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * kv_bytes
    for batch, row in rows.items():
        # All prompts prefill in one untimed step (which samples token 1), then 4 decode steps
        # of the whole batch; decoding token n + 1 attends to the 6 prompt positions + n.
        assert row["decode_steps"] == 4 and row["decode_tokens"] == 4 * batch
        keys = batch * sum(6 + n for n in range(1, 5))
        bound_s = (4 * weights + keys * kv_per_key) / data["copy_bytes_per_s"]
        assert row["bound_ms_per_step"] == pytest.approx(1e3 * bound_s / 4)
        assert row["fraction_of_bound"] == pytest.approx(bound_s / row["elapsed_s"])
    assert "% of bound" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["", "0,4", "a,b", "8,-1"])
def test_bad_batch_sizes_are_refused_naming_the_field(text: str) -> None:
    with pytest.raises(ValueError, match="batch_sizes must be"):
        parse_batch_sizes(text)


def test_a_preset_builds_that_models_shape(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from benchmarks.common import MODEL_PRESETS, add_model_args, resolve_model
    from strand.testing import tiny_model

    built: list[dict[str, object]] = []

    def recording_make(out: object, **kwargs: object) -> object:
        built.append(kwargs)
        return out

    monkeypatch.setattr(tiny_model, "make_tiny_model", recording_make)
    parser = argparse.ArgumentParser()
    add_model_args(parser)
    args = parser.parse_args(["--preset", "llama-3.2-1b", "--dtype", "bfloat16",
                              "--model-cache-dir", str(tmp_path)])
    path = resolve_model(args)
    assert path.name.startswith("llama-3.2-1b-")
    assert built == [{**MODEL_PRESETS["llama-3.2-1b"], "dtype": "bfloat16", "seed": 0}]
    assert built[0]["hidden_size"] == 2048 and built[0]["num_kv_heads"] == 8
