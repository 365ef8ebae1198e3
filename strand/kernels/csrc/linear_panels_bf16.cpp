#include "linear_panels_bf16.h"

#include "avx512_bf16.h"
#include "check.h"
#include "claim_chunks.h"
#include "kernels.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "vec16.h"

// out[M, N] = x[M, K] @ w[N, K]^T (+ bias) in bfloat16, w regrouped once at load into panels of
// W output columns whose consecutive k come in pairs: panels[p][i][j] is the 32-bit pair
// (w[W p + j][2 i], w[W p + j][2 i + 1]), the low half first. One copy, the size of the weight,
// serves every row count, as linear_panels does for float32 (the same tiles of kTileRows rows by
// a panel, panel by panel; runs of panels claimed by the threads as they come free). x is
// repacked once a call so that a tile's values of one pair lie together (pack_x). At a few rows
// (up to 4 with VDPBF16PS, 2 widening) a tile takes several panels at once (group_dp,
// group_wide): the product is a read of the weights, faster from several streams than one.
//
// Two ways through a pair of k, the same layout for both:
// - VDPBF16PS (AVX512_BF16): x's pair broadcast as one 32-bit value, one instruction multiplies
//   16 columns by both k and adds to float32 sums: twice float32 FMA's products per instruction,
//   and no widening.
// - elsewhere (AVX2, AVX-512 without BF16): a 32-bit lane shifted left by 16 is the low k's
//   weight as float32, masked with 0xFFFF0000 the high k's; two float32 FMAs against x widened
//   to float32 once per call. Half the weight bytes of float32 panels for the same arithmetic.
// Each output is one float32 sum along k in order (the bias added last), rounded once to
// bfloat16: whichever threads take its panel and rows, and whatever M. (The two paths may differ
// in the last bits: VDPBF16PS adds a pair's products in its own order and flushes denormals.)
namespace {
using namespace strand;

#if defined(__AVX512F__)
constexpr int kVecs = 3, kTileRows = 8;  // 24 accumulators + 3 panel vectors + a broadcast
#else
constexpr int kVecs = 2, kTileRows = 5;  // 10 + 4 widened + 2 broadcasts: 16 ymm
#endif
constexpr int kPanel = kVecs * kLanes;                          // columns a panel
constexpr int kPairBytes = kPanel * (int)sizeof(uint32_t);      // one pair of k of a panel
constexpr int64_t kAheadPairs = 16;  // how far ahead of a stream of panel rows to prefetch
typedef uint32_t u32lu __attribute__((vector_size(4 * kLanes), aligned(4)));

// The bias (float32 here, zero past cols), added to the sums, which are rounded and stored.
template <int MR>
inline void finish(vl (&acc)[MR][kVecs], const float* bias, bf16* out, int64_t ldo, int cols) {
  if (bias != nullptr) add_panel_bias(acc, bias, cols);
  for (int m = 0; m < MR; ++m) {
    bf16* o = out + m * ldo;
    if (cols == kPanel) {
      for (int v = 0; v < kVecs; ++v) store_l(o + v * kLanes, acc[m][v]);
    } else {  // the last, partial panel: only its columns are stored
      alignas(64) bf16 full[kPanel];
      for (int v = 0; v < kVecs; ++v) store_l(full + v * kLanes, acc[m][v]);
      std::memcpy(o, full, cols * sizeof(bf16));
    }
  }
}

inline void prefetch_pair(const char* pf, int64_t i) {
  if (pf == nullptr) return;
  for (int line = 0; line < kPairBytes; line += 64)
    __builtin_prefetch(pf + i * kPairBytes + line, 0, 2);
}

// The widening tile: rows [0, MR) of a tile of x as pack_x left it for this path (float32,
// xt[(2 i + t) * kTileRows + m] = x[m][2 i + t]) against one panel of K2 pairs.
template <int MR>
void tile_wide(const float* xt, int64_t K2, const uint32_t* panel, const float* bias, bf16* out,
               int64_t ldo, int cols, const char* pf) {
  vl acc[MR][kVecs];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < kVecs; ++v) acc[m][v] = vl{};
  const u32l high = u32l{} + 0xFFFF0000u;
  for (int64_t i = 0; i < K2; ++i) {
    prefetch_pair(pf, i);
    const uint32_t* row = panel + i * kPanel;
    const float* x0 = xt + 2 * i * kTileRows;
#if defined(__AVX512F__)
    // One panel vector at a time (widened into two), its products for every row: the widened
    // pairs of the whole panel row beside every accumulator would not fit the registers.
    for (int v = 0; v < kVecs; ++v) {
      const u32l w = *reinterpret_cast<const u32lu*>(row + v * kLanes);
      const u32l lo_bits = w << 16, hi_bits = w & high;
      const vl lo = reinterpret_cast<const vl&>(lo_bits), hi = reinterpret_cast<const vl&>(hi_bits);
      // x's broadcasts are loaded again for each v: left to itself the compiler loads each once
      // for all v and, short of registers for them, moves accumulators to the stack instead.
      const float* xv = x0;
      asm volatile("" : "+r"(xv));
      for (int m = 0; m < MR; ++m) {
        acc[m][v] += broadcast(xv + m) * lo;
        acc[m][v] += broadcast(xv + kTileRows + m) * hi;
      }
    }
#else
    // The whole panel row widened (4 registers), then each row's two broadcasts once: fewer
    // rows a tile than float32's, for half the broadcasts a product of the order above.
    vl lo[kVecs], hi[kVecs];
    for (int v = 0; v < kVecs; ++v) {
      const u32l w = *reinterpret_cast<const u32lu*>(row + v * kLanes);
      const u32l lo_bits = w << 16, hi_bits = w & high;
      lo[v] = reinterpret_cast<const vl&>(lo_bits);
      hi[v] = reinterpret_cast<const vl&>(hi_bits);
    }
    for (int m = 0; m < MR; ++m) {
      const vl a0 = broadcast(x0 + m), a1 = broadcast(x0 + kTileRows + m);
      for (int v = 0; v < kVecs; ++v) {
        acc[m][v] += a0 * lo[v];
        acc[m][v] += a1 * hi[v];
      }
    }
#endif
  }
  finish<MR>(acc, bias, out, ldo, cols);
}

// group_dp's grouping on the widening path, for one or two rows: NP panels as streams of their
// own, each pair of x broadcast once for all of them.
constexpr int group_panels_wide(int MR) { return MR == 1 ? 4 : 2; }

template <int MR>
void group_wide(const float* xt, int64_t K2, const uint32_t* panel, int np_live,
                const float* bias, bf16* out, int64_t ldo, int last_cols) {
  constexpr int NP = group_panels_wide(MR);
  vl acc[NP][MR][kVecs];
  for (int q = 0; q < NP; ++q)
    for (int m = 0; m < MR; ++m)
      for (int v = 0; v < kVecs; ++v) acc[q][m][v] = vl{};
  const u32l high = u32l{} + 0xFFFF0000u;
  const int64_t stride = K2 * kPanel;
  const uint32_t* panels[NP];  // past the live ones, the last live one again (never stored)
  for (int q = 0; q < NP; ++q) panels[q] = panel + std::min(q, np_live - 1) * stride;
  for (int64_t i = 0; i < K2; ++i) {
    vl a0[MR], a1[MR];
    for (int m = 0; m < MR; ++m) {
      a0[m] = broadcast(xt + 2 * i * kTileRows + m);
      a1[m] = broadcast(xt + (2 * i + 1) * kTileRows + m);
    }
    for (int q = 0; q < NP; ++q) {
      const uint32_t* row = panels[q] + i * kPanel;
      for (int line = 0; line < kPairBytes; line += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(row + kAheadPairs * kPanel) + line, 0, 3);
      for (int v = 0; v < kVecs; ++v) {
        const u32l w = *reinterpret_cast<const u32lu*>(row + v * kLanes);
        const u32l lo_bits = w << 16, hi_bits = w & high;
        const vl lo = reinterpret_cast<const vl&>(lo_bits);
        const vl hi = reinterpret_cast<const vl&>(hi_bits);
        for (int m = 0; m < MR; ++m) {
          acc[q][m][v] += a0[m] * lo;
          acc[q][m][v] += a1[m] * hi;
        }
      }
    }
  }
  for (int q = 0; q < np_live; ++q)
    finish<MR>(acc[q], bias == nullptr ? nullptr : bias + q * kPanel, out + q * kPanel, ldo,
               q == np_live - 1 ? last_cols : kPanel);
}

#ifdef STRAND_DPBF16
// The VDPBF16PS tile: rows [0, MR) of a tile of x as pack_x left it for this path (x's pairs,
// xt[i * kTileRows + m] = (x[m][2 i], x[m][2 i + 1]), an odd K's last high half zero) against
// one panel of K2 pairs. Each pair is broadcast as one 32-bit value.
template <int MR>
BF16_TARGET void tile_dp(const uint32_t* xt, int64_t K2, const uint32_t* panel,
                         const float* bias, bf16* out, int64_t ldo, int cols, const char* pf) {
  __m512 acc[MR][kVecs];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < kVecs; ++v) acc[m][v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < K2; ++i) {
    prefetch_pair(pf, i);
    const uint32_t* row = panel + i * kPanel;
    __m512bh b[kVecs];
    for (int v = 0; v < kVecs; ++v) b[v] = (__m512bh)_mm512_loadu_si512(row + v * kLanes);
    for (int m = 0; m < MR; ++m) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32((int32_t)xt[i * kTileRows + m]);
      for (int v = 0; v < kVecs; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], a, b[v]);
    }
  }
  vl sums[MR][kVecs];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < kVecs; ++v) sums[m][v] = (vl)acc[m][v];
  finish<MR>(sums, bias, out, ldo, cols);
}

// Panels side by side for a few rows (one tile): rows [0, MR) of x against NP consecutive
// panels at once, each read as a stream of its own; the sums are the same as tile_dp's, output
// by output. Panels past N are not read (np_live of them are). At two to four rows several
// streams read faster (a kernel alone, cold weights); at one row, in a whole model's decode
// step, eight panels at once (streams a panel apart) ran slower than one, so a thread reads one
// panel there.
constexpr int group_panels(int MR) { return MR == 1 ? 1 : (MR == 2 ? 4 : 2); }

template <int MR>
BF16_TARGET void group_dp(const uint32_t* xt, int64_t K2, const uint32_t* panel, int np_live,
                          const float* bias, bf16* out, int64_t ldo, int last_cols) {
  constexpr int NP = group_panels(MR);
  __m512 acc[NP][MR][kVecs];
  for (int q = 0; q < NP; ++q)
    for (int m = 0; m < MR; ++m)
      for (int v = 0; v < kVecs; ++v) acc[q][m][v] = _mm512_setzero_ps();
  const int64_t stride = K2 * kPanel;
  // Panels past the live ones repeat the last live one (read again from cache, never stored).
  const uint32_t* panels[NP];
  for (int q = 0; q < NP; ++q) panels[q] = panel + std::min(q, np_live - 1) * stride;
  for (int64_t i = 0; i < K2; ++i) {
    __m512bh a[MR];
    for (int m = 0; m < MR; ++m) a[m] = (__m512bh)_mm512_set1_epi32((int32_t)xt[i * kTileRows + m]);
    for (int q = 0; q < NP; ++q) {
      const uint32_t* row = panels[q] + i * kPanel;
      for (int line = 0; line < kPairBytes; line += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(row + kAheadPairs * kPanel) + line, 0, 3);
      for (int v = 0; v < kVecs; ++v) {
        const __m512bh b = (__m512bh)_mm512_loadu_si512(row + v * kLanes);
        for (int m = 0; m < MR; ++m) acc[q][m][v] = _mm512_dpbf16_ps(acc[q][m][v], a[m], b);
      }
    }
  }
  for (int q = 0; q < np_live; ++q) {
    vl sums[MR][kVecs];
    for (int m = 0; m < MR; ++m)
      for (int v = 0; v < kVecs; ++v) sums[m][v] = (vl)acc[q][m][v];
    finish<MR>(sums, bias == nullptr ? nullptr : bias + q * kPanel, out + q * kPanel, ldo,
               q == np_live - 1 ? last_cols : kPanel);
  }
}
#endif

// What a call shares with every tile: x packed by pack_x, the panels, the bias as float32, out.
struct Args {
  const uint32_t* xq;  // the VDPBF16PS path's pairs, or
  const float* xw;     // the widening path's float32 values
  int64_t K2, N;
  const uint32_t* panels;
  const float* bias;
  bf16* out;
};

// Rows [m, m + MR) of x, m a multiple of kTileRows: one tile of the packed x.
template <int MR>
void tile(const Args& a, int64_t m, const uint32_t* panel, const float* bias, bf16* out,
          int cols, const char* pf) {
  const int64_t t = m / kTileRows;
#ifdef STRAND_DPBF16
  if (a.xq != nullptr) {
    tile_dp<MR>(a.xq + t * a.K2 * kTileRows, a.K2, panel, bias, out, a.N, cols, pf);
    return;
  }
#endif
  tile_wide<MR>(a.xw + t * a.K2 * 2 * kTileRows, a.K2, panel, bias, out, a.N, cols, pf);
}

template <int MR>
void short_tile(int n, const Args& a, int64_t m, const uint32_t* panel, const float* bias,
                bf16* out, int cols, const char* pf) {
  if constexpr (MR > 0) {
    if (n == MR)
      tile<MR>(a, m, panel, bias, out, cols, pf);
    else
      short_tile<MR - 1>(n, a, m, panel, bias, out, cols, pf);
  }
}

// Rows [m0, m1) against panel p; the next panel (pf) prefetched during the first tile.
void rows(const Args& a, int64_t p, int64_t m0, int64_t m1, const char* pf) {
  const uint32_t* panel = a.panels + p * a.K2 * kPanel;
  const int cols = (int)std::min<int64_t>(kPanel, a.N - p * kPanel);
  const float* bias = a.bias == nullptr ? nullptr : a.bias + p * kPanel;
  int64_t m = m0;
  for (; m + kTileRows <= m1; m += kTileRows)
    tile<kTileRows>(a, m, panel, bias, a.out + m * a.N + p * kPanel, cols,
                    m == m0 ? pf : nullptr);
  short_tile<kTileRows - 1>((int)(m1 - m), a, m, panel, bias, a.out + m * a.N + p * kPanel, cols,
                            m == m0 ? pf : nullptr);
}

// x [M, K] into tiles of kTileRows rows: out[t][i][m] is x[t kTileRows + m]'s pair i (k = 2 i
// and 2 i + 1), as one 32-bit value (uint32_t) or as two float32 values out[t][2 i + s][m]
// (float); zeros past M and K.
inline void put(uint32_t* tile, int64_t i, int m, uint32_t lo, uint32_t hi) {
  tile[i * kTileRows + m] = lo | hi << 16;
}
inline void put(float* tile, int64_t i, int m, uint32_t lo, uint32_t hi) {
  const uint32_t wide[2] = {lo << 16, hi << 16};
  std::memcpy(&tile[2 * i * kTileRows + m], &wide[0], sizeof(float));
  std::memcpy(&tile[(2 * i + 1) * kTileRows + m], &wide[1], sizeof(float));
}
template <typename T>
void pack_x(const bf16* x, int64_t M, int64_t K, T* out) {
  const int64_t K2 = (K + 1) / 2, tiles = (M + kTileRows - 1) / kTileRows;
  constexpr int64_t kPer = std::is_same_v<T, float> ? 2 : 1;  // values a pair
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      T* tile = out + t * K2 * kPer * kTileRows;
      const bf16* rows[kTileRows];  // the tile's rows of x (nullptr past M)
      for (int m = 0; m < kTileRows; ++m)
        rows[m] = t * kTileRows + m < M ? x + (t * kTileRows + m) * K : nullptr;
      // Pair by pair, the tile's rows side by side: written in order, each row read in order.
      for (int64_t i = 0; i < K2; ++i) {
        const bool whole = 2 * i + 1 < K;
        for (int m = 0; m < kTileRows; ++m) {
          if (rows[m] == nullptr) {
            put(tile, i, m, 0, 0);
          } else {
            put(tile, i, m, rows[m][2 * i].bits, whole ? rows[m][2 * i + 1].bits : 0);
          }
        }
      }
    }
  });
}
// Work items [i0, i1) of a product, on the calling thread: item i is panel i / blocks against
// rows [i % blocks * block_rows, + block_rows) of x (blocks 1: every row, and the few-row
// groups of panels where M is small).
void run_items(const Args& a, int64_t M, int64_t i0, int64_t i1, int64_t blocks,
               int64_t block_rows) {
  const int64_t K2 = a.K2, N = a.N;
#ifdef STRAND_DPBF16
  if (a.xq != nullptr && M <= 4) {  // one tile of a few rows: panels in groups (group_dp)
    const int np = M == 1 ? group_panels(1) : (M == 2 ? group_panels(2) : group_panels(3));
    for (int64_t p = i0; p < i1; p += np) {  // blocks is 1: items are panels
      const int live = (int)std::min<int64_t>(np, i1 - p);
      const int last_cols = (int)std::min<int64_t>(kPanel, N - (p + live - 1) * kPanel);
      const float* bias = a.bias == nullptr ? nullptr : a.bias + p * kPanel;
      const uint32_t* panel = a.panels + p * K2 * kPanel;
      bf16* o = a.out + p * kPanel;
      switch (M) {
        case 1: group_dp<1>(a.xq, K2, panel, live, bias, o, N, last_cols); break;
        case 2: group_dp<2>(a.xq, K2, panel, live, bias, o, N, last_cols); break;
        case 3: group_dp<3>(a.xq, K2, panel, live, bias, o, N, last_cols); break;
        default: group_dp<4>(a.xq, K2, panel, live, bias, o, N, last_cols); break;
      }
    }
    return;
  }
#endif
  if (a.xw != nullptr && M <= 2) {  // the same on the widening path (group_wide)
    const int np = M == 1 ? group_panels_wide(1) : group_panels_wide(2);
    for (int64_t p = i0; p < i1; p += np) {
      const int live = (int)std::min<int64_t>(np, i1 - p);
      const int last_cols = (int)std::min<int64_t>(kPanel, N - (p + live - 1) * kPanel);
      const float* bias = a.bias == nullptr ? nullptr : a.bias + p * kPanel;
      const uint32_t* panel = a.panels + p * K2 * kPanel;
      if (M == 1) group_wide<1>(a.xw, K2, panel, live, bias, a.out + p * kPanel, N, last_cols);
      else group_wide<2>(a.xw, K2, panel, live, bias, a.out + p * kPanel, N, last_cols);
    }
    return;
  }
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t p = i / blocks, m0 = i % blocks * block_rows;
    const int64_t m1 = std::min(M, m0 + block_rows);
    if (m0 >= m1) continue;
    // The next item's panel, when it is another and this run's: fetched meanwhile.
    const bool next = i + 1 < i1 && (i + 1) / blocks != p;
    const char* pf =
        next ? reinterpret_cast<const char*>(a.panels + (p + 1) * K2 * kPanel) : nullptr;
    rows(a, p, m0, m1, pf);
  }
}

}  // namespace

int64_t linear_panel_bf16_width() { return kPanel; }

bool linear_panels_bf16_dp() {
#ifdef STRAND_DPBF16
  return has_dpbf16();
#else
  return false;
#endif
}

void pack_panels_bf16(at::Tensor panels, at::Tensor weight) {
  STRAND_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16 &&
                   weight.is_contiguous(),
               "pack_panels_bf16 takes a contiguous bfloat16 weight [N, K], got ",
               weight.scalar_type(), " ", weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t P = (N + kPanel - 1) / kPanel, K2 = (K + 1) / 2;
  STRAND_CHECK(panels.dim() == 4 && panels.size(0) == P && panels.size(1) == K2 &&
                   panels.size(2) == kPanel && panels.size(3) == 2 &&
                   panels.scalar_type() == at::kBFloat16 && panels.is_contiguous(),
               "pack_panels_bf16: panels must be a contiguous bfloat16 [", P, ", ", K2, ", ",
               kPanel, ", 2], got ", panels.scalar_type(), " ", panels.sizes());
  const uint16_t* w = reinterpret_cast<const uint16_t*>(weight.data_ptr());
  uint16_t* dst = reinterpret_cast<uint16_t*>(panels.data_ptr());
  at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      uint16_t* panel = dst + p * K2 * kPanel * 2;
      const int64_t cols = std::min<int64_t>(kPanel, N - p * kPanel);
      std::memset(panel, 0, K2 * kPanel * 2 * sizeof(uint16_t));
      for (int64_t j = 0; j < cols; ++j) {  // one weight row at a time: read in order
        const uint16_t* src = w + (p * kPanel + j) * K;
        for (int64_t k = 0; k < K; ++k) panel[(k / 2 * kPanel + j) * 2 + k % 2] = src[k];
      }
    }
  });
}

namespace {
// x as the tiles read it (pack_x): each pair of k as one 32-bit value (VDPBF16PS), or each value
// widened to float32.
struct PackedX {
  std::vector<uint32_t> pairs;
  std::vector<float> wide;
};

// What a product's tiles share: x packed into `xs`, the panels, out, and the bias as float32
// (into `bias32`).
Args args_of(const at::Tensor& x, PackedX& xs, const at::Tensor& panels, at::Tensor& out,
             const c10::optional<at::Tensor>& bias, std::vector<float>& bias32) {
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  const int64_t K2 = (K + 1) / 2, tiles = (M + kTileRows - 1) / kTileRows;
  Args a{};
  a.K2 = K2;
  a.N = N;
  a.panels = reinterpret_cast<const uint32_t*>(panels.data_ptr());
  a.out = reinterpret_cast<bf16*>(out.data_ptr());
  const bf16* xv = reinterpret_cast<const bf16*>(x.data_ptr());
  if (linear_panels_bf16_dp()) {
    xs.pairs.resize(tiles * K2 * kTileRows);
    pack_x(xv, M, K, xs.pairs.data());
    a.xq = xs.pairs.data();
  } else {
    xs.wide.resize(tiles * K2 * 2 * kTileRows);
    pack_x(xv, M, K, xs.wide.data());
    a.xw = xs.wide.data();
  }
  if (bias.has_value()) {
    bias32.resize(N);
    if (bias->scalar_type() == at::kFloat) {
      std::memcpy(bias32.data(), bias->data_ptr<float>(), N * sizeof(float));
    } else {
      const bf16* b = reinterpret_cast<const bf16*>(bias->data_ptr());
      for (int64_t n = 0; n < N; ++n) bias32[n] = to_float(b[n]);
    }
    a.bias = bias32.data();
  }
  return a;
}
}  // namespace

void linear_panels_bf16(at::Tensor out, at::Tensor x, at::Tensor panels,
                        c10::optional<at::Tensor> bias) {
  STRAND_CHECK(x.dim() == 2 && out.dim() == 2 && panels.dim() == 4 && panels.size(2) == kPanel &&
                   panels.size(3) == 2,
               "linear_panels_bf16 takes x [M, K], panels [P, ceil(K / 2), ", kPanel,
               ", 2] and out [M, N], got x ", x.sizes(), ", panels ", panels.sizes(), ", out ",
               out.sizes());
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1), P = panels.size(0);
  const int64_t K2 = (K + 1) / 2;
  STRAND_CHECK(panels.size(1) == K2 && out.size(0) == M && N > (P - 1) * kPanel &&
                   N <= P * kPanel,
               "linear_panels_bf16: x is [", M, ", ", K, "], panels [", P, ", ", panels.size(1),
               ", ", kPanel, ", 2], out [", out.size(0), ", ", N, "]: out must be [M, N] with N in (",
               (P - 1) * kPanel, ", ", P * kPanel, "] and panels' pairs ceil(K / 2) = ", K2);
  STRAND_CHECK(x.scalar_type() == at::kBFloat16 && panels.scalar_type() == at::kBFloat16 &&
                   out.scalar_type() == at::kBFloat16,
               "linear_panels_bf16 takes bfloat16 x, panels and out, got ", x.scalar_type(), ", ",
               panels.scalar_type(), ", ", out.scalar_type());
  STRAND_CHECK(x.is_contiguous() && panels.is_contiguous() && out.is_contiguous(),
               "linear_panels_bf16 takes contiguous tensors");
  STRAND_CHECK(!bias.has_value() ||
                   (bias->dim() == 1 && bias->size(0) == N && bias->is_contiguous() &&
                    (bias->scalar_type() == at::kBFloat16 || bias->scalar_type() == at::kFloat)),
               "linear_panels_bf16: bias must be a contiguous bfloat16 or float32 [", N, "]");
  if (M == 0 || P == 0) return;  // nothing to compute (and no panels to share out)
  std::vector<float> bias32;
  // x repacked once a call, tile by tile (kTileRows rows interleaved along k, rows past M zero):
  // a tile's values for one pair are contiguous, so its broadcasts read one stream in order
  // instead of kTileRows rows a row length apart (which, at a power-of-two length, share a few
  // cache sets and evict each other). The buffer stays between calls: a fresh one's page
  // faults cost a few percent of a prefill's product.
  thread_local PackedX xs;
  const Args a = args_of(x, xs, panels, out, bias, bias32);
  const int64_t tiles = (M + kTileRows - 1) / kTileRows;
  // Work items (panel, block of rows), panel by panel, as linear_panels shares them: panels
  // alone where there are enough for the threads; rows split too, in whole tiles, where not.
  // Runs of items are claimed by the threads as they come free (claim_chunks.h), so that a
  // thread waiting for a core does not hold back its whole share.
  const int threads = at::get_num_threads();
  const int64_t blocks = std::min(tiles, std::max<int64_t>(1, (2 * threads + P - 1) / P));
  const int64_t block_rows = (tiles + blocks - 1) / blocks * kTileRows;
  const int64_t items = P * blocks, chunks = chunk_count(items, threads, 1);
  claim_for(chunks, [&](int64_t c) {
    run_items(a, M, chunk_begin(items, chunks, c), chunk_begin(items, chunks, c + 1), blocks,
              block_rows);
  });
}
