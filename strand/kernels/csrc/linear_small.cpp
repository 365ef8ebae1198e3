#include "check.h"
#include "kernels.h"
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "vec16.h"

#include "avx512_bf16.h"
#include "claim_chunks.h"
#include "linear_small.h"

// out[M, N] = x[M, K] @ w[N, K]^T (+ bias) for a few rows of x (M <= 4): decode steps of a few
// requests. A GEMM library is built for products that reuse each weight many times; here each
// weight is used M times, so the product is a read of the weights and nothing else. This streams
// each weight row once, contiguous per thread (the hardware prefetchers see one run), and
// serves all M rows of x from it. float32 or bfloat16 weights (bf16: half the bytes to read),
// x in the weight's dtype, computed in float32 and rounded once per output. bfloat16 goes through
// VDPBF16PS where the CPU has AVX512_BF16 (run_dp), else through 32-bit pairs (run_pairs); float32
// through run_f32.
namespace {
using namespace strand;

// The lanes of v summed by halving (log2 kLanes shuffle-adds): the rows of a group reduce
// side by side, where a lane-by-lane sum is a chain of kLanes dependent adds per row.
inline float hsum(vl v) {
#if defined(__AVX512F__)
  const auto h8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  const vl h8 = v;
#endif
  const auto h4 = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) +
                  __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
  const auto h2 = __builtin_shufflevector(h4, h4, 0, 1) + __builtin_shufflevector(h4, h4, 2, 3);
  return h2[0] + h2[1];
}

// The N output columns of a call in whole groups of RB weight rows, at least 64 rows a chunk
// (fewer and a claim costs more than its share of the read), claimed by whichever thread is free
// (claim_chunks.h): with an even split (at::parallel_for) a call waits for the slowest thread's
// whole share, and on a shared machine that is often a thread waiting for a core; the lm_head,
// called on its own, is a fifth of a bfloat16 step. task(n0, n1) computes columns n0..n1.
template <typename Task>
void split_rows(int64_t N, int RB, const Task& task) {
  const int64_t groups = (N + RB - 1) / RB;
  const int64_t chunks = chunk_count(groups, at::get_num_threads(), 64 / RB);
  claim_for(chunks, [&](int64_t i) {
    task(chunk_begin(groups, chunks, i) * RB, std::min(N, chunk_begin(groups, chunks, i + 1) * RB));
  });
}

// ---- bfloat16 weights where the CPU has no AVX512_BF16 (AVX2-only CPUs, older AVX-512) ----
// Widening 8 bfloat16 values to float32 the direct way (zero-extend each 16 bits, shift) costs
// shuffles: GCC at -march=x86-64-v3 split each into two vpmovzxwd, a vpsrldq and a vinserti128,
// four port-5 uops per 8 weights, and bfloat16 decode read its weights at about half float32's
// rate on one core. Read as 32-bit words instead, 2 kLanes weights a load: the word's low half is the even
// weight, so `word << 16` is it in float32, and `word & 0xFFFF0000` is the odd one. Two integer
// ops and no shuffle per 2 kLanes weights; x is laid out to match (evens then odds per chunk,
// `pair_layout`), once per call.
constexpr int kPair = 2 * kLanes;  // bfloat16 weights one load takes
typedef uint32_t u32lu __attribute__((vector_size(4 * kLanes), aligned(2)));

inline void split_pairs(const bf16* p, vl& even, vl& odd) {
  const u32l u = *reinterpret_cast<const u32lu*>(p);
  const u32l e = u << 16, o = u & 0xFFFF0000u;
  even = reinterpret_cast<const vl&>(e);
  odd = reinterpret_cast<const vl&>(o);
}

// x [M, K] in float32, each whole chunk of kPair values as its kLanes even values then its kLanes
// odd ones; the last K % kPair values as they are.
void pair_layout(const bf16* x, float* xp, int64_t M, int64_t K) {
  const int64_t KC = K / kPair * kPair;
  for (int64_t m = 0; m < M; ++m) {
    const bf16* src = x + m * K;
    float* dst = xp + m * K;
    for (int64_t k = 0; k < KC; k += kPair)
      for (int l = 0; l < kLanes; ++l) {
        dst[k + l] = to_float(src[k + 2 * l]);
        dst[k + kLanes + l] = to_float(src[k + 2 * l + 1]);
      }
    for (int64_t k = KC; k < K; ++k) dst[k] = to_float(src[k]);
  }
}

// Weight rows a group: as many independent accumulator chains as the registers hold beside x
// (two FMAs a row and chunk, one after the other: 8 rows keep 8 chains of them in flight).
constexpr int pair_rows(int M) { return M == 1 ? 8 : (M == 2 ? 4 : 2); }
// Bytes ahead of each load of weights that the kernels ask for (this one and the AVX512_BF16 one
// below), a load at a time. At one row of x a kernel is bound by how many reads one core keeps in
// flight, and the hardware prefetchers stop at each 4 KB page. Asking 4 KB of a group of rows at
// its start (as the AVX512_BF16 path first did) covers one page while the loads in flight are
// few; here, with ~10 instructions a cache line, the out-of-order window reaches only ~3 KB
// ahead. 16 KB ahead (past the next group of rows) read SmolLM2's 30 layers and lm_head (M = 1,
// one thread) faster than no prefetch, than the group's 4 KB, and than 4 or 32 KB ahead a load,
// on this path under AVX2; the AVX512_BF16 path gained as well, at M = 1, 2 and 4. A
// prefetch past the weight's end never faults.
constexpr int64_t kPrefetchAhead = 16384;

template <int M>
void rows_task_pairs(const bf16* w, const bf16* bias, bf16* out, int64_t K, int64_t N,
                     int64_t n0, int64_t n1, const float* xp) {
  constexpr int RB = pair_rows(M);
  const int64_t KC = K / kPair * kPair;
  for (int64_t n = n0; n < n1; n += RB) {
    const int64_t nr = std::min<int64_t>(RB, n1 - n);
    vl acc[RB][M];
    for (int r = 0; r < RB; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = vl{};
    const bf16* rows[RB];
    for (int r = 0; r < RB; ++r) rows[r] = w + (n + std::min<int64_t>(r, nr - 1)) * K;
    for (int64_t k = 0; k < KC; k += kPair) {
      for (int r = 0; r < RB; ++r) {
        __builtin_prefetch(reinterpret_cast<const char*>(rows[r] + k) + kPrefetchAhead);
        vl even, odd;
        split_pairs(rows[r] + k, even, odd);
        for (int m = 0; m < M; ++m) {
          acc[r][m] += even * load_l(xp + m * K + k);
          acc[r][m] += odd * load_l(xp + m * K + k + kLanes);
        }
      }
    }
    for (int r = 0; r < nr; ++r) {
      for (int m = 0; m < M; ++m) {
        float sum = hsum(acc[r][m]);
        for (int64_t k = KC; k < K; ++k) sum += to_float(rows[r][k]) * xp[m * K + k];
        if (bias != nullptr) sum += to_float(bias[n + r]);
        store_scalar(out + m * N + n + r, sum);
      }
    }
  }
}

#include "linear_small_seq.h"

// STRAND_SMALL_ROWS_GROUPED=1: the grouped kernels above instead of a row at a time
// (linear_small_seq.h), for A/B runs on CPUs other than the one that chose the default.
inline bool rows_grouped() {
  const char* v = std::getenv("STRAND_SMALL_ROWS_GROUPED");
  static const bool yes = v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  return yes;
}

// The task each kernel runs for columns n0..n1: a row at a time, or grouped where asked.
template <int M>
void pairs_task(const bf16* w, const bf16* bias, bf16* out, int64_t K, int64_t N, int64_t n0,
                int64_t n1, const float* xp) {
  if (rows_grouped()) rows_task_pairs<M>(w, bias, out, K, N, n0, n1, xp);
  else seq_task_pairs<M>(w, bias, out, K, N, n0, n1, xp);
}

template <int M>
void run_pairs(const bf16* x, const bf16* w, const bf16* bias, bf16* out, int64_t K, int64_t N) {
  constexpr int RB = pair_rows(M);
  std::vector<float> xp(M * K);
  pair_layout(x, xp.data(), M, K);
  split_rows(N, RB, [&](int64_t n0, int64_t n1) {
    pairs_task<M>(w, bias, out, K, N, n0, n1, xp.data());
  });
}

// ---- float32 weights ----
// The same shape as the pairs kernel above: pair_rows(M) weight rows a group (8 independent
// chains at one row of x, where 4 had been), a prefetch kPrefetchAhead past every load, and tree
// lane sums. float32 decode reads twice bfloat16's bytes, so it is the more bound by one core's
// reads in flight: the 4-row kernel with no prefetch read SmolLM2's weights well below the
// memory's bandwidth under AVX2 (benchmarks/dense_kernel.py measures it).
template <int M>
void rows_task_f32(const float* w, const float* bias, float* out, int64_t K, int64_t N,
                   int64_t n0, int64_t n1, const float* x) {
  constexpr int RB = pair_rows(M);
  const int64_t KV = K / kLanes * kLanes;
  for (int64_t n = n0; n < n1; n += RB) {
    const int64_t nr = std::min<int64_t>(RB, n1 - n);
    vl acc[RB][M];
    for (int r = 0; r < RB; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = vl{};
    const float* rows[RB];
    for (int r = 0; r < RB; ++r) rows[r] = w + (n + std::min<int64_t>(r, nr - 1)) * K;
    for (int64_t k = 0; k < KV; k += kLanes) {
      for (int r = 0; r < RB; ++r) {
        __builtin_prefetch(reinterpret_cast<const char*>(rows[r] + k) + kPrefetchAhead);
        const vl wv = load_l(rows[r] + k);
        for (int m = 0; m < M; ++m) acc[r][m] += wv * load_l(x + m * K + k);
      }
    }
    for (int r = 0; r < nr; ++r) {
      for (int m = 0; m < M; ++m) {
        float sum = hsum(acc[r][m]);
        for (int64_t k = KV; k < K; ++k) sum += rows[r][k] * x[m * K + k];
        if (bias != nullptr) sum += bias[n + r];
        out[m * N + n + r] = sum;
      }
    }
  }
}

template <int M>
void f32_task(const float* w, const float* bias, float* out, int64_t K, int64_t N, int64_t n0,
              int64_t n1, const float* x) {
  if (rows_grouped()) rows_task_f32<M>(w, bias, out, K, N, n0, n1, x);
  else seq_task_f32<M>(w, bias, out, K, N, n0, n1, x);
}

template <int M>
void run_f32(const float* x, const float* w, const float* bias, float* out, int64_t K, int64_t N) {
  constexpr int RB = pair_rows(M);
  split_rows(N, RB, [&](int64_t n0, int64_t n1) {
    f32_task<M>(w, bias, out, K, N, n0, n1, x);
  });
}

#ifdef STRAND_DPBF16
// bfloat16 weights through VDPBF16PS (avx512_bf16.h): widening each weight first made bfloat16
// decode compute-bound on one core, at half the rate of weights float32 reads.

// Weight rows a group at M rows of x: 8 at M <= 2 (one x register and 8 or 16 accumulators),
// 4 above (16 accumulators and 4 x registers: 8 rows would take all 32 registers and spill).
constexpr int dp_rows(int M) { return M <= 2 ? 8 : 4; }

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
  for (int64_t n = n0; n < n1; n += RB) {
    const int64_t nr = std::min<int64_t>(RB, n1 - n);
    __m512 acc[RB][M];
    for (int r = 0; r < RB; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
    const bf16* rows[RB];
    for (int r = 0; r < RB; ++r) rows[r] = w + (n + std::min<int64_t>(r, nr - 1)) * K;
    for (int64_t k = 0; k < KV; k += 32) {
      __m512bh xv[M];
      for (int m = 0; m < M; ++m) xv[m] = load(x + m * K + k);
      for (int r = 0; r < RB; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + k) + kPrefetchAhead, _MM_HINT_T0);
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
void dp_task(const bf16* x, const bf16* w, const bf16* bias, bf16* out, int64_t K, int64_t N,
             int64_t n0, int64_t n1) {
  if (rows_grouped()) rows_task_dp<M>(x, w, bias, out, K, N, n0, n1);
  else seq_task_dp<M>(x, w, bias, out, K, N, n0, n1);
}

template <int M>
void run_dp(const bf16* x, const bf16* w, const bf16* bias, bf16* out, int64_t K, int64_t N) {
  constexpr int RB = dp_rows(M);
  split_rows(N, RB, [&](int64_t n0, int64_t n1) {
    dp_task<M>(x, w, bias, out, K, N, n0, n1);
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
  if constexpr (std::is_same_v<T, bf16>) {
    switch (M) {
      case 1: run_pairs<1>(x, w, bias, out, K, N); return;
      case 2: run_pairs<2>(x, w, bias, out, K, N); return;
      case 3: run_pairs<3>(x, w, bias, out, K, N); return;
      default: run_pairs<4>(x, w, bias, out, K, N); return;
    }
  } else {  // float32
    switch (M) {
      case 1: run_f32<1>(x, w, bias, out, K, N); break;
      case 2: run_f32<2>(x, w, bias, out, K, N); break;
      case 3: run_f32<3>(x, w, bias, out, K, N); break;
      default: run_f32<4>(x, w, bias, out, K, N);
    }
  }
}
}  // namespace

void linear_small(at::Tensor out, at::Tensor x, at::Tensor weight, c10::optional<at::Tensor> bias) {
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  STRAND_CHECK(M >= 1 && M <= 4, "linear_small takes 1 to 4 rows, got ", M);
  if (x.scalar_type() == at::kBFloat16) {
    const bf16* b = bias.has_value() ? static_cast<const bf16*>(bias->data_ptr()) : nullptr;
    by_m<bf16>(static_cast<const bf16*>(x.data_ptr()), static_cast<const bf16*>(weight.data_ptr()),
               b, static_cast<bf16*>(out.data_ptr()), M, K, N);
  } else {
    const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
    by_m<float>(x.data_ptr<float>(), weight.data_ptr<float>(), b, out.data_ptr<float>(), M, K, N);
  }
}

namespace strand {

void small_prepare(const at::Tensor& x, SmallX& out) {
  out.data = x.data_ptr();
  out.M = x.size(0);
  out.K = x.size(1);
  out.bf16 = x.scalar_type() == at::kBFloat16;
  out.laid_out.clear();
#ifdef STRAND_DPBF16
  if (out.bf16 && has_dpbf16()) return;  // VDPBF16PS reads x as it is
#endif
  if (out.bf16) {
    out.laid_out.resize(out.M * out.K);
    pair_layout(static_cast<const bf16*>(out.data), out.laid_out.data(), out.M, out.K);
  }
}

namespace {
template <int M>
void small_rows_m(at::Tensor& out, const SmallX& x, const at::Tensor& w,
                  const c10::optional<at::Tensor>& bias, int64_t n0, int64_t n1) {
  const int64_t K = x.K, N = w.size(0);
  if (!x.bf16) {
    const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
    f32_task<M>(w.data_ptr<float>(), b, out.data_ptr<float>(), K, N, n0, n1,
                static_cast<const float*>(x.data));
    return;
  }
  const bf16* b = bias.has_value() ? static_cast<const bf16*>(bias->data_ptr()) : nullptr;
  const bf16* wp = static_cast<const bf16*>(w.data_ptr());
  bf16* op = static_cast<bf16*>(out.data_ptr());
#ifdef STRAND_DPBF16
  if (x.laid_out.empty()) {
    dp_task<M>(static_cast<const bf16*>(x.data), wp, b, op, K, N, n0, n1);
    return;
  }
#endif
  pairs_task<M>(wp, b, op, K, N, n0, n1, x.laid_out.data());
}
}  // namespace

void small_rows(at::Tensor& out, const SmallX& x, const at::Tensor& w,
                const c10::optional<at::Tensor>& bias, int64_t n0, int64_t n1) {
  switch (x.M) {
    case 1: small_rows_m<1>(out, x, w, bias, n0, n1); break;
    case 2: small_rows_m<2>(out, x, w, bias, n0, n1); break;
    case 3: small_rows_m<3>(out, x, w, bias, n0, n1); break;
    default: small_rows_m<4>(out, x, w, bias, n0, n1);
  }
}

}  // namespace strand
