#include "check.h"
#include "kernels.h"
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "avx512_bf16.h"
#include "vec16.h"

// out[r, h] = softmax(q[r, h] . K[r, :len] * scale) @ V[r, :len], K/V read through the block table
// where they lie. float32 or bfloat16 (computed in float32), contiguous tensors (the Python
// wrapper checks).
//
// One task per request, longest first (or, with fewer requests than threads, per request and kv
// head). Its blocks are visited in order and each is finished for every kv head of the task
// before the next, so the cache is read as whole contiguous blocks (the hardware
// prefetchers follow that; a task per (request, kv head) reading 1/num_kv_heads of each row did
// not).
// The arithmetic is register-wide vectors (vec16.h's vl: 16 floats with AVX-512, 8 with AVX2):
// dot products of that many tokens are reduced together by a transpose-and-add tree, and exp is
// a vector polynomial, not a libm call per score. Nothing wider than a register is carried
// through a loop: under AVX2 GCC keeps such a value on the stack (2 GB/s of K/V that way, on one
// thread of an AVX2-only EPYC, against 11 GB/s of memory bandwidth).
namespace {
using namespace strand;

constexpr int kMaxChunks = 512 / kLanes;  // head_dim <= 512
constexpr int64_t kAhead = 2;  // blocks prefetched ahead of the one being read (1 and 3: slower)

// Asks for the cache rows of block `b` (tokens from t0 on, up to len) before they are needed.
// Blocks lie anywhere in the pool, so the hardware prefetchers stop at each block's end and
// start over at the next; asking kAhead blocks ahead keeps the loads in flight (on the standard
// workload's decode steps: 3.27 s without, 3.05 s one block ahead, 2.92 s two).
template <typename T>
inline void prefetch_block(const T* cache, const int32_t* blocks, int64_t b, int64_t t0,
                           int64_t len, int64_t BS, int64_t RS) {
  if (t0 >= len) return;
  const char* p = reinterpret_cast<const char*>(cache + (int64_t)blocks[b] * BS * RS);
  const int64_t bytes = std::min(BS, len - t0) * RS * (int64_t)sizeof(T);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
}

template <typename T>  // float or bf16: what the tensors hold
struct Args {
  const T *q, *kc, *vc;
  const int32_t *bt, *lens;
  T* o;
  int64_t H, D, BS, KVH, MB;
  float scale;
};

#ifdef STRAND_DPBF16
// The scores of n <= 16 bfloat16 key rows (stride RS) against one bfloat16 query head of D values
// (a multiple of 32), through VDPBF16PS (avx512_bf16.h): two instructions a 64-value row where
// widening both sides to float32 took eight. The products are exact; scale is applied to the
// sums (the float path scales the query first: the same where scale is a power of two).
template <int D>
BF16_TARGET void scores_dp(const bf16* qh, const bf16* k, int64_t RS, int64_t n, float scale,
                           float* dst) {
  constexpr int C = D / 32;
  __m512bh qv[C];
  for (int c = 0; c < C; ++c) qv[c] = (__m512bh)_mm512_loadu_si512(qh + 32 * c);
  v16 part[16];
  for (int64_t i = 0; i < n; ++i) {
    __m512 acc = _mm512_setzero_ps();
    for (int c = 0; c < C; ++c)
      acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(k + i * RS + 32 * c), qv[c]);
    part[i] = (v16)acc;
  }
  for (int64_t i = n; i < 16; ++i) part[i] = v16{};
  alignas(64) float tile[16];
  store(tile, reduce16(part) * scale);
  std::memcpy(dst, tile, n * sizeof(float));
}
#endif

// Whether request_task's bfloat16 scores go through scores_dp: head_dim a multiple of 32 and a
// CPU with the instruction.
template <typename T, int DC>
bool use_scores_dp() {
#ifdef STRAND_DPBF16
  if constexpr (std::is_same_v<T, bf16> && DC > 0 && (kLanes * DC) % 32 == 0 && kLanes == 16)
    return has_dpbf16();
#endif
  return false;
}

// DC > 0: head_dim == kLanes * DC (the chunk loops unroll and accumulators stay in registers);
// DC == 0: any head_dim, its last D % kLanes lanes handled apart.
// The task: request r's kv heads [g0, g1) and their query heads.
template <typename T, int DC>
void request_task(const Args<T>& a, int64_t r, int64_t g0, int64_t g1, std::vector<float>& s,
                  std::vector<float>& inv, std::vector<float>& acc_out) {
  const int64_t H = a.H, D = DC > 0 ? kLanes * DC : a.D, G = a.H / a.KVH, RS = a.KVH * D;
  const int64_t len = a.lens[r], FC = DC > 0 ? DC : D / kLanes, rem = DC > 0 ? 0 : D % kLanes;
  const int64_t L = (len + 15) / 16 * 16;  // each head's scores, padded to whole v16s
  const int32_t* blocks = a.bt + r * a.MB;
  s.resize(H * L);
  [[maybe_unused]] const bool dp = use_scores_dp<T, DC>();
  vl part[kLanes];
  // Scores: for every block, every kv head, every query head of its group, kLanes tokens a tile.
  for (int64_t b = 0, t0 = 0; t0 < len; ++b) {
    const int64_t in_block = std::min(a.BS, len - t0);
    for (int64_t ahead = b == 0 ? 1 : kAhead; ahead <= kAhead; ++ahead)
      prefetch_block(a.kc, blocks, b + ahead, t0 + ahead * a.BS, len, a.BS, RS);
    for (int64_t g = g0; g < g1; ++g) {
      const T* kb = a.kc + (int64_t)blocks[b] * a.BS * RS + g * D;
      for (int64_t j = 0; j < G; ++j) {
        const int64_t h = g * G + j;
        const T* qh = a.q + (r * H + h) * D;
#ifdef STRAND_DPBF16
        if constexpr (std::is_same_v<T, bf16> && DC > 0 && (kLanes * DC) % 32 == 0) {
          if (dp) {
            for (int64_t i0 = 0; i0 < in_block; i0 += 16)
              scores_dp<kLanes * DC>(qh, kb + i0 * RS, RS, std::min<int64_t>(16, in_block - i0),
                                     a.scale, s.data() + h * L + t0 + i0);
            continue;
          }
        }
#endif
        vl qv[DC > 0 ? DC : kMaxChunks];
        for (int64_t c = 0; c < FC; ++c) qv[c] = load_l(qh + kLanes * c) * a.scale;
        const vl qt = rem ? load_tail_l(qh + kLanes * FC, rem) * a.scale : vl{};
        for (int64_t i0 = 0; i0 < in_block; i0 += kLanes) {
          const int64_t n = std::min<int64_t>(kLanes, in_block - i0);
          for (int64_t i = 0; i < n; ++i) {
            const T* k = kb + (i0 + i) * RS;
            vl acc = vl{};
            for (int64_t c = 0; c < FC; ++c) acc += qv[c] * load_l(k + kLanes * c);
            if (rem) acc += qt * load_tail_l(k + kLanes * FC, rem);
            part[i] = acc;
          }
          for (int64_t i = n; i < kLanes; ++i) part[i] = vl{};
          alignas(64) float tile[kLanes];
          store_l(tile, reduce_lanes(part));
          std::memcpy(s.data() + h * L + t0 + i0, tile, n * sizeof(float));
        }
      }
    }
    t0 += in_block;
  }
  // Softmax numerators in place; each head's 1 / sum scales its output at the end. The first V
  // block is on its way meanwhile.
  prefetch_block(a.vc, blocks, 0, 0, len, a.BS, RS);
  inv.resize(H);
  for (int64_t h = g0 * G; h < g1 * G; ++h) {
    float* sh = s.data() + h * L;
    std::fill(sh + len, sh + L, -std::numeric_limits<float>::infinity());
    vl mv = load_l(sh);
    for (int64_t t = kLanes; t < L; t += kLanes) {
      const vl x = load_l(sh + t);
      mv = x > mv ? x : mv;
    }
    float m = mv[0];
    for (int l = 1; l < kLanes; ++l) m = std::max(m, mv[l]);
    vl sum = vl{};
    for (int64_t t = 0; t < L; t += kLanes) {
      const vl e = vexp(load_l(sh + t) - m);
      store_l(sh + t, e);
      sum += e;
    }
    float total = 0.f;
    for (int l = 0; l < kLanes; ++l) total += sum[l];
    inv[h] = 1.f / total;
  }
  // Weighted sums of V rows, block by block, accumulated in float32 rows.
  acc_out.assign(H * D, 0.f);
  float* out = acc_out.data();
  for (int64_t b = 0, t0 = 0; t0 < len; ++b) {
    const int64_t in_block = std::min(a.BS, len - t0);
    for (int64_t ahead = b == 0 ? 1 : kAhead; ahead <= kAhead; ++ahead)
      prefetch_block(a.vc, blocks, b + ahead, t0 + ahead * a.BS, len, a.BS, RS);
    for (int64_t g = g0; g < g1; ++g) {
      const T* vb = a.vc + (int64_t)blocks[b] * a.BS * RS + g * D;
      for (int64_t j = 0; j < G; ++j) {
        const int64_t h = g * G + j;
        const float* p = s.data() + h * L + t0;
        float* oh = out + h * D;
        vl acc[DC > 0 ? DC : kMaxChunks];
        for (int64_t c = 0; c < FC; ++c) acc[c] = load_l(oh + kLanes * c);
        for (int64_t i = 0; i < in_block; ++i) {
          const T* v = vb + i * RS;
          for (int64_t c = 0; c < FC; ++c) acc[c] += p[i] * load_l(v + kLanes * c);
          for (int64_t d = kLanes * FC; d < D; ++d) oh[d] += p[i] * to_float(v[d]);
        }
        for (int64_t c = 0; c < FC; ++c) store_l(oh + kLanes * c, acc[c]);
      }
    }
    t0 += in_block;
  }
  T* dst = a.o + r * H * D;
  for (int64_t h = g0 * G; h < g1 * G; ++h) {
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) store(dst + h * D + d, load(out + h * D + d) * inv[h]);
    for (; d < D; ++d) store_scalar(dst + h * D + d, out[h * D + d] * inv[h]);
  }
}

// Longest first, to whichever thread is free: an even split of 64 requests of random lengths
// left one thread a tenth more work than the other. With fewer requests than threads (a decode
// step of one request) a request's kv heads are tasks of their own, so every thread has work:
// each head's sums are the same either way, in the same order.
template <typename T, int DC>
void run(const Args<T>& a, int64_t R) {
  struct Task {
    int64_t r, g0, g1;
  };
  std::vector<int64_t> order(R);
  for (int64_t r = 0; r < R; ++r) order[r] = r;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return a.lens[x] > a.lens[y]; });
  const int64_t threads_wanted = at::get_num_threads();
  std::vector<Task> tasks;
  for (int64_t r : order) {
    if (R >= threads_wanted) {
      tasks.push_back({r, 0, a.KVH});
    } else {
      for (int64_t g = 0; g < a.KVH; ++g) tasks.push_back({r, g, g + 1});
    }
  }
  const int64_t T_ = (int64_t)tasks.size();
  const int threads = (int)std::max<int64_t>(1, std::min<int64_t>(threads_wanted, T_));
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> s, inv, acc_out;  // scratch reused across the thread's tasks
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < T_; ++i)
      request_task<T, DC>(a, tasks[i].r, tasks[i].g0, tasks[i].g1, s, inv, acc_out);
  }
}

template <typename T, typename Torch>
Args<T> make_args(const at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                  const at::Tensor& value_cache, const at::Tensor& block_table,
                  const at::Tensor& seq_lens, double scale) {
  const auto ptr = [](const at::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr<Torch>()); };
  const Args<T> a{ptr(query), ptr(key_cache), ptr(value_cache), block_table.data_ptr<int32_t>(),
                  seq_lens.data_ptr<int32_t>(), ptr(out), query.size(1), query.size(2),
                  key_cache.size(1), key_cache.size(2), block_table.size(1), (float)scale};
  STRAND_CHECK(a.D <= kLanes * kMaxChunks, "head_dim must be at most ", kLanes * kMaxChunks);
  return a;
}

// fn(std::integral_constant<int, DC>): the head_dim's instantiation (0: any head_dim).
template <typename T, typename Fn>
void by_head_dim(const Args<T>& a, Fn fn) {
  switch (a.D) {
    case 64: fn(std::integral_constant<int, 64 / kLanes>{}); break;
    case 128: fn(std::integral_constant<int, 128 / kLanes>{}); break;
    case 32: fn(std::integral_constant<int, 32 / kLanes>{}); break;
    case 256: fn(std::integral_constant<int, 256 / kLanes>{}); break;
    default: fn(std::integral_constant<int, 0>{});
  }
}

template <typename T, typename Torch>
void dispatch(at::Tensor out, at::Tensor query, at::Tensor key_cache,
              at::Tensor value_cache, at::Tensor block_table, at::Tensor seq_lens,
              double scale) {
  const Args<T> a = make_args<T, Torch>(out, query, key_cache, value_cache, block_table,
                                        seq_lens, scale);
  const int64_t R = query.size(0);
  by_head_dim(a, [&](auto dc) { run<T, decltype(dc)::value>(a, R); });
}

template <typename T, typename Torch>
void dispatch_part(at::Tensor out, at::Tensor query, at::Tensor key_cache,
                   at::Tensor value_cache, at::Tensor block_table, at::Tensor seq_lens,
                   double scale, int64_t r, int64_t g0, int64_t g1) {
  const Args<T> a = make_args<T, Torch>(out, query, key_cache, value_cache, block_table,
                                        seq_lens, scale);
  STRAND_CHECK(r >= 0 && r < query.size(0) && g0 >= 0 && g0 < g1 && g1 <= a.KVH,
              "decode_attention_part takes a request of the query and a range of its kv heads");
  std::vector<float> s, inv, acc_out;
  by_head_dim(a, [&](auto dc) {
    request_task<T, decltype(dc)::value>(a, r, g0, g1, s, inv, acc_out);
  });
}
}  // namespace

void decode_attention(at::Tensor out, at::Tensor query, at::Tensor key_cache,
                      at::Tensor value_cache, at::Tensor block_table,
                      at::Tensor seq_lens, double scale) {
  if (query.scalar_type() == at::kBFloat16)
    dispatch<bf16, at::BFloat16>(out, query, key_cache, value_cache, block_table, seq_lens, scale);
  else
    dispatch<float, float>(out, query, key_cache, value_cache, block_table, seq_lens, scale);
}

void decode_attention_part(at::Tensor out, at::Tensor query, at::Tensor key_cache,
                           at::Tensor value_cache, at::Tensor block_table, at::Tensor seq_lens,
                           double scale, int64_t r, int64_t g0, int64_t g1) {
  if (query.scalar_type() == at::kBFloat16)
    dispatch_part<bf16, at::BFloat16>(out, query, key_cache, value_cache, block_table, seq_lens,
                                      scale, r, g0, g1);
  else
    dispatch_part<float, float>(out, query, key_cache, value_cache, block_table, seq_lens,
                                scale, r, g0, g1);
}
