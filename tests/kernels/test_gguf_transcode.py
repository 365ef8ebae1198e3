"""llama.cpp's other weight types rewritten into the packed kernels' block types
(strand/kernels/gguf_transcode.py): bit for bit the weights the `gguf` package's dequantization gives
(transformers' oracle), on random blocks (every bit pattern of quants and 6-bit scales) and on
blocks made from weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from strand.kernels.gguf_linear_ref import (
    BLOCK_BYTES,
    IQ4_F,
    NAMES,
    Q3_F,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_F,
    Q6_F,
    Q8_0,
    Q8_F,
    dequantize_ref,
)
from strand.kernels.gguf_transcode import (
    IQ4_NL,
    IQ4_XS,
    NATIVE,
    Q3_K,
    Q5_K,
    Q6_K,
    SOURCE_BLOCK,
    SOURCE_NAMES,
    common_type,
    transcode,
)
from tests.kernels.test_cpu_gguf_linear import needs_kernels

gguf = pytest.importorskip("gguf")

# Where each type's float16 fields start: d (and m / dmin); Q6_K's and Q3_K's d are their last
# 2 bytes.
_HALVES = {Q4_0: [0], Q4_1: [0, 2], Q8_0: [0], Q5_0: [0], Q5_1: [0, 2], Q4_K: [0, 2],
           Q5_K: [0, 2], Q6_K: [208], Q3_K: [108], IQ4_NL: [0], IQ4_XS: [0]}


def random_rows(ggml_type: int, n: int, k: int, seed: int) -> np.ndarray:
    """[n, row bytes]: random bytes, float16 scales of a model's magnitude (either sign)."""
    rng = np.random.default_rng(seed)
    weights, size = SOURCE_BLOCK[ggml_type]
    blocks = rng.integers(0, 256, (n * k // weights, size), dtype=np.uint8)
    for at in _HALVES[ggml_type]:
        half = np.asarray(rng.standard_normal(blocks.shape[0]) * 0.02, dtype=np.float16)
        blocks[:, at:at + 2] = half.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(n, -1)


def _oracle(rows: np.ndarray, ggml_type: int) -> torch.Tensor:
    n = rows.shape[0]
    return torch.from_numpy(np.asarray(gguf.quants.dequantize(rows, ggml_type)).reshape(n, -1))


@pytest.mark.parametrize("ggml_type", sorted(SOURCE_NAMES))
def test_each_type_is_rewritten_bit_for_bit(ggml_type: int) -> None:
    rows = random_rows(ggml_type, 24, 512, seed=ggml_type)
    want = _oracle(rows, ggml_type)
    wider = {Q5_0: {Q8_0}, IQ4_NL: {Q8_0}, Q3_K: {Q6_F}}.get(ggml_type, set())
    targets = {NATIVE[ggml_type], Q8_F} | wider
    for target in sorted(targets):
        got = transcode(rows, ggml_type, target)
        assert got.shape == (24, 512 // 32 * BLOCK_BYTES[target])
        assert torch.equal(dequantize_ref(torch.from_numpy(got), target), want), NAMES[target]


@pytest.mark.parametrize("name", ["Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"])
def test_blocks_made_from_weights_are_rewritten_bit_for_bit(name: str) -> None:
    from tests.engine_core.model_executor.kquants import QUANTIZERS

    w = np.random.default_rng(1).standard_normal((32, 768)).astype(np.float32) * 0.04
    rows = QUANTIZERS[name](w)
    ggml_type = int(getattr(gguf.GGMLQuantizationType, name))
    want = _oracle(rows, ggml_type)
    # The blocks hold w: Q3_K's 8 levels a 16 within a step of its scale, the others closer.
    assert float((want - torch.from_numpy(w)).abs().max()) < (0.05 if name == "Q3_K" else 0.02)
    got = transcode(rows, ggml_type, NATIVE[ggml_type])
    assert torch.equal(dequantize_ref(torch.from_numpy(got), NATIVE[ggml_type]), want)


@pytest.mark.parametrize(("types", "want"), [
    ([Q4_K, Q4_K], Q4_K), ([Q6_K], Q6_F), ([Q5_K, Q5_K, Q5_K], Q5_F), ([Q5_0], Q5_0),
    ([Q5_0, Q5_0, Q8_0], Q8_0), ([Q4_1], Q4_1), ([Q4_K, Q4_K, Q6_K], Q8_F), ([Q4_0, Q8_0], Q8_F),
    ([Q5_1, Q4_1], Q8_F), ([Q5_1], Q5_1), ([Q3_K], Q3_F), ([Q3_K, Q3_K, Q6_K], Q6_F),
    ([Q3_K, Q4_K], Q8_F), ([IQ4_NL], IQ4_NL), ([IQ4_NL, Q5_0, Q8_0], Q8_0), ([IQ4_XS], IQ4_F),
    ([IQ4_XS, IQ4_NL], Q8_F),
])
def test_a_layers_parts_share_the_type_that_holds_each_exactly(types: list[int],
                                                               want: int) -> None:
    assert common_type(types) == want


def test_types_not_read_packed_are_named() -> None:
    with pytest.raises(ValueError, match="GGML type 10 is not read packed"):  # Q2_K
        common_type([Q4_K, 10])
    with pytest.raises(ValueError, match="Q6_K rows cannot be written as Q4_K"):
        transcode(random_rows(Q6_K, 1, 256, 0), Q6_K, Q4_K)
    with pytest.raises(ValueError, match="Q4_K rows cannot be written as Q8_0"):
        transcode(random_rows(Q4_K, 1, 256, 0), Q4_K, Q8_0)
    with pytest.raises(ValueError, match="Q6_K rows cannot be written as Q3_F"):  # 3 bits
        transcode(random_rows(Q6_K, 1, 256, 0), Q6_K, Q3_F)


@needs_kernels
def test_the_kernels_q6_k_rewrite_is_the_numpy_rewrites_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from strand.kernels import gguf_transcode

    rows = random_rows(Q6_K, 40, 1024, seed=7)
    fast = gguf_transcode._q6_k_kernel(rows)
    assert fast is not None and fast.shape == (40, 1024 // 32 * BLOCK_BYTES[Q6_F])
    read_only = rows.copy()
    read_only.flags.writeable = False  # as the file's memory map is
    assert np.array_equal(transcode(read_only, Q6_K, Q6_F), fast)
    monkeypatch.setattr(gguf_transcode, "_q6_k_kernel", lambda rows: None)
    assert np.array_equal(transcode(rows, Q6_K, Q6_F), fast)


@needs_kernels
def test_the_kernels_q6_k_rewrite_names_what_is_wrong() -> None:
    from strand.kernels._cpu_build import KERNELS

    module = KERNELS.require()
    rows = torch.zeros(2, 209, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="Q6_K rows"):
        module.gguf_q6k_to_q6f(torch.zeros(2, 224, dtype=torch.uint8), rows)
    rows = torch.zeros(2, 210, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="Q6_F rows"):
        module.gguf_q6k_to_q6f(torch.zeros(2, 223, dtype=torch.uint8), rows)
