"""Phi-3's LongRoPE table against transformers' Phi3RotaryEmbedding: short factors below the
original length, long ones from it on, both scaled by the attention factor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from strand.engine_core.model_executor.layers.rotary_embedding import RotaryEmbedding
from strand.engine_core.model_executor.model_config import load_model_config
from strand.testing.tiny_model import make_tiny_model

ORIG = 32
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0 + 0.2 * i for i in range(8)],
            "long_factor": [3.0 + i for i in range(8)]}


def hf_cos_sin(model_dir: Path, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    transformers = pytest.importorskip("transformers")
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    config = transformers.AutoConfig.from_pretrained(str(model_dir))
    cos, sin = Phi3RotaryEmbedding(config)(torch.zeros(1, dtype=torch.float32),
                                           positions.unsqueeze(0))
    return cos[0, :, :8], sin[0, :, :8]  # [positions, head_dim // 2]: the halves repeat


@pytest.fixture(scope="module")
def longrope_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("longrope"), arch="phi3",
                           rope_scaling=LONGROPE, max_position_embeddings=256,
                           extra_config={"original_max_position_embeddings": ORIG},
                           with_tokenizer=False)


def ours(model_dir: Path) -> torch.Tensor:
    config = load_model_config(str(model_dir))
    rotary = RotaryEmbedding(config.head_dim, config.max_position_embeddings,
                             config.rope_theta, config.rope_scaling)
    rotary.build_cache(torch.device("cpu"))
    return rotary.cos_sin  # [max_positions, head_dim]: cos | sin


def test_positions_below_the_original_length_use_the_short_factors(longrope_dir: Path) -> None:
    positions = torch.arange(ORIG)
    cos, sin = hf_cos_sin(longrope_dir, positions)
    table = ours(longrope_dir)[positions]
    torch.testing.assert_close(table, torch.cat([cos, sin], dim=-1), atol=1e-6, rtol=1e-6)


def test_positions_from_the_original_length_on_use_the_long_factors(longrope_dir: Path) -> None:
    positions = torch.arange(ORIG, 200)
    cos, sin = hf_cos_sin(longrope_dir, positions)
    table = ours(longrope_dir)[positions]
    torch.testing.assert_close(table, torch.cat([cos, sin], dim=-1), atol=1e-5, rtol=1e-5)


def test_attention_factor_defaults_to_the_longrope_formula(longrope_dir: Path) -> None:
    scaling = load_model_config(str(longrope_dir)).rope_scaling
    assert scaling is not None
    # factor = 256 / 32 = 8: sqrt(1 + ln 8 / ln 32) = sqrt(1.6)
    assert scaling["attention_factor"] == pytest.approx(1.6**0.5)


def test_factor_lists_of_the_wrong_length_are_rejected(longrope_dir: Path,
                                                       tmp_path: Path) -> None:
    raw = json.loads((longrope_dir / "config.json").read_text())
    raw["rope_scaling"]["long_factor"] = [1.0] * 3
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="rope_scaling.long_factor must list head_dim // 2 = 8"):
        load_model_config(str(tmp_path))
