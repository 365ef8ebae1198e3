"""Linear layers on CPU through oneDNN instead of torch's default BLAS.

torch's CPU `mm` goes to MKL, which on AMD processors runs its AVX2 code even where AVX-512 is
there. oneDNN (bundled with torch as mkldnn) picks its kernels by the CPU's features alone, so on
an AMD CPU with AVX-512 it ran float32 at the engine's shapes (M = 64 decodes or 2048 prefill
tokens, K = 512 or 1024, N = 512 to 32000) about twice as fast as MKL, with the same float32
accuracy (max error about 1e-6 of the largest output; both sum in float32).

`torch.ops.mkldnn._linear_pointwise` is the op torch's own compiler (inductor) emits for CPU
linear layers. Given a plain weight it copies it into its blocked layout on every call, which at
64 decode rows costs about as much as the product; `pack_weight` does that once, at load
(`layers/linear.py`), which measured faster at 64 decode rows and a little faster at 2048, at
the same float32 accuracy.
float32 on an AVX2 or AVX-512 CPU packs into panels for Strand's own GEMM instead (kernels/
cpu_linear_panels.py: faster at decode batches, about level at prefill), and bfloat16 into
bfloat16 panels (kernels/cpu_linear_panels_bf16.py); `pack_weight` and `linear_packed` take
each.
Set STRAND_CPU_GEMM=torch to keep torch's default path (for A/B measurements), and
STRAND_DISABLE_CPU_KERNELS=1 turns off every CPU-specific kernel, this one included.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

from strand import envs
from strand.kernels import cpu_linear_panels, cpu_linear_panels_bf16
from strand.platform.cpu_isa import probe

logger = logging.getLogger(__name__)

_DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def unavailable_reason(dtype: torch.dtype = torch.float32) -> str | None:
    """None when oneDNN linear is usable here for `dtype`; else why not (checked once per dtype,
    on first use). bfloat16 also needs the CPU support oneDNN's bfloat16 kernels need
    (strand/platform/cpu_isa.py): without it torch's op raises rather than falling back."""
    if envs.disable_cpu_kernels():
        return "disabled by STRAND_DISABLE_CPU_KERNELS"
    if envs.cpu_gemm() != "onednn":
        return f"STRAND_CPU_GEMM={envs.cpu_gemm()}"
    if dtype not in _DTYPES:
        return f"oneDNN linear takes float32 or bfloat16, not {dtype}"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn,
                                                               "_linear_pointwise"):
        return "this torch build has no oneDNN linear op"
    isa = probe()
    if dtype == torch.bfloat16 and not isa.onednn_bf16:
        reason = f"no oneDNN bfloat16 kernels for CPU ISA {isa.level}"
        logger.info("bfloat16 linear layers use torch's default path (%s)", reason)
        return reason
    try:  # one small product, packed and not, against torch's own: a broken op cannot go unnoticed
        g = torch.Generator().manual_seed(0)
        x, w, b = (torch.randn(*shape, generator=g).to(dtype) for shape in ((5, 24), (40, 24),
                                                                             (40,)))
        want = F.linear(x.float(), w.float(), b.float())
        tol = 1e-4 if dtype == torch.float32 else 5e-2
        for got in (torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], ""),
                    torch.ops.mkldnn._linear_pointwise(
                        x, torch.ops.mkldnn._reorder_linear_weight(w), b, "none", [], "")):
            torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
    except Exception as exc:  # keep torch's path, and say why once
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        logger.warning("oneDNN %s linear unavailable (%s); using torch's default", dtype, reason)
        return reason
    return None


def pack_weight(weight: torch.Tensor, release_source: bool = False) -> torch.Tensor | None:
    """A [out, in] weight's copy for `linear_packed`, made once: float32 panels for Strand's own
    GEMM where it is chosen (strand/kernels/cpu_linear_panels.py: the avx512 level), else oneDNN's
    blocked copy; None where neither applies (another device or dtype, or switched off).
    `release_source`: the caller drops the weight once it is packed into panels, and its pages
    may go as they are packed (cpu_linear_panels.pack)."""
    if cpu_linear_panels.applies(weight):
        with torch.no_grad():
            return cpu_linear_panels.pack(weight, release_source=release_source)
    if cpu_linear_panels_bf16.applies(weight):
        with torch.no_grad():
            return cpu_linear_panels_bf16.pack(weight, release_source=release_source)
    if (weight.device.type != "cpu" or weight.dtype not in _DTYPES or weight.dim() != 2
            or unavailable_reason(weight.dtype) is not None):
        return None
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def linear_packed(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                  out_features: int) -> torch.Tensor:
    """x @ weight.T + bias with the [out_features, in] weight from `pack_weight`; x [..., in] of
    the weight's dtype."""
    if cpu_linear_panels_bf16.is_panels(packed):
        return cpu_linear_panels_bf16.linear(x, packed, bias, out_features)
    if cpu_linear_panels.is_panels(packed):
        return cpu_linear_panels.linear(x, packed, bias, out_features)
    if x.dim() == 2:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    flat = x.reshape(-1, x.shape[-1])
    out = torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")
    return out.view(*x.shape[:-1], out.shape[-1])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear, through oneDNN where it applies (CPU, float32/bfloat16, 2-D input)."""
    if (x.device.type == "cpu" and x.dim() == 2 and x.dtype in _DTYPES
            and weight.dtype == x.dtype and not torch.is_grad_enabled()
            and unavailable_reason(x.dtype) is None):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


# Rows of x up to which `linear_small` reads the weights itself (strand/kernels/csrc/linear_small.cpp):
# a decode step of a few requests uses each weight a few times, so the product is a read of the
# weights. On an AVX2-only CPU, float32, SmolLM2's layers at M=1 took about two thirds of
# oneDNN's time on its packed weights (and less than MKL's); at M=4 it still led oneDNN.
SMALL_M = 4


def small_m_applies(weight: torch.Tensor) -> bool:
    """Whether `linear_small` takes this weight (CPU, float32/bfloat16, dense) and the CPU
    kernels are built."""
    from strand.kernels._cpu_build import KERNELS

    return (weight.device.type == "cpu" and weight.dtype in _DTYPES and weight.dim() == 2
            and weight.is_contiguous() and KERNELS.module() is not None)


def linear_small(x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias for 1..SMALL_M rows of x, the weight's dtype: [M, in] -> [M, out]."""
    from strand.kernels._cpu_build import KERNELS

    module = KERNELS.require()
    if x.dim() != 2 or not 1 <= x.shape[0] <= SMALL_M:
        raise ValueError(f"linear_small takes [M, in] with 1 <= M <= {SMALL_M}, got "
                         f"{tuple(x.shape)}")
    if x.dtype != weight.dtype or (bias is not None and bias.dtype != weight.dtype):
        raise ValueError(f"linear_small needs x and bias in the weight's dtype ({weight.dtype})")
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"x has {x.shape[1]} features, the weight takes {weight.shape[1]}")
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
    module.linear_small(out, x.contiguous(), weight,
                        None if bias is None else bias.contiguous())
    return out
