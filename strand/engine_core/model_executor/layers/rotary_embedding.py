"""Rotary position embedding (HF's rotate-half layout) with linear, llama3 and Phi-3's longrope
frequency scaling."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from strand.kernels import _triton, cpu_elementwise


def rope_inv_freq(head_dim: int, theta: float,
                  scaling: dict[str, Any] | None) -> torch.Tensor:  # [head_dim // 2] float32
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    rope_type = scaling["rope_type"]
    factor = float(scaling["factor"])
    if rope_type == "linear":
        return inv_freq / factor
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, factor, scaling)
    raise ValueError(f"rope_scaling.rope_type must be linear or llama3, got {rope_type!r}")


def _llama3_inv_freq(inv_freq: torch.Tensor, factor: float,
                     scaling: dict[str, Any]) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between
    # interpolated smoothly (same formula as transformers' _compute_llama3_parameters).
    low = float(scaling["low_freq_factor"])
    high = float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_len / low
    high_freq_wavelen = old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position up to max_positions, looked up by each token's position."""

    def __init__(self, head_dim: int, max_positions: int, theta: float,
                 scaling: dict[str, Any] | None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.theta = theta
        self.scaling = scaling
        # Not a checkpoint tensor: rebuilt on the target device by build_cache().
        self.register_buffer("cos_sin", torch.empty(0), persistent=False)

    def build_cache(self, device: torch.device, positions: int | None = None) -> None:
        """The table for positions 0..positions - 1 (all max_positions when None). An engine
        passes its max_model_len: a Llama 3.1 table for all 131,072 positions is 64 MiB at
        head_dim 128, resident for positions no request can reach."""
        if positions is not None and positions < 1:
            raise ValueError(f"positions must be >= 1, got {positions}")
        count = self.max_positions if positions is None else min(positions, self.max_positions)
        t = torch.arange(count, dtype=torch.float32, device=device)
        if self.scaling is not None and self.scaling["rope_type"] == "longrope":
            self.cos_sin = _longrope_table(self.head_dim, self.theta, self.scaling, t)
            return
        inv_freq = rope_inv_freq(self.head_dim, self.theta, self.scaling).to(device)
        freqs = torch.outer(t, inv_freq)  # [max_positions, head_dim // 2]
        # Kept in float32 and cast per call, as HF does (tables in bf16 lose position detail).
        self.cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)

    def forward(
        self,
        positions: torch.Tensor,  # [num_tokens] int64
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated (query, key). float32/bfloat16 on CPU rotates them in place, in one pass each
        (strand/kernels/cpu_elementwise.py), instead of building new tensors op by op."""
        # The table stays float32 (the kernel rounds its entries as the torch path's cast does).
        if (cpu_elementwise.applies(query, key) and query.stride(-1) == 1
                and key.stride(-1) == 1):
            cpu_elementwise.rotary_neox_(positions, self.cos_sin, query, key)
            return query, key
        if _triton.runs_triton(query) and query.stride(-1) == 1 and key.stride(-1) == 1:
            # One launch for q and k (strand/kernels/rotary.py); torch's path makes a dozen.
            from strand.kernels.rotary import apply_rotary  # here: Triton only where it runs

            return apply_rotary(query, key, positions, self.cos_sin, is_neox=True)
        cos, sin = self.cos_sin[positions].to(query.dtype).unsqueeze(1).chunk(2, dim=-1)
        return _rotate(query, cos, sin), _rotate(key, cos, sin)


def _longrope_table(head_dim: int, theta: float, scaling: dict[str, Any],
                    t: torch.Tensor) -> torch.Tensor:  # [max_positions, head_dim] float32
    """Positions below original_max_position_embeddings rotate by the short factors, the rest by
    the long ones (vLLM's table); both scaled by attention_factor. transformers instead picks
    one set per forward from the longest position in it, so the two agree exactly while every
    position stays below the original length, and past it only on the positions beyond."""
    shape = torch.arange(0, head_dim, 2, dtype=torch.int64, device=t.device).float() / head_dim
    orig = int(scaling["original_max_position_embeddings"])
    tables = []
    for key in ("short_factor", "long_factor"):
        ext = torch.tensor(scaling[key], dtype=torch.float32, device=t.device)
        freqs = torch.outer(t, 1.0 / (ext * theta**shape))
        tables.append(torch.cat([freqs.cos(), freqs.sin()], dim=-1) * scaling["attention_factor"])
    return torch.where((t < orig).unsqueeze(1), tables[0], tables[1])


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)  # [num_tokens, heads, head_dim // 2] each
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
