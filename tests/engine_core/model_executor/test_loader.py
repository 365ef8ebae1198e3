"""load_model: single and sharded safetensors, tied embeddings, dtypes, and naming errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from strand.engine_core.model_executor.loader import load_model, resolve_device
from strand.engine_core.model_executor.model_config import load_model_config
from tests.engine_core.model_executor.conftest import build_model_dir

CPU = torch.device("cpu")


def test_sharded_and_single_file_checkpoints_load_the_same_weights(tmp_path: Path) -> None:
    single = load_model(load_model_config(str(build_model_dir(tmp_path / "one"))), CPU)
    sharded_dir = build_model_dir(tmp_path / "three", num_shards=3)
    assert (sharded_dir / "model.safetensors.index.json").is_file()
    sharded = load_model(load_model_config(str(sharded_dir)), CPU)
    for (name, a), (_, b) in zip(single.state_dict().items(), sharded.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name


def test_fused_projections_hold_the_checkpoint_tensors(tmp_path: Path) -> None:
    model_dir = build_model_dir(tmp_path, arch="qwen2")
    tensors = load_file(str(model_dir / "model.safetensors"))
    model = load_model(load_model_config(str(model_dir)), CPU)
    attn: Any = model.model.layers[1].self_attn
    expected = torch.cat([tensors[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(attn.qkv_proj.weight, expected)
    assert torch.equal(attn.qkv_proj.bias[-attn.kv_size:],
                       tensors["model.layers.1.self_attn.v_proj.bias"])


def test_tied_embeddings_share_one_tensor(tmp_path: Path) -> None:
    model_dir = build_model_dir(tmp_path, tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(str(model_dir / "model.safetensors"))
    model = load_model(load_model_config(str(model_dir)), CPU)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_bfloat16_loads_weights_in_bfloat16(tmp_path: Path) -> None:
    model = load_model(load_model_config(str(build_model_dir(tmp_path)), "bfloat16"), CPU)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    model_dir = build_model_dir(tmp_path)
    tensors = load_file(str(model_dir / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(model_dir / "model.safetensors"))
    with pytest.raises(ValueError, match="missing tensor.*model.layers.1.mlp.up_proj.weight"):
        load_model(load_model_config(str(model_dir)), CPU)


def test_shape_mismatch_names_the_tensor_and_both_shapes(tmp_path: Path) -> None:
    model_dir = build_model_dir(tmp_path)
    tensors = load_file(str(model_dir / "model.safetensors"))
    tensors["model.norm.weight"] = torch.ones(63)
    save_file(tensors, str(model_dir / "model.safetensors"))
    with pytest.raises(ValueError, match=r"'model.norm.weight'.*\[63\].*\[64\]"):
        load_model(load_model_config(str(model_dir)), CPU)


def test_directory_without_safetensors_is_a_file_not_found_error(tmp_path: Path) -> None:
    model_dir = build_model_dir(tmp_path)
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load_model(load_model_config(str(model_dir)), CPU)


def test_index_naming_a_missing_shard_is_a_file_not_found_error(tmp_path: Path) -> None:
    model_dir = build_model_dir(tmp_path, num_shards=2)
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    (model_dir / next(iter(index["weight_map"].values()))).unlink()
    with pytest.raises(FileNotFoundError, match="shard files that do not exist"):
        load_model(load_model_config(str(model_dir)), CPU)


def test_device_auto_is_cpu_without_cuda_and_bad_devices_are_rejected() -> None:
    if not torch.cuda.is_available():
        assert resolve_device("auto") == CPU
    with pytest.raises(ValueError, match="device must be auto, cpu or cuda"):
        resolve_device("tpu")


def test_loading_does_not_import_sympy(tmp_path: Path) -> None:
    # empty_like of a meta tensor runs torch's Python reference ops, whose first use imports
    # sympy: some 25 MB of resident modules in a process that never uses them. The loader makes
    # its tensors with torch.empty. In a fresh process: this one may have imported it already.
    import subprocess
    import sys

    model_dir = build_model_dir(tmp_path)
    script = ("import sys, torch\n"
              "from strand.engine_core.model_executor.loader import load_model\n"
              "from strand.engine_core.model_executor.model_config import load_model_config\n"
              "before = 'sympy' in sys.modules\n"
              f"load_model(load_model_config({str(model_dir)!r}), torch.device('cpu'))\n"
              "print('before' if before else 'sympy' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parents[3])
    result = done.stdout.strip().splitlines()[-1]
    if result == "before":
        pytest.skip("importing torch and the loader imports sympy already")
    assert result == "False"
