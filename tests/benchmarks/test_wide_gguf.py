"""benchmarks/wide_gguf.py's shapes: the sharded bfloat16 writer names the tensors make_tiny_model
does, shards them with an index a loader reads, and the files keep wide-0.6b's old names."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from safetensors import safe_open

from benchmarks import wide_gguf
from strand.testing.tiny_model import make_tiny_model


@pytest.mark.parametrize("name", ["llama-3.2-1b", "qwen2.5-3b", "llama-3.1-8b"])
def test_sharded_writer_matches_make_tiny_model(tmp_path: Path, name: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    small = replace(wide_gguf.SHAPES[name], num_layers=2, hidden_size=64, num_heads=4,
                    num_kv_heads=2, intermediate_size=96, vocab_size=300)
    reference = make_tiny_model(tmp_path / "ref", small.arch, 2, 64, 4, 2, 300,
                                intermediate_size=96,
                                tie_word_embeddings=small.tie_word_embeddings,
                                with_tokenizer=False)
    with safe_open(str(reference / "model.safetensors"), "pt") as f:
        expected = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}  # noqa: SIM118
    monkeypatch.setattr(wide_gguf, "SHARD_BYTES", 20_000)
    out = tmp_path / "sharded"
    wide_gguf.write_sharded_bf16(out, small, name)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    got = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(out / shard), "pt") as f:
            got.update({n: tuple(f.get_slice(n).get_shape()) for n in f.keys()})  # noqa: SIM118
    assert got == expected
    assert len(set(index["weight_map"].values())) > 1
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"
    assert config["rope_theta"] == wide_gguf.SHAPES[name].rope_theta


def test_file_names_keep_wide_gguf_old_ones(tmp_path: Path) -> None:
    assert wide_gguf.gguf_path(tmp_path, "wide-0.6b", "F32").name == "wide-0.6b-f32.gguf"
    assert wide_gguf.gguf_path(tmp_path, "wide-0.6b", "Q4_K_M").name == "wide-0.6b-Q4_K_M.gguf"
    assert wide_gguf.gguf_path(tmp_path, "llama-3.1-8b", "BF16").name == "llama-3.1-8b-bf16.gguf"
