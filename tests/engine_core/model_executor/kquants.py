"""Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS blocks made from float weights, for test files (the `gguf` package
dequantizes the K-quants but does not make them; llama.cpp's llama-quantize does, and is not
built here). A plain min/max rounding per sub-block, not llama.cpp's search for the best
scales: what matters to the tests is valid blocks that hold weights close to the model's, read
back by gguf's own dequantization (the oracle) and by Strand's transcoding."""

from __future__ import annotations

import numpy as np

QK_K = 256


def _f16(a: np.ndarray) -> np.ndarray:  # [B] float -> [B, 2] uint8
    return np.ascontiguousarray(a.astype(np.float16)).view(np.uint8).reshape(-1, 2)


def _scale_min_bytes(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins a block -> llama.cpp's 12 bytes (get_scale_min_k4's inverse)."""
    out = np.zeros((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
    return out


def _asymmetric(x: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    """x [B, 8, 32] -> (d, dmin [B] float16-rounded, sc, mn [B, 8] uint8, q [B, 8, 32] uint8):
    x ~ d * sc * q - dmin * mn, q in 0..levels."""
    lo = np.minimum(x.min(axis=2), 0.0)
    scale = (x.max(axis=2) - lo) / levels
    d = (scale.max(axis=1) / 63).astype(np.float16).astype(np.float32)
    dmin = ((-lo).max(axis=1) / 63).astype(np.float16).astype(np.float32)
    safe = np.where(d > 0, d, 1.0)[:, None]
    sc = np.clip(np.rint(scale / safe), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(-lo / np.where(dmin > 0, dmin, 1.0)[:, None]), 0, 63).astype(np.uint8)
    step = (d[:, None] * sc)[..., None]
    offset = (dmin[:, None] * mn)[..., None]
    q = np.clip(np.rint((x + offset) / np.where(step > 0, step, 1.0)), 0, levels)
    return d, dmin, sc, mn, q.astype(np.uint8)


def _k_nibbles(q: np.ndarray) -> np.ndarray:  # [B, 8, 32] 4-bit -> [B, 128]
    g = q.reshape(-1, 4, 2, 32)
    return (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(-1, 128)


def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    """[N, K] float (K a multiple of 256) -> [N, K / 256 * 144] uint8 Q4_K blocks."""
    n = w.shape[0]
    d, dmin, sc, mn, q = _asymmetric(w.reshape(-1, 8, 32).astype(np.float32), 15)
    blocks = np.concatenate([_f16(d), _f16(dmin), _scale_min_bytes(sc, mn), _k_nibbles(q)],
                            axis=1)
    return blocks.reshape(n, -1)


def quantize_q5_k(w: np.ndarray) -> np.ndarray:
    """[N, K] float -> [N, K / 256 * 176] uint8 Q5_K blocks."""
    n = w.shape[0]
    d, dmin, sc, mn, q = _asymmetric(w.reshape(-1, 8, 32).astype(np.float32), 31)
    high = (q >> 4) & 1  # [B, 8, 32]: bit j of qh[l] is sub-block j's weight l's fifth bit
    qh = (high << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1).astype(np.uint8)
    blocks = np.concatenate([_f16(d), _f16(dmin), _scale_min_bytes(sc, mn), qh,
                             _k_nibbles(q & 15)], axis=1)
    return blocks.reshape(n, -1)


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """[N, K] float -> [N, K / 256 * 210] uint8 Q6_K blocks: 16 int8 scales of 16 weights."""
    n = w.shape[0]
    x = w.reshape(-1, 16, 16).astype(np.float32)
    scale = np.abs(x).max(axis=2) / 31  # [B, 16]
    d = (scale.max(axis=1) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scale / np.where(d > 0, d, 1.0)[:, None]), -128, 127).astype(np.int8)
    step = (d[:, None] * sc)[..., None]
    q = (np.clip(np.rint(x / np.where(step > 0, step, 1.0)), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(-1, 2, 4, 32)  # per 128 weights, 4 runs of 32
    ql = ((q[:, :, 0:2] & 15) | ((q[:, :, 2:4] & 15) << 4)).reshape(-1, 128)
    qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4)
          | ((q[:, :, 3] >> 4) << 6)).reshape(-1, 64)
    blocks = np.concatenate([ql, qh, sc.view(np.uint8), _f16(d)], axis=1)
    return blocks.reshape(n, -1)


def quantize_q3_k(w: np.ndarray) -> np.ndarray:
    """[N, K] float -> [N, K / 256 * 110] uint8 Q3_K blocks: 16 six-bit signed scales of 16
    weights, quants -4..3 (2 bits in qs, the third in hmask: set for 0..3)."""
    n = w.shape[0]
    x = w.reshape(-1, 16, 16).astype(np.float32)
    scale = np.abs(x).max(axis=2) / 4  # [B, 16]
    d = (scale.max(axis=1) / 31).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scale / np.where(d > 0, d, 1.0)[:, None]), -32, 31).astype(np.int16)
    step = (d[:, None] * sc)[..., None]
    q = (np.clip(np.rint(x / np.where(step > 0, step, 1.0)), -4, 3) + 4).astype(np.uint8)
    q = q.reshape(-1, 2, 4, 32)  # per 128 weights h, runs j of 32 weights l
    qs = ((q & 3) << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)).sum(
        axis=2).astype(np.uint8).reshape(-1, 64)
    hmask = ((q >> 2) << np.arange(8, dtype=np.uint8).reshape(1, 2, 4, 1)).sum(
        axis=(1, 2)).astype(np.uint8)
    s6 = (sc + 32).astype(np.uint8)  # [B, 16], 0..63
    scales = np.concatenate([
        (s6[:, 0:8] & 15) | ((s6[:, 8:16] & 15) << 4),
        (s6[:, 0:4] >> 4) | ((s6[:, 4:8] >> 4) << 2) | ((s6[:, 8:12] >> 4) << 4)
        | ((s6[:, 12:16] >> 4) << 6)], axis=1)
    blocks = np.concatenate([hmask, qs, scales, _f16(d)], axis=1)
    return blocks.reshape(n, -1)


IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89,
                       113], np.float32)


def _iq4_codes(x: np.ndarray, step: np.ndarray) -> np.ndarray:
    """x [B, 32] -> [B, 16] bytes: each weight's nearest level (times step [B]), code j in byte
    j's low nibble and code j + 16 in byte j's high one."""
    levels = IQ4_LEVELS[None, None, :] * step[:, None, None]
    codes = np.abs(x[:, :, None] - levels).argmin(axis=2).astype(np.uint8)
    return codes[:, :16] | (codes[:, 16:] << 4)


def quantize_iq4_nl(w: np.ndarray) -> np.ndarray:
    """[N, K] float -> [N, K / 32 * 18] uint8 IQ4_NL blocks: a float16 d per 32, 4-bit codes."""
    n = w.shape[0]
    x = w.reshape(-1, 32).astype(np.float32)
    d = (np.abs(x).max(axis=1) / 127).astype(np.float16).astype(np.float32)
    return np.concatenate([_f16(d), _iq4_codes(x, d)], axis=1).reshape(n, -1)


def quantize_iq4_xs(w: np.ndarray) -> np.ndarray:
    """[N, K] float -> [N, K / 256 * 136] uint8 IQ4_XS blocks: a float16 d per 256, a 6-bit
    scale (+ 32) per 32 (low 4 bits as nibbles, high 2 in a uint16), 4-bit codes."""
    n = w.shape[0]
    x = w.reshape(-1, 8, 32).astype(np.float32)
    scale = np.abs(x).max(axis=2) / 127  # [B, 8]
    d = (scale.max(axis=1) / 31).astype(np.float16).astype(np.float32)
    ls = np.clip(np.rint(scale / np.where(d > 0, d, 1.0)[:, None]), -32, 31).astype(np.int16)
    codes = _iq4_codes(x.reshape(-1, 32), (d[:, None] * ls).reshape(-1)).reshape(-1, 128)
    s6 = (ls + 32).astype(np.uint16)
    high = ((s6 >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(axis=1).astype("<u2")
    low = ((s6[:, 0::2] & 15) | ((s6[:, 1::2] & 15) << 4)).astype(np.uint8)
    return np.concatenate([_f16(d), high.view(np.uint8).reshape(-1, 2), low, codes],
                          axis=1).reshape(n, -1)


QUANTIZERS = {"Q3_K": quantize_q3_k, "Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k,
              "Q6_K": quantize_q6_k, "IQ4_NL": quantize_iq4_nl, "IQ4_XS": quantize_iq4_xs}
