"""Linear layers over GGUF-packed weights on CPU (kernels/csrc/gguf_linear.cpp; the pure-torch
reference is kernels/gguf_linear_ref.py).

A decode step of up to SMALL_M rows reads the packed blocks directly, as llama.cpp does: x's rows
rounded once per call to int8 blocks of 32 (a float scale each), integer dot products per block
(AVX-512 VNNI, AVX2, or plain C++; kernels/csrc/gguf_dot.h), one float scaling per block. The step
reads 3.8x (Q8_0) to 6.4x (Q4_1) fewer weight bytes than float32; up to CHUNKED_M rows take
SMALL_M at a time. The int8 rounding moves an output by at most
gguf_linear_ref.int8_rounding_bound (the reference of the product is gguf_linear_int8_ref). Products of more rows (prefill) unpack
the weight to float32 once per call and go through the GEMM library, which reuses each weight
across the rows.
"""

from __future__ import annotations

import torch

from kernels import _triton
from kernels.cpu_linear import SMALL_M, linear
from kernels.gguf_linear_ref import dequantize_ref, row_bytes

_DTYPES = (torch.float32, torch.bfloat16)


def kernels_apply(packed: torch.Tensor) -> bool:
    """Whether the C++ kernels take this packed weight (on CPU, built)."""
    from kernels._cpu_build import KERNELS

    return packed.device.type == "cpu" and KERNELS.module() is not None


def _check(packed: torch.Tensor, qtype: int, in_features: int) -> None:
    if packed.dtype != torch.uint8 or packed.dim() != 2 or not packed.is_contiguous():
        raise ValueError(f"packed must be a contiguous 2-D uint8 tensor, got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    want = row_bytes(qtype, in_features)
    if packed.shape[1] != want:
        raise ValueError(f"a packed row of {in_features} weights takes {want} bytes, got "
                         f"{packed.shape[1]}")


def gguf_dequantize(packed: torch.Tensor, qtype: int, in_features: int) -> torch.Tensor:
    """[N, row bytes] uint8 -> [N, in_features] float32, by the C++ kernel where it applies."""
    _check(packed, qtype, in_features)
    if not kernels_apply(packed):
        return dequantize_ref(packed, qtype)
    from kernels._cpu_build import KERNELS

    module = KERNELS.module()
    assert module is not None
    out = torch.empty(packed.shape[0], in_features, dtype=torch.float32)
    module.gguf_dequantize(out, packed, qtype)
    return out


def gguf_linear_small(x: torch.Tensor, packed: torch.Tensor, qtype: int,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T + bias for 1..SMALL_M rows, w read packed: [M, K] -> [M, N] in x's dtype."""
    from kernels._cpu_build import KERNELS

    module = KERNELS.module()
    if module is None:
        raise RuntimeError(f"CPU kernels unavailable: {KERNELS.unavailable_reason()}")
    if x.dim() != 2 or not 1 <= x.shape[0] <= SMALL_M:
        raise ValueError(f"gguf_linear_small takes [M, in] with 1 <= M <= {SMALL_M}, got "
                         f"{tuple(x.shape)}")
    if x.dtype not in _DTYPES or (bias is not None and bias.dtype != x.dtype):
        raise ValueError(f"x must be float32 or bfloat16 and bias of x's dtype, got {x.dtype}"
                         f" and {None if bias is None else bias.dtype}")
    _check(packed, qtype, x.shape[1])
    if bias is not None and bias.shape != (packed.shape[0],):
        raise ValueError(f"bias must have {packed.shape[0]} values, got {tuple(bias.shape)}")
    out = torch.empty(x.shape[0], packed.shape[0], dtype=x.dtype)
    module.gguf_linear_small(out, x.contiguous(), packed, qtype,
                             None if bias is None else bias.contiguous())
    return out


def triton_max_m() -> int:
    from kernels.gguf_linear_triton import MAX_M

    return MAX_M


# Rows up to which the packed kernel runs SMALL_M rows at a time instead of unpacking the weight:
# unpacking (a write and a read of the float32 weight) costs about what 4 passes of the packed
# kernel do. One thread, 576 x 3072, Q8_0: 8 rows 0.9 ms in 4-row passes against 2.0 ms
# unpacked; 16 rows 1.6 against 2.5; 32 rows 3.7 against 2.1 (Q4_1 alike).
CHUNKED_M = 16


def gguf_linear(x: torch.Tensor, packed: torch.Tensor, qtype: int, in_features: int,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T + bias for any number of rows, in x's dtype: [M, K] -> [M, N]. On CUDA up to
    gguf_linear_triton.MAX_M rows take the Triton kernel over the packed blocks."""
    rows = x.shape[0] if x.dim() == 2 else 0
    if 0 < rows <= triton_max_m() and _triton.runs_triton(x):
        from kernels.gguf_linear_triton import gguf_linear_triton

        return gguf_linear_triton(x, packed, qtype, bias)
    if (0 < rows <= CHUNKED_M and x.dtype in _DTYPES and kernels_apply(packed)
            and (bias is None or bias.dtype == x.dtype)):
        if rows <= SMALL_M:
            return gguf_linear_small(x, packed, qtype, bias)
        return torch.cat([gguf_linear_small(x[i:i + SMALL_M], packed, qtype, bias)
                          for i in range(0, rows, SMALL_M)])
    w = gguf_dequantize(packed, qtype, in_features).to(x.device)
    b = None if bias is None else bias.float()
    if x.device.type == "cpu":
        return linear(x.float(), w, b).to(x.dtype)
    return torch.nn.functional.linear(x.float(), w, b).to(x.dtype)
