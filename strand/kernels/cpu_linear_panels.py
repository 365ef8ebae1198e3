"""float32 linear layers on an AVX2 or AVX-512 CPU through Strand's own GEMM on panel-packed
weights (strand/kernels/csrc/linear_panels.cpp), in place of oneDNN's packed copy.

The weight is regrouped once, at load, into panels of 48 output columns (16 with AVX2) laid out
along the input: one copy, the size of the weight, as oneDNN's was. At SmolLM2-135M's shapes
with the weights cold, as in a decode step, the panels led oneDNN (and, under AVX2, linear_batch)
at a 32-row decode batch and matched oneDNN at prefill (4096 rows), at the AVX-512 and AVX2
levels alike; `python -m benchmarks.linear_batch` measures the three side by side.

Each output is one float32 sum, as oneDNN's are. bfloat16 weights stay on oneDNN's native
kernels (AVX-512) or linear_batch and a float32 copy (AVX2). The generic level has too few
registers for the tiles. STRAND_LINEAR_PANELS=0 keeps oneDNN (for A/B measurements);
STRAND_CPU_GEMM=torch and STRAND_DISABLE_CPU_KERNELS=1 turn it off with the other CPU paths.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from strand import envs
from strand.kernels._cpu_build import KERNELS
from strand.platform.cpu_isa import probe
from strand.platform.page_release import owns_storage, release_pages


@functools.cache
def chosen() -> bool:
    """Whether float32 weights are packed into panels here: the avx2 or avx512 level, the C++
    kernels built, and not switched off."""
    if envs.disable_cpu_kernels() or not envs.linear_panels():
        return False
    if envs.cpu_gemm() != "onednn":
        return False
    return probe().level in ("avx2", "avx512") and KERNELS.module() is not None


def applies(weight: torch.Tensor) -> bool:
    """Whether `pack` takes this weight here: a 2-D float32 CPU weight, where chosen()."""
    return (weight.dtype == torch.float32 and weight.dim() == 2 and weight.device.type == "cpu"
            and chosen())


def width() -> int:
    """Output columns a panel holds here (48 with AVX-512, 16 with AVX2)."""
    return int(KERNELS.require().linear_panel_width())


def is_panels(packed: torch.Tensor) -> bool:
    """Whether a packed weight is `pack`'s panels ([P, K, width]; oneDNN's copy is 2-D)."""
    return packed.dim() == 3


def pack(weight: torch.Tensor, release_source: bool = False) -> torch.Tensor:
    """A float32 [out, in] weight as panels [ceil(out / width), in, width], zero-padded.

    With `release_source` the weight is packed a slice of panels at a time and the pages of
    the rows already packed are handed back as it goes (strand/platform/page_release.py): for a
    weight its owner drops right after, so that a large one (a 128k-row head is over a GB)
    is never held twice. The weight reads as garbage afterwards."""
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.device.type != "cpu":
        raise ValueError(f"pack takes a 2-D float32 CPU weight, got {weight.dtype} "
                         f"{tuple(weight.shape)} on {weight.device}")
    cols = width()
    panels = torch.empty((weight.shape[0] + cols - 1) // cols, weight.shape[1], cols)
    pack_in_slices(KERNELS.require().pack_panels, panels, weight.detach(), release_source)
    return panels


def pack_in_slices(pack_fn: Callable[[torch.Tensor, torch.Tensor], None], panels: torch.Tensor,
                   source: torch.Tensor, release_source: bool) -> None:
    """pack_fn(panels, source) (panel p holding rows [p W, (p + 1) W) of the source), where
    `release_source` asks it, a slice of panels at a time, the pages of the rows packed
    handed back after each: only for a source that is the whole of its storage (a view's
    neighbours may still be read)."""
    cols, rows = panels.shape[2], source.shape[0]
    if not release_source or not owns_storage(source):
        pack_fn(panels, source.contiguous())
        return
    row_bytes = source.shape[1] * source.element_size()
    step = max(1, _RELEASE_EVERY // (cols * row_bytes))  # panels a slice
    for first in range(0, panels.shape[0], step):
        last = min(first + step, panels.shape[0])
        pack_fn(panels[first:last], source[first * cols:min(last * cols, rows)])
        release_pages(source, min(last * cols, rows) * row_bytes)


# Bytes of a weight packed between two hand-backs of its pages (pack's release_source).
_RELEASE_EVERY = 32 << 20


def linear(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None,
           out_features: int) -> torch.Tensor:
    """x @ weight.T + bias for float32 x [..., in], the weight as `pack` left it."""
    if x.dtype != torch.float32 or x.shape[-1] != panels.shape[1]:
        raise ValueError(f"linear takes float32 x [..., {panels.shape[1]}], got {x.dtype} "
                         f"{tuple(x.shape)}")
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty(flat.shape[0], out_features)
    KERNELS.require().linear_panels(out, flat, panels,
                                    None if bias is None else bias.contiguous())
    return out.view(*x.shape[:-1], out_features)
