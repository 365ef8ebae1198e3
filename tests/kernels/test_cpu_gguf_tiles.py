"""GGUF weights regrouped into 16-row tiles (strand/kernels/csrc/gguf_tiled.cpp), the layout GGUFLinear
keeps on CPU: the regrouping against its pure-torch statement (tile_ref / untile_ref), and the
decode kernel over tiles against the int8 reference, as the row kernel is compared
(test_cpu_gguf_linear.py). CI runs this file again under STRAND_CPU_ISA=avx2, so the AVX-512
(VNNI where the CPU has it) and AVX2 builds are both compared; STRAND_CPU_ISA=generic runs the
plain C++ lanes."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from strand.engine_core.model_executor.layers.gguf_linear import GGUFLinear
from strand.kernels import cpu_gguf_linear
from strand.kernels.gguf_linear_ref import (
    BLOCK_BYTES,
    IQ4_F,
    NAMES,
    PLANES,
    Q3_F,
    Q4_1,
    Q4_K,
    Q5_1,
    Q5_F,
    Q6_F,
    Q8_0,
    Q8_F,
    dequantize_ref,
    gguf_linear_int8_ref,
    gguf_linear_ref,
    tile_ref,
    untile_ref,
)
from tests.kernels.test_cpu_gguf_linear import (
    _assert_int8_product,
    needs_kernels,
    random_packed,
    width,
)

QTYPES = sorted(NAMES)  # GGML's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Strand's own
BLOCK_TYPES = [q for q in QTYPES if q != Q4_K]  # a head per block of 32


@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_tile_ref_puts_each_rows_quant_words_side_by_side(qtype: int) -> None:
    packed = random_packed(32, 96, qtype, seed=qtype)
    tiles = tile_ref(packed, qtype)
    width = 4 if qtype in (Q5_F, Q8_F, IQ4_F) else 2  # bytes a head field (Q6_F: d, sc pair)
    fields = {Q4_1: 2, Q5_1: 2, Q5_F: 2, Q6_F: 2, Q3_F: 2, Q8_F: 3}.get(qtype, 1)
    planes = PLANES.get(qtype, 0)
    size, head = BLOCK_BYTES[qtype], fields * width
    quant_at = head + 4 * planes
    assert tiles.shape == (2, 3, 16 * size)
    # tile 1, block 2, chunk 3, row 5: row 21's block 2, quant bytes 12..15
    row, block = packed[21].reshape(3, size), tiles[1, 2]
    assert torch.equal(block[3 * 64 + 5 * 4:3 * 64 + 5 * 4 + 4],
                       row[2, quant_at + 12:quant_at + 16])
    quant_bytes = 16 * (size - quant_at)
    for p in range(planes):  # lane 4 * 5 + j: row 21's fifth (sixth) bit of quant 4g + j
        word = int.from_bytes(bytes(row[2, head + 4 * p:head + 4 * p + 4].tolist()), "little")
        for g in range(8):
            for j in range(4):
                vec, bit = (0, g) if planes == 1 else (g // 4, 2 * (g % 4) + p)
                lane = int(block[quant_bytes + 64 * vec + 4 * 5 + j])
                assert (lane >> bit) & 1 == (word >> (4 * g + j)) & 1
    fields_at = quant_bytes + 64 * planes
    for f in range(fields):  # field f of the 16 rows (d, then m, ...): row 5's is row 21's
        at = fields_at + (16 * f + 5) * width
        assert torch.equal(block[at:at + width], row[2, f * width:(f + 1) * width])
    assert torch.equal(untile_ref(tiles, qtype), packed)


def test_q4_k_tiles_go_by_super_block() -> None:
    packed = random_packed(32, 512, Q4_K, seed=3)
    tiles = tile_ref(packed, Q4_K)
    assert tiles.shape == (2, 16, 288)  # 8 tile-blocks per 256 weights, 16 x 18 bytes each
    row = packed[21].reshape(2, 144)  # tile 1, row 5; its super-block 1 is tile-blocks 8..15
    for j in range(8):  # tile-block j = 2g + h, chunk 3: bytes 16h + 12.. of group g's 32
        g, h = divmod(j, 2)
        at = 16 + 32 * g + 16 * h + 12
        assert torch.equal(tiles[1, 8 + j, 3 * 64 + 5 * 4:3 * 64 + 5 * 4 + 4], row[1, at:at + 4])
    head = torch.cat([tiles[1, 8 + j, 256:] for j in range(8)])  # the super-block's, by field
    assert torch.equal(head[2 * 5:2 * 5 + 2], row[1, 0:2])  # d
    assert torch.equal(head[32 + 2 * 5:32 + 2 * 5 + 2], row[1, 2:4])  # dmin
    for k in range(12):
        assert int(head[64 + 16 * k + 5]) == int(row[1, 4 + k])
    assert torch.equal(untile_ref(tiles, Q4_K), packed)


@needs_kernels
def test_rows_tiled_a_piece_at_a_time_into_one_tensor_are_the_whole_ones_tiles() -> None:
    # The loader tiles a large table a piece of rows at a time into its final tensor (out=):
    # the same bytes as tiling it whole.
    k = width(Q6_F, 256)
    packed = random_packed(64, k, Q6_F, seed=5)
    whole = cpu_gguf_linear.gguf_tile(packed, Q6_F, k)
    tiles = torch.empty_like(whole)
    for start in range(0, 64, 32):
        got = cpu_gguf_linear.gguf_tile(packed[start:start + 32], Q6_F, k,
                                        out=tiles[start // 16:start // 16 + 2])
        assert got.data_ptr() == tiles[start // 16].data_ptr()
    assert torch.equal(tiles, whole)
    with pytest.raises(ValueError, match="out must be contiguous uint8 tiles"):
        cpu_gguf_linear.gguf_tile(packed, Q6_F, k, out=tiles[:2])


@needs_kernels
def test_gguf_linear_keeps_tiles_made_before_it_as_they_are() -> None:
    packed = random_packed(48, 64, Q4_1, seed=2)
    tiles = cpu_gguf_linear.gguf_tile(packed, Q4_1, 64)
    layer, from_rows = GGUFLinear(tiles, Q4_1, 64), GGUFLinear(packed, Q4_1, 64)
    assert layer.packed.data_ptr() == tiles.data_ptr() and layer.out_features == 48
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert torch.equal(layer(x), from_rows(x))
    with pytest.raises(ValueError, match="16-row tiles of 64-weight Q4_1 rows"):
        GGUFLinear(tiles[:, :1].contiguous(), Q4_1, 64)


@needs_kernels
@pytest.mark.parametrize("qtype", QTYPES)
def test_kernel_tiles_as_the_reference_and_back(qtype: int) -> None:
    k = width(qtype, 576)
    packed = random_packed(48, k, qtype, seed=7)
    tiles = cpu_gguf_linear.gguf_tile(packed, qtype, k)
    assert torch.equal(tiles, tile_ref(packed, qtype))
    assert torch.equal(cpu_gguf_linear.gguf_dequantize(tiles, qtype, k),
                       dequantize_ref(packed, qtype))


@needs_kernels
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", [(16, 32), (80, 96), (272, 576)])
def test_small_rows_over_tiles_match_the_int8_reference(qtype: int, m: int,
                                                        shape: tuple[int, int]) -> None:
    n, k = shape[0], width(qtype, shape[1])
    g = torch.Generator().manual_seed(m * 1000 + n + qtype)
    packed = random_packed(n, k, qtype, seed=m + n + k)
    x = torch.randn(m, k, generator=g) * 3
    x[0, :32] = 0.0  # an all-zero block: scale 0
    x[-1, -32:] = -x[-1, -32:].abs()  # a block of negatives only (Q8_0's sum-of-x correction)
    bias = torch.randn(n, generator=g) if m % 2 else None
    got = cpu_gguf_linear.gguf_linear_small(x, tile_ref(packed, qtype), qtype, bias)
    assert got.shape == (m, n) and got.dtype == torch.float32
    _assert_int8_product(got, x, packed, qtype, bias)


@needs_kernels
def test_extreme_q8_quants_do_not_saturate() -> None:
    # Every quant -128 or 127 against x blocks of +-127 after rounding: the largest products
    # (vpmaddubsw's int16 pair sums are the tight spot on AVX2) must stay exact.
    n, k = 32, 64
    packed = torch.zeros(n, k // 32, 34, dtype=torch.uint8)
    packed[..., :2] = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)
    quants = torch.where(torch.arange(32) % 3 == 0, -128, 127).to(torch.int8)
    packed[..., 2:] = quants.view(torch.uint8)
    packed = packed.reshape(n, -1)
    x = torch.where(torch.arange(k) % 2 == 0, 1.0, -1.0).repeat(2, 1)
    x[1] = -1.0
    got = cpu_gguf_linear.gguf_linear_small(x, tile_ref(packed, Q8_0), Q8_0)
    want = gguf_linear_int8_ref(x, packed, Q8_0)  # x's blocks round exactly to +-127
    # A saturated pair sum would be off by thousands; float32 scaling is off by < 1e-6.
    torch.testing.assert_close(got.double(), want, atol=0, rtol=1e-6)


@needs_kernels
@pytest.mark.parametrize("qtype", QTYPES)
def test_bfloat16_rows_over_tiles(qtype: int) -> None:
    g = torch.Generator().manual_seed(qtype)
    k = width(qtype, 128)
    packed = random_packed(64, k, qtype, seed=5)
    x, bias = torch.randn(3, k, generator=g).bfloat16(), torch.randn(64, generator=g).bfloat16()
    got = cpu_gguf_linear.gguf_linear_small(x, tile_ref(packed, qtype), qtype, bias)
    assert got.dtype == torch.bfloat16
    want = gguf_linear_int8_ref(x, packed, qtype, bias)
    torch.testing.assert_close(got.float(), want.bfloat16().float(), atol=2e-2, rtol=1e-2)


@needs_kernels
@pytest.mark.parametrize("qtype", QTYPES)
def test_tiles_split_across_threads_give_the_one_thread_result(qtype: int) -> None:
    g = torch.Generator().manual_seed(qtype)
    tiles = tile_ref(random_packed(1008, 256, qtype, seed=9), qtype)
    x = torch.randn(2, 256, generator=g)
    one = cpu_gguf_linear.gguf_linear_small(x, tiles, qtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = cpu_gguf_linear.gguf_linear_small(x, tiles, qtype)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


@needs_kernels
@pytest.mark.parametrize("qtype", QTYPES)
def test_a_non_finite_input_makes_its_row_nan_over_tiles(qtype: int) -> None:
    k = width(qtype, 64)
    tiles = tile_ref(random_packed(16, k, qtype, seed=1), qtype)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(0))
    x[1, 3] = float("nan")
    got = cpu_gguf_linear.gguf_linear_small(x, tiles, qtype)
    assert bool(got[1].isnan().all()) and bool(got[0].isfinite().all())


@needs_kernels
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("m", [5, 13, 33, 70])
def test_many_rows_over_tiles_match_the_int8_reference(qtype: int, m: int) -> None:
    # A decode batch's or a prefill's rows take the int8 kernel too, kRowGroup rows a pass over
    # each tile (8 with AVX-512, 4 else): 13, 33 and 70 end in a short group; nothing is
    # unpacked to float32.
    n, k = 80, width(qtype, 256)
    g = torch.Generator().manual_seed(m * 100 + qtype)
    packed = random_packed(n, k, qtype, seed=m + qtype)
    x = torch.randn(m, k, generator=g) * 3
    x[m // 2, :32] = 0.0
    bias = torch.randn(n, generator=g) if m % 2 else None
    got = cpu_gguf_linear.gguf_linear(x, tile_ref(packed, qtype), qtype, k, bias)
    assert got.shape == (m, n) and got.dtype == torch.float32
    _assert_int8_product(got, x, packed, qtype, bias)


@needs_kernels
@pytest.mark.parametrize("qtype", [Q4_K, Q6_F, Q8_0])
def test_a_prefills_rows_go_in_blocks_and_keep_their_own_outputs(qtype: int) -> None:
    # 300 rows of 2048 (600 KB of int8 x) run in blocks of whole row groups (128, 128, 44), so
    # that a block's x stays in cache while each tile passes over it: the int8 product still,
    # and each row's outputs bit for bit those of the row alone or in a decode-sized batch.
    n, k = 48, width(qtype, 2048)
    packed = random_packed(n, k, qtype, seed=qtype)
    tiles = tile_ref(packed, qtype)
    x = torch.randn(300, k, generator=torch.Generator().manual_seed(qtype))
    got = cpu_gguf_linear.gguf_linear(x, tiles, qtype, k)
    _assert_int8_product(got, x, packed, qtype)
    for rows in (slice(0, 1), slice(120, 136), slice(250, 300), slice(299, 300)):
        assert torch.equal(got[rows], cpu_gguf_linear.gguf_linear(x[rows], tiles, qtype, k))


@needs_kernels
@pytest.mark.parametrize("qtype", QTYPES)
def test_a_rows_outputs_do_not_depend_on_the_rows_beside_it(qtype: int) -> None:
    # Each row is its own chains of instructions: a request's logits in a batch of 37 (split
    # 8 + 8 + 8 + 8 + 5 or 4 + ... + 1 between passes) are bit for bit its logits alone or in a batch of 3, at any
    # thread count, in float32 and bfloat16.
    k = width(qtype, 128)
    tiles = tile_ref(random_packed(1008, k, qtype, seed=11), qtype)
    x = torch.randn(37, k, generator=torch.Generator().manual_seed(qtype))
    threads = torch.get_num_threads()
    for dtype in (torch.float32, torch.bfloat16):
        xs = x.to(dtype)
        batch = cpu_gguf_linear.gguf_linear(xs, tiles, qtype, k)
        torch.set_num_threads(2)
        try:
            two = cpu_gguf_linear.gguf_linear(xs, tiles, qtype, k)
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(batch, two)
        for i in (0, 17, 36):
            assert torch.equal(batch[i], cpu_gguf_linear.gguf_linear(xs[i:i + 1], tiles, qtype,
                                                                     k)[0])
        assert torch.equal(batch[34:], cpu_gguf_linear.gguf_linear(xs[34:], tiles, qtype, k))


@pytest.mark.parametrize("qtype", QTYPES)
def test_without_the_kernels_many_rows_over_tiles_unpack_whole_tiles(
        qtype: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the C++ kernels (or off CPU) tiles are unpacked in pieces of whole tiles, 8 KB of
    # float32 here: 160 rows take 64 + 64 + 32.
    monkeypatch.setattr(cpu_gguf_linear, "kernels_apply", lambda packed: False)
    seen: list[int] = []
    real = cpu_gguf_linear.gguf_dequantize

    def counting(packed: torch.Tensor, *args: Any) -> Any:
        seen.append(cpu_gguf_linear.out_features(packed))
        return real(packed, *args)

    monkeypatch.setattr(cpu_gguf_linear, "gguf_dequantize", counting)
    g = torch.Generator().manual_seed(qtype)
    k = width(qtype, 32)
    monkeypatch.setattr(cpu_gguf_linear, "TILE_BYTES", (8 << 10) * k // 32)  # 64 rows a piece
    packed = random_packed(160, k, qtype, seed=4)
    x, bias = torch.randn(20, k, generator=g), torch.randn(160, generator=g)
    with torch.inference_mode():
        got = cpu_gguf_linear.gguf_linear(x, tile_ref(packed, qtype), qtype, k, bias)
    assert seen == [64, 64, 32]
    torch.testing.assert_close(got, gguf_linear_ref(x, packed, qtype, bias), atol=1e-4, rtol=1e-4)


@needs_kernels
def test_the_tiled_kernel_names_what_is_wrong() -> None:
    tiles = tile_ref(random_packed(16, 64, Q8_0, seed=0), Q8_0)
    with pytest.raises(ValueError, match=r"takes \[M >= 1, in\] and 3-D tiles"):
        cpu_gguf_linear.gguf_tiled_linear(torch.randn(0, 64), tiles, Q8_0)
    with pytest.raises(ValueError, match="bias must have 16 values"):
        cpu_gguf_linear.gguf_tiled_linear(torch.randn(5, 64), tiles, Q8_0, torch.randn(15))


def test_bad_tiles_name_what_is_wrong() -> None:
    tiles = tile_ref(random_packed(16, 64, Q8_0, seed=0), Q8_0)
    with pytest.raises(ValueError, match=r"tiles of 64-weight rows are \[tiles, 2, 544\]"):
        cpu_gguf_linear.gguf_dequantize(tiles[:, :1].contiguous(), Q8_0, 64)
    with pytest.raises(ValueError, match="a multiple of 16"):
        cpu_gguf_linear.gguf_tile(random_packed(8, 64, Q8_0, seed=0), Q8_0, 64)
    with pytest.raises(ValueError, match="takes GGUF rows"):
        cpu_gguf_linear.gguf_tile(tiles, Q8_0, 64)


@pytest.mark.parametrize("n", [48, 40])
def test_gguf_linear_keeps_tiles_on_cpu_where_rows_come_in_sixteens(n: int) -> None:
    packed = random_packed(n, 64, Q4_1, seed=n)
    layer = GGUFLinear(packed, Q4_1, 64)
    assert layer.out_features == n
    tiled = n % 16 == 0 and cpu_gguf_linear.kernels_apply(packed)
    assert layer.packed.dim() == (3 if tiled else 2)
    assert layer.packed.nbytes == packed.nbytes  # the same bytes, regrouped
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        got = layer(x)
    if cpu_gguf_linear.kernels_apply(packed):
        _assert_int8_product(got, x, packed, Q4_1)
    else:
        torch.testing.assert_close(got, gguf_linear_ref(x, packed, Q4_1), atol=1e-4, rtol=1e-4)


@needs_kernels
@pytest.mark.parametrize("qtype", [q for q in QTYPES if q not in (Q8_0, Q8_F, Q6_F)
                                   and PLANES.get(q, 0) < 2])
def test_the_largest_unsigned_quants_by_the_largest_activations_stay_exact(qtype: int) -> None:
    # Without VNNI, a block's int16 pair sums (vpmaddubsw) are added before they are widened:
    # every quant at its largest (15, or 31 with the fifth bit) against activations rounding to
    # +-127 is the largest they get (31 * 127 * 2 * 4 = 31496 < 32767), and must stay exact.
    from strand.kernels.gguf_linear_ref import _HEAD

    packed = random_packed(32, 256, qtype, seed=3)
    if qtype == Q4_K:
        packed.view(32, -1, 144)[..., 16:] = 255
    else:
        fields, width = _HEAD[qtype]
        packed.view(32, -1, BLOCK_BYTES[qtype])[..., fields * width:] = 255
    x = torch.ones(3, 256)
    x[1] = -1.0
    x[2, ::2] = -1.0
    got = cpu_gguf_linear.gguf_linear(x, tile_ref(packed, qtype), qtype, 256)
    want = gguf_linear_int8_ref(x, packed, qtype)  # x's blocks round exactly to +-127
    torch.testing.assert_close(got.double(), want, atol=1e-5 * float(want.abs().max()), rtol=1e-6)
