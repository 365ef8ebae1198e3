"""Read only this rank's part of each checkpoint tensor (safetensors' get_slice: the other ranks'
bytes are never copied out of the file)."""

from __future__ import annotations

from typing import Any

import torch

from engine_core.distributed.layers import ShardLayout

_COLUMN = ("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj.", "mlp.gate_proj.",
           "mlp.up_proj.")
_ROW = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


def shard_range(name: str, layout: ShardLayout) -> tuple[int, int, int] | None:
    """(dim, start, length) of the full tensor `name` that this rank holds; None: all of it."""
    q = layout.num_heads * layout.head_dim
    if name in _VOCAB:
        return 0, layout.vocab_start, layout.vocab_rows
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
