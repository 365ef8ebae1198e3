"""Llama 3.1/3.2's llama3 rope scaling from a GGUF file: llama.cpp's converter writes no
metadata for it, only a `rope_freqs` tensor, each rotary frequency's divisor. Here the
divisors become the `rope_scaling` entry of the converted config.json, so the model runs with
the scaling its HF checkpoint has.

The divisors fix the scaling only up to one common factor of (low_freq_factor,
high_freq_factor, original_max_position_embeddings): the formula depends on their ratios. So
low_freq_factor is taken as 1 and the other two follow from the divisors of the band in
between (a straight line in 1 / wavelength), or, with fewer than two frequencies in that band,
from the wavelengths either side of it: any choice there that gives the band's divisors gives
the same frequencies. The result is checked by recomputing the divisors."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch

from strand.engine_core.model_executor.layers.rotary_embedding import rope_inv_freq

logger = logging.getLogger(__name__)

_CLOSE = 1e-4  # relative: the divisors are float32


def llama3_scaling(divisors: np.ndarray, theta: float, head_dim: int) -> dict[str, Any] | None:
    """The llama3 `rope_scaling` whose divisors these are; None where they are none."""
    d = torch.as_tensor(np.asarray(divisors, dtype=np.float64).reshape(-1))
    plain = rope_inv_freq(head_dim, theta, None).double()
    if d.shape != plain.shape or not bool((d >= 1 - _CLOSE).all()):
        return None
    factor = float(d.max())
    if factor <= 1 + _CLOSE:
        return None
    wavelen = 2 * math.pi / plain
    kept = d <= 1 + _CLOSE
    scaled = d >= factor * (1 - _CLOSE)
    medium = ~kept & ~scaled
    # smooth = (1 / d - 1 / factor) / (1 - 1 / factor) = (old / wavelen - low) / (high - low)
    smooth = (1 / d[medium] - 1 / factor) / (1 - 1 / factor)
    if int(medium.sum()) >= 2:
        a, b = np.polyfit((1 / wavelen[medium]).numpy(), smooth.numpy(), 1)
        if b >= 0:
            return None
        high, old = 1 - 1 / b, -a / b
    elif int(medium.sum()) == 1:
        # old = low_freq_wavelen anywhere between this wavelength and the next scaled one;
        # high then follows from this one's smooth.
        w = float(wavelen[medium][0])
        shortest_scaled = float(wavelen[scaled].min()) if bool(scaled.any()) else 2 * w
        old = (w + shortest_scaled) / 2
        high = 1 + (old / w - 1) / float(smooth[0])
    else:
        # Both thresholds between the longest kept wavelength and the shortest scaled one.
        longest_kept = float(wavelen[kept].max()) if bool(kept.any()) else 0.0
        shortest_scaled = float(wavelen[scaled].min())
        if longest_kept >= shortest_scaled:
            return None
        gap = shortest_scaled - longest_kept
        old = longest_kept + 2 * gap / 3  # low_freq_wavelen = old / low, low = 1
        high = old / (longest_kept + gap / 3)
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
               "high_freq_factor": float(high), "original_max_position_embeddings": float(old)}
    again = plain / rope_inv_freq(head_dim, theta, scaling).double()
    return scaling if torch.allclose(again, d, rtol=_CLOSE, atol=0) else None


def rope_scaling_of(divisors: np.ndarray, theta: float, head_dim: int) -> dict[str, Any] | None:
    """llama3_scaling, saying so where a file's rope_freqs is not llama3 scaling (then the
    model runs with plain rope, as before this file was read)."""
    scaling = llama3_scaling(divisors, theta, head_dim)
    if scaling is None:
        logger.warning("the GGUF file's rope_freqs tensor is not llama3 rope scaling: ignored "
                       "(plain rope)")
    return scaling
