"""The dense weights that decode steps read, gathered into one block of memory on 2 MiB pages.

A bs=1 decode step on CPU is a read of every weight (strand/kernels/csrc/linear_small.cpp), bound by
how many reads one core keeps in flight. On 4 KiB pages that read crosses a page every 4 KiB: a
TLB miss and a page walk each time, 67 000 a token for SmolLM2-135M in bfloat16. Weights loaded
into the heap (model_executor/cpu_allocator.py keeps large blocks there) sit on 4 KiB pages.
Here they are copied, once after loading, into one anonymous mapping aligned to 2 MiB and
advised for transparent huge pages (MADV_HUGEPAGE: honoured where THP is `always` or
`madvise`), in the order a step reads them (each layer's projections, then the lm_head), and each
parameter is pointed at its copy. The kernel alone over SmolLM2's weights, one thread, AVX2,
in the same process: see benchmarks/dense_kernel.py --layout both.

STRAND_HUGE_PAGE_WEIGHTS=0 leaves the weights where they were loaded (A/B runs).

What a decode step reads moves: the few-row kernel's dense weights (`Linear.small_m`) and float32
panels that are their layer's only copy (`Linear.panels_only`); a tied lm_head moves once, with
the embedding it shares. The pages the weights leave are handed back to the system as the copy
proceeds (a weight's own pages, and the heap's: malloc_trim), so memory is what it was.
"""

from __future__ import annotations

import logging
import mmap

import torch
from torch import nn

from strand import envs
from strand.engine_core.model_executor.cpu_allocator import trim_heap
from strand.engine_core.model_executor.layers.linear import Linear
from strand.platform.page_release import owns_storage, release_pages

logger = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
_ALIGN = 4096  # each weight starts on a page of its own (a whole number of cache lines)
_TRIM_EVERY = 64 << 20  # bytes moved between two trims of the heap
_RELEASE_EVERY = 32 << 20  # bytes of one weight copied between two hand-backs of its pages


def huge_page_block(nbytes: int) -> torch.Tensor:
    """A uint8 tensor of `nbytes` zeros on anonymous memory aligned to 2 MiB and advised for
    transparent huge pages; the mapping lives as long as a tensor that views it."""
    if nbytes <= 0:
        raise ValueError(f"nbytes must be > 0, got {nbytes}")
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if advise is not None:
        try:
            mapping.madvise(advise)  # before the first touch: the pages are made huge at fault
        except OSError:  # a kernel without THP: 4 KiB pages, the same bytes
            pass
    whole = torch.frombuffer(mapping, dtype=torch.uint8)  # keeps the mapping alive
    offset = -whole.data_ptr() % HUGE_PAGE
    return whole[offset:offset + nbytes]


def _decode_weights(model: nn.Module) -> list[tuple[Linear, str]]:
    """(layer, attribute) of each weight a decode step reads, in module order (a step's read
    order), each once: the few-row kernel's dense weights, and float32 panels that are their
    layer's only copy."""
    seen: set[int] = set()
    found: list[tuple[Linear, str]] = []
    for module in model.modules():
        if not isinstance(module, Linear):
            continue
        name = "weight" if module.small_m else "packed" if module.panels_only else ""
        weight = getattr(module, name) if name else None
        if (weight is None or id(weight) in seen or weight.device.type != "cpu"
                or not weight.is_contiguous() or weight.numel() == 0):
            continue
        seen.add(id(weight))
        found.append((module, name))
    return found


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def gather_decode_weights(model: nn.Module) -> int:
    """Moves the decode step's weights into one huge-page block; returns its size in bytes
    (0: nothing to move, or STRAND_HUGE_PAGE_WEIGHTS=0). Values, shapes, dtypes and parameter
    identities stay what they were."""
    if not envs.huge_page_weights():
        return 0
    weights = _decode_weights(model)
    total = sum(_aligned(_nbytes(getattr(module, name))) for module, name in weights)
    if total == 0:
        return 0
    block = huge_page_block(total)
    offset = untrimmed = 0
    with torch.no_grad():
        for module, name in weights:
            t = getattr(module, name)
            nbytes = _nbytes(t)
            view = block[offset:offset + nbytes].view(t.dtype).view(t.shape)
            _move(view, t.data)
            if name == "weight":
                t.data = view  # the Parameter stays (a tied head shares it)
            else:
                module.packed = view
            del t
            offset += _aligned(nbytes)
            # The heap pages each weight left go back as the copy proceeds: at no time are
            # the weights held twice (peak RSS), only the last _TRIM_EVERY bytes of them.
            untrimmed += nbytes
            if untrimmed >= _TRIM_EVERY:
                trim_heap()
                untrimmed = 0
    trim_heap()
    logger.info("decode weights: %d MiB in one block of 2 MiB pages", total >> 20)
    return total


def _move(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst.copy_(src) a slice at a time, handing back the pages of `src` already copied where
    it is the whole of its storage (strand/platform/page_release.py): the block's pages fill
    as the source's empty, so a large weight (a tied 128k-row head) is not held twice."""
    whole = owns_storage(src)
    flat_dst, flat_src = dst.view(-1), src.view(-1)
    step = max(1, _RELEASE_EVERY // src.element_size())
    for first in range(0, flat_src.numel(), step):
        flat_dst[first:first + step].copy_(flat_src[first:first + step])
        if whole:
            release_pages(src, (first + step) * src.element_size())


def huge_page_bytes(t: torch.Tensor) -> int | None:
    """Bytes of transparent huge pages backing the mapping that holds `t` (its AnonHugePages in
    /proc/self/smaps); None where that cannot be read."""
    address = t.data_ptr()
    try:
        with open("/proc/self/smaps") as smaps:
            inside = False
            for line in smaps:
                head = line.split()
                if head and "-" in head[0] and not head[0].endswith(":"):
                    lo, hi = (int(a, 16) for a in head[0].split("-"))
                    inside = lo <= address < hi
                elif inside and head and head[0] == "AnonHugePages:":
                    return int(head[1]) * 1024
    except (OSError, ValueError):
        return None
    return None
