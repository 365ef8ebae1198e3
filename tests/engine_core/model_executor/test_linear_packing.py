"""Linear layers packed for oneDNN or into float32 panels after loading: same outputs, dense
copies released where nothing reads them; a few rows go to the few-row kernel, which reads the
dense weight, or to the panels where they are the layer's only copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core.model_executor.layers import linear as linear_layer
from strand.engine_core.model_executor.layers.linear import Linear, pack_linear_weights
from strand.engine_core.model_executor.loader import load_model
from strand.engine_core.model_executor.model_config import load_model_config
from strand.kernels import cpu_linear, cpu_linear_panels, cpu_linear_panels_bf16
from strand.testing.tiny_model import make_tiny_model

pytestmark = pytest.mark.skipif(cpu_linear.unavailable_reason() is not None,
                                reason=f"oneDNN linear unavailable: "
                                       f"{cpu_linear.unavailable_reason()}")


def test_a_packed_layer_computes_what_it_did(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear_layer, "small_m_applies", lambda weight: False)
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
        lm_head: Any = model.lm_head
        assert (lm_head.weight.device.type == "cpu") == (tied or lm_head.small_m)
        layer0: Any = model.model.layers[0]
        down = layer0.mlp.down_proj
        assert (down.weight.device.type == "meta") == (not down.small_m)
        torch.testing.assert_close(model.compute_logits(model.model.embed_tokens(ids)),
                                   logits_before, rtol=1e-6, atol=1e-6)
        assert pack_linear_weights(model) == 0  # already packed: nothing to do


@pytest.mark.parametrize("keep_dense", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [0, 1, 2, 3, 4, 5, 9])
def test_a_few_rows_read_the_dense_weight_or_the_panels_that_are_the_only_copy(
        monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, rows: int,
        keep_dense: bool) -> None:
    if not cpu_linear.small_m_applies(torch.empty(4, 4)):
        pytest.skip("CPU kernels not built")
    monkeypatch.setenv("STRAND_KEEP_DENSE_WEIGHTS", "1" if keep_dense else "0")
    layer = Linear(75, 41, bias=True).to(dtype)  # not multiples of the vector width
    x = torch.randn(rows, 75).to(dtype)
    # Panels (float32 or bfloat16) serve every row count: they are the layer's only copy.
    panels = cpu_linear_panels if dtype == torch.float32 else cpu_linear_panels_bf16
    one_copy = panels.chosen() and not keep_dense
    with torch.inference_mode():
        want = torch.nn.functional.linear(x.float(), layer.weight.float(), layer.bias.float())
        layer.pack(keep_dense=False)
        assert layer.panels_only == one_copy
        assert layer.small_m == (layer.weight.device.type == "cpu") == (not one_copy)
        small_calls: list[int] = []
        real = linear_layer.linear_small

        def counting_small(x: torch.Tensor, w: torch.Tensor, b: Any) -> torch.Tensor:
            small_calls.append(x.shape[0])
            return real(x, w, b)

        monkeypatch.setattr(linear_layer, "linear_small", counting_small)
        got = layer(x)
    assert small_calls == ([rows] if 0 < rows <= cpu_linear.SMALL_M and not one_copy else [])
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * 4)


def test_linear_small_names_what_it_refuses() -> None:
    if not cpu_linear.small_m_applies(torch.empty(4, 4)):
        pytest.skip("CPU kernels not built")
    w = torch.randn(8, 16)
    with pytest.raises(ValueError, match="1 <= M <= 4"):
        cpu_linear.linear_small(torch.randn(5, 16), w, None)
    with pytest.raises(ValueError, match="x has 12 features, the weight takes 16"):
        cpu_linear.linear_small(torch.randn(2, 12), w, None)
    with pytest.raises(ValueError, match="weight's dtype"):
        cpu_linear.linear_small(torch.randn(2, 16).bfloat16(), w, None)


def test_bfloat16_without_onednn_bf16_goes_through_a_float32_copy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # As on an AVX2-only CPU: oneDNN takes float32 only.
    real_pack = linear_layer.pack_weight
    monkeypatch.setattr(linear_layer, "pack_weight",
                        lambda w, **kw: None if w.dtype == torch.bfloat16 else real_pack(w, **kw))
    layer = Linear(64, 24, bias=True).to(torch.bfloat16)
    x = torch.randn(16, 64).bfloat16()
    with torch.inference_mode():
        want = torch.nn.functional.linear(x.float(), layer.weight.float(), layer.bias.float())
        assert layer.pack(keep_dense=False)
        assert layer.packed is not None and layer.packed.dtype == torch.float32
        got = layer(x)
    assert got.dtype == torch.bfloat16
    # One bfloat16 rounding of float32 sums (the order of the sums may differ: one step at most).
    torch.testing.assert_close(got.float(), want, rtol=8e-3, atol=1e-2)


@pytest.mark.parametrize("outputs", [37, 1001])
@pytest.mark.parametrize("features", [32, 75, 600])
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_linear_small_in_bfloat16_sums_every_feature(features: int, rows: int,
                                                     outputs: int) -> None:
    # Where the CPU has AVX512_BF16 the kernel takes 32 features a step and masks the rest:
    # whole steps, a remainder, and many steps, against float32 sums of the same values; weight
    # rows in groups of 8 (1-2 rows of x) or 4, a partial group last, split over the threads.
    if not cpu_linear.small_m_applies(torch.empty(4, 4)):
        pytest.skip("CPU kernels not built")
    g = torch.Generator().manual_seed(features * 10 + rows + outputs)
    x = torch.randn(rows, features, generator=g).bfloat16()
    w = torch.randn(outputs, features, generator=g).bfloat16()
    b = torch.randn(outputs, generator=g).bfloat16()
    want = torch.nn.functional.linear(x.float(), w.float(), b.float())
    got = cpu_linear.linear_small(x, w, b)
    assert got.dtype == torch.bfloat16
    # One bfloat16 rounding of float32 sums: within one bfloat16 step of the float32 result.
    torch.testing.assert_close(got.float(), want, rtol=8e-3, atol=8e-3 * want.abs().max().item())
