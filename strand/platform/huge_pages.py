"""Large CPU tensors on transparent huge pages, asked for before torch allocates anything.

A decode step reads every weight once (538 MB for SmolLM2-135M in float32) and each request's
K/V, in 4 KB pages: one TLB miss a page, and the hardware prefetchers start over at each page's
end. Where the kernel's transparent huge pages are on for madvise'd memory (most distributions'
default, `madvise` in /sys/kernel/mm/transparent_hugepage/enabled), torch puts allocations of
2 MB and more on 2 MB pages when THP_MEM_ALLOC_ENABLE=1 (c10's CPU allocator aligns them and
calls madvise(MADV_HUGEPAGE)). Batched decode steps, which stream the weights and many
requests' K/V, measured faster that way.

torch reads the variable once, at its first CPU allocation, so this runs when engine_core is
imported (with configure_openmp_wait, before anything here imports torch). A value the user set
is kept, THP_MEM_ALLOC_ENABLE=0 included.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from strand import envs

ENV = "THP_MEM_ALLOC_ENABLE"
_THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode(path: Path = _THP_MODE) -> str | None:
    """The kernel's THP mode (always, madvise or never), None where it cannot be read."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def configure_huge_pages(path: Path = _THP_MODE) -> bool:
    """Ask torch for huge pages unless the user chose, the OS is not Linux or THP is off;
    True when the variable was set here."""
    if (envs.user_thp_mem_alloc() or platform.system() != "Linux"
            or thp_mode(path) in (None, "never")):
        return False
    os.environ[ENV] = "1"
    return True
