#include "check.h"
#include "kernels.h"
#include "linear_panels.h"

#include <algorithm>
#include <cstring>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "vec16.h"

// out[M, N] = x[M, K] @ w[N, K]^T (+ bias), float32, with w regrouped once at load into panels of
// W output columns (48 with AVX-512, 16 with AVX2): panels[p][k][j] = w[W p + j][k], the last
// panel padded with zeros.
//
// Why not oneDNN: at a decode batch of 32 rows its kernels, blocked for large products, ran
// SmolLM2's 30 layers with the weights cold (as in a step: 424 MB of them) in more than the
// weights' arithmetic at the machine's GEMM rate plus their reading, which can overlap; this
// kernel overlaps them and takes less than that sum. For prefill (4096 rows) the two are
// level. One packed copy serves both.
//
// The AVX-512 tile: 8 rows of x by a panel's 48 columns, 24 accumulators (3 per row). Each k is
// one panel row of 3 vector loads, contiguous along the panel, and 8 broadcasts of x for 24
// multiply-adds: compute-bound, not load-bound. A panel (K x 192 bytes: 110 KB at K = 576) stays
// in L2 while every tile of rows passes over it, and the next panel is prefetched during the
// first tile, so the weights are read from memory once, in order, while the arithmetic runs.
// Each output is one float32 sum along k in order (no split over k), whatever the threads.
namespace {
using namespace strand;

// A panel row is kVecs register-wide vectors; a tile, kTileRows rows of x by one panel:
// kTileRows * kVecs accumulators beside kVecs panel loads and a broadcast, within the register
// file (AVX-512: 8 x 3 = 24 + 4 of 32 zmm; AVX2: 6 x 2 = 12 + 3 of 16 ymm).
#if defined(__AVX512F__)
constexpr int kVecs = 3, kTileRows = 8;
#else
constexpr int kVecs = 2, kTileRows = 6;
#endif
constexpr int kPanel = kVecs * kLanes;  // columns a panel: 48 with AVX-512, 16 with AVX2
constexpr int kRowBytes = kPanel * (int)sizeof(float);

// Rows [0, MR) of x (row stride K) against one panel into out (row stride ldo): cols <= kPanel
// of its columns are stored. pf: the next panel's bytes to prefetch alongside (nullptr: none).
template <int MR>
inline void tile(const float* x, int64_t K, const float* panel, const float* bias, float* out,
                 int64_t ldo, int cols, const char* pf) {
  vl acc[MR][kVecs];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < kVecs; ++v) acc[m][v] = vl{};
  for (int64_t k = 0; k < K; ++k) {
    const float* row = panel + k * kPanel;
    if (pf != nullptr) {  // the next panel's row k, as this one's is used
      for (int line = 0; line < kRowBytes; line += 64)
        __builtin_prefetch(pf + k * kRowBytes + line, 0, 2);
    }
    vl b[kVecs];
    for (int v = 0; v < kVecs; ++v) b[v] = load_l(row + v * kLanes);
    for (int m = 0; m < MR; ++m) {
      const vl a = broadcast(x + m * K + k);
      for (int v = 0; v < kVecs; ++v) acc[m][v] += a * b[v];
    }
  }
  if (bias != nullptr) add_panel_bias(acc, bias, cols);
  for (int m = 0; m < MR; ++m) {
    float* o = out + m * ldo;
    if (cols == kPanel) {
      for (int v = 0; v < kVecs; ++v) store_l(o + v * kLanes, acc[m][v]);
    } else {  // the last, partial panel
      alignas(64) float full[kPanel];
      for (int v = 0; v < kVecs; ++v) store_l(full + v * kLanes, acc[m][v]);
      std::memcpy(o, full, cols * sizeof(float));
    }
  }
}

// The last n < kTileRows rows: a tile of n rows.
template <int MR>
inline void short_tile(int n, const float* x, int64_t K, const float* panel, const float* bias,
                       float* out, int64_t ldo, int cols, const char* pf) {
  if constexpr (MR > 0) {
    if (n == MR)
      tile<MR>(x, K, panel, bias, out, ldo, cols, pf);
    else
      short_tile<MR - 1>(n, x, K, panel, bias, out, ldo, cols, pf);
  }
}

// Rows [m0, m1) of x against one panel; the next panel prefetched during the first tile.
void rows(const float* x, int64_t m0, int64_t m1, int64_t K, const float* panel,
          const float* bias, float* out, int64_t N, int cols, const char* pf) {
  int64_t m = m0;
  for (; m + kTileRows <= m1; m += kTileRows)
    tile<kTileRows>(x + m * K, K, panel, bias, out + m * N, N, cols, m == m0 ? pf : nullptr);
  short_tile<kTileRows - 1>((int)(m1 - m), x + m * K, K, panel, bias, out + m * N, N, cols,
                            m == m0 ? pf : nullptr);
}
}  // namespace

int64_t linear_panel_width() { return kPanel; }

void strand::panels_rows(at::Tensor& out, const float* x, int64_t M, const at::Tensor& panels,
                         const c10::optional<at::Tensor>& bias, int64_t p0, int64_t p1) {
  const int64_t K = panels.size(1), N = out.size(1);
  const float* pp = panels.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  for (int64_t p = p0; p < p1; ++p) {
    const float* panel = pp + p * K * kPanel;
    const char* pf = p + 1 < p1 ? reinterpret_cast<const char*>(panel + K * kPanel) : nullptr;
    const int cols = (int)std::min<int64_t>(kPanel, N - p * kPanel);
    rows(x, 0, M, K, panel, bp == nullptr ? nullptr : bp + p * kPanel, op + p * kPanel, N, cols,
         pf);
  }
}

void pack_panels(at::Tensor panels, at::Tensor weight) {
  STRAND_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.is_contiguous(),
              "pack_panels takes a contiguous float32 weight [N, K]");
  const int64_t N = weight.size(0), K = weight.size(1), P = (N + kPanel - 1) / kPanel;
  STRAND_CHECK(panels.dim() == 3 && panels.size(0) == P && panels.size(1) == K &&
                  panels.size(2) == kPanel && panels.scalar_type() == at::kFloat &&
                  panels.is_contiguous(),
              "pack_panels: panels must be a contiguous float32 [", P, ", ", K, ", ", kPanel, "]");
  const float* w = weight.data_ptr<float>();
  float* out = panels.data_ptr<float>();
  at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      float* dst = out + p * K * kPanel;
      const int64_t cols = std::min<int64_t>(kPanel, N - p * kPanel);
      for (int64_t k = 0; k < K; ++k) {
        for (int64_t j = 0; j < cols; ++j) dst[k * kPanel + j] = w[(p * kPanel + j) * K + k];
        for (int64_t j = cols; j < kPanel; ++j) dst[k * kPanel + j] = 0.f;
      }
    }
  });
}

void linear_panels(at::Tensor out, at::Tensor x, at::Tensor panels,
                   c10::optional<at::Tensor> bias) {
  STRAND_CHECK(x.dim() == 2 && out.dim() == 2 && panels.dim() == 3 && panels.size(2) == kPanel,
              "linear_panels takes x [M, K], panels [P, K, ", kPanel, "] and out [M, N]");
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1), P = panels.size(0);
  STRAND_CHECK(panels.size(1) == K && out.size(0) == M && N > (P - 1) * kPanel && N <= P * kPanel,
              "linear_panels: x is [", M, ", ", K, "], panels [", P, ", ", panels.size(1), ", ",
              kPanel, "], out [", out.size(0), ", ", N, "]: out must be [M, N] with N in (",
              (P - 1) * kPanel, ", ", P * kPanel, "] and panels' K the same as x's");
  STRAND_CHECK(x.scalar_type() == at::kFloat && panels.scalar_type() == at::kFloat &&
                  out.scalar_type() == at::kFloat,
              "linear_panels takes float32 tensors");
  STRAND_CHECK(x.is_contiguous() && panels.is_contiguous() && out.is_contiguous(),
              "linear_panels takes contiguous tensors");
  STRAND_CHECK(!bias.has_value() || (bias->dim() == 1 && bias->size(0) == N &&
                                     bias->scalar_type() == at::kFloat && bias->is_contiguous()),
              "linear_panels: bias must be a contiguous float32 [", N, "]");
  if (M == 0 || P == 0) return;  // nothing to compute (and no panels to share out)
  const float* xp = x.data_ptr<float>();
  const float* pp = panels.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  // Work items: (panel, block of rows), panel by panel. Panels alone where there are enough to
  // share out (a thread streams a run of panels, each once); with fewer than two a thread, rows
  // are split too, in whole tiles, so that every thread has work.
  const int64_t tiles = (M + kTileRows - 1) / kTileRows;
  const int64_t threads = at::get_num_threads();
  const int64_t blocks = std::min(tiles, std::max<int64_t>(1, (2 * threads + P - 1) / P));
  const int64_t block_rows = (tiles + blocks - 1) / blocks * kTileRows;
  at::parallel_for(0, P * blocks, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t p = i / blocks, m0 = i % blocks * block_rows;
      const int64_t m1 = std::min(M, m0 + block_rows);
      if (m0 >= m1) continue;
      const float* panel = pp + p * K * kPanel;
      // The next item's panel, when it is another and this thread's: fetched meanwhile.
      const bool next = i + 1 < i1 && (i + 1) / blocks != p;
      const char* pf = next ? reinterpret_cast<const char*>(panel + K * kPanel) : nullptr;
      const int cols = (int)std::min<int64_t>(kPanel, N - p * kPanel);
      rows(xp, m0, m1, K, panel, bp == nullptr ? nullptr : bp + p * kPanel, op + p * kPanel, N,
           cols, pf);
    }
  });
}
