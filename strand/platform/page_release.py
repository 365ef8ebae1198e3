"""Handing a tensor's pages back to the system while the tensor is still allocated.

A weight repacked into another layout is read once more and then dropped. Packed whole, the
dense weight and its packed copy are both resident at the end; a tied 128k-row head of a 1B
model is over a GB each. Handing back the dense pages as the packing passes them keeps the two
at about one copy. madvise(MADV_DONTNEED) drops the pages now; they read as zeros after (private
memory) or as the file again (a private file map), so only bytes nobody reads again may go.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import platform
from typing import Any

import torch

_MADV_DONTNEED = 4


def owns_storage(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is the whole of its storage, contiguous: no view of it reaches bytes
    beyond its own (a view's neighbours may still be read, and keep their pages)."""
    return (tensor.is_contiguous()
            and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size())


def release_pages(tensor: torch.Tensor, end: int) -> bool:
    """Hands back the whole pages among `tensor`'s first `end` bytes; a page it shares with a
    neighbour's bytes stays. False (and nothing done) off Linux/glibc or off the CPU."""
    if tensor.device.type != "cpu" or end <= 0:
        return False
    page = mmap.PAGESIZE
    first = tensor.data_ptr()
    start = -(-first // page) * page
    stop = (first + min(end, tensor.numel() * tensor.element_size())) // page * page
    return release_range(start, stop - start)


def release_range(address: int, nbytes: int) -> bool:
    """madvise(MADV_DONTNEED) over the pages of [address, address + nbytes), widened to whole
    pages: for a read-only file map, whose pages nobody loses (they are the file's). False off
    Linux/glibc."""
    libc = _libc()
    if libc is None:
        return False
    page = mmap.PAGESIZE
    start = address // page * page
    stop = -(-(address + nbytes) // page) * page
    if stop > start:
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(stop - start), _MADV_DONTNEED)
    return True


@functools.cache
def _libc() -> Any:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
