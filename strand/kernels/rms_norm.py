"""Triton RMSNorm, optionally fused with the residual add that precedes it in every layer.

One program per row. Rounding follows HF Llama: the sum x + residual is rounded to the input
dtype (it is also the next residual), the norm is taken in fp32 and rounded back to the input
dtype before the weight multiplies it.
"""

from __future__ import annotations

from typing import overload

import torch

from strand.kernels._triton import lazy_jit, next_power_of_2

try:
    import triton.language as tl
except ImportError:  # the module stays importable; launching needs triton
    tl = None  # type: ignore[assignment]


@lazy_jit
def _rms_norm_kernel(
    out_ptr,  # [num_rows, hidden]
    new_residual_ptr,  # [num_rows, hidden] (HAS_RESIDUAL)
    x_ptr,  # [num_rows, hidden]
    residual_ptr,  # [num_rows, hidden] (HAS_RESIDUAL)
    weight_ptr,  # [hidden]
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * hidden
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = x + tl.load(residual_ptr + row + offs, mask=mask, other=0.0)
        tl.store(new_residual_ptr + row + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / hidden + eps)
    normed = (xf * rstd).to(x.dtype).to(tl.float32)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row + offs, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


@overload
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: None = None) -> torch.Tensor: ...


@overload
def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]: ...


def rms_norm(
    x: torch.Tensor,  # [..., hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [..., hidden]
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Without residual: the normed x. With it: (norm(x + residual), x + residual).

    Out of place: x and residual are not modified. The output dtype is the wider of x's and
    weight's, as `weight * normed` is in torch.
    """
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise ValueError(f"weight must be [hidden={hidden}], got {tuple(weight.shape)}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    if residual is not None and residual.dtype != x.dtype:
        raise ValueError(f"residual dtype {residual.dtype} must equal x dtype {x.dtype}")
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    x2 = x.reshape(-1, hidden).contiguous()  # [num_rows, hidden]
    out = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    res2 = residual.reshape(-1, hidden).contiguous() if residual is not None else None
    new_res = torch.empty_like(x2) if residual is not None else None
    if x2.shape[0] > 0:
        _rms_norm_kernel[(x2.shape[0],)](
            out, new_res if new_res is not None else out, x2,
            res2 if res2 is not None else x2, weight.contiguous(), hidden, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=next_power_of_2(hidden),
        )
    if new_res is None:
        return out.view(x.shape)
    return out.view(x.shape), new_res.view(x.shape)
