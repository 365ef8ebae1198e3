"""bfloat16 linear layers on an AVX2 or AVX-512 CPU through Strand's own GEMM on panel-packed
bfloat16 weights (strand/kernels/csrc/linear_panels_bf16.cpp): one copy of each weight, the size
of the weight, for every row count, in place of a dense copy for few rows beside oneDNN's
blocked copy (or a float32 copy where oneDNN has no bfloat16 kernels).

The weight is regrouped once, at load, into panels of 48 output columns (16 with AVX2) whose
consecutive inputs come in pairs: [ceil(out / width), ceil(in / 2), width, 2], zero-padded.
Where the CPU has AVX512_BF16 the kernel multiplies the pairs by VDPBF16PS; elsewhere (AVX2,
AVX-512 without it, or STRAND_DISABLE_AVX512_BF16 set) it widens them to float32 and uses FMAs.
Each output is one float32 sum (the bias added last) rounded once to bfloat16, as oneDNN's are;
`python -m benchmarks.linear_panels_bf16` measures it beside the other kernels.

The generic level has too few registers for the tiles. STRAND_LINEAR_PANELS=0,
STRAND_CPU_GEMM=torch and STRAND_DISABLE_CPU_KERNELS=1 turn it off with the float32 panels.
"""

from __future__ import annotations

import torch

from strand.kernels import cpu_linear_panels
from strand.kernels._cpu_build import KERNELS
from strand.kernels.cpu_linear_panels import pack_in_slices


def chosen() -> bool:
    """Whether bfloat16 weights are packed into panels here: where float32 ones are
    (cpu_linear_panels.chosen: the avx2 or avx512 level, the C++ kernels built, not switched
    off)."""
    return cpu_linear_panels.chosen()


def applies(weight: torch.Tensor) -> bool:
    """Whether `pack` takes this weight here: a 2-D bfloat16 CPU weight, where chosen()."""
    return (weight.dtype == torch.bfloat16 and weight.dim() == 2 and weight.device.type == "cpu"
            and chosen())


def width() -> int:
    """Output columns a panel holds here (48 with AVX-512, 16 with AVX2)."""
    return int(KERNELS.require().linear_panel_bf16_width())


def uses_dpbf16() -> bool:
    """Whether the kernel multiplies by AVX512_BF16's VDPBF16PS here (else it widens)."""
    return bool(KERNELS.require().linear_panels_bf16_dp())


def is_panels(packed: torch.Tensor) -> bool:
    """Whether a packed weight is `pack`'s panels ([P, ceil(in / 2), width, 2] bfloat16)."""
    return packed.dim() == 4 and packed.dtype == torch.bfloat16


def pack(weight: torch.Tensor, release_source: bool = False) -> torch.Tensor:
    """A bfloat16 [out, in] weight as panels [ceil(out / width), ceil(in / 2), width, 2].

    With `release_source` the weight is packed a slice of panels at a time and the pages of the
    rows already packed are handed back as it goes (strand/platform/page_release.py), as
    cpu_linear_panels.pack does: for a weight its owner drops right after. The weight reads as
    garbage afterwards."""
    if weight.dtype != torch.bfloat16 or weight.dim() != 2 or weight.device.type != "cpu":
        raise ValueError(f"pack takes a 2-D bfloat16 CPU weight, got {weight.dtype} "
                         f"{tuple(weight.shape)} on {weight.device}")
    cols = width()
    rows, inner = weight.shape
    panels = torch.empty((rows + cols - 1) // cols, (inner + 1) // 2, cols, 2,
                         dtype=torch.bfloat16)
    pack_in_slices(KERNELS.require().pack_panels_bf16, panels, weight.detach(), release_source)
    return panels


def in_features(panels: torch.Tensor) -> tuple[int, int]:
    """The input sizes the panels take: 2 * pairs - 1 and 2 * pairs (an odd size's last pair
    is padded)."""
    return 2 * panels.shape[1] - 1, 2 * panels.shape[1]


def linear(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None,
           out_features: int) -> torch.Tensor:
    """x @ weight.T + bias for bfloat16 x [..., in], the weight as `pack` left it; bias
    bfloat16 or float32 [out_features]. Returns bfloat16 [..., out_features]."""
    if not is_panels(panels):
        raise ValueError(f"linear takes bfloat16 panels [P, pairs, width, 2], got {panels.dtype} "
                         f"{tuple(panels.shape)}")
    if x.dtype != torch.bfloat16 or x.dim() < 1 or x.shape[-1] not in in_features(panels):
        raise ValueError(f"linear takes bfloat16 x [..., {2 * panels.shape[1]} or "
                         f"{2 * panels.shape[1] - 1}], got {x.dtype} {tuple(x.shape)}")
    cols = panels.shape[2]
    if not (panels.shape[0] - 1) * cols < out_features <= panels.shape[0] * cols:
        raise ValueError(f"out_features {out_features} does not fit panels "
                         f"{tuple(panels.shape)} (between {(panels.shape[0] - 1) * cols + 1} "
                         f"and {panels.shape[0] * cols})")
    if bias is not None and (bias.dtype not in (torch.bfloat16, torch.float32)
                             or tuple(bias.shape) != (out_features,)):
        raise ValueError(f"bias must be bfloat16 or float32 [{out_features}], got {bias.dtype} "
                         f"{tuple(bias.shape)}")
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty(flat.shape[0], out_features, dtype=torch.bfloat16)
    KERNELS.require().linear_panels_bf16(out, flat, panels,
                                         None if bias is None else bias.contiguous())
    return out.view(*x.shape[:-1], out_features)
