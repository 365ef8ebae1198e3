"""config.json fields of Qwen3, Qwen3-MoE, Phi-3 and Gemma 2/3: read into config.arch, and
ValueError naming the field for what the engine cannot run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core.model_executor.layers.moe import SparseMoeBlock
from strand.engine_core.model_executor.loader import load_model
from strand.engine_core.model_executor.model_config import load_model_config, model_config_from_dict
from strand.testing.tiny_model import make_tiny_model


def tiny_config(tmp_path: Path, arch: str, **kwargs: Any) -> dict[str, Any]:
    make_tiny_model(tmp_path, arch=arch, with_tokenizer=False, **kwargs)
    config: dict[str, Any] = json.loads((tmp_path / "config.json").read_text())
    return config


def test_gemma2_reads_windows_per_layer_softcaps_and_scalar(tmp_path: Path) -> None:
    raw = tiny_config(tmp_path, "gemma2", num_layers=4, sliding_window=16)
    arch = model_config_from_dict(raw, str(tmp_path)).arch
    assert arch.layer_windows == (16, None, 16, None)
    assert (arch.attn_logit_softcap, arch.final_logit_softcap) == (50.0, 30.0)
    assert arch.query_pre_attn_scalar == 16.0  # tiny: hidden 64 / 4 heads
    assert arch.hidden_act == "gelu_pytorch_tanh" and not arch.qk_norm


def test_gemma3_default_layer_types_put_one_global_layer_in_six(tmp_path: Path) -> None:
    raw = tiny_config(tmp_path, "gemma3", num_layers=7, sliding_window=32)
    del raw["layer_types"]
    config = model_config_from_dict(raw, str(tmp_path))
    assert config.arch.layer_windows == (32,) * 5 + (None, 32)
    assert config.arch.local_rope_theta == 10000.0 and config.arch.qk_norm


def test_gemma3_reads_transformers5_rope_parameters(tmp_path: Path) -> None:
    raw = tiny_config(tmp_path, "gemma3")
    for key in ("rope_theta", "rope_local_base_freq", "rope_scaling"):
        raw.pop(key, None)
    raw["rope_parameters"] = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}}
    config = model_config_from_dict(raw, str(tmp_path))
    assert config.rope_theta == 1e6
    assert config.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert config.arch.local_rope_theta == 500.0


def test_qwen3_moe_sparse_layers_follow_step_and_mlp_only_layers(tmp_path: Path) -> None:
    raw = tiny_config(tmp_path, "qwen3_moe", num_layers=4,
                      extra_config={"decoder_sparse_step": 2, "mlp_only_layers": [3]})
    arch = model_config_from_dict(raw, str(tmp_path)).arch
    assert arch.moe_layers == (False, True, False, False)
    assert (arch.num_experts, arch.num_experts_per_tok, arch.norm_topk_prob) == (8, 2, True)
    # The tiny checkpoint matches: every tensor the model expects is there (dense MLPs on the
    # other layers, per-expert tensors on layer 1).
    model = load_model(load_model_config(str(tmp_path)), torch.device("cpu"))
    assert isinstance(model.model.layers[1].mlp, SparseMoeBlock)
    assert not isinstance(model.model.layers[3].mlp, SparseMoeBlock)


def test_mistral_and_phi3_window_every_layer(tmp_path: Path) -> None:
    raw = tiny_config(tmp_path, "phi3", sliding_window=40)
    assert model_config_from_dict(raw, str(tmp_path)).arch.layer_windows == (40, 40)
    raw["sliding_window"] = None
    assert model_config_from_dict(raw, str(tmp_path)).arch.layer_windows == ()


@pytest.mark.parametrize(("arch", "field", "value", "message"), [
    ("gemma2", "layer_types", ["sliding_attention"], "layer_types must list 2 entries"),
    ("gemma2", "attn_logit_softcapping", 0.0, "attn_logit_softcapping must be > 0"),
    ("gemma2", "query_pre_attn_scalar", -1, "query_pre_attn_scalar must be > 0"),
    ("gemma2", "hidden_activation", "relu", "hidden_act must be one of"),
    ("phi3", "sliding_window", 0, "sliding_window must be a positive integer"),
    ("phi3", "partial_rotary_factor", 0.5, "partial_rotary_factor must be 1.0"),
    ("qwen3_moe", "num_experts_per_tok", 9, "num_experts_per_tok must be <= num_experts"),
    ("qwen3_moe", "moe_intermediate_size", 0, "moe_intermediate_size must be a positive"),
    ("qwen3_moe", "decoder_sparse_step", 0, "decoder_sparse_step must be >= 1"),
])
def test_bad_fields_are_rejected_by_name(tmp_path: Path, arch: str, field: str, value: Any,
                                         message: str) -> None:
    raw = tiny_config(tmp_path, arch)
    raw[field] = value
    with pytest.raises(ValueError, match=message):
        model_config_from_dict(raw, str(tmp_path))


def test_phi3_su_rope_is_longrope_and_yarn_is_refused(tmp_path: Path) -> None:
    raw = tiny_config(tmp_path, "phi3", extra_config={"original_max_position_embeddings": 512})
    raw["rope_scaling"] = {"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    scaling = model_config_from_dict(raw, str(tmp_path)).rope_scaling
    assert scaling is not None and scaling["rope_type"] == "longrope"
    assert scaling["original_max_position_embeddings"] == 512
    raw["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    with pytest.raises(ValueError, match="rope_scaling.rope_type must be one of"):
        model_config_from_dict(raw, str(tmp_path))
