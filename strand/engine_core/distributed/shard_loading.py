"""Read only this rank's part of each checkpoint tensor (safetensors' get_slice: the other ranks'
bytes are never copied out of the file).

Most tensors give a rank one contiguous range of one dim (shard_range). Phi-3's fused tensors
give it one range per part (fused_ranges): its q, k and v rows of qkv_proj, its gate and up rows
of gate_up_proj, copied one after another as the rank's own fused parameter lays them out;
cutting the fused tensor in N equal pieces would hand rank 0 all of q and none of v."""

from __future__ import annotations

from typing import Any

import torch

from strand.engine_core.distributed.layers import ShardLayout

_COLUMN = ("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj.", "mlp.gate_proj.",
           "mlp.up_proj.")
_ROW = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")
_EXPERTS = ".mlp.experts."  # Qwen3-MoE: model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight
_FUSED = (".self_attn.qkv_proj.weight", ".mlp.gate_up_proj.weight")  # Phi-3's checkpoints


def fused_ranges(name: str, layout: ShardLayout) -> list[tuple[int, int]] | None:
    """(start, length) along dim 0 of each part of a fused tensor this rank holds, in the order
    of its local parameter; None when `name` is not fused."""
    if not name.endswith(_FUSED):
        return None
    hd = layout.head_dim
    if name.endswith(".qkv_proj.weight"):
        q, kv = layout.num_heads * hd, layout.num_kv_heads * hd
        q_total, kv_total = q * layout.world_size, layout.total_kv_heads * hd
        kv_start = layout.first_kv_head * hd
        return [(layout.rank * q, q), (q_total + kv_start, kv),
                (q_total + kv_total + kv_start, kv)]
    inter = layout.intermediate_size
    return [(layout.rank * inter, inter), (inter * layout.world_size + layout.rank * inter, inter)]


def shard_range(name: str, layout: ShardLayout) -> tuple[int, int, int] | None:
    """(dim, start, length) of the full tensor `name` that this rank holds; None: all of it."""
    q = layout.num_heads * layout.head_dim
    if name in _VOCAB:
        return 0, layout.vocab_start, layout.vocab_rows
    if _EXPERTS in name:  # each expert's width split: gate/up rows, down columns
        width = layout.moe_intermediate_size
        return (1 if name.endswith(".down_proj.weight") else 0), layout.rank * width, width
    if any(part in name for part in _COLUMN):
        if ".q_proj." in name:
            return 0, layout.rank * q, q
        if ".k_proj." in name or ".v_proj." in name:
            kv = layout.num_kv_heads * layout.head_dim
            return 0, layout.first_kv_head * layout.head_dim, kv
        return 0, layout.rank * layout.intermediate_size, layout.intermediate_size
    if name.endswith(_ROW):
        width = q if "o_proj" in name else layout.intermediate_size
        return 1, layout.rank * width, width
    return None


def copy_shard(handle: Any, name: str, dest: torch.Tensor, layout: ShardLayout,
               file_name: str) -> None:
    """Copy this rank's part of `name` (from an open safe_open handle) into dest."""
    if name.endswith("self_attn.o_proj.bias") and layout.rank != 0:
        # Row-parallel outputs are summed over ranks: the bias must be added by one of them.
        dest.zero_()
        return
    part = handle.get_slice(name)
    full = tuple(part.get_shape())
    pieces = fused_ranges(name, layout)
    if pieces is not None:
        _copy_fused(part, name, full, pieces, dest, layout, file_name)
        return
    spec = shard_range(name, layout)
    if spec is None:
        tensor = part[:]
        target = dest
    else:
        dim, start, length = spec
        if dim >= len(full) or start + length > full[dim]:
            raise ValueError(f"tensor {name!r} in {file_name} has shape {list(full)}: rank "
                             f"{layout.rank} of {layout.world_size} needs [{start}, "
                             f"{start + length}) of dim {dim}")
        tensor = part[start:start + length] if dim == 0 else part[:, start:start + length]
        target = dest
        if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
            # The last rank's table is padded to vocab_per_rank rows: zeros past the vocabulary.
            dest.zero_()
            target = dest.narrow(0, 0, length)
    if tuple(tensor.shape) != tuple(target.shape):
        raise ValueError(f"tensor {name!r} in {file_name} has shape {list(full)}, rank "
                         f"{layout.rank}'s shard {list(tensor.shape)} does not fit the model's "
                         f"{list(target.shape)}")
    target.copy_(tensor)


def _copy_fused(part: Any, name: str, full: tuple[int, ...], pieces: list[tuple[int, int]],
                dest: torch.Tensor, layout: ShardLayout, file_name: str) -> None:
    total = sum(length for _, length in pieces)
    if len(full) != 2 or total != dest.shape[0] or full[1] != dest.shape[1] or any(
            start + length > full[0] for start, length in pieces):
        raise ValueError(f"tensor {name!r} in {file_name} has shape {list(full)}: rank "
                         f"{layout.rank} of {layout.world_size} needs rows {pieces} "
                         f"(start, length) into its {list(dest.shape)}")
    offset = 0
    for start, length in pieces:
        dest.narrow(0, offset, length).copy_(part[start:start + length])
        offset += length
