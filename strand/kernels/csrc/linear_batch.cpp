#include "check.h"
#include "kernels.h"
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "vec16.h"

// out[M, N] = x[M, K] @ w[N, K]^T (+ bias) for a decode step of a batch of requests (M of 5 to
// about 64 rows) on the dense weight as it is loaded: no packed copy. Each weight is used M times,
// enough to make the product compute-bound, but too few for a GEMM library's packing and blocking
// to pay: oneDNN capped at AVX2 ran SmolLM2's M = 32 decode products on one core at little more
// than half the rate of its 4096-row prefill products.
//
// The kernel takes a group of NR weight rows (a few KB, kept in L1 while it is used), and runs
// every row of x against it in tiles of MR x rows by the NR weight rows: MR * NR accumulators of
// dot products along K, each step MR + NR loads for MR * NR multiply-adds, and one lane sum per
// output at the end. The weights are read from memory once, in order; x (M * K floats, the
// batch's activations) stays in L2. bfloat16 weights are widened to float32 once per group, into
// a buffer in L1, so the widening is paid once for the M rows and not once per tile. Sums in
// float32, one rounding per output (what a bfloat16 GEMM gives).
namespace {
using namespace strand;

// Tiles: as many accumulators as the register file holds beside the MR + 1 operands
// (16 ymm with AVX2: 2 x 6 = 12 + 2 + 1; 32 zmm with AVX-512: 4 x 6 = 24 + 4 + 1). With AVX2,
// 2 x 6 beat 3 x 4 (which reads x from L2 a third more often) at SmolLM2's M = 32, one thread,
// cold weights.
// Long rows (SmolLM2's down_proj, K = 1536: 6 rows are 37 KB) take 3 x 4 tiles under AVX2, so
// that the group stays in L1 beside the x rows passing through (faster at M = 32, one thread,
// cold weights).
#if defined(__AVX512F__)
constexpr int kNR = 6, kMR = 4, kNRLong = 6, kMRLong = 4;
#else
constexpr int kNR = 6, kMR = 2, kNRLong = 4, kMRLong = 3;
#endif
constexpr int64_t kLongRow = 16 * 1024 / (6 * 4);  // K above which a 6-row group passes 16 KB

// The bytes of the next weight group asked for at each tile's start, a slice per tile, so that the
// group arrives in L2 while this one is computed: the hardware prefetchers alone left the M = 32
// products waiting on memory (SmolLM2's layers and lm_head in turn, one thread: as slow as
// oneDNN, which runs the same shapes much faster once the weights are in cache).
inline void prefetch(const char* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i, 0, 2);
}

inline void store_out(float* p, float v) { *p = v; }
inline void store_out(bf16* p, float v) {  // rounded to nearest, ties to even (as torch rounds)
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  p->bits = v != v ? 0x7FC0u : (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// MR rows of xf (float32, rows of stride KP, zero past K) against kNR rows of wf (stride ws):
// out[m * N + r] = xf[m] . wf[r] (+ bias[r]) for r < nr. KV: K rounded down to whole vectors;
// the K - KV tail is summed in scalar.
template <typename T, int MR, int kNR>
inline void tile(const float* xf, int64_t KP, const float* wf, int64_t ws, int64_t K, int64_t KV,
                 int nr, const T* bias, T* out, int64_t N) {
  constexpr int A = MR * kNR;
  constexpr int AP = (A + kLanes - 1) / kLanes * kLanes;  // accumulators, padded for reduce_lanes
  vl acc[AP];
  for (int a = 0; a < AP; ++a) acc[a] = vl{};
  for (int64_t k = 0; k < KV; k += kLanes) {
    vl xv[MR];
    for (int m = 0; m < MR; ++m) xv[m] = load_l(xf + m * KP + k);
    for (int r = 0; r < kNR; ++r) {
      const vl wv = load_l(wf + r * ws + k);
      for (int m = 0; m < MR; ++m) acc[m * kNR + r] += xv[m] * wv;
    }
  }
  alignas(64) float sums[AP];
  for (int a = 0; a < AP; a += kLanes) store_l(sums + a, reduce_lanes(acc + a));
  for (int m = 0; m < MR; ++m) {
    for (int r = 0; r < nr; ++r) {
      float sum = sums[m * kNR + r];
      for (int64_t k = KV; k < K; ++k) sum += xf[m * KP + k] * wf[r * ws + k];
      if (bias != nullptr) sum += to_float(bias[r]);
      store_out(out + m * N + r, sum);
    }
  }
}

// Every row of x against the weight rows [n, n + nr) (nr <= kNR), read from wf.
// next, next_bytes: the weight bytes to prefetch meanwhile (the next group's).
template <typename T, int kMR, int kNR>
void group(const float* xf, int64_t M, int64_t KP, const float* wf, int64_t ws, int64_t K,
           int nr, const T* bias, T* out, int64_t N, const char* next, int64_t next_bytes) {
  const int64_t KV = K / kLanes * kLanes;
  const int64_t tiles = (M + kMR - 1) / kMR;
  const int64_t slice = (next_bytes + tiles - 1) / tiles;
  int64_t m = 0;
  for (int64_t t = 0; m + kMR <= M; m += kMR, ++t) {
    prefetch(next + t * slice, std::min(slice, next_bytes - t * slice));
    tile<T, kMR, kNR>(xf + m * KP, KP, wf, ws, K, KV, nr, bias, out + m * N, N);
  }
  switch (M - m) {  // the last rows: a narrower tile
    case 3: tile<T, 3, kNR>(xf + m * KP, KP, wf, ws, K, KV, nr, bias, out + m * N, N); break;
    case 2: tile<T, 2, kNR>(xf + m * KP, KP, wf, ws, K, KV, nr, bias, out + m * N, N); break;
    case 1: tile<T, 1, kNR>(xf + m * KP, KP, wf, ws, K, KV, nr, bias, out + m * N, N); break;
    default: break;
  }
}

template <typename T, int kMR, int kNR>
void run(const T* x, const T* w, const T* bias, T* out, int64_t M, int64_t K, int64_t N) {
  // x in float32 once, rows padded to whole vectors with zeros (it is read N / kNR times).
  const int64_t KP = (K + kLanes - 1) / kLanes * kLanes;
  std::vector<float> xf(M * KP, 0.f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xf[m * KP + k] = to_float(x[m * K + k]);
  const int64_t groups = (N + kNR - 1) / kNR;
  // At least 16 weight rows per thread: fewer and starting the thread costs more than its share.
  at::parallel_for(0, groups, 16 / kNR + 1, [&](int64_t g0, int64_t g1) {
    std::vector<float> wbuf;  // bfloat16 weights widened, one group at a time
    if constexpr (std::is_same_v<T, bf16>) wbuf.assign(kNR * KP, 0.f);
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t n = g * kNR;
      const int nr = (int)std::min<int64_t>(kNR, N - n);
      const T* b = bias == nullptr ? nullptr : bias + n;
      const int64_t n1 = std::min(N, n + kNR), n2 = std::min(N, n + 2 * kNR);
      const char* next = reinterpret_cast<const char*>(w + n1 * K);  // the next group's rows
      const int64_t next_bytes = (n2 - n1) * K * (int64_t)sizeof(T);
      if constexpr (std::is_same_v<T, bf16>) {
        for (int r = 0; r < nr; ++r) {
          const bf16* row = w + (n + r) * K;
          float* dst = wbuf.data() + r * KP;
          int64_t k = 0;
          for (; k + kLanes <= K; k += kLanes) store_l(dst + k, load_l(row + k));
          for (; k < K; ++k) dst[k] = to_float(row[k]);
        }
        // Rows past nr keep what they held: their sums are computed and never stored.
        group<T, kMR, kNR>(xf.data(), M, KP, wbuf.data(), KP, K, nr, b, out + n, N, next, next_bytes);
      } else {
        if (nr == kNR) {
          group<T, kMR, kNR>(xf.data(), M, KP, w + n * K, K, K, nr, b, out + n, N, next, next_bytes);
        } else {  // the last, partial group: from a zero-padded copy (reads stay in bounds)
          std::vector<float> last(kNR * KP, 0.f);
          for (int r = 0; r < nr; ++r) std::memcpy(last.data() + r * KP, w + (n + r) * K, K * 4);
          group<T, kMR, kNR>(xf.data(), M, KP, last.data(), KP, K, nr, b, out + n, N, next, next_bytes);
        }
      }
    }
  });
}
}  // namespace

void linear_batch(at::Tensor out, at::Tensor x, at::Tensor weight, c10::optional<at::Tensor> bias) {
  STRAND_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "linear_batch takes x [M, K] and weight [N, K]");
  STRAND_CHECK(x.is_contiguous() && weight.is_contiguous() && out.is_contiguous(),
              "linear_batch takes contiguous tensors");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  if (x.scalar_type() == at::kBFloat16) {
    const bf16* b = bias.has_value() ? static_cast<const bf16*>(bias->data_ptr()) : nullptr;
    const auto* xp = static_cast<const bf16*>(x.data_ptr());
    const auto* wp = static_cast<const bf16*>(weight.data_ptr());
    auto* op = static_cast<bf16*>(out.data_ptr());
    if (K > kLongRow) run<bf16, kMRLong, kNRLong>(xp, wp, b, op, M, K, N);
    else run<bf16, kMR, kNR>(xp, wp, b, op, M, K, N);
  } else {
    const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
    if (K > kLongRow) {
      run<float, kMRLong, kNRLong>(x.data_ptr<float>(), weight.data_ptr<float>(), b,
                                   out.data_ptr<float>(), M, K, N);
    } else {
      run<float, kMR, kNR>(x.data_ptr<float>(), weight.data_ptr<float>(), b, out.data_ptr<float>(),
                           M, K, N);
    }
  }
}
