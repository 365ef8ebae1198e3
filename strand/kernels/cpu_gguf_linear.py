"""Linear layers over GGUF-packed weights on CPU (strand/kernels/csrc/gguf_linear.cpp; the pure-torch
reference is strand/kernels/gguf_linear_ref.py).

A decode step of up to SMALL_M rows reads the packed blocks directly, as llama.cpp does: x's rows
rounded once per call to int8 blocks of 32 (a float scale each), integer dot products per block
(AVX-512 VNNI, AVX2, or plain C++; strand/kernels/csrc/gguf_dot.h), one float scaling per block. The step
reads 3.8x (Q8_0) to 6.4x (Q4_1) fewer weight bytes than float32. GGUFLinear keeps a CPU weight
whose rows come in sixteens regrouped into 16-row tiles (gguf_tile; strand/kernels/csrc/gguf_tiled.cpp),
which the kernel reads 16 rows a vector instruction; every function here takes either layout (a
2-D packed weight is GGUF rows, a 3-D one tiles). Tiles take any number of rows that way (a
decode batch, a prefill: gguf_tiled_linear), each tile read once a call; GGUF rows take up to
CHUNKED_M rows SMALL_M at a time. The int8 rounding moves an output by at most
gguf_linear_ref.int8_rounding_bound (the reference of the product is gguf_linear_int8_ref).
Products of more rows over GGUF rows (and without the C++ kernels) unpack the weight to float32
once per call and go through the GEMM library.
"""

from __future__ import annotations

import torch

from strand.kernels import _triton
from strand.kernels.cpu_linear import SMALL_M, linear
from strand.kernels.gguf_linear_ref import (
    BLOCK,
    BLOCK_BYTES,
    TILE_ROWS,
    dequantize_ref,
    row_bytes,
    untile_ref,
)

_DTYPES = (torch.float32, torch.bfloat16)


def kernels_apply(packed: torch.Tensor) -> bool:
    """Whether the C++ kernels take this packed weight (on CPU, built)."""
    from strand.kernels._cpu_build import KERNELS

    return packed.device.type == "cpu" and KERNELS.module() is not None


def out_features(packed: torch.Tensor) -> int:
    """Weight rows of a packed weight: GGUF rows [N, row bytes] or 16-row tiles [N / 16, ...]."""
    return packed.shape[0] * TILE_ROWS if packed.dim() == 3 else packed.shape[0]


def _check(packed: torch.Tensor, qtype: int, in_features: int) -> None:
    if packed.dtype != torch.uint8 or packed.dim() not in (2, 3) or not packed.is_contiguous():
        raise ValueError(f"packed must be a contiguous 2-D (rows) or 3-D (tiles) uint8 tensor, "
                         f"got {packed.dtype} {tuple(packed.shape)}")
    want = row_bytes(qtype, in_features)
    if packed.dim() == 3:
        tile = (in_features // BLOCK, TILE_ROWS * BLOCK_BYTES[qtype])
        if tuple(packed.shape[1:]) != tile:
            raise ValueError(f"tiles of {in_features}-weight rows are [tiles, {tile[0]}, "
                             f"{tile[1]}], got {tuple(packed.shape)}")
    elif packed.shape[1] != want:
        raise ValueError(f"a packed row of {in_features} weights takes {want} bytes, got "
                         f"{packed.shape[1]}")


def gguf_tile(packed: torch.Tensor, qtype: int, in_features: int,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """GGUF rows [N, row bytes] (N a multiple of 16) -> the same bytes as 16-row tiles
    [N / 16, in_features / 32, 16 * block bytes], the layout the decode kernel reads 16 rows at a
    time (strand/kernels/csrc/gguf_tiled.cpp); by the C++ kernel where it applies, else tile_ref.
    Into `out` (contiguous tiles of that shape) when given: a loader tiles a large weight a piece
    of rows at a time into its one final tensor, never holding the rows and the tiles whole."""
    _check(packed, qtype, in_features)
    if packed.dim() != 2 or packed.shape[0] % TILE_ROWS:
        raise ValueError(f"gguf_tile takes GGUF rows, a multiple of {TILE_ROWS} of them, got "
                         f"{tuple(packed.shape)}")
    shape = (packed.shape[0] // TILE_ROWS, in_features // BLOCK, TILE_ROWS * BLOCK_BYTES[qtype])
    if out is not None and (tuple(out.shape) != shape or out.dtype != torch.uint8
                            or not out.is_contiguous() or out.device != packed.device):
        raise ValueError(f"out must be contiguous uint8 tiles {list(shape)} on "
                         f"{packed.device}, got {out.dtype} {list(out.shape)} on {out.device}")
    if not kernels_apply(packed):
        from strand.kernels.gguf_linear_ref import tile_ref

        tiles = tile_ref(packed, qtype)
        return tiles if out is None else out.copy_(tiles)
    from strand.kernels._cpu_build import KERNELS

    module = KERNELS.module()
    assert module is not None
    tiles = torch.empty(shape, dtype=torch.uint8) if out is None else out
    module.gguf_tile(tiles, packed, qtype)
    return tiles


def tiles_apply(packed: torch.Tensor) -> bool:
    """Whether a GGUF weight is worth regrouping into tiles: GGUF rows, a multiple of 16 of
    them, on CPU with the C++ kernels (the Triton kernel on CUDA reads GGUF rows)."""
    return (packed.dim() == 2 and packed.shape[0] % TILE_ROWS == 0 and kernels_apply(packed)
            and not _triton.runs_triton(packed))


def gguf_dequantize(packed: torch.Tensor, qtype: int, in_features: int,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """[N, row bytes] uint8 (or its 16-row tiles) -> [N, in_features] float32, by the C++
    kernel where it applies; into `out` (a contiguous float32 [N, in_features]) when given."""
    _check(packed, qtype, in_features)
    shape = (out_features(packed), in_features)
    if out is not None and (out.shape != shape or out.dtype != torch.float32
                            or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous float32 {list(shape)}, got {out.dtype} "
                         f"{list(out.shape)}")
    if not kernels_apply(packed):
        w = dequantize_ref(untile_ref(packed, qtype) if packed.dim() == 3 else packed, qtype)
        return w if out is None else out.copy_(w)
    from strand.kernels._cpu_build import KERNELS

    module = KERNELS.module()
    assert module is not None
    out = torch.empty(shape, dtype=torch.float32) if out is None else out
    module.gguf_dequantize(out, packed, qtype)
    return out


def gguf_linear_small(x: torch.Tensor, packed: torch.Tensor, qtype: int,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T + bias for 1..SMALL_M rows, w read packed: [M, K] -> [M, N] in x's dtype."""
    if x.dim() != 2 or not 1 <= x.shape[0] <= SMALL_M:
        raise ValueError(f"gguf_linear_small takes [M, in] with 1 <= M <= {SMALL_M}, got "
                         f"{tuple(x.shape)}")
    return _run_kernel("gguf_linear_small", x, packed, qtype, bias)


def _run_kernel(name: str, x: torch.Tensor, packed: torch.Tensor, qtype: int,
                bias: torch.Tensor | None) -> torch.Tensor:
    """The C++ kernel `name` into a new [M, N] of x's dtype, after the checks every packed
    product makes (x's and bias's dtypes, the weight's layout, the bias's length)."""
    from strand.kernels._cpu_build import KERNELS

    module = KERNELS.require()
    if x.dtype not in _DTYPES or (bias is not None and bias.dtype != x.dtype):
        raise ValueError(f"x must be float32 or bfloat16 and bias of x's dtype, got {x.dtype}"
                         f" and {None if bias is None else bias.dtype}")
    _check(packed, qtype, x.shape[1])
    n = out_features(packed)
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias must have {n} values, got {tuple(bias.shape)}")
    out = torch.empty(x.shape[0], n, dtype=x.dtype)
    getattr(module, name)(out, x.contiguous(), packed, qtype,
                          None if bias is None else bias.contiguous())
    return out


def triton_max_m() -> int:
    from strand.kernels.gguf_linear_triton import MAX_M

    return MAX_M


# Rows up to which the packed kernel over GGUF rows runs SMALL_M rows at a time instead of
# unpacking the weight (tiles take their kernel at any row count: gguf_tiled_linear). One
# thread, 3072 x 576, int8 kernel: the 4-row passes beat unpacking up to 16 rows (by far at 8,
# narrowly at 16, Q8_0 and Q4_1 alike) and lost at 32.
CHUNKED_M = 16


def gguf_linear(x: torch.Tensor, packed: torch.Tensor, qtype: int, in_features: int,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T + bias for any number of rows, in x's dtype: [M, K] -> [M, N]. On CUDA up to
    gguf_linear_triton.MAX_M rows take the Triton kernel over the packed blocks."""
    rows = x.shape[0] if x.dim() == 2 else 0
    if _triton.runs_triton(x) and 0 < rows <= triton_max_m():  # on CPU Triton is not imported
        from strand.kernels.gguf_linear_triton import gguf_linear_triton

        return gguf_linear_triton(x, packed, qtype, bias)
    takes = (rows > 0 and x.dtype in _DTYPES and kernels_apply(packed)
             and (bias is None or bias.dtype == x.dtype))
    if takes and packed.dim() == 3:
        return gguf_tiled_linear(x, packed, qtype, bias)
    if takes and rows <= CHUNKED_M:
        if rows <= SMALL_M:
            return gguf_linear_small(x, packed, qtype, bias)
        return torch.cat([gguf_linear_small(x[i:i + SMALL_M], packed, qtype, bias)
                          for i in range(0, rows, SMALL_M)])
    if x.device.type != "cpu":
        w = gguf_dequantize(packed, qtype, in_features).to(x.device)
        return torch.nn.functional.linear(x.float(), w, None if bias is None else bias.float()
                                          ).to(x.dtype)
    return _dequantized_tiles(x, packed, qtype, in_features, bias)


def gguf_tiled_linear(x: torch.Tensor, tiles: torch.Tensor, qtype: int,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T + bias for any number of rows over 16-row tiles, x rounded to int8 blocks once
    and each tile read once a call: [M, K] -> [M, N] in x's dtype. Products of many rows (a
    decode batch, a prefill) unpacked the weight to float32 per call for the GEMM library
    before, several times slower than here at 32 and 512 rows (with AVX-512 VNNI the int8
    products are 4x float32's FMAs a cycle, and nothing is unpacked to memory). As llama.cpp, which
    rounds a prefill's activations too (its Q8_K), the outputs are the int8 product's
    (gguf_linear_ref.gguf_linear_int8_ref), within int8_rounding_bound of the float one."""
    if x.dim() != 2 or x.shape[0] < 1 or tiles.dim() != 3:
        raise ValueError(f"gguf_tiled_linear takes [M >= 1, in] and 3-D tiles, got "
                         f"{tuple(x.shape)} and {tuple(tiles.shape)}")
    return _run_kernel("gguf_tiled_linear", x, tiles, qtype, bias)


# Float32 weight rows unpacked at a time for products of many rows: a tile of at most ~8 MB is
# unpacked into one buffer and multiplied, then the next, so a large weight (SmolLM2's tied
# lm_head: 113 MB in float32) is never unpacked whole. For such a 49152 x 576 Q4_1 weight, tiles
# took a fraction of the whole unpack's time at 32 rows (the fresh 113 MB's page faults and
# writes) and less at 512; weights under one tile (the layers) as before.
TILE_BYTES = 8 << 20


def _dequantized_tiles(x: torch.Tensor, packed: torch.Tensor, qtype: int, in_features: int,
                       bias: torch.Tensor | None) -> torch.Tensor:
    xf = x.float()
    n = out_features(packed)
    # Whole 16-row tiles where the weight is tiled (a slice of it is then a slice of tiles).
    tile = max(64, TILE_BYTES // (4 * in_features)) // TILE_ROWS * TILE_ROWS
    if tile >= n:
        w = gguf_dequantize(packed, qtype, in_features)
        return linear(xf, w, None if bias is None else bias.float()).to(x.dtype)
    out = torch.empty(x.shape[0], n, dtype=torch.float32)
    buffer = torch.empty(tile, in_features, dtype=torch.float32)  # each tile's, in turn
    for n0 in range(0, n, tile):
        n1 = min(n, n0 + tile)
        part = (packed[n0 // TILE_ROWS:n1 // TILE_ROWS] if packed.dim() == 3
                else packed[n0:n1])  # n0, n1: multiples of 16 (n too, where tiled)
        w = gguf_dequantize(part, qtype, in_features, buffer[:n1 - n0])
        out[:, n0:n1] = linear(xf, w, None if bias is None else bias[n0:n1].float())
    return out.to(x.dtype)
