"""The Triton GGUF linear kernel (strand/kernels/gguf_linear_triton.py: Q8_0, Q4_0, Q4_1 blocks read
packed, for CUDA) against the pure-torch reference on fresh random blocks; on CPU through the
interpreter (float32 only there: it has no half-precision dot)."""

from __future__ import annotations

import pytest
import torch

from strand.kernels.gguf_linear_ref import Q4_1, Q5_0, Q8_0, gguf_linear_ref
from strand.kernels.gguf_linear_triton import TYPES, gguf_linear_triton
from tests.kernels.conftest import DEVICE
from tests.kernels.test_cpu_gguf_linear import random_packed

QTYPES = sorted(TYPES)  # Q4_0, Q4_1, Q8_0 (the rest are read over CPU tiles only)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 40, 64), (3, 77, 96), (4, 33, 32), (17, 50, 160)])
def test_kernel_matches_the_reference(qtype: int, m: int, n: int, k: int) -> None:
    # n off BLOCK_N's multiples, K one block and an odd number of blocks (a half-empty last step),
    # m past one 16-row tile.
    g = torch.Generator().manual_seed(qtype * 100 + m + n)
    packed = random_packed(n, k, qtype, seed=m + n + k)
    x = torch.randn(m, k, generator=g)
    bias = torch.randn(n, generator=g) if m % 2 else None
    got = gguf_linear_triton(x.to(DEVICE), packed.to(DEVICE), qtype,
                             None if bias is None else bias.to(DEVICE))
    want = gguf_linear_ref(x.double(), packed, qtype, None if bias is None else bias.double())
    assert got.shape == (m, n) and got.dtype == torch.float32
    scale = float(want.abs().max()) + 1.0
    torch.testing.assert_close(got.cpu().double(), want.double(), atol=2e-5 * scale, rtol=1e-5)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the interpreter has no half-precision dot")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_activations_keep_their_dtype(dtype: torch.dtype) -> None:
    packed = random_packed(64, 128, Q4_1, seed=1)
    x = torch.randn(2, 128).to(dtype)
    got = gguf_linear_triton(x.to(DEVICE), packed.to(DEVICE), Q4_1)
    assert got.dtype == dtype
    want = gguf_linear_ref(x, packed, Q4_1)
    torch.testing.assert_close(got.cpu().float(), want.to(dtype).float(), atol=2e-2, rtol=1e-2)


def test_bad_shapes_name_what_is_wrong() -> None:
    packed = random_packed(4, 64, Q8_0, seed=0).to(DEVICE)
    with pytest.raises(ValueError, match=r"packed must be \[N, 68\] uint8"):
        gguf_linear_triton(torch.randn(1, 64, device=DEVICE), packed[:, :34], Q8_0)
    with pytest.raises(ValueError, match="qtype must be one of"):
        gguf_linear_triton(torch.randn(1, 64, device=DEVICE), packed, 11)  # Q3_K
    with pytest.raises(ValueError, match="the others are read over CPU tiles"):
        gguf_linear_triton(torch.randn(1, 64, device=DEVICE), packed, Q5_0)
    with pytest.raises(ValueError, match="bias must have 4 values"):
        gguf_linear_triton(torch.randn(1, 64, device=DEVICE), packed, Q8_0,
                           torch.zeros(5, device=DEVICE))


@pytest.mark.parametrize(("rows", "takes_triton"), [(1, True), (64, True), (65, False)])
def test_the_layer_takes_the_kernel_for_few_rows_on_cuda(monkeypatch: pytest.MonkeyPatch,
                                                         rows: int, takes_triton: bool) -> None:
    # On CPU tensors through the interpreter, routed as on CUDA.
    from strand.engine_core.model_executor.layers.gguf_linear import GGUFLinear
    from strand.kernels import _triton
    from strand.kernels import gguf_linear_triton as module

    launched: list[int] = []
    real = module.gguf_linear_triton

    def recording(*args: object, **kwargs: object) -> torch.Tensor:
        launched.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_triton, "runs_triton", lambda t: True)
    monkeypatch.setattr(module, "gguf_linear_triton", recording)
    packed = random_packed(48, 64, Q4_1, seed=2)
    layer = GGUFLinear(packed.to(DEVICE), Q4_1, 64, torch.randn(48).to(DEVICE))
    x = torch.randn(rows, 64)
    with torch.inference_mode():
        got = layer(x.to(DEVICE))
    assert bool(launched) == takes_triton
    assert layer.bias is not None
    want = gguf_linear_ref(x, packed, Q4_1, layer.bias.cpu())
    torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)
