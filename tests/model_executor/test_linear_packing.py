"""Linear layers packed for oneDNN after loading: same outputs, dense copies released."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine_core.model_executor.layers.linear import Linear, pack_linear_weights
from engine_core.model_executor.loader import load_model
from engine_core.model_executor.model_config import load_model_config
from engine_core.model_executor.tiny_model import make_tiny_model
from kernels import cpu_linear

pytestmark = pytest.mark.skipif(cpu_linear.unavailable_reason() is not None,
                                reason=f"oneDNN linear unavailable: "
                                       f"{cpu_linear.unavailable_reason()}")


def test_a_packed_layer_computes_what_it_did(tmp_path: Path) -> None:
    layer = Linear(48, 24, bias=True)
    x = torch.randn(5, 48)
    with torch.inference_mode():
        before = layer(x)
        assert layer.pack(keep_dense=False)
        assert layer.weight.device.type == "meta"  # the dense bytes are gone
        assert layer.in_features == 48 and layer.out_features == 24
        torch.testing.assert_close(layer(x), before, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tied", [False, True])
def test_every_linear_is_packed_and_a_shared_weight_kept(tmp_path: Path, tied: bool) -> None:
    model_dir = make_tiny_model(tmp_path / "m", tie_word_embeddings=tied)
    model = load_model(load_model_config(str(model_dir), "float32"), torch.device("cpu"))
    ids = torch.tensor([1, 5, 9])
    with torch.inference_mode():
        logits_before = model.compute_logits(model.model.embed_tokens(ids))
        linears = [m for m in model.modules() if isinstance(m, Linear)]
        assert pack_linear_weights(model) == len(linears)
        # The embedding still reads the table a tied lm_head shares; the rest are released.
        assert model.model.embed_tokens.weight.device.type == "cpu"
        assert (model.lm_head.weight.device.type == "cpu") == tied
        assert model.model.layers[0].mlp.down_proj.weight.device.type == "meta"
        torch.testing.assert_close(model.compute_logits(model.model.embed_tokens(ids)),
                                   logits_before, rtol=1e-6, atol=1e-6)
        assert pack_linear_weights(model) == 0  # already packed: nothing to do
