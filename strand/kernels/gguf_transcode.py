"""llama.cpp's other weight types rewritten at load, exactly, into the block types the packed
kernels read (strand/kernels/gguf_linear_ref.py states them): what a Q4_K_M or Q5_K_M file holds.

Every type here is, per 32 weights, integer quants q with a scale and an offset: w = d * q + m.
The K-quants keep their per-32 (Q6_K: per-16) scale as a 6- or 8-bit integer times a float16
super-block scale; that product, and the offset's dmin * m, are exact in float32 (at most 11 + 8
significant bits), so a block written with float32 d and m gives the same float32 weights as
llama.cpp's and the `gguf` package's dequantization, bit for bit (the per-256 super-blocks
become per-32 blocks, each with its own float32 scale):
  Q5_K (5.5 bits a weight)  -> Q5_F (7): nibbles and a word of fifth bits, float32 d and m
                               per 32;
  Q6_K (6.56)               -> Q6_F (7): nibbles, two words of fifth and sixth bits, the
                               super-block's float16 d and the two int8 scales of its 16s;
  Q3_K (3.44)               -> Q3_F (5): Q6_F's head (the super-block's float16 d and a
                               6-bit signed scale per 16 weights), its q in -4..3 as nibbles of
                               q + 4; a Q3_K_M or Q3_K_L file's layers read at 1.45x their
                               bytes (Q6_F's 7 bits, before: 2x);
  IQ4_XS (4.25)             -> IQ4_F (5): its 4-bit codes (indices into 16 int8 levels) kept,
                               its float16 d times a 6-bit signed scale per 32 as a float32 d;
  Q4_K, Q5_0, Q5_1, Q8_0, Q4_0, Q4_1, IQ4_NL: read as they are (IQ4_NL's codes looked up in
                               the kernel's registers; in a mix of types, as Q8_0 or Q8_F).
A layer whose parts differ in type (Q4_K_M's attn_v is Q6_K where attn_q and attn_k are Q4_K)
is packed in the one type that holds all of them exactly: Q8_F (int8 quants, float32 d per 16
and m per 32: 11 bits a weight), or Q8_0 where every part is Q8_0 or Q5_0 (q - 16 in int8, the
same float16 d), or Q6_F where every part is Q6_K or Q3_K.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from strand.kernels.gguf_linear_ref import (
    BLOCK,
    BLOCK_BYTES,
    IQ4_F,
    IQ4_LEVELS,
    IQ4_NL,
    NAMES,
    Q3_F,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_F,
    Q6_F,
    Q8_0,
    Q8_F,
    scale_min_k4,
)

# GGML's numbers (gguf.GGMLQuantizationType) and block bytes of the types read here.
Q3_K, Q5_K, Q6_K, IQ4_XS = 11, 13, 14, 23
SOURCE_NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0", Q5_0: "Q5_0", Q5_1: "Q5_1",
                Q3_K: "Q3_K", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K", IQ4_NL: "IQ4_NL",
                IQ4_XS: "IQ4_XS"}
SOURCE_BLOCK = {Q4_0: (32, 18), Q4_1: (32, 20), Q8_0: (32, 34), Q5_0: (32, 22),
                Q5_1: (32, 24), Q3_K: (256, 110), Q4_K: (256, 144), Q5_K: (256, 176),
                Q6_K: (256, 210), IQ4_NL: (32, 18), IQ4_XS: (256, 136)}
# Each type's own packed form; any mix of types goes to Q8_F (or Q8_0, see common_type).
NATIVE = {Q4_0: Q4_0, Q4_1: Q4_1, Q8_0: Q8_0, Q5_0: Q5_0, Q5_1: Q5_1, Q3_K: Q3_F, Q4_K: Q4_K,
          Q5_K: Q5_F, Q6_K: Q6_F, IQ4_NL: IQ4_NL, IQ4_XS: IQ4_F}
_LEVELS = np.array(IQ4_LEVELS, np.int8)


class Fields(NamedTuple):
    """A weight's 32-blocks as numbers: q [B, 32] int8, d [B, 2] float32 (the first and the last
    16 weights' scale), m [B] float32; w = d * q + m. d16: the float16 scale bytes [B, 2] where
    the source had one per block (the types Q8_0 keeps as they are; Q6_K's super-block d, with
    sc [B, 2] int8 its two scales: d = d16 * sc)."""
    q: np.ndarray
    d: np.ndarray
    m: np.ndarray
    d16: np.ndarray | None = None
    sc: np.ndarray | None = None
    codes: np.ndarray | None = None  # IQ4's [B, 16] code bytes (q: their levels)


def common_type(types: list[int]) -> int:
    """The packed type every part of a layer goes to: its own where all parts share one, Q8_0
    where each is Q8_0, Q5_0 or IQ4_NL, Q6_F where each is Q6_K or Q3_K, else Q8_F (which
    holds each type exactly)."""
    unknown = [t for t in types if t not in NATIVE]
    if unknown:
        raise ValueError(f"GGML type {unknown[0]} is not read packed (types read: "
                         f"{', '.join(SOURCE_NAMES.values())})")
    targets = {NATIVE[t] for t in types}
    if len(targets) == 1:
        return targets.pop()
    if targets == {Q3_F, Q6_F}:
        return Q6_F  # which holds Q3_K's q - 4 as q - 32 exactly, at 7 bits to Q8_F's 11
    return Q8_0 if targets <= {Q8_0, Q5_0, IQ4_NL} else Q8_F


def transcode(rows: np.ndarray, ggml_type: int, target: int) -> np.ndarray:
    """A GGUF tensor's rows ([N, row bytes] uint8, GGML type `ggml_type`) as rows of `target`
    blocks ([N, K / 32 * block bytes] uint8), the same weights exactly."""
    wider = (target == Q8_0 and ggml_type in (Q5_0, IQ4_NL)) or (target == Q6_F
                                                                 and ggml_type == Q3_K)
    if ggml_type not in NATIVE or (target not in (NATIVE[ggml_type], Q8_F) and not wider):
        raise ValueError(f"{SOURCE_NAMES.get(ggml_type, ggml_type)} rows cannot be written as "
                         f"{NAMES.get(target, target)}")
    if target == ggml_type:
        return rows
    if ggml_type == Q6_K and target == Q6_F and (fast := _q6_k_kernel(rows)) is not None:
        return fast
    n = rows.shape[0]
    f = _fields(rows, ggml_type)
    pack = {Q3_F: _pack_q3f, Q5_F: _pack_q5f, Q6_F: _pack_q6f, Q8_0: _pack_q8_0, Q8_F: _pack_q8f,
            IQ4_F: _pack_iq4f}
    return pack[target](f).reshape(n, -1)


def _q6_k_kernel(rows: np.ndarray) -> np.ndarray | None:
    """Q6_K rows as Q6_F by the C++ kernels (strand/kernels/csrc/gguf_transcode.cpp), where they
    are built: the bytes the numpy rewrite below makes, one pass over each super-block instead of
    a dozen whole-array numpy ops (a Q4_K_M file's head and half its down projections are Q6_K).
    None without them."""
    from strand.kernels._cpu_build import KERNELS

    module = KERNELS.built()
    if module is None:
        return None
    if not (rows.flags.writeable and rows.flags.c_contiguous):
        rows = np.array(rows, order="C")  # the file's own rows: a read-only map torch refuses
    n, row_bytes = rows.shape
    out = np.empty((n, row_bytes // SOURCE_BLOCK[Q6_K][1] * 8 * BLOCK_BYTES[Q6_F]), np.uint8)
    module.gguf_q6k_to_q6f(torch.from_numpy(out), torch.from_numpy(rows))
    return out


def _fields(rows: np.ndarray, ggml_type: int) -> Fields:
    weights, size = SOURCE_BLOCK[ggml_type]
    blocks = np.ascontiguousarray(rows).reshape(-1, size)
    if ggml_type in (IQ4_NL, IQ4_XS):
        return _iq4(blocks, ggml_type)
    if weights == BLOCK:
        return _legacy(blocks, ggml_type)
    return {Q3_K: _q3_k, Q4_K: _q4_k, Q5_K: _q5_k, Q6_K: _q6_k}[ggml_type](blocks)


def _half(b: np.ndarray) -> np.ndarray:  # [B, 2] uint8 -> [B] float32
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32).reshape(-1)


def _nibbles32(qs: np.ndarray) -> np.ndarray:  # [B, 16] -> [B, 32]: low nibbles, then high
    return np.concatenate([qs & 15, qs >> 4], axis=1)


def _high_bits(qh: np.ndarray) -> np.ndarray:  # [B, 4] (a little-endian uint32) -> [B, 32] 0/16
    bits = np.ascontiguousarray(qh).view("<u4").reshape(-1, 1) >> np.arange(32, dtype=np.uint32)
    return ((bits & 1) << 4).astype(np.uint8)


def _legacy(blocks: np.ndarray, t: int) -> Fields:
    b = blocks.shape[0]
    d = _half(blocks[:, :2])
    zero = np.zeros(b, np.float32)
    if t == Q8_0:
        q, m = blocks[:, 2:].view(np.int8), zero
    elif t == Q4_0:
        q, m = _nibbles32(blocks[:, 2:]).astype(np.int8) - 8, zero
    elif t == Q4_1:
        q, m = _nibbles32(blocks[:, 4:]).astype(np.int8), _half(blocks[:, 2:4])
    elif t == Q5_0:
        q = (_nibbles32(blocks[:, 6:]) | _high_bits(blocks[:, 2:6])).astype(np.int8) - 16
        m = zero
    else:  # Q5_1
        q = (_nibbles32(blocks[:, 8:]) | _high_bits(blocks[:, 4:8])).astype(np.int8)
        m = _half(blocks[:, 2:4])
    return Fields(np.ascontiguousarray(q), np.repeat(d[:, None], 2, axis=1), m,
                  np.ascontiguousarray(blocks[:, :2]))


def _iq4(blocks: np.ndarray, t: int) -> Fields:
    """IQ4_NL (per 32: float16 d, 16 bytes of codes) and IQ4_XS (per 256: float16 d, the high 2
    bits of 8 scales as a uint16, their low 4 bits as nibbles, 128 bytes of codes): the codes'
    levels as int8 quants, d per 32 (IQ4_XS: d * (scale - 32), exact in float32)."""
    if t == IQ4_NL:
        codes, d16 = blocks[:, 2:], np.ascontiguousarray(blocks[:, :2])
        d = _half(d16)
    else:
        codes, d16 = blocks[:, 8:].reshape(-1, 16), None
        high = (blocks[:, 2:4].view("<u2").astype(np.uint32) >> (2 * np.arange(8))) & 3
        low = (blocks[:, 4:8, None] >> np.array([0, 4], np.uint8)).reshape(-1, 8) & 15
        scales = (low | (high << 4)).astype(np.float32) - 32  # [B, 8], one per 32
        d = (_half(blocks[:, :2])[:, None] * scales).reshape(-1)
    q = _LEVELS[_nibbles32(codes)]
    return Fields(np.ascontiguousarray(q), np.repeat(d[:, None], 2, axis=1),
                  np.zeros(d.size, np.float32), d16, codes=np.ascontiguousarray(codes))


def _k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: per 32-weight sub-block, d * sc and -(dmin * m): [B * 8] float32 each."""
    d, dmin = _half(blocks[:, :2])[:, None], _half(blocks[:, 2:4])[:, None]
    sc, mn = (t.numpy() for t in scale_min_k4(torch.from_numpy(np.array(blocks[:, 4:16]))))
    return ((d * sc.astype(np.float32)).reshape(-1),
            (-(dmin * mn.astype(np.float32))).reshape(-1))


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """[B, 128] -> [B * 8, 32]: per 64 weights, 32 bytes whose low nibbles are the first 32."""
    q = qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & 15).reshape(-1, 32)


def _q4_k(blocks: np.ndarray) -> Fields:
    d, m = _k_scales(blocks)
    q = _k_nibbles(blocks[:, 16:]).astype(np.int8)
    return Fields(q, np.repeat(d[:, None], 2, axis=1), m)


def _q5_k(blocks: np.ndarray) -> Fields:
    d, m = _k_scales(blocks)
    qh = blocks[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    q = _k_nibbles(blocks[:, 48:]) | ((qh & 1) << 4).reshape(-1, 32)
    return Fields(q.astype(np.int8), np.repeat(d[:, None], 2, axis=1), m)


def _q6_k(blocks: np.ndarray) -> Fields:
    ql, qh = blocks[:, :128], blocks[:, 128:192]
    scales = blocks[:, 192:208].view(np.int8).astype(np.float32)  # [B, 16], one per 16 weights
    d = _half(blocks[:, 208:210])[:, None] * scales
    # Per 128 weights: 64 bytes of low 4 bits (low nibbles weights 0-63, high 64-127) and 32
    # bytes of top 2 bits (bits 0-1 weights 0-31, 2-3 32-63, 4-5 64-95, 6-7 96-127).
    low = (ql.reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 15
    top = (qh.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    q = (low.reshape(-1, 2, 4, 32) | (top << 4)).astype(np.int8) - 32
    d16 = np.repeat(np.ascontiguousarray(blocks[:, 208:210]), 8, axis=0)  # [B * 8, 2] bytes
    return Fields(q.reshape(-1, 32), d.reshape(-1, 2), np.zeros(d.size // 2, np.float32), d16,
                  np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).reshape(-1, 2))


def _q3_k_scales(packed: np.ndarray) -> np.ndarray:
    """[B, 12] -> [B, 16] int8: the 16 six-bit scales less 32, as llama.cpp unpacks them: the
    low 4 bits of scale i in byte i's low nibble (i < 8) or byte i - 8's high one, the top 2
    bits of scale 4k + i in bits 2k, 2k + 1 of byte 8 + i."""
    lo = np.concatenate([packed[:, 0:8] & 15, packed[:, 0:8] >> 4], axis=1)  # scales 0..15
    top = (packed[:, 8:12, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3  # [B, i, k]
    top = top.transpose(0, 2, 1).reshape(-1, 16)  # scale 4k + i
    return ((lo | (top << 4)).astype(np.int16) - 32).astype(np.int8)


def _q3_k(blocks: np.ndarray) -> Fields:
    hmask, qs, d = blocks[:, :32], blocks[:, 32:96], _half(blocks[:, 108:110])
    sc = _q3_k_scales(blocks[:, 96:108])  # [B, 16], one per 16 weights
    # Per 128 weights h: 32 bytes of 2-bit quants (bits 2j, 2j + 1: weights 32j + l of the
    # 128), and the third bit of weight 128h + 32j + l in bit 4h + j of hmask[l]; the quant is
    # (2 bits) - 4 where that bit is clear.
    low = (qs.reshape(-1, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3
    bit = (hmask.reshape(-1, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 2, 4, 1)) & 1
    q = low.astype(np.int8) - 4 * (1 - bit.astype(np.int8))  # [B, 2, 4, 32]: -4..3
    dsc = d[:, None] * sc.astype(np.float32)
    d16 = np.repeat(np.ascontiguousarray(blocks[:, 108:110]), 8, axis=0)
    return Fields(np.ascontiguousarray(q.reshape(-1, 32)), dsc.reshape(-1, 2),
                  np.zeros(dsc.size // 2, np.float32), d16, sc.reshape(-1, 2))


def _f32_bytes(a: np.ndarray) -> np.ndarray:  # [B, k] float32 -> [B, 4k] uint8
    return np.ascontiguousarray(a, dtype="<f4").view(np.uint8).reshape(a.shape[0], -1)


def _pack_q8f(f: Fields) -> np.ndarray:
    return np.concatenate([_f32_bytes(f.d), _f32_bytes(f.m[:, None]), f.q.view(np.uint8)],
                          axis=1)


def _nibble_bytes(q: np.ndarray) -> np.ndarray:  # [B, 32] -> [B, 16]: byte i holds i, i + 16
    return (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)


def _bit_word(q: np.ndarray, bit: int) -> np.ndarray:  # [B, 32] -> [B, 4]: bit j is q_j's
    return np.packbits((q >> bit) & 1, axis=1, bitorder="little")


def _pack_q5f(f: Fields) -> np.ndarray:
    q = f.q.view(np.uint8)
    return np.concatenate([_f32_bytes(f.d[:, :1]), _f32_bytes(f.m[:, None]), _bit_word(q, 4),
                           _nibble_bytes(q)], axis=1)


def _pack_q6f(f: Fields) -> np.ndarray:
    assert f.d16 is not None and f.sc is not None  # from Q6_K or Q3_K, the types sent here
    q = (f.q.astype(np.int16) + 32).astype(np.uint8)  # q - 32 (Q3_K's -4..3) to 0..63
    return np.concatenate([f.d16, f.sc.view(np.uint8), _bit_word(q, 4), _bit_word(q, 5),
                           _nibble_bytes(q)], axis=1)


def _pack_q3f(f: Fields) -> np.ndarray:
    assert f.d16 is not None and f.sc is not None  # from Q3_K, the type sent here
    q = (f.q + 4).astype(np.uint8)  # -4..3 to 0..7
    return np.concatenate([f.d16, f.sc.view(np.uint8), _nibble_bytes(q)], axis=1)


def _pack_iq4f(f: Fields) -> np.ndarray:
    assert f.codes is not None  # from IQ4_XS, the one type sent here
    return np.concatenate([_f32_bytes(f.d[:, :1]), f.codes], axis=1)


def _pack_q8_0(f: Fields) -> np.ndarray:
    assert f.d16 is not None  # Q8_0, Q5_0 and IQ4_NL, the types common_type sends here
    return np.concatenate([f.d16, f.q.view(np.uint8)], axis=1)
