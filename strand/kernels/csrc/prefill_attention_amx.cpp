#include "check.h"
#include "kernels.h"
#include <omp.h>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

// bfloat16 causal prefill attention on AMX tiles (Sapphire Rapids and later), over the paged
// cache like prefill_attention.cpp, for the same requests and with the same arguments. The
// float32 kernel widens every bfloat16 element and multiplies 16 lanes an instruction; one
// TDPBF16PS multiplies a 16x32 by a 32x16 bfloat16 block (8192 products). The math is torch's
// CPU flash attention (what SDPA ran for these prompts before): scores in float32 (products of
// bfloat16 values, float32 sums), scaled, an online softmax in float32 over chunks of keys, the
// probabilities rounded to bfloat16 for P.V, float32 output sums divided by the row's sum and
// rounded once. The bits differ from SDPA's only where summation order and exp do.
//
// Work: tasks of 16 tokens of one request and one kv head, the kv head's query heads one after
// another (so the chunk of packed K/V each reads stays in L1/L2), longest first to whichever
// thread is free. AMX reads its B operand in pairs along the reduction ("VNNI" layout), so K
// and V are first copied out of the paged cache into that layout per (request, kv head): 4 bytes
// a key per head dimension pair, once, against a whole prompt's reads of them.
//
// Built only at the avx512 level (never under STRAND_CPU_ISA=avx2) and run only where CPUID
// reports AMX-TILE and AMX-BF16 and Linux grants the tile state (arch_prctl); the Python side
// falls back to the other kernels where amx_available() is false.

#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define STRAND_AMX 1
#endif

#if STRAND_AMX
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512bf16,avx512f,avx512bw,avx512vl,avx512dq")
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "prefill_bf16_avx512.h"

namespace {
using strand::exp2_nonpos;
using strand::interleave16;

// Keys per online-softmax step: S is [16][256] float32 and P [16][256] bfloat16, 24 KB of L1
// (512 keys: 48 KB, past L1, and no faster).
constexpr int kKeysPerChunk = 256;
constexpr float kLog2e = 1.44269504088896341f;
constexpr long kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureTileData = 18;

bool amx_granted() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!((d >> 22) & 1) || !((d >> 24) & 1)) return false;  // AMX-BF16, AMX-TILE
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return false;  // OSXSAVE
  if ((_xgetbv(0) & 0x60000) != 0x60000) return false;  // XTILECFG and XTILEDATA enabled
  // Linux hands the 8 KB tile state to a process only on request (oneDNN asks too; asking
  // twice is harmless).
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureTileData) != 0) return false;
  unsigned long mask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &mask) != 0) return false;
  return (mask >> kXfeatureTileData) & 1;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Every tile is 16 rows of 64 bytes: tiles 0-3 float32 accumulators (16x16), tiles 4-5 A
// operands (16 rows x 32 bfloat16), tiles 6-7 B operands (16 pairs x 16 columns x 2).
void configure_tiles() {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.colsb[i] = 64;
    cfg.rows[i] = 16;
  }
  _tile_loadconfig(&cfg);
}

struct Args {
  const uint16_t *q, *kc, *vc;
  const int32_t *bt, *q_starts, *q_lens, *lens;
  uint16_t* o;
  int64_t H, D, BS, KVH, MB, q_stride, o_stride;
  float scale;
};

// Packed K and V of one (request, kv head), keys padded with zeros to a multiple of 32:
// K for S = Q K^T as B tiles [key block of 16][d chunk of 32][16 d pairs][16 keys][2];
// V for O = P V as B tiles [key block of 32][d tile of 16][16 key pairs][16 d][2].
struct Packed {
  const uint16_t* k;
  const uint16_t* v;
};

inline const uint16_t* cache_row(const Args& a, int64_t r, int64_t g, int64_t j,
                                 const uint16_t* cache) {
  const int64_t block = a.bt[r * a.MB + j / a.BS];
  return cache + ((block * a.BS + j % a.BS) * a.KVH + g) * a.D;
}

// Keys j0..j0+32 of (r, g) into the packed buffers (rows past seq_len are zeros).
void pack_block(const Args& a, int64_t r, int64_t g, int64_t j0, uint16_t* kp, uint16_t* vp) {
  const int64_t D = a.D, len = a.lens[r], nc = D / 32, ndt = D / 16;
  alignas(64) uint16_t rows_k[32][256], rows_v[32][256];  // D <= 256 (checked by the caller)
  for (int64_t i = 0; i < 32; ++i) {
    if (j0 + i < len) {
      std::memcpy(rows_k[i], cache_row(a, r, g, j0 + i, a.kc), D * 2);
      std::memcpy(rows_v[i], cache_row(a, r, g, j0 + i, a.vc), D * 2);
    } else {
      std::memset(rows_k[i], 0, D * 2);
      std::memset(rows_v[i], 0, D * 2);
    }
  }
  // K: two 16-key blocks; element (key n, d = c*32 + 2p + e) at ((kb*nc + c)*16 + p)*32 + 2n + e.
  for (int64_t half = 0; half < 2; ++half) {
    uint32_t* dst = reinterpret_cast<uint32_t*>(kp + (j0 / 16 + half) * nc * 512);
    for (int64_t c = 0; c < nc; ++c)
      for (int64_t p = 0; p < 16; ++p)
        for (int64_t n = 0; n < 16; ++n)
          dst[(c * 16 + p) * 16 + n] =
              reinterpret_cast<const uint32_t*>(rows_k[half * 16 + n])[c * 16 + p];
  }
  // V: element (key 2p + e, d = dt*16 + col) at ((dt*16 + p)*16 + col)*2 + e: pairs of rows
  // interleaved 16 bits at a time.
  uint16_t* vdst = vp + (j0 / 32) * ndt * 512;
  for (int64_t dt = 0; dt < ndt; ++dt)
    for (int64_t p = 0; p < 16; ++p) {
      const __m256i x =
          _mm256_load_si256(reinterpret_cast<const __m256i*>(rows_v[2 * p] + dt * 16));
      const __m256i y =
          _mm256_load_si256(reinterpret_cast<const __m256i*>(rows_v[2 * p + 1] + dt * 16));
      const __m512i xy = _mm512_inserti64x4(_mm512_castsi256_si512(x), y, 1);
      _mm512_storeu_si512(vdst + (dt * 16 + p) * 32, interleave16(xy));
    }
}

// Tile C += tile A times tile B (4 with 6, 5 with 7), loaded from b first. GCC's
// tile intrinsics are macros that paste the tile number into the instruction, hence a macro.
// A and B each alternate between two tiles: a load into a tile waits for the product still
// reading it, so one tile each would serialize every load behind the previous product.
#define DP_LOAD_B(C, A, B, b) \
  do {                        \
    _tile_loadd(B, b, 64);    \
    _tile_dpbf16ps(C, A, B);  \
  } while (0)

// S[16][NB*16] = Q[16][D] K^T for key blocks kb0..kb0+NB (NB <= 4), into s (row stride 256).
// The q chunk c sits in tile 4 + c % 2 and its K blocks' tiles in 6 + c % 2.
template <int NB>
void scores(const uint16_t* qbuf, const uint16_t* kp, int64_t kb0, int64_t D, float* s) {
  const int64_t nc = D / 32, step = nc * 512;
  if constexpr (NB > 0) _tile_zero(0);
  if constexpr (NB > 1) _tile_zero(1);
  if constexpr (NB > 2) _tile_zero(2);
  if constexpr (NB > 3) _tile_zero(3);
  for (int64_t c = 0; c < nc; c += 2) {
    const uint16_t* b = kp + (kb0 * nc + c) * 512;
    _tile_loadd(4, qbuf + c * 32, D * 2);
    DP_LOAD_B(0, 4, 6, b);
    if constexpr (NB > 1) DP_LOAD_B(1, 4, 6, b + step);
    if constexpr (NB > 2) DP_LOAD_B(2, 4, 6, b + 2 * step);
    if constexpr (NB > 3) DP_LOAD_B(3, 4, 6, b + 3 * step);
    // nc is even (D a multiple of 64) or this is the last chunk; D = 32, 96, ... end here.
    if (c + 1 == nc) break;
    _tile_loadd(5, qbuf + (c + 1) * 32, D * 2);
    DP_LOAD_B(0, 5, 7, b + 512);
    if constexpr (NB > 1) DP_LOAD_B(1, 5, 7, b + 512 + step);
    if constexpr (NB > 2) DP_LOAD_B(2, 5, 7, b + 512 + 2 * step);
    if constexpr (NB > 3) DP_LOAD_B(3, 5, 7, b + 512 + 3 * step);
  }
  constexpr int64_t stride = kKeysPerChunk * 4;
  _tile_stored(0, s, stride);
  if constexpr (NB > 1) _tile_stored(1, s + 16, stride);
  if constexpr (NB > 2) _tile_stored(2, s + 32, stride);
  if constexpr (NB > 3) _tile_stored(3, s + 48, stride);
}

// O[16][dt0*16 .. +NT*16] += P[16][n32] V for the chunk's key pairs (kb32 = its first 32-key
// block). P's 32-key block kb sits in tile 4 + kb % 2, its V tiles in 6 + kb % 2.
template <int NT>
void accumulate(const uint16_t* pbuf, const uint16_t* vp, int64_t kb32, int64_t n32, int64_t dt0,
                int64_t D, float* obuf) {
  const int64_t ndt = D / 16, ostride = D * 4, nkb = n32 / 32;
  float* o = obuf + dt0 * 16;
  if constexpr (NT > 0) _tile_loadd(0, o, ostride);
  if constexpr (NT > 1) _tile_loadd(1, o + 16, ostride);
  if constexpr (NT > 2) _tile_loadd(2, o + 32, ostride);
  if constexpr (NT > 3) _tile_loadd(3, o + 48, ostride);
  for (int64_t kb = 0; kb < nkb; kb += 2) {
    const uint16_t* b = vp + ((kb32 + kb) * ndt + dt0) * 512;
    _tile_loadd(4, pbuf + kb * 32, kKeysPerChunk * 2);
    DP_LOAD_B(0, 4, 6, b);
    if constexpr (NT > 1) DP_LOAD_B(1, 4, 6, b + 512);
    if constexpr (NT > 2) DP_LOAD_B(2, 4, 6, b + 1024);
    if constexpr (NT > 3) DP_LOAD_B(3, 4, 6, b + 1536);
    if (kb + 1 == nkb) break;
    b += ndt * 512;
    _tile_loadd(5, pbuf + (kb + 1) * 32, kKeysPerChunk * 2);
    DP_LOAD_B(0, 5, 7, b);
    if constexpr (NT > 1) DP_LOAD_B(1, 5, 7, b + 512);
    if constexpr (NT > 2) DP_LOAD_B(2, 5, 7, b + 1024);
    if constexpr (NT > 3) DP_LOAD_B(3, 5, 7, b + 1536);
  }
  if constexpr (NT > 0) _tile_stored(0, o, ostride);
  if constexpr (NT > 1) _tile_stored(1, o + 16, ostride);
  if constexpr (NT > 2) _tile_stored(2, o + 32, ostride);
  if constexpr (NT > 3) _tile_stored(3, o + 48, ostride);
}

struct Scratch {
  alignas(64) uint16_t q[16 * 256];  // the tile's q rows, zeros past the last token
  alignas(64) float s[16 * kKeysPerChunk];
  alignas(64) uint16_t p[16 * kKeysPerChunk];  // probabilities rounded to bfloat16
  alignas(64) float o[16 * 256];
  float m[16], l[16];
};

struct Task {
  int64_t keys;  // keys its last token attends to: its cost
  int32_t r, g, t0, nt;  // tokens t0..t0+nt of request r, kv head g
};

// One query head h over tokens t0..t0+nt of request r (positions first + t0 + i).
void head_task(const Args& a, const Packed& pk, const Task& t, int64_t h, Scratch& sc) {
  const int64_t D = a.D, r = t.r, nt = t.nt;
  const int64_t first = a.lens[r] - a.q_lens[r], q_start = a.q_starts[r];
  for (int64_t i = 0; i < 16; ++i) {
    if (i < nt)
      std::memcpy(sc.q + i * D, a.q + (q_start + t.t0 + i) * a.q_stride + h * D, D * 2);
    else
      std::memset(sc.q + i * D, 0, D * 2);
    sc.m[i] = -std::numeric_limits<float>::infinity();
    sc.l[i] = 0.f;
  }
  std::memset(sc.o, 0, sizeof(float) * 16 * D);
  const int64_t last_pos = first + t.t0 + nt - 1;  // padding rows take the last token's place
  const int64_t num_keys = last_pos + 1;
  const __m512 scale2 = _mm512_set1_ps(a.scale * kLog2e);
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t k0 = 0; k0 < num_keys; k0 += kKeysPerChunk) {
    const int64_t n = std::min<int64_t>(kKeysPerChunk, num_keys - k0);
    const int64_t n16 = (n + 15) / 16 * 16, n32 = (n + 31) / 32 * 32;
    for (int64_t kb = 0; kb < n16 / 16; kb += 4) {
      float* s = sc.s + kb * 16;
      switch (std::min<int64_t>(4, n16 / 16 - kb)) {
        case 4: scores<4>(sc.q, pk.k, k0 / 16 + kb, D, s); break;
        case 3: scores<3>(sc.q, pk.k, k0 / 16 + kb, D, s); break;
        case 2: scores<2>(sc.q, pk.k, k0 / 16 + kb, D, s); break;
        default: scores<1>(sc.q, pk.k, k0 / 16 + kb, D, s); break;
      }
    }
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t pos = std::min<int64_t>(first + t.t0 + i, last_pos);
      // Keys of this chunk the row sees: whole vectors first, then one masked tail; the
      // rest of the chunk's 32-key blocks are zeros in P.
      const int64_t visible = std::clamp<int64_t>(pos + 1 - k0, 0, n);
      const int64_t full = visible / 16 * 16;
      const __mmask16 tail = (__mmask16)((1u << (visible - full)) - 1u);
      const float* s = sc.s + i * kKeysPerChunk;
      uint16_t* p = sc.p + i * kKeysPerChunk;
      __m512 mx = neg_inf;
      int64_t j = 0;
      for (; j < full; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
      if (j < visible) mx = _mm512_mask_max_ps(mx, tail, mx, _mm512_loadu_ps(s + j));
      const float m_old = sc.m[i];
      // scale > 0: the scaled maximum is the maximum scaled. Key 0 is in every row's first
      // chunk, so m_new is finite from then on.
      const float m_new = std::max(m_old, _mm512_reduce_max_ps(mx) * a.scale);
      // exp(s * scale - m_new) = 2^(s * scale * log2(e) - m_new * log2(e))
      const __m512 m = _mm512_set1_ps(m_new * kLog2e);
      __m512 sum = _mm512_setzero_ps();
      for (j = 0; j < full; j += 16) {
        const __m512 e = exp2_nonpos(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), scale2, m));
        sum = _mm512_add_ps(sum, e);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j), (__m256i)_mm512_cvtneps_pbh(e));
      }
      if (j < visible) {
        const __m512 t = _mm512_fmsub_ps(_mm512_loadu_ps(s + j), scale2, m);
        const __m512 e = _mm512_maskz_mov_ps(tail, exp2_nonpos(t));
        sum = _mm512_add_ps(sum, e);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j), (__m256i)_mm512_cvtneps_pbh(e));
        j += 16;
      }
      for (; j < n32; j += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j), _mm256_setzero_si256());
      const float alpha = k0 > 0 ? std::exp(m_old - m_new) : 0.f;  // m_old = -inf at first
      sc.l[i] = sc.l[i] * alpha + _mm512_reduce_add_ps(sum);
      sc.m[i] = m_new;
      if (k0 > 0) {
        const __m512 al = _mm512_set1_ps(alpha);
        for (int64_t d = 0; d < D; d += 16)
          _mm512_storeu_ps(sc.o + i * D + d, _mm512_mul_ps(_mm512_loadu_ps(sc.o + i * D + d), al));
      }
    }
    const int64_t ndt = D / 16;
    for (int64_t dt0 = 0; dt0 < ndt; dt0 += 4) {
      switch (std::min<int64_t>(4, ndt - dt0)) {
        case 4: accumulate<4>(sc.p, pk.v, k0 / 32, n32, dt0, D, sc.o); break;
        case 3: accumulate<3>(sc.p, pk.v, k0 / 32, n32, dt0, D, sc.o); break;
        case 2: accumulate<2>(sc.p, pk.v, k0 / 32, n32, dt0, D, sc.o); break;
        default: accumulate<1>(sc.p, pk.v, k0 / 32, n32, dt0, D, sc.o); break;
      }
    }
  }
  for (int64_t i = 0; i < nt; ++i) {
    const __m512 inv = _mm512_set1_ps(1.f / sc.l[i]);
    uint16_t* out = a.o + (q_start + t.t0 + i) * a.o_stride + h * D;
    for (int64_t d = 0; d < D; d += 16) {
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(sc.o + i * D + d), inv);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + d), (__m256i)_mm512_cvtneps_pbh(x));
    }
  }
}

}  // namespace

bool prefill_attention_amx_available() {
  static const bool yes = amx_granted();
  return yes;
}

void prefill_attention_amx(at::Tensor out, at::Tensor query, at::Tensor key_cache,
                           at::Tensor value_cache, at::Tensor block_table, at::Tensor q_starts,
                           at::Tensor q_lens, at::Tensor seq_lens, double scale) {
  STRAND_CHECK(prefill_attention_amx_available(), "AMX is not available on this CPU");
  STRAND_CHECK(query.scalar_type() == at::kBFloat16, "prefill_attention_amx needs bfloat16");
  STRAND_CHECK(scale > 0, "prefill_attention_amx needs scale > 0, got ", scale);
  const int64_t D = query.size(2);
  STRAND_CHECK(D % 32 == 0 && D <= 256, "prefill_attention_amx needs head_dim a multiple of 32 "
              "up to 256, got ", D);
  const auto ptr = [](at::Tensor t) {
    return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>());
  };
  const Args a{ptr(query), ptr(key_cache), ptr(value_cache), block_table.data_ptr<int32_t>(),
               q_starts.data_ptr<int32_t>(), q_lens.data_ptr<int32_t>(),
               seq_lens.data_ptr<int32_t>(), ptr(out), query.size(1), D, key_cache.size(1),
               key_cache.size(2), block_table.size(1), query.stride(0), out.stride(0),
               (float)scale};
  const int64_t R = q_lens.size(0), KVH = a.KVH, G = a.H / KVH;
  // Packed K/V of every (request, kv head): offsets in 32-key blocks.
  std::vector<int64_t> base(R + 1, 0);
  for (int64_t r = 0; r < R; ++r) base[r + 1] = base[r] + (a.lens[r] + 31) / 32;
  const int64_t block_elems = 32 * D;  // one 32-key block of K (or V), one kv head
  // Not zero-filled: pack_block writes every element, zeros past each context included.
  const std::unique_ptr<uint16_t[]> kbuf(new uint16_t[base[R] * KVH * block_elems]);
  const std::unique_ptr<uint16_t[]> vbuf(new uint16_t[base[R] * KVH * block_elems]);
  auto packed = [&](int64_t r, int64_t g) {
    const int64_t off = (base[r] * KVH + g * (base[r + 1] - base[r])) * block_elems;
    return Packed{kbuf.get() + off, vbuf.get() + off};
  };
  std::vector<Task> tasks;
  std::vector<std::pair<int64_t, int64_t>> packs;  // (r * KVH + g, 32-key block)
  for (int64_t r = 0; r < R; ++r) {
    const int64_t q_len = a.q_lens[r], first = a.lens[r] - q_len;
    for (int64_t g = 0; g < KVH; ++g) {
      for (int64_t b = 0; b < base[r + 1] - base[r]; ++b) packs.push_back({r * KVH + g, b});
      for (int64_t t0 = 0; t0 < q_len; t0 += 16) {
        const int64_t nt = std::min<int64_t>(16, q_len - t0);
        tasks.push_back({first + t0 + nt, (int32_t)r, (int32_t)g, (int32_t)t0, (int32_t)nt});
      }
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& x, const Task& y) { return x.keys > y.keys; });
  const int64_t np = (int64_t)packs.size(), nt = (int64_t)tasks.size();
  const int threads = (int)std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), nt));
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < np; ++i) {
      const int64_t r = packs[i].first / KVH, g = packs[i].first % KVH;
      const Packed pk = packed(r, g);
      pack_block(a, r, g, packs[i].second * 32,
                 const_cast<uint16_t*>(pk.k), const_cast<uint16_t*>(pk.v));
    }  // the loop's implicit barrier: every block is packed before any is read
    configure_tiles();
    std::unique_ptr<Scratch> scratch(new Scratch());
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < nt; ++i) {
      const Task& t = tasks[i];
      const Packed pk = packed(t.r, t.g);
      for (int64_t h = t.g * G; h < (t.g + 1) * G; ++h) head_task(a, pk, t, h, *scratch);
    }
    _tile_release();
  }
}

#pragma GCC pop_options
#else  // no AMX in this build (below the avx512 level, or not GCC on x86-64)

bool prefill_attention_amx_available() { return false; }

void prefill_attention_amx(at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                           at::Tensor, at::Tensor, double) {
  STRAND_CHECK(false, "prefill_attention_amx is not built for this CPU level");
}
#endif
