"""Pure-torch rotary embedding over the first rot_dim dims of each head."""

from __future__ import annotations

import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    # x: [num_tokens, heads, rot_dim]; cos, sin: [num_tokens, 1, rot_dim // 2]
    if is_neox:  # halves: (x[:h], x[h:]) are the pairs
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # GPT-J: adjacent dims are the pairs
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def apply_rotary_ref(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    positions: torch.Tensor,  # [num_tokens]
    cos_sin_cache: torch.Tensor,  # [max_position, rot_dim]: cos | sin
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    rot_dim = cos_sin_cache.shape[1]
    cos, sin = cos_sin_cache[positions.long()].float().unsqueeze(1).chunk(2, dim=-1)
    outs = []
    for x in (q, k):
        rotated = _rotate(x[..., :rot_dim].float(), cos, sin, is_neox).to(x.dtype)
        outs.append(torch.cat((rotated, x[..., rot_dim:]), dim=-1))
    return outs[0], outs[1]
