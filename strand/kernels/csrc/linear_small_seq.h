// The few-row kernels of linear_small.cpp reading each weight row whole before the next, so a
// thread's share of a weight is read as one run of ascending addresses. Included by
// linear_small.cpp inside its anonymous namespace, after the helpers it uses (hsum, split_pairs,
// kPair, BF16_TARGET).
//
// Why not a group of rows side by side (the grouped kernels there, STRAND_SMALL_ROWS_GROUPED=1):
// reading 8 rows a cache line each in turn is 8 interleaved streams, 1-2 KB apart, and the
// hardware prefetchers of an AMD CPU did not keep up with them: at SmolLM2-135M's 30 layers and
// lm_head, one thread (a standalone copy of both loops, alternating rounds), a row at a time read
// the weights markedly faster, in float32 and bfloat16 (VDPBF16PS) at M = 1, and in bfloat16 at
// M = 2 and 4. The chains a row's sums need in flight come from consecutive rows instead: nothing
// links one row's sums to the next, so the out-of-order window overlaps them.
#pragma once

// Independent sums per row of x: enough that a short row (K = 576: 18 cache lines of bfloat16)
// is a few dependent steps, few enough that M rows of x fit the registers beside the loads
// (M = 4 at 2 chains: 8 accumulators, AVX2's 16 registers included).
constexpr int seq_chains(int M) { return M <= 2 ? 4 : 2; }

// A row of x's U chains summed to one float (the chains, then the lanes).
template <int U>
inline float chains_sum(const vl (&acc)[U]) {
  vl total = acc[0];
  for (int u = 1; u < U; ++u) total += acc[u];
  return hsum(total);
}

template <int M>
void seq_task_f32(const float* w, const float* bias, float* out, int64_t K, int64_t N,
                  int64_t n0, int64_t n1, const float* x) {
  constexpr int U = seq_chains(M);
  const int64_t KU = K / (U * kLanes) * (U * kLanes), KV = K / kLanes * kLanes;
  for (int64_t n = n0; n < n1; ++n) {
    const float* row = w + n * K;
    vl acc[M][U] = {};
    int64_t k = 0;
    for (; k < KU; k += U * kLanes) {
      for (int u = 0; u < U; ++u) {
        const vl wv = load_l(row + k + u * kLanes);
        for (int m = 0; m < M; ++m) acc[m][u] += wv * load_l(x + m * K + k + u * kLanes);
      }
    }
    for (; k < KV; k += kLanes) {
      const vl wv = load_l(row + k);
      for (int m = 0; m < M; ++m) acc[m][0] += wv * load_l(x + m * K + k);
    }
    for (int m = 0; m < M; ++m) {
      float sum = chains_sum(acc[m]);
      for (int64_t j = KV; j < K; ++j) sum += row[j] * x[m * K + j];
      if (bias != nullptr) sum += bias[n];
      out[m * N + n] = sum;
    }
  }
}

// bfloat16 weights without AVX512_BF16: each chunk of kPair weights as its even and odd halves
// (split_pairs), x laid out to match (pair_layout); U / 2 chunks a step, evens and odds on chains
// of their own.
template <int M>
void seq_task_pairs(const bf16* w, const bf16* bias, bf16* out, int64_t K, int64_t N,
                    int64_t n0, int64_t n1, const float* xp) {
  constexpr int U = seq_chains(M), C = U / 2;  // chains, chunks a step
  const int64_t KU = K / (C * kPair) * (C * kPair), KC = K / kPair * kPair;
  for (int64_t n = n0; n < n1; ++n) {
    const bf16* row = w + n * K;
    vl acc[M][U] = {};
    const auto chunk = [&](int64_t k, int c) {
      vl even, odd;
      split_pairs(row + k, even, odd);
      for (int m = 0; m < M; ++m) {
        acc[m][2 * c] += even * load_l(xp + m * K + k);
        acc[m][2 * c + 1] += odd * load_l(xp + m * K + k + kLanes);
      }
    };
    int64_t k = 0;
    for (; k < KU; k += C * kPair)
      for (int c = 0; c < C; ++c) chunk(k + c * kPair, c);
    for (; k < KC; k += kPair) chunk(k, 0);
    for (int m = 0; m < M; ++m) {
      float sum = chains_sum(acc[m]);
      for (int64_t j = KC; j < K; ++j) sum += to_float(row[j]) * xp[m * K + j];
      if (bias != nullptr) sum += to_float(bias[n]);
      store_scalar(out + m * N + n, sum);
    }
  }
}

#ifdef STRAND_DPBF16
// bfloat16 through VDPBF16PS: two cache lines (64 weights) a step on two chains per row of x;
// the last K % 32 weights through a masked load (zeros past K add nothing).
template <int M>
BF16_TARGET void seq_task_dp(const bf16* x, const bf16* w, const bf16* bias, bf16* out,
                             int64_t K, int64_t N, int64_t n0, int64_t n1) {
  const int64_t K2 = K / 64 * 64, KV = K / 32 * 32;
  const __mmask32 tail = (__mmask32)((1ull << (K - KV)) - 1);
  const auto load = [](const bf16* p) { return (__m512bh)_mm512_loadu_si512(p); };
  for (int64_t n = n0; n < n1; ++n) {
    const bf16* row = w + n * K;
    __m512 acc[M][2];
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k < K2; k += 64) {
      const __m512bh w0 = load(row + k), w1 = load(row + k + 32);
      for (int m = 0; m < M; ++m) {
        acc[m][0] = _mm512_dpbf16_ps(acc[m][0], w0, load(x + m * K + k));
        acc[m][1] = _mm512_dpbf16_ps(acc[m][1], w1, load(x + m * K + k + 32));
      }
    }
    for (; k < KV; k += 32) {
      const __m512bh wv = load(row + k);
      for (int m = 0; m < M; ++m) acc[m][0] = _mm512_dpbf16_ps(acc[m][0], wv, load(x + m * K + k));
    }
    if (KV < K) {
      const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(tail, row + KV);
      for (int m = 0; m < M; ++m)
        acc[m][0] = _mm512_dpbf16_ps(acc[m][0], wv,
                                     (__m512bh)_mm512_maskz_loadu_epi16(tail, x + m * K + KV));
    }
    for (int m = 0; m < M; ++m) {
      float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]));
      if (bias != nullptr) sum += to_float(bias[n]);
      store_scalar(out + m * N + n, sum);
    }
  }
}
#endif
