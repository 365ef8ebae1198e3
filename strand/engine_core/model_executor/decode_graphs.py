"""CUDA graphs for pure-decode steps (vLLM's CUDAGraphRunner): one graph per padded batch size.

Life of a graph step:
 1. at start-up, once the KV cache exists, each capture size (largest first) gets a warm-up
    forward and then a capture over static input buffers; all graphs share one memory pool;
 2. a step whose every request has exactly one new token, with no more requests than the largest
    size, is padded to the next capture size: its rows go into the first n rows of the static
    buffers; padding rows get slot -1 (the KV write skips it), seq_len 1 and a block table row of
    block 0 (reserved: no request owns it), so they read something finite and write nothing;
 3. replay; the first n rows of the graph's output are the step's hidden states.
Logits and sampling stay outside the graph, so they keep their data-dependent shapes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from strand.engine_core.model_executor.attention.backend import AttentionBackend, AttentionMetadata
from strand.engine_core.model_executor.attention.metadata_builder import build_graph_decode_metadata
from strand.engine_core.model_executor.cuda_graphs import (
    CapturedGraph,
    GraphCapturer,
    capture_sizes,
    padded_size,
)

logger = logging.getLogger(__name__)

PAD_SLOT = -1  # slot mapping of a padding row: the KV write kernels skip negative slots

# model(input_ids, positions, kv_caches, metadata, backend) -> [num_tokens, hidden]
Forward = Callable[
    [torch.Tensor, torch.Tensor, list[torch.Tensor], AttentionMetadata, AttentionBackend],
    torch.Tensor]


@dataclass(slots=True)
class DecodeBuffers:
    """What every decode graph reads; the graph of size s reads rows [:s]."""

    input_ids: torch.Tensor  # [max_size] int64
    positions: torch.Tensor  # [max_size] int64
    slot_mapping: torch.Tensor  # [max_size] int64
    query_start_loc: torch.Tensor  # [max_size + 1] int32: 0, 1, ..., max_size; never changes
    seq_lens: torch.Tensor  # [max_size] int32
    block_table: torch.Tensor  # [max_size, max_num_blocks] int32
    query_start_loc_cpu: torch.Tensor  # host twins, kept equal to the device tensors
    seq_lens_cpu: torch.Tensor

    @classmethod
    def allocate(cls, max_size: int, max_num_blocks: int, device: torch.device) -> DecodeBuffers:
        """Every row starts as padding: warm-up and capture run on it and write no KV."""
        def on(t: torch.Tensor) -> torch.Tensor:
            return t.to(device)

        query_start_loc = torch.arange(max_size + 1, dtype=torch.int32)
        seq_lens = torch.ones(max_size, dtype=torch.int32)
        return cls(
            input_ids=on(torch.zeros(max_size, dtype=torch.int64)),
            positions=on(torch.zeros(max_size, dtype=torch.int64)),
            slot_mapping=on(torch.full((max_size,), PAD_SLOT, dtype=torch.int64)),
            query_start_loc=on(query_start_loc),
            seq_lens=on(seq_lens),
            block_table=on(torch.zeros(max_size, max_num_blocks, dtype=torch.int32)),
            query_start_loc_cpu=query_start_loc.clone(),
            seq_lens_cpu=seq_lens.clone(),
        )


class DecodeGraphRunner:
    """Captures the model's forward for each capture size; loads and replays steps."""

    def __init__(self, model: Forward, backend: AttentionBackend, kv_caches: list[torch.Tensor],
                 capturer: GraphCapturer, *, max_num_seqs: int, max_model_len: int,
                 block_size: int, device: torch.device) -> None:
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches  # the graphs keep these tensors' addresses: never replaced
        self.capturer = capturer
        self.sizes = capture_sizes(max_num_seqs)  # ascending
        self.max_seq_len = max_model_len
        self.block_size = block_size
        self.device = device
        self.num_block_cols = -(-max_model_len // block_size)
        self.buffers = DecodeBuffers.allocate(self.sizes[-1], self.num_block_cols, device)
        b = self.buffers
        self.metadata = {size: build_graph_decode_metadata(
            size, b.slot_mapping, b.query_start_loc, b.seq_lens, b.block_table,
            b.query_start_loc_cpu, b.seq_lens_cpu, max_model_len, block_size)
            for size in self.sizes}
        self.graphs: dict[int, CapturedGraph] = {}

    @torch.inference_mode()
    def capture(self) -> None:
        start = time.perf_counter()
        pool = self.capturer.new_pool()
        # Largest first: the pool grows to the largest graph's needs once, and the smaller
        # graphs reuse that memory instead of each adding their own.
        for size in reversed(self.sizes):
            fn = self._forward_fn(size)
            fn()  # warm-up: Triton compiles and libraries pick kernels outside the capture
            try:
                self.graphs[size] = self.capturer.capture(fn, pool)
            except RuntimeError as e:
                raise RuntimeError(f"capturing the decode CUDA graph of batch size {size} "
                                   f"failed (--enforce-eager skips CUDA graphs): {e}") from e
        logger.info("captured CUDA graphs for decode batch sizes %s in %.1f s",
                    self.sizes, time.perf_counter() - start)

    def _forward_fn(self, size: int) -> Callable[[], torch.Tensor]:
        b, metadata = self.buffers, self.metadata[size]
        ids, positions = b.input_ids[:size], b.positions[:size]
        return lambda: self.model(ids, positions, self.kv_caches, metadata, self.backend)

    def padded_size(self, query_lens: np.ndarray, seq_lens: np.ndarray) -> int | None:
        """The graph size this step runs in, or None to run it eagerly: any request with more
        (or fewer) than one new token, more requests than the largest graph, or a context past
        the static maximum the graphs were captured for."""
        if not len(query_lens) or bool((query_lens != 1).any()):
            return None
        if int(seq_lens.max()) > self.max_seq_len:
            return None
        return padded_size(self.sizes, len(query_lens))

    def load(
        self,
        size: int,
        input_ids: np.ndarray,  # [n] int64
        positions: np.ndarray,  # [n] int64
        slot_mapping: np.ndarray,  # [n] int64
        seq_lens: np.ndarray,  # [n] int
        block_table: np.ndarray,  # [n, >= blocks of the longest context] int32
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Writes rows [:size] of the static buffers: the step's n rows, then padding rows
        (every one of them, so no row left from a larger earlier batch writes into blocks that
        may have changed owner since). Returns what the graph of that size reads."""
        n = len(input_ids)
        ids = np.zeros(size, dtype=np.int64)
        ids[:n] = input_ids
        pos = np.zeros(size, dtype=np.int64)
        pos[:n] = positions
        slots = np.full(size, PAD_SLOT, dtype=np.int64)
        slots[:n] = slot_mapping
        lens = np.ones(size, dtype=np.int32)
        lens[:n] = seq_lens
        cols = min(self.num_block_cols, block_table.shape[1])
        table = np.zeros((size, self.num_block_cols), dtype=np.int32)
        table[:n, :cols] = block_table[:, :cols]
        b = self.buffers
        # From fresh pageable arrays: each copy has read its source when it returns, so the
        # host needs no sync and no buffer is overwritten while a copy is in flight.
        non_blocking = self.device.type == "cuda"
        for dst, src in ((b.input_ids, ids), (b.positions, pos), (b.slot_mapping, slots),
                         (b.seq_lens, lens), (b.block_table, table)):
            dst[:size].copy_(torch.from_numpy(src), non_blocking=non_blocking)
        b.seq_lens_cpu[:size] = torch.from_numpy(lens)
        return b.input_ids[:size], b.positions[:size], self.metadata[size]

    def replay(self, size: int) -> torch.Tensor:  # [size, hidden]: rows past n are padding
        graph = self.graphs[size]
        graph.replay()
        return graph.output
