"""load_model_config: what config.json says, and clear errors when it says something wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from strand.engine_core.model_executor.model_config import config_eos_token_id, load_model_config
from tests.engine_core.model_executor.conftest import build_model_dir


def _edit(model_dir: Path, **changes: object) -> None:
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_reads_the_fields_of_a_tiny_qwen2(tmp_path: Path) -> None:
    build_model_dir(tmp_path, arch="qwen2", tie_word_embeddings=True)
    c = load_model_config(str(tmp_path))
    assert (c.architecture, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads,
            c.head_dim, c.vocab_size) == ("Qwen2ForCausalLM", 64, 2, 4, 2, 16, 512)
    assert c.qkv_bias and not c.o_proj_bias and c.tie_word_embeddings
    assert (c.dtype, c.eos_token_id, c.bos_token_id) == (torch.float32, 2, 1)
    assert c.model_dir == str(tmp_path)


@pytest.mark.parametrize(("requested", "expected"), [
    ("auto", torch.bfloat16), ("float32", torch.float32), ("float16", torch.float16),
    ("half", torch.float16),
])
def test_dtype_auto_follows_the_checkpoint_and_explicit_wins(
        tmp_path: Path, requested: str, expected: torch.dtype) -> None:
    build_model_dir(tmp_path, dtype="bfloat16")
    assert load_model_config(str(tmp_path), requested).dtype == expected


def test_transformers5_rope_parameters_are_understood(tmp_path: Path) -> None:
    build_model_dir(tmp_path)
    _edit(tmp_path, rope_theta=None, rope_scaling=None,
          rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0})
    c = load_model_config(str(tmp_path))
    assert c.rope_theta == 5000.0
    assert c.rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_missing_directory_is_a_file_not_found_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model_config(str(tmp_path / "nope"))


def test_directory_without_config_json_is_a_file_not_found_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model_config(str(tmp_path))


def test_unsupported_architecture_names_the_supported_ones(tmp_path: Path) -> None:
    build_model_dir(tmp_path)
    _edit(tmp_path, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM, "
                                         "MistralForCausalLM, Qwen2ForCausalLM"):
        load_model_config(str(tmp_path))


def test_unsupported_rope_type_is_rejected(tmp_path: Path) -> None:
    build_model_dir(tmp_path)
    _edit(tmp_path, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match="rope_type.*'yarn'"):
        load_model_config(str(tmp_path))


def test_kv_heads_that_do_not_divide_heads_are_rejected(tmp_path: Path) -> None:
    build_model_dir(tmp_path)
    _edit(tmp_path, num_key_value_heads=3)
    with pytest.raises(ValueError, match="num_key_value_heads must divide"):
        load_model_config(str(tmp_path))


def test_bad_dtype_names_the_choices(tmp_path: Path) -> None:
    build_model_dir(tmp_path)
    with pytest.raises(ValueError, match="dtype must be auto, float32, bfloat16 or float16"):
        load_model_config(str(tmp_path), "int8")


def test_missing_required_field_is_named(tmp_path: Path) -> None:
    build_model_dir(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    del config["hidden_size"]
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="'hidden_size'"):
        load_model_config(str(tmp_path))


@pytest.mark.parametrize(("eos", "expected"), [(2, 2), ([7, 2], 7), ([], None), (None, None),
                                               (True, None)])
def test_config_eos_is_the_first_of_a_list_as_the_loaded_config_says(
        tmp_path: Path, eos: object, expected: int | None) -> None:
    # What a stage without a tokenizer stops on (skip_tokenizer_init), read without the weights.
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": eos}))
    assert config_eos_token_id(str(tmp_path)) == expected
