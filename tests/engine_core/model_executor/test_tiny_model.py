"""make_tiny_model writes a complete, seeded HF directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from strand.testing.tiny_model import make_tiny_model
from tests.engine_core.model_executor.conftest import build_model_dir


def test_writes_every_file_of_an_hf_directory(tmp_path: Path) -> None:
    make_tiny_model(tmp_path, "llama", vocab_size=300, seed=3)
    names = {p.name for p in tmp_path.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= names
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["vocab_size"], config["bos_token_id"], config["eos_token_id"]) == (300, 1, 2)
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2


def test_same_seed_same_weights_other_seed_other_weights(tmp_path: Path) -> None:
    a = load_file(str(build_model_dir(tmp_path / "a", seed=5) / "model.safetensors"))
    b = load_file(str(build_model_dir(tmp_path / "b", seed=5) / "model.safetensors"))
    c = load_file(str(build_model_dir(tmp_path / "c", seed=6) / "model.safetensors"))
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(a[name], b[name])
    assert not torch.equal(a[name], c[name])


def test_tensor_names_and_shapes_follow_hf(tmp_path: Path) -> None:
    tensors = load_file(str(build_model_dir(tmp_path, arch="qwen2") / "model.safetensors"))
    assert tensors["model.embed_tokens.weight"].shape == (512, 64)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)  # 2 kv heads x 16
    assert tensors["model.layers.0.self_attn.k_proj.bias"].shape == (32,)
    assert tensors["model.layers.1.mlp.down_proj.weight"].shape == (64, 128)
    assert tensors["lm_head.weight"].shape == (512, 64)


def test_unknown_arch_names_the_supported_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="arch must be one of llama, mistral, qwen2"):
        make_tiny_model(tmp_path, "gpt2")


def test_heads_that_do_not_divide_hidden_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="hidden_size must be a multiple of num_heads"):
        make_tiny_model(tmp_path, hidden_size=60, num_heads=8, with_tokenizer=False)
