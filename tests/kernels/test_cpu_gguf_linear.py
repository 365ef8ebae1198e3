"""The GGUF-packed linear kernels (Q8_0, Q4_0, Q4_1; Q5_0, Q5_1 and Strand's own types, read
over tiles only, in test_cpu_gguf_tiles.py) against the pure-torch reference, on random blocks; the reference against the `gguf` package's own dequantization. CI runs this file again
under STRAND_CPU_ISA=avx2, so both the AVX-512 (VNNI where the CPU has it) and the AVX2 integer
dot products are compared.

The few-row kernel rounds x to int8 blocks first (as llama.cpp does): it is compared with the
reference of that (gguf_linear_int8_ref: same rounding, float64 sums) to float32 summation
error, and with the float product within the bound the rounding allows (int8_rounding_bound)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from strand.kernels import cpu_gguf_linear
from strand.kernels._cpu_build import KERNELS
from strand.kernels.gguf_linear_ref import (
    BLOCK_BYTES,
    IQ4_F,
    IQ4_NL,
    NAMES,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_F,
    Q8_0,
    Q8_F,
    dequantize_ref,
    gguf_linear_int8_ref,
    gguf_linear_ref,
    int8_rounding_bound,
)

QTYPES = [Q4_0, Q4_1, Q8_0]  # read as rows too (the others over tiles only)
GGML_TYPES = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, IQ4_NL]  # the `gguf` package's own
needs_kernels = pytest.mark.skipif(KERNELS.module() is None,
                                   reason=f"CPU kernels unavailable: "
                                          f"{KERNELS.unavailable_reason()}")


def width(qtype: int, k: int) -> int:
    """A row length the type takes: Q4_K's rows are whole 256-weight super-blocks (k rounded up
    to one), the others' whole blocks of 32."""
    return -(-k // 256) * 256 if qtype == Q4_K else k


def random_packed(n: int, k: int, qtype: int, seed: int) -> torch.Tensor:
    """[n, k / 32 * block bytes] random blocks: random quants, scales (and offsets) drawn as
    float16 of a model's magnitude (random bytes there would be NaN or huge); Strand's own types
    hold them as float32, as the K-quants' transcoding does (strand/kernels/gguf_transcode.py)."""
    g = torch.Generator().manual_seed(seed)
    if qtype == Q4_K:  # per 256 weights: float16 d and dmin, random scales, mins and nibbles
        assert k % 256 == 0, k
        blocks = torch.randint(0, 256, (n, k // 256, 144), generator=g, dtype=torch.uint8)
        blocks[..., 0:2] = (torch.rand(n, k // 256, 1, generator=g) * 2e-3 + 1e-4).half().view(
            torch.uint8)
        blocks[..., 2:4] = (torch.rand(n, k // 256, 1, generator=g) * 2e-3).half().view(
            torch.uint8)
        return blocks.reshape(n, -1)
    blocks = torch.randint(0, 256, (n, k // 32, BLOCK_BYTES[qtype]), generator=g,
                           dtype=torch.uint8)

    def field(offset: bool) -> torch.Tensor:
        if offset:
            return ((torch.rand(n, k // 32, 1, generator=g) - 0.5) * 0.2).half()
        return (torch.rand(n, k // 32, 1, generator=g) * 0.05 + 1e-3).half()

    # Each type's head: (fields, float32?, which fields are offsets m). Q6_F's float16 d is
    # followed by its two int8 scales, left random (any int8).
    fields, f32, offsets = {Q4_1: (2, False, {1}), Q5_1: (2, False, {1}), Q5_F: (2, True, {1}),
                            Q8_F: (3, True, {2}), IQ4_F: (1, True, set())
                            }.get(qtype, (1, False, set()))
    width = 4 if f32 else 2
    for i in range(fields):
        value = field(i in offsets)
        blocks[..., width * i:width * (i + 1)] = (value.float() if f32 else value).view(torch.uint8)
    return blocks.reshape(n, -1)


@pytest.mark.parametrize("qtype", GGML_TYPES)
def test_reference_dequantizes_as_the_gguf_package_does(qtype: int) -> None:
    gguf = pytest.importorskip("gguf")
    packed = random_packed(7, width(qtype, 96), qtype, seed=qtype)
    want = gguf.quants.dequantize(packed.numpy(), gguf.GGMLQuantizationType(qtype))
    assert torch.equal(dequantize_ref(packed, qtype), torch.from_numpy(np.asarray(want)))


@needs_kernels
@pytest.mark.parametrize("qtype", sorted(NAMES))
@pytest.mark.parametrize("shape", [(3, 32), (77, 96), (130, 576)])
def test_kernel_dequantizes_bit_for_bit(qtype: int, shape: tuple[int, int]) -> None:
    n, k = shape[0], width(qtype, shape[1])
    packed = random_packed(n, k, qtype, seed=n + k + qtype)
    got = cpu_gguf_linear.gguf_dequantize(packed, qtype, k)
    assert torch.equal(got, dequantize_ref(packed, qtype))


def _assert_int8_product(got: torch.Tensor, x: torch.Tensor, packed: torch.Tensor, qtype: int,
                         bias: torch.Tensor | None = None) -> None:
    """got is the int8-activation product to float32 summation error, and the float product
    within the rounding bound."""
    want = gguf_linear_int8_ref(x, packed, qtype, bias)
    scale = float(want.abs().max()) + 1.0
    torch.testing.assert_close(got.double(), want, atol=2e-5 * scale, rtol=1e-5)
    exact = gguf_linear_ref(x.double(), packed, qtype, bias).double()
    bound = int8_rounding_bound(x, packed, qtype)
    assert bool(((got.double() - exact).abs() <= bound + 2e-5 * scale).all())


@needs_kernels
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", [(1, 32), (77, 96), (258, 576)])
def test_small_rows_match_the_int8_reference(qtype: int, m: int, shape: tuple[int, int]) -> None:
    n, k = shape
    g = torch.Generator().manual_seed(m * 1000 + n + qtype)
    packed = random_packed(n, k, qtype, seed=m + n + k)
    x = torch.randn(m, k, generator=g)
    x[0, :32] = 0.0  # an all-zero block: scale 0, no division by it
    bias = torch.randn(n, generator=g) if m % 2 else None
    got = cpu_gguf_linear.gguf_linear_small(x, packed, qtype, bias)
    assert got.shape == (m, n) and got.dtype == torch.float32
    _assert_int8_product(got, x, packed, qtype, bias)


@needs_kernels
def test_activations_round_to_nearest_even_in_blocks_of_32() -> None:
    # Q8_0 unit rows (d = 1, one quant of 1): output j is x's block scale times its int8 q_j.
    k = 64
    packed = torch.zeros(k, k // 32, 34, dtype=torch.uint8)
    packed[..., :2] = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)
    for j in range(k):
        packed[j, j // 32, 2 + j % 32] = 1
    x = torch.zeros(1, k)
    x[0, :5] = torch.tensor([0.5, 1.5, 2.5, -2.5, 127.0])  # block 0: scale 1, ties to even
    x[0, 32:35] = torch.tensor([-254.0, 3.0, 1.0])  # block 1: scale 2: -127, 1.5 -> 2, 0.5 -> 0
    got = cpu_gguf_linear.gguf_linear_small(x, packed.reshape(k, -1), Q8_0)
    want = torch.zeros(1, k)
    want[0, :5] = torch.tensor([0.0, 2.0, 2.0, -2.0, 127.0])
    want[0, 32:35] = torch.tensor([-254.0, 4.0, 0.0])
    assert torch.equal(got, want)


@needs_kernels
@pytest.mark.parametrize("qtype", QTYPES)
def test_bfloat16_rows_are_summed_in_float32(qtype: int) -> None:
    g = torch.Generator().manual_seed(qtype)
    packed = random_packed(64, 128, qtype, seed=5)
    x, bias = torch.randn(2, 128, generator=g).bfloat16(), torch.randn(64, generator=g).bfloat16()
    got = cpu_gguf_linear.gguf_linear_small(x, packed, qtype, bias)
    assert got.dtype == torch.bfloat16
    want = gguf_linear_int8_ref(x, packed, qtype, bias)  # same bf16 inputs, int8-rounded x
    torch.testing.assert_close(got.float(), want.bfloat16().float(), atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("m", [3, 9, 16, 17, 40])
def test_any_number_of_rows_matches_the_reference(qtype: int, m: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Up to 16 rows: the packed kernel, 4 rows at a time (int8 x); more: the unpacked weight.
    calls: list[int] = []
    real = cpu_gguf_linear.gguf_dequantize

    def counting(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(cpu_gguf_linear, "gguf_dequantize", counting)
    g = torch.Generator().manual_seed(11)
    packed = random_packed(40, 64, qtype, seed=qtype + 3)
    x, bias = torch.randn(m, 64, generator=g), torch.randn(40, generator=g)
    with torch.inference_mode():
        got = cpu_gguf_linear.gguf_linear(x, packed, qtype, 64, bias)
    assert got.shape == (m, 40)
    if KERNELS.module() is not None and m <= cpu_gguf_linear.CHUNKED_M:
        assert not calls
        _assert_int8_product(got, x, packed, qtype, bias)
    else:
        assert bool(calls)
        torch.testing.assert_close(got, gguf_linear_ref(x, packed, qtype, bias), atol=1e-4,
                                   rtol=1e-4)


def test_bad_packed_weights_name_what_is_wrong() -> None:
    packed = random_packed(4, 64, Q8_0, seed=0)
    with pytest.raises(ValueError, match="qtype must be one of"):
        cpu_gguf_linear.gguf_dequantize(packed, 11, 64)  # Q3_K
    with pytest.raises(ValueError, match="multiple of 256 for Q4_K, got 64"):
        cpu_gguf_linear.gguf_dequantize(packed, Q4_K, 64)
    with pytest.raises(ValueError, match="multiple of 32"):
        cpu_gguf_linear.gguf_dequantize(packed, Q8_0, 48)
    with pytest.raises(ValueError, match="takes 68 bytes, got 34"):
        cpu_gguf_linear.gguf_dequantize(packed[:, :34].contiguous(), Q8_0, 64)
    with pytest.raises(ValueError, match="uint8"):
        cpu_gguf_linear.gguf_dequantize(packed.float(), Q8_0, 64)


@needs_kernels
def test_small_rows_refuse_more_than_four() -> None:
    packed = random_packed(4, 64, Q8_0, seed=0)
    with pytest.raises(ValueError, match="1 <= M <= 4"):
        cpu_gguf_linear.gguf_linear_small(torch.randn(5, 64), packed, Q8_0)


@needs_kernels
@pytest.mark.parametrize("qtype", QTYPES)
def test_rows_split_across_threads_give_the_one_thread_result(qtype: int) -> None:
    # 2 threads split the 1003 rows into row groups (the last one partial): each row's sum is
    # made by one thread in the same order, so the results are equal bit for bit.
    g = torch.Generator().manual_seed(qtype)
    packed = random_packed(1003, 256, qtype, seed=9)
    x = torch.randn(3, 256, generator=g)
    one = cpu_gguf_linear.gguf_linear_small(x, packed, qtype)
    one_dense = cpu_gguf_linear.gguf_dequantize(packed, qtype, 256)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = cpu_gguf_linear.gguf_linear_small(x, packed, qtype)
        two_dense = cpu_gguf_linear.gguf_dequantize(packed, qtype, 256)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two) and torch.equal(one_dense, two_dense)


@pytest.mark.parametrize("qtype", QTYPES)
def test_many_rows_unpack_a_large_weight_tile_by_tile(qtype: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 KB tiles of 64 rows x 32 weights: 150 rows take 3 tiles, the last one partial.
    monkeypatch.setattr(cpu_gguf_linear, "TILE_BYTES", 8 << 10)
    tiles: list[int] = []
    real = cpu_gguf_linear.gguf_dequantize

    def counting(packed: torch.Tensor, *args: Any) -> Any:
        tiles.append(packed.shape[0])
        return real(packed, *args)

    monkeypatch.setattr(cpu_gguf_linear, "gguf_dequantize", counting)
    g = torch.Generator().manual_seed(qtype)
    packed = random_packed(150, 32, qtype, seed=4)
    x, bias = torch.randn(20, 32, generator=g), torch.randn(150, generator=g)
    with torch.inference_mode():
        got = cpu_gguf_linear.gguf_linear(x, packed, qtype, 32, bias)
    assert tiles == [64, 64, 22]
    torch.testing.assert_close(got, gguf_linear_ref(x, packed, qtype, bias), atol=1e-4,
                               rtol=1e-4)


def test_dequantize_into_a_buffer_checks_its_shape() -> None:
    packed = random_packed(4, 64, Q8_0, seed=0)
    buffer = torch.empty(4, 64)
    assert cpu_gguf_linear.gguf_dequantize(packed, Q8_0, 64, buffer) is buffer
    assert torch.equal(buffer, dequantize_ref(packed, Q8_0))
    with pytest.raises(ValueError, match=r"out must be a contiguous float32 \[4, 64\]"):
        cpu_gguf_linear.gguf_dequantize(packed, Q8_0, 64, torch.empty(4, 32))


@needs_kernels
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_input_makes_its_row_nan_not_a_number(qtype: int, bad: float) -> None:
    # Rounding NaN or infinity to int8 has no value; the row's outputs say so, as float would.
    packed = random_packed(8, 64, qtype, seed=1)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    x[1, 40] = bad
    got = cpu_gguf_linear.gguf_linear_small(x, packed, qtype)
    assert bool(got[1].isnan().all())
    _assert_int8_product(got[:1], x[:1], packed, qtype)
