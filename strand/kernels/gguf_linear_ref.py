"""Pure-torch reference of the GGUF block formats the CPU kernel reads packed
(strand/kernels/csrc/gguf_linear.cpp, gguf_tiled.cpp): llama.cpp's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K
and IQ4_NL, and five of Strand's own that llama.cpp's other types are rewritten into at load,
exactly (strand/kernels/gguf_transcode.py).

A packed weight is [N, K / 32 * block bytes] uint8: each row its K weights as K / 32 blocks of 32,
each block a head (scale d and offset m, float16 or float32), then its 5th (and 6th) bits, then
its quants. Q8_0 (34 bytes): float16 d, 32 int8 q; w = d * q. Q4_0 (18 bytes): float16 d, 16
bytes of nibbles; w = d * (q - 8). Q4_1 (20 bytes): float16 d, float16 m, 16 bytes of nibbles;
w = d * q + m. A block's first 16 weights are its bytes' low nibbles, the last 16 their high
nibbles. Q5_0 (22 bytes): float16 d, 4 bytes of bit 4 (bit j of the little-endian word is weight
j's), 16 bytes of nibbles; w = d * (q - 16). Q5_1 (24 bytes): float16 d, float16 m, the same;
w = d * q + m. Q4_K (144 bytes per 256 weights, 18 per 32): float16 d, float16 dmin, 12 bytes of
eight 6-bit scales sc and mins mn, then per 64 weights 32 bytes of nibbles (the low ones the first
32 weights); w = d * sc * q - dmin * mn per 32.
Strand's: float32 d and m hold a K-quant's per-32 scale d * sc and offset -dmin * m exactly.
Q5_F (28 bytes): float32 d, float32 m, bit 4's word, nibbles; w = d * q + m (from Q5_K).
Q6_F (28 bytes, 7 bits a weight): float16 d, int8 sc_lo, int8 sc_hi, bit 4's word, bit 5's
word, nibbles; w_j = (d * sc) * (q_j - 32), sc_lo for weights 0..15 and sc_hi for 16..31 (from
Q6_K: its super-block's d and its per-16 scales; d * sc is exact in float32).
Q3_F (20 bytes, 5 bits a weight): Q6_F's head (float16 d, int8 sc_lo, int8 sc_hi), then nibbles
of q + 4 (q in -4..3); w_j = (d * sc) * (q_j - 4) (from Q3_K, whose form this is exactly).
Q8_F (44 bytes): float32 d_lo, float32 d_hi, float32 m, 32 int8 q; w_j = d * q_j + m (any of the
above exactly: what a layer whose parts differ in type is packed in).
IQ4_NL (llama.cpp's, 18 bytes): float16 d, 16 bytes of nibbles as Q4_0's; w = d * IQ4_LEVELS[q],
16 int8 levels a code indexes. IQ4_F (Strand's, 20 bytes): the same with a float32 d (from
IQ4_XS: its super-block d times a 6-bit scale per 32, exact in float32).

On CPU the decode kernel reads the same blocks regrouped into tiles of 16 rows
(strand/kernels/csrc/gguf_tiled.cpp): [N / 16, K / 32, 16 * block bytes], tile t block b holding rows
16t..16t+15's block b: first their quants as chunks of 64 bytes (chunk c: each row's quant bytes
4c..4c+3, row after row), so that the low nibbles of chunk c are quants 4c..4c+3 of each row and
the high nibbles quants 16 + 4c..; then the fifth (and sixth) bits as one (two) 64-byte vectors
laid out as the nibble lanes, byte 4r + j holding row r's bits of quants 4g + j for the 8
groups g of 4 quants (chunk g's low nibbles for g < 4, chunk g - 4's high ones after): bit g
(Q6_F: vector g // 4, bits 2k and 2k + 1 the fifth and sixth bits of group 4 (g // 4) + k), which
the kernel moves into place with one shift and one mask; then the head's fields, each as the 16 rows' values
(Q6_F: d, then the (sc_lo, sc_hi) pairs). Q4_K's tiles go by its
256-weight super-blocks, 8 tile-blocks each: tile-block j = 2g + h holds bytes 16h..16h+15 of
each row's 32 nibble bytes of group g as 4 chunks (low nibbles: quants 16h + 4c.. of sub-block 2g,
high: of sub-block 2g + 1), then 32 bytes of the super-block's head laid out by field (the 16
rows' d, their dmin, then each of the 12 scale bytes as 16 rows' bytes): tile-block j the head's
bytes 32j..32j+31. tile_ref and untile_ref state these layouts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BLOCK = 32
# GGML's type numbers (gguf.GGMLQuantizationType) -> name and bytes per block of 32.
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K = 2, 3, 6, 7, 8, 12
IQ4_NL = 20
# Strand's own (no GGML number; outside GGML's range so that none is ever taken for one).
Q3_F, IQ4_F, Q5_F, Q6_F, Q8_F = 1003, 1004, 1005, 1006, 1008
NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1", Q8_0: "Q8_0", Q4_K: "Q4_K",
         IQ4_NL: "IQ4_NL", Q3_F: "Q3_F", IQ4_F: "IQ4_F", Q5_F: "Q5_F", Q6_F: "Q6_F",
         Q8_F: "Q8_F"}
BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q5_0: 22, Q5_1: 24, Q8_0: 34, Q4_K: 18, IQ4_NL: 18,
               Q3_F: 20, IQ4_F: 20, Q5_F: 28, Q6_F: 28,
               Q8_F: 44}  # Q4_K's 144 bytes per 256, per 32
SUPER = {Q4_K: 256}  # weights a block's head covers where not 32: a row's length divides by it
# The types read over 16-row tiles only (no row kernel, no Triton kernel).
TILES_ONLY = frozenset({Q5_0, Q5_1, Q4_K, IQ4_NL, Q3_F, IQ4_F, Q5_F, Q6_F, Q8_F})
# The 16 int8 levels an IQ4 code indexes (llama.cpp's kvalues_iq4nl).
IQ4_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def row_bytes(qtype: int, in_features: int) -> int:
    """Bytes of one packed row of `in_features` weights; ValueError for what cannot be packed."""
    if qtype not in BLOCK_BYTES:
        raise ValueError(f"qtype must be one of {sorted(NAMES)} ({', '.join(NAMES.values())}), "
                         f"got {qtype}")
    multiple = SUPER.get(qtype, BLOCK)
    if in_features <= 0 or in_features % multiple:
        raise ValueError(f"in_features must be a positive multiple of {multiple} for "
                         f"{NAMES[qtype]}, got {in_features}")
    return in_features // BLOCK * BLOCK_BYTES[qtype]


TILE_ROWS = 16
# A block's head before its quants: (fields, bytes each): d (and m; Q6_F d and its two int8
# scales as one field; Q8_F d_lo, d_hi, m); then its bit planes, 4 bytes each (bit 4; Q6_F bit
# 4 and bit 5).
_HEAD = {Q4_0: (1, 2), Q4_1: (2, 2), Q5_0: (1, 2), Q5_1: (2, 2), Q8_0: (1, 2), Q5_F: (2, 4),
         Q6_F: (2, 2), Q3_F: (2, 2), Q8_F: (3, 4), IQ4_NL: (1, 2), IQ4_F: (1, 4)}
PLANES = {Q5_0: 1, Q5_1: 1, Q5_F: 1, Q6_F: 2}


def _bits(words: torch.Tensor) -> torch.Tensor:  # [..., 4] bytes -> [..., 32] bits, LSB first
    return (words[..., :, None] >> torch.arange(8, dtype=torch.uint8)) & 1


def _planes_to_tiles(words: list[torch.Tensor]) -> torch.Tensor:
    """Each plane's [T, 16 rows, nb, 4] words -> [T, nb, 64 * planes]: per byte lane 4r + j the
    bits of row r's quants 4g + j, one bit per group g (one plane: bit g; two: bits 2k, 2k + 1
    of vector g // 4 for g = 4 (g // 4) + k, the fifth bit first)."""
    t, _, nb, _ = words[0].shape
    # [T, nb, 16 rows, 8 groups, 4 j] per plane
    bits = [_bits(w).reshape(t, TILE_ROWS, nb, 8, 4).permute(0, 2, 1, 3, 4) for w in words]
    if len(bits) == 1:
        weights = (1 << torch.arange(8, dtype=torch.uint8)).reshape(1, 1, 1, 8, 1)
        lanes = (bits[0] * weights).sum(dim=3, dtype=torch.uint8)  # [T, nb, 16, 4]
        return lanes.reshape(t, nb, 64)
    vectors = []
    for v in range(2):
        lane = torch.zeros(t, nb, TILE_ROWS, 4, dtype=torch.uint8)
        for k in range(4):
            lane |= (bits[0][:, :, :, 4 * v + k] << (2 * k)) | (bits[1][:, :, :, 4 * v + k]
                                                               << (2 * k + 1))
        vectors.append(lane.reshape(t, nb, 64))
    return torch.cat(vectors, dim=-1)


def _planes_from_tiles(lanes: torch.Tensor, planes: int) -> list[torch.Tensor]:
    """_planes_to_tiles' inverse: [T, nb, 64 * planes] -> each plane's [T, 16, nb, 4] words."""
    t, nb, _ = lanes.shape
    shifts = torch.arange(8, dtype=torch.uint8)
    if planes == 1:
        per_group = [(lanes.reshape(t, nb, TILE_ROWS, 1, 4) >> shifts.reshape(1, 1, 1, 8, 1)) & 1]
    else:
        vec = lanes.reshape(t, nb, 2, TILE_ROWS, 4)
        k2 = (2 * torch.arange(4, dtype=torch.uint8)).reshape(1, 1, 1, 4, 1)
        per_group = [torch.cat([(vec[:, :, v, :, None, :] >> (k2 + p)) & 1 for v in range(2)],
                               dim=3) for p in range(2)]  # [T, nb, 16, 8 groups, 4 j]
    words = []
    for bits in per_group:
        q_bits = bits.permute(0, 2, 1, 3, 4).reshape(t, TILE_ROWS, nb, 4, 8)  # quant 4g + j
        weights = (1 << shifts).reshape(1, 1, 1, 1, 8)
        words.append((q_bits * weights).sum(dim=-1, dtype=torch.uint8))
    return words


def _tile_q4_k(packed: torch.Tensor) -> torch.Tensor:
    t = packed.shape[0] // TILE_ROWS
    sb = packed.reshape(t, TILE_ROWS, -1, 144)  # [T, 16, super-blocks, 144]
    ns = sb.shape[2]
    qs = sb[..., 16:].reshape(t, TILE_ROWS, ns, 4, 2, 4, 4)  # [.., g, h, c, 4 bytes]
    chunks = qs.permute(0, 2, 3, 4, 5, 1, 6).reshape(t, ns, 8, 256)
    by_field = [sb[..., 0:2], sb[..., 2:4], *(sb[..., 4 + k:5 + k] for k in range(12))]
    head = torch.cat([f.permute(0, 2, 1, 3).reshape(t, ns, -1) for f in by_field], dim=-1)
    return torch.cat([chunks, head.reshape(t, ns, 8, 32)], dim=-1).reshape(t, ns * 8, 288)


def _untile_q4_k(tiles: torch.Tensor) -> torch.Tensor:
    t = tiles.shape[0]
    tb = tiles.reshape(t, -1, 8, 288)  # [T, super-blocks, j, 288]
    ns = tb.shape[1]
    qs = tb[..., :256].reshape(t, ns, 4, 2, 4, TILE_ROWS, 4).permute(0, 5, 1, 2, 3, 4, 6)
    head = tb[..., 256:].reshape(t, ns, 256)
    d, dmin = (head[..., a:a + 32].reshape(t, ns, TILE_ROWS, 2) for a in (0, 32))
    scales = head[..., 64:].reshape(t, ns, 12, TILE_ROWS).permute(0, 1, 3, 2)
    rows = torch.cat([d, dmin, scales], dim=-1).permute(0, 2, 1, 3)  # [T, 16, ns, 16]
    out = torch.cat([rows, qs.reshape(t, TILE_ROWS, ns, 128)], dim=-1)
    return out.reshape(t * TILE_ROWS, ns * 144).contiguous()


def tile_ref(packed: torch.Tensor, qtype: int) -> torch.Tensor:
    """[N, row bytes] uint8 (N a multiple of 16) -> [N / 16, K / 32, 16 * block bytes]."""
    if qtype == Q4_K:
        return _tile_q4_k(packed).contiguous()
    n, (fields, width), size = packed.shape[0], _HEAD[qtype], BLOCK_BYTES[qtype]
    head, planes = fields * width, PLANES.get(qtype, 0)
    blocks = packed.reshape(n // TILE_ROWS, TILE_ROWS, -1, size)  # [T, 16, nb, bytes]
    nb, quant_at = blocks.shape[2], head + 4 * planes
    quants = blocks[..., quant_at:].reshape(n // TILE_ROWS, TILE_ROWS, nb, -1, 4)
    parts = [quants.permute(0, 2, 3, 1, 4).reshape(n // TILE_ROWS, nb, -1)]
    if planes:
        parts.append(_planes_to_tiles([blocks[..., head + 4 * p:head + 4 * p + 4]
                                       for p in range(planes)]))
    for h in range(0, head, width):  # each field: [T, 16, nb, width] -> [T, nb, 16 * width]
        parts.append(blocks[..., h:h + width].permute(0, 2, 1, 3).reshape(n // TILE_ROWS, nb, -1))
    return torch.cat(parts, dim=-1).contiguous()


def untile_ref(tiles: torch.Tensor, qtype: int) -> torch.Tensor:
    """tile_ref's inverse: [N / 16, K / 32, 16 * block bytes] -> [N, row bytes]."""
    if qtype == Q4_K:
        return _untile_q4_k(tiles)
    t, nb, _ = tiles.shape
    (fields, width), size = _HEAD[qtype], BLOCK_BYTES[qtype]
    head, planes = fields * width, PLANES.get(qtype, 0)
    quant_bytes = TILE_ROWS * (size - head - 4 * planes)
    quants = tiles[..., :quant_bytes].reshape(t, nb, -1, TILE_ROWS, 4).permute(0, 3, 1, 2, 4)
    bits = (_planes_from_tiles(tiles[..., quant_bytes:quant_bytes + 64 * planes], planes)
            if planes else [])
    at = quant_bytes + 64 * planes
    heads = [tiles[..., at + TILE_ROWS * h:at + TILE_ROWS * (h + width)]
             .reshape(t, nb, TILE_ROWS, width).permute(0, 2, 1, 3) for h in range(0, head, width)]
    blocks = torch.cat([*heads, *bits, quants.reshape(t, TILE_ROWS, nb, -1)], dim=-1)
    return blocks.reshape(t * TILE_ROWS, nb * size).contiguous()


def _half(b: torch.Tensor) -> torch.Tensor:  # [..., 2] uint8 -> [..., 1] float32
    return b.contiguous().view(torch.float16).float()


def _float(b: torch.Tensor) -> torch.Tensor:  # [..., 4] uint8 -> [..., 1] float32
    return b.contiguous().view(torch.float32)


def _nibbles(b: torch.Tensor) -> torch.Tensor:  # [..., 16] uint8 -> [..., 32] float32
    return torch.cat([b & 15, b >> 4], dim=-1).float()


def _plane(b: torch.Tensor) -> torch.Tensor:  # [..., 4] uint8 (a word) -> [..., 32] 0/1
    bits = torch.arange(8, dtype=torch.uint8)
    return ((b[..., :, None] >> bits) & 1).reshape(*b.shape[:-1], 32)


def scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's 12 scale bytes [..., 12] -> its 8 six-bit scales and mins [..., 8] each (llama.cpp's
    get_scale_min_k4: bytes 0-3 scales 0-3, 4-7 mins 0-3, 8-11 the low 4 bits of scales and mins
    4-7, whose top 2 bits are the top bits of bytes 0-3 and 4-7)."""
    lo, mid, hi = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = torch.cat([lo & 63, (hi & 15) | ((lo >> 6) << 4)], dim=-1)
    mn = torch.cat([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], dim=-1)
    return sc, mn


def _dequantize_q4_k(packed: torch.Tensor) -> torch.Tensor:
    n = packed.shape[0]
    sb = packed.reshape(n, -1, 144)
    sc, mn = scale_min_k4(sb[..., 4:16])
    d = _half(sb[..., 0:2]) * sc.float()  # [N, ns, 8]: per 32 weights, as llama.cpp does
    m = _half(sb[..., 2:4]) * mn.float()
    qs = sb[..., 16:].reshape(n, -1, 4, 1, 32)
    q = torch.cat([qs & 15, qs >> 4], dim=3).reshape(n, -1, 8, 32).float()
    return (d[..., None] * q - m[..., None]).reshape(n, -1)


def dequantize_ref(packed: torch.Tensor, qtype: int) -> torch.Tensor:
    """[N, row bytes] uint8 -> [N, K] float32."""
    if qtype == Q4_K:
        return _dequantize_q4_k(packed)
    n = packed.shape[0]
    blocks = packed.reshape(n, -1, BLOCK_BYTES[qtype])  # [N, K / 32, block bytes]
    if qtype == Q8_0:
        return (_half(blocks[..., :2]) * blocks[..., 2:].contiguous().view(torch.int8).float()
                ).reshape(n, -1)
    if qtype == Q8_F:  # d_lo for weights 0..15, d_hi for 16..31
        q = blocks[..., 12:].contiguous().view(torch.int8).float().reshape(n, -1, 2, 16)
        d = _float(blocks[..., :8]).reshape(n, -1, 2, 1)
        return ((d * q).reshape(n, -1, BLOCK) + _float(blocks[..., 8:12])).reshape(n, -1)
    fields, width = _HEAD[qtype]
    at = fields * width
    q = _nibbles(blocks[..., at + 4 * PLANES.get(qtype, 0):])
    for p in range(PLANES.get(qtype, 0)):
        q = q + (_plane(blocks[..., at + 4 * p:at + 4 * p + 4]) << (4 + p)).float()
    field = _half if width == 2 else _float
    d = field(blocks[..., :width])
    if qtype in (Q6_F, Q3_F):  # d * sc_lo, d * sc_hi
        sc = blocks[..., 2:4].contiguous().view(torch.int8).float()
        d = (d * sc).reshape(n, -1, 2, 1)
        return (d * (q.reshape(n, -1, 2, 16) - (32 if qtype == Q6_F else 4))).reshape(n, -1)
    if qtype in (IQ4_NL, IQ4_F):
        w = d * torch.tensor(IQ4_LEVELS, dtype=torch.float32)[q.long()]
    elif qtype in (Q4_0, Q5_0):
        w = d * (q - (8 if qtype == Q4_0 else 16))
    else:  # Q4_1, Q5_1, Q5_F
        w = d * q + field(blocks[..., width:2 * width])
    return w.reshape(n, -1)


def gguf_linear_ref(x: torch.Tensor, packed: torch.Tensor, qtype: int,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ dequantize(packed).T + bias in float32: [M, K] -> [M, N]."""
    return F.linear(x.float(), dequantize_ref(packed, qtype),
                    None if bias is None else bias.float())


def quantize_rows_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K a multiple of 32) -> (q [M, K] int8, d [M, K / 32] float32): each block of 32
    as d * q, d = max|x| / 127, q = round(x / d) (ties to even), as the C++ kernel rounds the
    activations of a few-row product (llama.cpp's Q8_0 for activations). Same float32 ops in the
    same order as the kernel (x times 1 / d), so q is equal bit for bit."""
    m, k = x.shape
    blocks = x.float().reshape(m, k // BLOCK, BLOCK)
    d = blocks.abs().amax(dim=-1) / 127.0  # [M, K / 32]
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv[..., None]).to(torch.int8)
    return q.reshape(m, k), d


def gguf_linear_int8_ref(x: torch.Tensor, packed: torch.Tensor, qtype: int,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """What the few-row kernel computes, in float64: x rounded to int8 blocks
    (quantize_rows_ref) times the dequantized weight: [M, K] -> [M, N] float64."""
    q, d = quantize_rows_ref(x)
    m, k = q.shape
    xq = (q.double().reshape(m, k // BLOCK, BLOCK) * d.double()[..., None]).reshape(m, k)
    return F.linear(xq, dequantize_ref(packed, qtype).double(),
                    None if bias is None else bias.double())


def int8_rounding_bound(x: torch.Tensor, packed: torch.Tensor, qtype: int) -> torch.Tensor:
    """[M, N] bound on |int8-activation product - float product|: each value of x moves by at
    most d / 2 of its block, so an output moves by at most sum_b (d_b / 2) * sum_j |w_bj|."""
    _, d = quantize_rows_ref(x)
    w = dequantize_ref(packed, qtype).double()
    n, k = w.shape
    w_abs = w.abs().reshape(n, k // BLOCK, BLOCK).sum(dim=-1)  # [N, K / 32]
    return (d.double() / 2) @ w_abs.T
