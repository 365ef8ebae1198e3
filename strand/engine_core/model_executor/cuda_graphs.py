"""The graph primitive behind decode graphs: capture sizes, and an injectable capturer.

A capturer records a callable once and replays it later on whatever its input buffers then hold.
The real one is torch.cuda.CUDAGraph; tests plug in an eager stand-in that calls the callable
again at each replay, so the whole graph path (static buffers, padding, replay) runs on CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from strand.engine_core.model_executor.attention.backend import AttentionBackend

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class CapturedGraph:
    output: torch.Tensor  # what the callable returned at capture; each replay rewrites it
    replay: Callable[[], None]


class GraphCapturer(Protocol):
    def new_pool(self) -> Any:
        """A memory pool that every graph of one set shares (they never replay at once)."""
        ...

    def capture(self, fn: Callable[[], torch.Tensor], pool: Any) -> CapturedGraph: ...


class CudaGraphCapturer:
    """torch.cuda.graph: the kernels fn launches are recorded, not run, and replayed as one."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def new_pool(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], torch.Tensor], pool: Any) -> CapturedGraph:
        graph = torch.cuda.CUDAGraph()
        # Work still queued (the warm-up) must not end up inside the capture.
        torch.cuda.synchronize(self.device)
        with torch.cuda.graph(graph, pool=pool):
            output = fn()
        torch.cuda.synchronize(self.device)
        return CapturedGraph(output=output, replay=graph.replay)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes that get a graph: 1, 2, 4, 8, 16, ... below max_num_seqs, then max_num_seqs."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    sizes = []
    size = 1
    while size < max_num_seqs:
        sizes.append(size)
        size *= 2
    return [*sizes, max_num_seqs]


def padded_size(sizes: list[int], num_reqs: int) -> int | None:
    """The smallest capture size that holds num_reqs rows; None when none does (run eager)."""
    for size in sizes:  # ascending
        if size >= num_reqs:
            return size
    return None


def choose_capturer(device: torch.device, enforce_eager: bool, backend: AttentionBackend,
                    injected: GraphCapturer | None) -> GraphCapturer | None:
    """The capturer decode graphs use, or None to run every step eagerly.

    injected: a stand-in from tests, used on any device; production passes None, so graphs only
    ever run on CUDA.
    """
    if enforce_eager:
        if device.type == "cuda":
            logger.info("CUDA graphs off: enforce_eager")
        return None
    if injected is None and device.type != "cuda":
        return None
    if not backend.supports_cuda_graphs:
        logger.info("CUDA graphs off: attention backend %s cannot be replayed from a graph",
                    backend.name)
        return None
    return injected if injected is not None else CudaGraphCapturer(device)
