#include "kernels.h"
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "vec16.h"

#include "avx512_bf16.h"

// out[M, N] = x[M, K] @ w[N, K]^T (+ bias) for a few rows of x (M <= 4): decode steps of a few
// requests. A GEMM library is built for products that reuse each weight many times; here each
// weight is used M times, so the product is a read of the weights and nothing else. This streams
// each weight row once, contiguous per thread (the hardware prefetchers see one run), and
// serves all M rows of x from it. float32 or bfloat16 weights (bf16: half the bytes to read),
// x in the weight's dtype, computed in float32 and rounded once per output.
namespace {
using namespace strand;

constexpr int kRowBlock = 4;  // weight rows whose dot products run together (independent chains)

template <typename T, int M>
void rows_task(const T* x, const T* w, const T* bias, T* out, int64_t K, int64_t N, int64_t n0,
               int64_t n1, const float* xf) {
  const int64_t KV = K / kLanes * kLanes;
  for (int64_t n = n0; n < n1; n += kRowBlock) {
    const int64_t nr = std::min<int64_t>(kRowBlock, n1 - n);
    vl acc[kRowBlock][M];
    for (int r = 0; r < kRowBlock; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = vl{};
    const T* rows[kRowBlock];
    for (int r = 0; r < kRowBlock; ++r) rows[r] = w + (n + std::min<int64_t>(r, nr - 1)) * K;
    for (int64_t k = 0; k < KV; k += kLanes) {
      vl xv[M];
      for (int m = 0; m < M; ++m) xv[m] = load_l(xf + m * K + k);
      for (int r = 0; r < kRowBlock; ++r) {
        const vl wv = load_l(rows[r] + k);
        for (int m = 0; m < M; ++m) acc[r][m] += wv * xv[m];
      }
    }
    for (int r = 0; r < nr; ++r) {
      for (int m = 0; m < M; ++m) {
        float sum = 0.f;
        for (int l = 0; l < kLanes; ++l) sum += acc[r][m][l];
        for (int64_t k = KV; k < K; ++k) sum += to_float(rows[r][k]) * xf[m * K + k];
        if (bias != nullptr) sum += to_float(bias[n + r]);
        store_scalar(out + m * N + n + r, sum);
      }
    }
  }
}

template <typename T, int M>
void run(const T* x, const T* w, const T* bias, T* out, int64_t K, int64_t N) {
  // x in float32 once (it is read N times); a few KB.
  std::vector<float> xf(M * K);
  for (int64_t i = 0; i < M * K; ++i) xf[i] = to_float(x[i]);
  // Whole row blocks per thread, at least 64 rows each: fewer and the threads' start costs more
  // than their share of the read.
  at::parallel_for(0, (N + kRowBlock - 1) / kRowBlock, 64 / kRowBlock, [&](int64_t b0, int64_t b1) {
    rows_task<T, M>(x, w, bias, out, K, N, b0 * kRowBlock, std::min(N, b1 * kRowBlock), xf.data());
  });
}

#ifdef STRAND_DPBF16
// bfloat16 weights through VDPBF16PS (avx512_bf16.h): widening each weight first made bfloat16
// decode compute-bound at about 7 GB/s of weights on one Xeon core, half what float32 reads.

// Weight rows a group at M rows of x: 8 at M <= 2 (one x register and 8 or 16 accumulators),
// 4 above (16 accumulators and 4 x registers: 8 rows would take all 32 registers and spill).
constexpr int dp_rows(int M) { return M <= 2 ? 8 : 4; }
// Bytes ahead of the group being read that the group asks for. At one row of x the kernel is
// bound by how many reads one core keeps in flight: the hardware prefetchers stop at each 4 KB
// page, and asking a page ahead keeps the loads going across it (SmolLM2's 30 layers and lm_head,
// 269 MB at M = 1 on one thread of the Xeon: 28.6 -> 27.0 ms, 9.4 -> 9.9 GB/s, with 8-row
// groups; 2 and 8 KB ahead, or into L2 only, did no better).
constexpr int64_t kPrefetchAhead = 4096;

template <int M>
BF16_TARGET void rows_task_dp(const bf16* x, const bf16* w, const bf16* bias, bf16* out,
                              int64_t K, int64_t N, int64_t n0, int64_t n1) {
  constexpr int RB = dp_rows(M);
  const int64_t KV = K / 32 * 32;
  const __mmask32 tail = (__mmask32)((1ull << (K - KV)) - 1);  // the last K % 32 values
  const auto load = [](const bf16* p) { return (__m512bh)_mm512_loadu_si512(p); };
  const auto load_tail = [tail](const bf16* p) {
    return (__m512bh)_mm512_maskz_loadu_epi16(tail, p);  // zeros past K: they add nothing
  };
  const char* end = reinterpret_cast<const char*>(w + n1 * K);  // this task's last byte + 1
  for (int64_t n = n0; n < n1; n += RB) {
    const int64_t nr = std::min<int64_t>(RB, n1 - n);
    // The group's rows are contiguous: ask for the same span kPrefetchAhead further on.
    const char* ahead = reinterpret_cast<const char*>(w + n * K) + kPrefetchAhead;
    const char* ahead_end = std::min(end, ahead + nr * K * (int64_t)sizeof(bf16));
    for (const char* p = ahead; p < ahead_end; p += 64) _mm_prefetch(p, _MM_HINT_T0);
    __m512 acc[RB][M];
    for (int r = 0; r < RB; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
    const bf16* rows[RB];
    for (int r = 0; r < RB; ++r) rows[r] = w + (n + std::min<int64_t>(r, nr - 1)) * K;
    for (int64_t k = 0; k < KV; k += 32) {
      __m512bh xv[M];
      for (int m = 0; m < M; ++m) xv[m] = load(x + m * K + k);
      for (int r = 0; r < RB; ++r) {
        const __m512bh wv = load(rows[r] + k);
        for (int m = 0; m < M; ++m) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], wv, xv[m]);
      }
    }
    if (KV < K) {
      __m512bh xv[M];
      for (int m = 0; m < M; ++m) xv[m] = load_tail(x + m * K + KV);
      for (int r = 0; r < RB; ++r) {
        const __m512bh wv = load_tail(rows[r] + KV);
        for (int m = 0; m < M; ++m) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], wv, xv[m]);
      }
    }
    for (int r = 0; r < nr; ++r) {
      for (int m = 0; m < M; ++m) {
        float sum = _mm512_reduce_add_ps(acc[r][m]);
        if (bias != nullptr) sum += to_float(bias[n + r]);
        store_scalar(out + m * N + n + r, sum);
      }
    }
  }
}

template <int M>
void run_dp(const bf16* x, const bf16* w, const bf16* bias, bf16* out, int64_t K, int64_t N) {
  constexpr int RB = dp_rows(M);
  at::parallel_for(0, (N + RB - 1) / RB, 64 / RB, [&](int64_t b0, int64_t b1) {
    rows_task_dp<M>(x, w, bias, out, K, N, b0 * RB, std::min(N, b1 * RB));
  });
}

#endif

template <typename T>
void by_m(const T* x, const T* w, const T* bias, T* out, int64_t M, int64_t K, int64_t N) {
#ifdef STRAND_DPBF16
  if constexpr (std::is_same_v<T, bf16>) {
    if (has_dpbf16()) {
      switch (M) {
        case 1: run_dp<1>(x, w, bias, out, K, N); return;
        case 2: run_dp<2>(x, w, bias, out, K, N); return;
        case 3: run_dp<3>(x, w, bias, out, K, N); return;
        default: run_dp<4>(x, w, bias, out, K, N); return;
      }
    }
  }
#endif
  switch (M) {
    case 1: run<T, 1>(x, w, bias, out, K, N); break;
    case 2: run<T, 2>(x, w, bias, out, K, N); break;
    case 3: run<T, 3>(x, w, bias, out, K, N); break;
    default: run<T, 4>(x, w, bias, out, K, N);
  }
}
}  // namespace

void linear_small(at::Tensor out, at::Tensor x, at::Tensor weight, c10::optional<at::Tensor> bias) {
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK(M >= 1 && M <= 4, "linear_small takes 1 to 4 rows, got ", M);
  if (x.scalar_type() == at::kBFloat16) {
    const bf16* b = bias.has_value() ? static_cast<const bf16*>(bias->data_ptr()) : nullptr;
    by_m<bf16>(static_cast<const bf16*>(x.data_ptr()), static_cast<const bf16*>(weight.data_ptr()),
               b, static_cast<bf16*>(out.data_ptr()), M, K, N);
  } else {
    const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
    by_m<float>(x.data_ptr<float>(), weight.data_ptr<float>(), b, out.data_ptr<float>(), M, K, N);
  }
}
