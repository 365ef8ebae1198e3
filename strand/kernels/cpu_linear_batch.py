"""Linear layers of decode batches (SMALL_M < M <= BATCH_M rows) on an AVX2-only CPU, on the
dense weight (strand/kernels/csrc/linear_batch.cpp).

A decode step of 32 requests uses each weight 32 times: compute-bound, but with the weights
coming from memory once per step, which oneDNN's AVX2 kernels, blocked for large products, do not
overlap with the arithmetic. At SmolLM2-135M's shapes, M = 32, one thread capped at AVX2, the
weights cold as in a real step (benchmarks/linear_batch.py), this kernel measured faster than
oneDNN in float32, and in bfloat16, where it reads its own weights (half the bytes) instead of
oneDNN's float32 copy. With AVX-512, oneDNN's own kernels are faster and bfloat16 has native
oneDNN kernels, so this path is taken at the avx2 level only (strand/platform/cpu_isa.py; the
generic level has too few registers for its tiles), and only where the panels
(strand/kernels/cpu_linear_panels.py) are switched off: their kernel is faster on the same rows.
"""

from __future__ import annotations

import functools

import torch

from strand import envs
from strand.kernels import cpu_linear_panels
from strand.kernels.cpu_linear import SMALL_M
from strand.platform.cpu_isa import probe

# Rows up to which the kernel runs (at M = 64 it still led oneDNN on the shapes above); far
# above, in prefill, oneDNN's blocking pays.
BATCH_M = 64
_DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def chosen() -> bool:
    """Whether decode batches go to linear_batch here: the avx2 level and the C++ kernels built.
    STRAND_LINEAR_BATCH=0 keeps oneDNN (for A/B measurements); STRAND_CPU_GEMM=torch and
    STRAND_DISABLE_CPU_KERNELS=1 turn it off with the other CPU paths."""
    if envs.disable_cpu_kernels() or not envs.linear_batch():
        return False
    if envs.cpu_gemm() != "onednn":
        return False
    from strand.kernels._cpu_build import KERNELS

    return probe().level == "avx2" and KERNELS.module() is not None


def takes(dtype: torch.dtype) -> bool:
    """Whether decode batches of this dtype go to linear_batch: where it is chosen and the
    layers' packed copies are not panels (strand/kernels/cpu_linear_panels.py), whose kernel is faster
    on the same rows even on a float32 copy of bfloat16 weights (SmolLM2's 32-row step's
    products at the avx2 level, float32 and bfloat16 alike; STRAND_LINEAR_PANELS=0 brings
    linear_batch back)."""
    return dtype in _DTYPES and chosen() and not cpu_linear_panels.chosen()


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `linear_batch` takes this product: SMALL_M < rows <= BATCH_M, CPU, a dense
    weight in x's dtype, a dtype it takes here."""
    return (x.dim() == 2 and SMALL_M < x.shape[0] <= BATCH_M and takes(x.dtype)
            and x.device.type == "cpu" and weight.dtype == x.dtype
            and weight.dim() == 2 and weight.device.type == "cpu" and weight.is_contiguous())


def linear_batch(x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias for [M, in] x of the weight's dtype (float32 or bfloat16): sums in
    float32, one rounding per output."""
    from strand.kernels._cpu_build import KERNELS

    module = KERNELS.require()
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"linear_batch takes x [M, in] and weight [out, in], got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    if x.dtype not in _DTYPES or x.dtype != weight.dtype or (
            bias is not None and bias.dtype != weight.dtype):
        raise ValueError(f"linear_batch needs x, weight and bias in one dtype of float32 or "
                         f"bfloat16, got {x.dtype} and {weight.dtype}")
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"x has {x.shape[1]} features, the weight takes {weight.shape[1]}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
    module.linear_batch(out, x.contiguous(), weight.contiguous(),
                        None if bias is None else bias.contiguous())
    return out
