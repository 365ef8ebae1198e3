"""AttentionMetadata from the runner's host-side arrays: one host->device copy per tensor."""

from __future__ import annotations

import numpy as np
import torch

from strand.engine_core.model_executor.attention.backend import AttentionMetadata


def build_attention_metadata(
    query_lens: np.ndarray,  # [num_reqs] int: tokens of each request this step
    seq_lens: np.ndarray,  # [num_reqs] int: context length after this step
    slot_mapping: np.ndarray,  # [num_tokens] int64: flat cache slot of each new token
    block_table: np.ndarray,  # [num_reqs, >= max blocks needed] int32
    block_size: int,
    device: torch.device,
) -> AttentionMetadata:
    num_reqs = int(query_lens.shape[0])
    query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(query_lens, out=query_start_loc[1:])
    max_seq_len = int(seq_lens.max()) if num_reqs else 0
    # Only as many block columns as the longest context needs: gathers stay small.
    num_cols = max(1, -(-max_seq_len // block_size))
    query_start_loc_cpu = torch.from_numpy(query_start_loc)
    seq_lens_cpu = torch.from_numpy(seq_lens.astype(np.int32, copy=False))
    table = torch.from_numpy(np.ascontiguousarray(block_table[:, :num_cols], dtype=np.int32))
    non_blocking = device.type == "cuda"
    return AttentionMetadata(
        num_reqs=num_reqs,
        num_actual_tokens=int(query_start_loc[-1]),
        slot_mapping=torch.from_numpy(slot_mapping.astype(np.int64, copy=False)).to(
            device, non_blocking=non_blocking),
        query_start_loc=query_start_loc_cpu.to(device, non_blocking=non_blocking),
        seq_lens=seq_lens_cpu.to(device, non_blocking=non_blocking),
        block_table=table.to(device, non_blocking=non_blocking),
        max_query_len=int(query_lens.max()) if num_reqs else 0,
        max_seq_len=max_seq_len,
        query_start_loc_cpu=query_start_loc_cpu,
        seq_lens_cpu=seq_lens_cpu,
        block_size=block_size,
    )


def build_graph_decode_metadata(
    size: int,  # rows of the graph: every row is one request of one new token
    slot_mapping: torch.Tensor,  # [>= size] int64 on the device
    query_start_loc: torch.Tensor,  # [>= size + 1] int32 on the device: 0, 1, 2, ...
    seq_lens: torch.Tensor,  # [>= size] int32 on the device
    block_table: torch.Tensor,  # [>= size, max_num_blocks] int32 on the device
    query_start_loc_cpu: torch.Tensor,  # host twins of the two above
    seq_lens_cpu: torch.Tensor,
    max_seq_len: int,  # the longest context any replay may see
    block_size: int,
) -> AttentionMetadata:
    """Metadata of a CUDA-graph decode batch, over static buffers rewritten before each replay.

    Its ints are frozen into the graph at capture, so they describe every batch it will serve:
    all `size` rows are requests (padding rows included) and max_seq_len is the static maximum,
    never this step's, so a kernel sizing its launch from it is sized for any replay.
    """
    return AttentionMetadata(
        num_reqs=size,
        num_actual_tokens=size,
        slot_mapping=slot_mapping[:size],
        query_start_loc=query_start_loc[:size + 1],
        seq_lens=seq_lens[:size],
        block_table=block_table[:size],
        max_query_len=1,
        max_seq_len=max_seq_len,
        query_start_loc_cpu=query_start_loc_cpu[:size + 1],
        seq_lens_cpu=seq_lens_cpu[:size],
        block_size=block_size,
    )
