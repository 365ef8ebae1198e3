#include "kernels.h"
#include <omp.h>
#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "avx512_bf16.h"
#include "kv_dtypes.h"
#include "prefill_bf16_avx512.h"
#include "vec16.h"

// Causal attention of each request's new tokens over its whole context, read from the paged cache
// where it lies: query token i of a request with q_len new tokens and seq_len in all sits at
// position seq_len - q_len + i and sees keys 0..that position (a cached prefix included). No
// padding: each request does its own work, however long. float32 or bfloat16, computed in
// float32, or a float32 query over a bfloat16 cache (kv_dtypes.h; the Python wrapper checks).
//
// The work is cut into tiles of kRows rows (48 with AVX-512, 32 below): the query heads that
// share a kv head times as many consecutive tokens as fit, so each K/V row loaded serves them
// all. Rows are the lanes of a few register-wide vectors, which makes every step lane-wise:
// scores of 8 keys for 48 rows are 24 multiply-adds per dimension (q of the rows, transposed once per tile, times a broadcast key
// element), the running max and sum of the online softmax are lane maxima and sums, and the
// output accumulates as out^T[d] += p[key] * v[key][d]. No horizontal reductions, no gathers.
// Tiles are handed out longest first to whichever thread is free: a 512-token prompt's last tile
// attends to 32x the keys of a 16-token prompt's.
namespace {
using namespace strand;

// Rows per tile: kNV register-wide vectors of lanes. With AVX-512, 48 (3 zmm) rather than 32:
// a tile fills all its rows for 1, 2, 3, 4, 6, 8, 12, 16 or 24 query heads per kv head (32
// rows hold 10 tokens of SmolLM2's 3 heads, 30 of 32 lanes), each K/V element loaded and
// broadcast feeds 3 multiply-adds instead of 2, and the 8x3 accumulator blocks below still fit
// the 32 zmm registers (measured faster at SmolLM2's 512-token prefill, 9 heads, 3 kv heads,
// one thread). AVX2 keeps 32: 48 rows would be 6 ymm vectors, and the
// 2x6 accumulators plus 6 operands would overflow its 16 registers.
constexpr int kRows = kLanes == 16 ? 48 : 32;
constexpr int kKeys = 32;  // keys per chunk of the key loop (16 -> 32: fewer rescales of ot)

// TQ, TKV: float or bf16, what the query (and out) and the cache hold (kv_dtypes.h).
template <typename TQ, typename TKV>
struct Args {
  using Q = TQ;
  using KV = TKV;
  const TQ* q;
  const TKV *kc, *vc;
  const int32_t *bt, *q_starts, *q_lens, *lens;
  TQ* o;
  int64_t H, D, BS, KVH, MB, q_stride, o_stride;
  float scale;
};

struct Tile {
  int64_t keys;  // the keys its last row attends to: its cost
  int32_t r, g, t0, nt, h0, nh;  // tokens t0..t0+nt of request r, query heads h0..h0+nh of group g
};

// Row m of a tile is token t0 + m / nh, query head g * G + h0 + m % nh.
template <typename Products>
struct Scratch {
  std::vector<float> ot;  // [D][kRows]: the output, transposed
  std::vector<float> row;  // [D]: one output row before it is stored
  Products products;  // what the products of q, K, P and V read (Widened, Pairs)
  void resize(int64_t D) {
    ot.resize(D * kRows);
    row.resize(D);
    products.resize(D);
  }
};

template <typename A, typename T>
inline const T* row_of(const A& a, int64_t r, int64_t g, int64_t j, const T* cache) {
  const int64_t block = a.bt[r * a.MB + j / a.BS];
  return cache + ((block * a.BS + j % a.BS) * a.KVH + g) * a.D;
}

// The rows of a tile are kNV lane vectors (vec16.h: 3 of 16 floats with AVX-512, 4 of 8
// with AVX2), each a register, so nothing a loop carries leaves the register file. Keys (scores)
// and head dimensions (output) are taken kBlock per pass over the other operand: kBlock * kNV
// accumulators plus kNV operand vectors must fit too (24 + 3 of 32 zmm; 8 + 4 of 16 ymm).
constexpr int kNV = kRows / kLanes;
constexpr int kBlock = kLanes == 16 ? 8 : (kRegsPerV16 == 2 ? 2 : 1);

// Scores of keys k[0..kBlock) for the kRows rows: s[i][row] = sum_d qt[d][row] * k[i][d].
template <typename T>
inline void scores_block(const float* qt, const T* const* k, int64_t D, float* s) {
  vl acc[kBlock][kNV];
  for (int i = 0; i < kBlock; ++i)
    for (int v = 0; v < kNV; ++v) acc[i][v] = vl{};
  for (int64_t d = 0; d < D; ++d) {
    vl q[kNV];
    for (int v = 0; v < kNV; ++v) q[v] = load_l(qt + d * kRows + v * kLanes);
    for (int i = 0; i < kBlock; ++i) {
      const float x = to_float(k[i][d]);
      for (int v = 0; v < kNV; ++v) acc[i][v] += q[v] * x;
    }
  }
  for (int i = 0; i < kBlock; ++i)
    for (int v = 0; v < kNV; ++v) store_l(s + i * kRows + v * kLanes, acc[i][v]);
}

// ot[d][row] = ot[d][row] * alpha[row] + sum_i p[i][row] * v[i][d] over n keys, for dimensions
// d0 .. d0 + B.
template <int B, typename T>
inline void accumulate_block(float* ot, const float* p, const T* const* v, int64_t n, int64_t d0,
                             const vl* alpha) {
  vl acc[B][kNV];
  for (int k = 0; k < B; ++k)
    for (int u = 0; u < kNV; ++u) acc[k][u] = load_l(ot + (d0 + k) * kRows + u * kLanes) * alpha[u];
  for (int64_t i = 0; i < n; ++i) {
    vl pi[kNV];
    for (int u = 0; u < kNV; ++u) pi[u] = load_l(p + i * kRows + u * kLanes);
    for (int k = 0; k < B; ++k) {
      const float x = to_float(v[i][d0 + k]);
      for (int u = 0; u < kNV; ++u) acc[k][u] += pi[u] * x;
    }
  }
  for (int k = 0; k < B; ++k)
    for (int u = 0; u < kNV; ++u) store_l(ot + (d0 + k) * kRows + u * kLanes, acc[k][u]);
}

template <typename T>
inline void accumulate(float* ot, const float* p, const T* const* v, int64_t n, int64_t D,
                       const vl* alpha) {
  int64_t d0 = 0;
  for (; d0 + kBlock <= D; d0 += kBlock) accumulate_block<kBlock>(ot, p, v, n, d0, alpha);
  for (; d0 < D; ++d0) accumulate_block<1>(ot, p, v, n, d0, alpha);  // head_dim % kBlock
}


// e^x of a score less its row's running maximum: x <= 0, or -inf where masked. With AVX-512,
// 2^n is applied by VSCALEFPS and arguments under -87 are zeroed by its mask, where vexp
// builds 2^n from integer bits and clamps both ends: 15 instructions against 22, and the
// softmax's exps are a sixth of the kernel's work. The same polynomial, so the same values.
#if defined(__AVX512F__)
inline vl vexp_nonpos(vl x) {
  const __mmask16 live = _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(-87.f), _CMP_GE_OQ);
  x = (vl)_mm512_max_ps((__m512)x, _mm512_set1_ps(-87.f));
  const vl n = (vl)_mm512_roundscale_ps((__m512)(x * 1.44269504088896341f),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const vl r = x - n * 0.693359375f + n * 2.12194440e-4f;
  vl p = vl{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const vl y = p * r * r + r + 1.f;
  return (vl)_mm512_maskz_scalef_ps(live, (__m512)y, (__m512)n);
}
#else
inline vl vexp_nonpos(vl x) { return vexp(x); }
#endif

inline vl vmax(vl a, vl b) { return a > b ? a : b; }

// r[i][c] -> r[c][i] for a 16x16 block held in 16 vectors: each of 4 stages swaps the
// off-diagonal s x s blocks (s = 8, 4, 2, 1) of every pair of rows s apart, 2-source shuffles
// only. Moving a tile's q rows in and its output rows out lane by lane took a tenth of the
// kernel (one scalar load and store per element, 48 x 64 of each per tile); 16 x 16 blocks
// through registers take 64 shuffles per 256 elements.
inline void transpose16(v16* r) {
  for (int i = 0; i < 16; ++i)
    if (!(i & 8)) {
      const v16 x = r[i], y = r[i + 8];
      r[i] = __builtin_shufflevector(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
      r[i + 8] = __builtin_shufflevector(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    }
  for (int i = 0; i < 16; ++i)
    if (!(i & 4)) {
      const v16 x = r[i], y = r[i + 4];
      r[i] = __builtin_shufflevector(x, y, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
      r[i + 4] = __builtin_shufflevector(x, y, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    }
  for (int i = 0; i < 16; ++i)
    if (!(i & 2)) {
      const v16 x = r[i], y = r[i + 2];
      r[i] = __builtin_shufflevector(x, y, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
      r[i + 2] = __builtin_shufflevector(x, y, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    }
  for (int i = 0; i < 16; ++i)
    if (!(i & 1)) {
      const v16 x = r[i], y = r[i + 1];
      r[i] = __builtin_shufflevector(x, y, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
      r[i + 1] = __builtin_shufflevector(x, y, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    }
}

// One bfloat16 row of D values as float32 (exact), 16 at a time.
inline void widen_row(const bf16* src, float* dst, int64_t D) {
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) store(dst + d, load(src + d));
  for (; d < D; ++d) dst[d] = to_float(src[d]);
}

// A tile's products in float32: q scaled and transposed once, each key chunk's bfloat16 K and V
// rows widened once (then read by every row of the tile: widened inside scores_block and
// accumulate, each element cost a scalar load, shift and broadcast per use beside 3
// multiply-adds, and bfloat16 prefill attention took over twice float32's time), scores and
// P.V by multiply-adds.
template <typename T, typename TKV = T>  // the query's and the cache's element types
struct Widened {
  static constexpr int kChunk = kKeys;
  static vl exp(vl x) { return vexp_nonpos(x); }  // e^x, x <= 0: the scores are natural

  std::vector<float> qt;  // [D][kRows]: q (scaled), transposed
  std::vector<float> kf, vf;  // [kKeys][D]: a key chunk's bfloat16 K and V rows in float32
  const float* kw[kKeys];
  const float* vw[kKeys];

  void resize(int64_t D) {
    qt.resize(D * kRows);
    kf.resize(kKeys * D);
    vf.resize(kKeys * D);
  }

  void load_q(const T* const* qrows, int64_t D, float scale) {
    float* q = qt.data();
    const int64_t D16 = kLanes == 16 ? D / 16 * 16 : 0;  // dimensions moved in 16x16 blocks
    for (int64_t m0 = 0; m0 < kRows; m0 += 16)
      for (int64_t d0 = 0; d0 < D16; d0 += 16) {
        v16 r[16];
        for (int i = 0; i < 16; ++i) r[i] = load(qrows[m0 + i] + d0) * scale;
        transpose16(r);
        for (int i = 0; i < 16; ++i) store(q + (d0 + i) * kRows + m0, r[i]);
      }
    for (int64_t m = 0; m < kRows; ++m)
      for (int64_t d = D16; d < D; ++d) q[d * kRows + m] = to_float(qrows[m][d]) * scale;
  }

  void load_chunk(const TKV* const* krows, const TKV* const* vrows, int64_t nk, int64_t D) {
    for (int64_t i = 0; i < nk; ++i) {  // nk <= kKeys rows, the padding ones included
      if constexpr (std::is_same_v<TKV, bf16>) {
        widen_row(krows[i], kf.data() + i * D, D);
        widen_row(vrows[i], vf.data() + i * D, D);
        kw[i] = kf.data() + i * D;
        vw[i] = vf.data() + i * D;
      } else {
        kw[i] = krows[i];
        vw[i] = vrows[i];
      }
    }
  }

  void scores(int64_t i, int64_t D, float* s) const { scores_block(qt.data(), kw + i, D, s); }

  void accumulate(float* ot, const float* p, int64_t n, int64_t D, const vl* alpha) const {
    ::accumulate(ot, p, vw, n, D, alpha);
  }
};

#ifdef STRAND_DPBF16
// A bfloat16 tile's products by VDPBF16PS (avx512_bf16.h), which multiplies pairs of bfloat16
// values along the reduction into float32 lanes: 32 products an instruction where Widened's
// multiply-add makes 16. The lanes stay the tile's rows; what changes is that each operand
// holds pairs. q: (d, d+1) of each row; K: the key's own (d, d+1), one 32-bit broadcast;
// P: (key, key+1) of each row, P rounded to bfloat16 as torch's CPU flash attention rounds it
// for P.V; V: (key, key+1) of one dimension, so each key chunk's V rows are interleaved in
// pairs first. The scores' sums and the softmax stay float32; scale is applied to the sums.

inline uint32_t pair_at(const bf16* p) {  // p[0] in the low 16 bits, p[1] in the high
  uint32_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
}

// acc[k] (dimensions d0 .. d0 + B of ot, rescaled by alpha) += P.V over np key pairs.
template <int B>
BF16_TARGET inline void accumulate_pairs(float* ot, const uint32_t* pp, const uint32_t* vp,
                                         int64_t np, int64_t D, int64_t d0, const vl* alpha) {
  __m512 acc[B][kNV];
  for (int k = 0; k < B; ++k)
    for (int u = 0; u < kNV; ++u)
      acc[k][u] = _mm512_mul_ps(_mm512_loadu_ps(ot + (d0 + k) * kRows + u * 16), (__m512)alpha[u]);
  for (int64_t i = 0; i < np; ++i) {
    __m512bh p[kNV];
    for (int u = 0; u < kNV; ++u)
      p[u] = (__m512bh)_mm512_loadu_si512(pp + i * kRows + u * 16);
    for (int k = 0; k < B; ++k) {
      const __m512bh v = (__m512bh)_mm512_set1_epi32((int)vp[i * D + d0 + k]);
      for (int u = 0; u < kNV; ++u) acc[k][u] = _mm512_dpbf16_ps(acc[k][u], p[u], v);
    }
  }
  for (int k = 0; k < B; ++k)
    for (int u = 0; u < kNV; ++u) _mm512_storeu_ps(ot + (d0 + k) * kRows + u * 16, acc[k][u]);
}

struct Pairs {
  // 64 keys a chunk where Widened takes 32: half the passes that rescale and reload ot for
  // P.V, which were a fifth of that loop's instructions (SmolLM2's layer measured faster).
  static constexpr int kChunk = 64, kPairs = kChunk / 2;
  // The scores are kept in base 2 (scaled by log2(e) with the scale), so the softmax's
  // exponential is 2^x: 10 instructions where e^x takes 15. P is rounded to 2^-9 anyway.
  static vl exp(vl x) { return (vl)exp2_nonpos((__m512)x); }

  std::vector<uint32_t> qp;  // [D/2][kRows]: each row's q pairs (d, d+1), unscaled
  std::vector<uint32_t> vp;  // [kPairs][D]: a chunk's V pairs (key 2i, key 2i+1) per dimension
  std::vector<uint32_t> pp;  // [kPairs][kRows]: the chunk's probabilities in pairs, bfloat16
  const bf16* const* k = nullptr;  // the chunk's K rows, read where they lie
  float scale = 1.f;  // the scores' scale times log2(e)

  void resize(int64_t D) {
    qp.resize(D / 2 * kRows);
    vp.resize(kPairs * D);
    pp.resize(kPairs * kRows);
  }

  void load_q(const bf16* const* qrows, int64_t D, float s) {
    scale = s * 1.44269504088896341f;
    for (int64_t m = 0; m < kRows; ++m)
      for (int64_t i = 0; i < D / 2; ++i) qp[i * kRows + m] = pair_at(qrows[m] + 2 * i);
  }

  BF16_TARGET void load_chunk(const bf16* const* krows, const bf16* const* vrows, int64_t nk,
                              int64_t D) {
    k = krows;
    for (int64_t i = 0; i < nk / 2; ++i) {  // nk is a multiple of kBlock: whole pairs
      const bf16 *a = vrows[2 * i], *b = vrows[2 * i + 1];
      uint32_t* dst = vp.data() + i * D;
      int64_t d = 0;
      for (; d + 16 <= D; d += 16) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + d));
        const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + d));
        _mm512_storeu_si512(dst + d,
                            interleave16(_mm512_inserti64x4(_mm512_castsi256_si512(x), y, 1)));
      }
      for (; d < D; ++d) dst[d] = a[d].bits | (uint32_t)b[d].bits << 16;
    }
  }

  // Scores of keys i0 .. i0 + kBlock for the tile's rows, scaled, in base 2.
  BF16_TARGET void scores(int64_t i0, int64_t D, float* s) const {
    __m512 acc[kBlock][kNV];
    for (int i = 0; i < kBlock; ++i)
      for (int u = 0; u < kNV; ++u) acc[i][u] = _mm512_setzero_ps();
    for (int64_t d2 = 0; d2 < D / 2; ++d2) {
      __m512bh q[kNV];
      for (int u = 0; u < kNV; ++u)
        q[u] = (__m512bh)_mm512_loadu_si512(qp.data() + d2 * kRows + u * 16);
      for (int i = 0; i < kBlock; ++i) {
        const __m512bh x = (__m512bh)_mm512_set1_epi32((int)pair_at(k[i0 + i] + 2 * d2));
        for (int u = 0; u < kNV; ++u) acc[i][u] = _mm512_dpbf16_ps(acc[i][u], q[u], x);
      }
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int i = 0; i < kBlock; ++i)
      for (int u = 0; u < kNV; ++u)
        _mm512_storeu_ps(s + i * kRows + u * 16, _mm512_mul_ps(acc[i][u], sc));
  }

  // ot = ot * alpha + P.V over the chunk's first n keys; p holds their float32 probabilities
  // (past n: zeros, the masked padding keys).
  BF16_TARGET void accumulate(float* ot, const float* p, int64_t n, int64_t D,
                              const vl* alpha) {
    const int64_t np = (n + 1) / 2;
    for (int64_t i = 0; i < np; ++i)
      for (int u = 0; u < kNV; ++u) {
        const __m512 a = _mm512_loadu_ps(p + 2 * i * kRows + u * 16);
        const __m512 b = _mm512_loadu_ps(p + (2 * i + 1) * kRows + u * 16);
        _mm512_storeu_si512(pp.data() + i * kRows + u * 16,
                            interleave16((__m512i)_mm512_cvtne2ps_pbh(b, a)));
      }
    int64_t d0 = 0;
    for (; d0 + kBlock <= D; d0 += kBlock)
      accumulate_pairs<kBlock>(ot, pp.data(), vp.data(), np, D, d0, alpha);
    for (; d0 < D; ++d0) accumulate_pairs<1>(ot, pp.data(), vp.data(), np, D, d0, alpha);
  }
};
#endif

template <typename A, typename Products>
void tile_task(const A& a, const Tile& t, Scratch<Products>& sc) {
  using T = typename A::Q;
  using TKV = typename A::KV;
  const int64_t D = a.D, G = a.H / a.KVH, rows = (int64_t)t.nt * t.nh;
  const int64_t q_start = a.q_starts[t.r], first_pos = a.lens[t.r] - a.q_lens[t.r] + t.t0;
  Products& products = sc.products;
  float* ot = sc.ot.data();
  // Lane positions (padding lanes copy the last row: finite, and never stored).
  alignas(64) int32_t pos[kRows];
  const T* qrows[kRows];
  for (int64_t m = 0; m < kRows; ++m) {
    const int64_t mm = std::min(m, rows - 1);
    pos[m] = (int32_t)(first_pos + mm / t.nh);
    const int64_t h = t.g * G + t.h0 + mm % t.nh;
    qrows[m] = a.q + (q_start + t.t0 + mm / t.nh) * a.q_stride + h * D;
  }
  products.load_q(qrows, D, a.scale);
  const int64_t D16 = kLanes == 16 ? D / 16 * 16 : 0;  // output dimensions moved in 16x16 blocks
  std::fill(ot, ot + D * kRows, 0.f);
  const vl neg_inf = vl{} - std::numeric_limits<float>::infinity();
  vl mx[kNV], l[kNV];  // the online softmax's running maximum and sum, per row
  for (int u = 0; u < kNV; ++u) {
    mx[u] = neg_inf;
    l[u] = vl{};
  }
  constexpr int kChunk = Products::kChunk;
  alignas(64) float s[kChunk * kRows];
  const TKV* krows[kChunk];
  const TKV* vrows[kChunk];
  const int64_t num_keys = t.keys;
  for (int64_t j0 = 0; j0 < num_keys; j0 += kChunk) {
    const int64_t n = std::min<int64_t>(kChunk, num_keys - j0);
    for (int64_t i = 0; i < kChunk; ++i) {  // past n: a real row, its scores masked below
      krows[i] = row_of(a, t.r, t.g, j0 + std::min(i, n - 1), a.kc);
      vrows[i] = row_of(a, t.r, t.g, j0 + std::min(i, n - 1), a.vc);
    }
    const int64_t nk = (n + kBlock - 1) / kBlock * kBlock;  // whole blocks; the rest masked
    products.load_chunk(krows, vrows, nk, D);
    for (int64_t i = 0; i < nk; i += kBlock) products.scores(i, D, s + i * kRows);
    if (j0 + nk - 1 > first_pos) {  // some key here lies past some row's position
      for (int64_t i = 0; i < nk; ++i) {
        const il j = il{} + (int32_t)(j0 + i);
        for (int u = 0; u < kNV; ++u) {
          const il p = *reinterpret_cast<const il*>(pos + u * kLanes);
          float* su = s + i * kRows + u * kLanes;
          store_l(su, j <= p ? load_l(su) : neg_inf);
        }
      }
    }
    vl alpha[kNV];
    for (int u = 0; u < kNV; ++u) {
      vl c = mx[u];
      for (int64_t i = 0; i < nk; ++i) c = vmax(c, load_l(s + i * kRows + u * kLanes));
      // Key 0 is every row's, so from the first chunk on each lane's maximum is finite.
      alpha[u] = Products::exp(mx[u] - c);
      vl sum = vl{};
      for (int64_t i = 0; i < nk; ++i) {
        float* su = s + i * kRows + u * kLanes;
        const vl e = Products::exp(load_l(su) - c);
        store_l(su, e);
        sum += e;
      }
      l[u] = l[u] * alpha[u] + sum;
      mx[u] = c;
    }
    products.accumulate(ot, s, n, D, alpha);
  }
  alignas(64) float inv[kRows];
  for (int u = 0; u < kNV; ++u) store_l(inv + u * kLanes, (vl{} + 1.f) / l[u]);
  T* orows[kRows];
  for (int64_t m = 0; m < rows; ++m) {
    const int64_t h = t.g * G + t.h0 + m % t.nh;
    orows[m] = a.o + (q_start + t.t0 + m / t.nh) * a.o_stride + h * D;
  }
  for (int64_t m0 = 0; m0 < rows; m0 += 16)
    for (int64_t d0 = 0; d0 < D16; d0 += 16) {
      v16 r[16];
      for (int i = 0; i < 16; ++i) r[i] = load(ot + (d0 + i) * kRows + m0);
      transpose16(r);
      for (int i = 0; i < 16 && m0 + i < rows; ++i) store(orows[m0 + i] + d0, r[i] * inv[m0 + i]);
    }
  for (int64_t m = 0; m < rows; ++m) {
    float* row = sc.row.data();
    for (int64_t d = D16; d < D; ++d) row[d] = ot[d * kRows + m] * inv[m];
    int64_t d = D16;
    for (; d + 16 <= D; d += 16) store(orows[m] + d, load(row + d));
    for (; d < D; ++d) store_scalar(orows[m] + d, row[d]);
  }
}

template <typename A>
std::vector<Tile> make_tiles(const A& a, int64_t R) {
  const int64_t G = a.H / a.KVH;
  const int64_t nh = std::min<int64_t>(G, kRows), tokens_per_tile = std::max<int64_t>(1, kRows / G);
  std::vector<Tile> tiles;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t q_len = a.q_lens[r], first = a.lens[r] - q_len;
    for (int64_t t0 = 0; t0 < q_len; t0 += tokens_per_tile) {
      const int64_t nt = std::min(tokens_per_tile, q_len - t0);
      for (int64_t g = 0; g < a.KVH; ++g)
        for (int64_t h0 = 0; h0 < G; h0 += nh)
          tiles.push_back({first + t0 + nt, (int32_t)r, (int32_t)g, (int32_t)t0, (int32_t)nt,
                           (int32_t)h0, (int32_t)std::min(nh, G - h0)});
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const Tile& x, const Tile& y) { return x.keys > y.keys; });
  return tiles;
}
template <typename TQ, typename TKV, typename Products>
void run(at::Tensor out, at::Tensor query, at::Tensor key_cache,
         at::Tensor value_cache, at::Tensor block_table, at::Tensor q_starts,
         at::Tensor q_lens, at::Tensor seq_lens, double scale) {
  STRAND_CHECK(out.scalar_type() == query.scalar_type() &&
                   value_cache.scalar_type() == key_cache.scalar_type(),
               "out must be in the query's dtype and the value cache in the key cache's");
  const Args<TQ, TKV> a{data_as<TQ>(query), data_as<TKV>(key_cache), data_as<TKV>(value_cache),
                        block_table.data_ptr<int32_t>(), q_starts.data_ptr<int32_t>(),
                        q_lens.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(),
                        data_as<TQ>(out), query.size(1), query.size(2), key_cache.size(1),
                        key_cache.size(2), block_table.size(1), query.stride(0), out.stride(0),
                        (float)scale};
  const std::vector<Tile> tiles = make_tiles(a, q_lens.size(0));
  const int64_t n = (int64_t)tiles.size();
  const int threads = (int)std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
#pragma omp parallel num_threads(threads)
  {
    Scratch<Products> scratch;
    scratch.resize(a.D);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) tile_task(a, tiles[i], scratch);
  }
}
}  // namespace

void prefill_attention(at::Tensor out, at::Tensor query, at::Tensor key_cache,
                       at::Tensor value_cache, at::Tensor block_table,
                       at::Tensor q_starts, at::Tensor q_lens, at::Tensor seq_lens,
                       double scale) {
  by_kv_dtypes(query, key_cache, [&](auto* q, auto* kv) {
    using TQ = std::remove_pointer_t<decltype(q)>;
    using TKV = std::remove_pointer_t<decltype(kv)>;
    run<TQ, TKV, Widened<TQ, TKV>>(out, query, key_cache, value_cache, block_table, q_starts,
                                   q_lens, seq_lens, scale);
  });
}

bool prefill_attention_pairs_available() {
#ifdef STRAND_DPBF16
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

void prefill_attention_pairs(at::Tensor out, at::Tensor query, at::Tensor key_cache,
                             at::Tensor value_cache, at::Tensor block_table,
                             at::Tensor q_starts, at::Tensor q_lens, at::Tensor seq_lens,
                             double scale) {
  TORCH_CHECK(prefill_attention_pairs_available(),
              "prefill_attention_pairs needs a build and a CPU with AVX512_BF16");
  TORCH_CHECK(query.scalar_type() == at::kBFloat16 && key_cache.scalar_type() == at::kBFloat16 &&
                  query.size(2) % 2 == 0,
              "prefill_attention_pairs takes bfloat16 with an even head_dim, got ",
              query.scalar_type(), " head_dim ", query.size(2));
#ifdef STRAND_DPBF16
  run<bf16, bf16, Pairs>(out, query, key_cache, value_cache, block_table, q_starts,
                                 q_lens, seq_lens, scale);
#endif
}
