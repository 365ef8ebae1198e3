#include "check.h"
#include "kernels.h"
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "avx512_bf16.h"
#include "kv_dtypes.h"
#include "vec16.h"

// out[r, h] = softmax(q[r, h] . K[r, :len] * scale) @ V[r, :len], K/V read through the block table
// where they lie. float32 or bfloat16 (computed in float32), or a float32 query over a bfloat16
// cache (kv_dtypes.h); contiguous tensors (the Python wrapper checks).
//
// One task per request, longest first (or, with fewer requests than threads, per request and kv
// head). Its blocks are visited in order and each is finished for every kv head of the task
// before the next, so the cache is read as whole contiguous blocks (the hardware
// prefetchers follow that; a task per (request, kv head) reading 1/num_kv_heads of each row did
// not).
// The arithmetic is register-wide vectors (vec16.h's vl: 16 floats with AVX-512, 8 with AVX2):
// dot products of that many tokens are reduced together by a transpose-and-add tree, and exp is
// a vector polynomial, not a libm call per score. Nothing wider than a register is carried
// through a loop: under AVX2 GCC keeps such a value on the stack (K/V then read at a fraction
// of the memory's bandwidth).
namespace {
using namespace strand;

constexpr int kMaxChunks = 512 / kLanes;  // head_dim <= 512
constexpr int64_t kAhead = 2;  // blocks prefetched ahead of the one being read (1 and 3: slower)
constexpr int kVecRegs = kLanes == 16 ? 32 : 16;  // the register file, in vl vectors

// Query heads of one kv head taken together (NG of them) share each K and V row load: the row
// is read from L1 once for NG heads, and the NG * DC accumulators give the FMAs independent
// chains. NG must divide the group and its accumulators, the row and the queries must fit the
// registers (past them the compiler spills every accumulator in every iteration).
template <int DC, int NG>
constexpr bool fits_registers() {
  return NG == 1 || (DC > 0 && NG * DC + DC + NG <= kVecRegs - 2);
}

// Asks for the cache rows of block `b` (tokens from t0 on, up to len) before they are needed.
// Blocks lie anywhere in the pool, so the hardware prefetchers stop at each block's end and
// start over at the next; asking kAhead blocks ahead keeps the loads in flight (on the standard
// workload's decode steps two blocks ahead beat one, and one beat none).
// The asks are spread over the work on the current block, a few lines at each row it reads:
// all of a block's lines asked at once (192 for a float32 block of SmolLM2) stalled the core
// once the miss buffers were full, a large share of the kernel's time. They fill L2, not
// L1 (locality 2: prefetcht1): L1's few miss buffers held the loads in flight to a third of
// what one core can stream, and two blocks of every kv head fit L2 with room to spare (one
// thread, 32 requests of 192 tokens from a pool past L3: faster in float32 and bfloat16 alike).
//
// A task of some kv heads asks only for its heads' part of each row: a task per kv head (a decode
// step of one request) asking for whole blocks fetched every block once per head, num_kv_heads
// times the cache, and two threads read the cache no faster than one.
struct Heads {  // kv heads [g0, g1) of a row of KVH heads of D values: elements first..first+width
  int64_t first = 0, width = -1;  // width -1: whole rows
};

template <typename T>
struct Trickle {
  const char* p = nullptr;    // the next line to ask for
  const char* end = nullptr;  // the end of the current row's part (or of the whole block)
  int64_t rows_left = 0;      // parts after the current one
  int64_t stride = 0, part = 0;  // bytes from one row to the next; bytes of a row's part
  int64_t per_step = 0;  // lines asked for at each step()

  // Block b's lines (of `heads` only), spread over `steps` calls of step().
  void start(const T* cache, const int32_t* blocks, int64_t b, int64_t t0, int64_t len,
             int64_t BS, int64_t RS, int64_t steps, Heads heads = {}) {
    p = end = nullptr;
    rows_left = 0;
    if (t0 >= len) return;
    const int64_t rows = std::min(BS, len - t0);
    const bool whole = heads.width < 0 || heads.width == RS;
    const char* base = reinterpret_cast<const char*>(cache + (int64_t)blocks[b] * BS * RS +
                                                     (whole ? 0 : heads.first));
    stride = RS * (int64_t)sizeof(T);
    part = whole ? rows * stride : heads.width * (int64_t)sizeof(T);
    rows_left = whole ? 0 : rows - 1;  // whole rows: the block is one contiguous part
    begin_part(base);
    const int64_t lines = (rows_left + 1) * ((end - p + 63) / 64);
    steps = std::max<int64_t>(steps, 1);
    per_step = (lines + steps - 1) / steps;
  }
  void step() {
    for (int64_t k = 0; k < per_step && ask(); ++k) {}
  }
  void rest() {
    while (ask()) {}
  }

 private:
  void begin_part(const char* at) {  // from the line holding its first byte
    p = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(at) & ~uintptr_t{63});
    end = at + part;
  }
  bool ask() {  // one line; false when none is left
    if (p >= end) {
      if (rows_left <= 0) return false;
      --rows_left;
      begin_part(end - part + stride);
    }
    __builtin_prefetch(p, 0, 2);
    p += 64;
    return true;
  }
};

// All of block b's lines (of `heads`) at once: the block after the first, needed before any
// trickle of it could have finished.
template <typename T>
void prefetch_block(const T* cache, const int32_t* blocks, int64_t b, int64_t t0, int64_t len,
                    int64_t BS, int64_t RS, Heads heads = {}) {
  Trickle<T> all;
  all.start(cache, blocks, b, t0, len, BS, RS, 1, heads);
  all.rest();
}

// TQ, TKV: float or bf16, what the query (and out) and the cache hold (kv_dtypes.h).
template <typename TQ, typename TKV>
struct Args {
  using Q = TQ;
  using KV = TKV;
  const TQ* q;
  const TKV *kc, *vc;
  const int32_t *bt, *lens;
  TQ* o;
  int64_t H, D, BS, KVH, MB;
  float scale;
};

#ifdef STRAND_DPBF16
// The scores of n <= 16 bfloat16 key rows (stride RS) against NG bfloat16 query heads (stride
// D, a multiple of 32) through VDPBF16PS (avx512_bf16.h): two instructions a 64-value row and
// head where widening both sides to float32 took eight. The products are exact; scale is
// applied to the sums (the float path scales the query first: the same where scale is a power
// of two). Head j's scores go to dst + j * L.
template <int D, int NG>
BF16_TARGET void scores_dp(const bf16* qh, const bf16* k, int64_t RS, int64_t n, float scale,
                           float* dst, int64_t L, Trickle<bf16>& ahead) {
  constexpr int C = D / 32;
  __m512bh qv[NG][C];
  for (int j = 0; j < NG; ++j)
    for (int c = 0; c < C; ++c) qv[j][c] = (__m512bh)_mm512_loadu_si512(qh + j * D + 32 * c);
  v16 part[NG][16];
  for (int64_t i = 0; i < n; ++i) {
    ahead.step();
    __m512 acc[NG];
    for (int j = 0; j < NG; ++j) acc[j] = _mm512_setzero_ps();
    for (int c = 0; c < C; ++c) {
      const __m512bh kv = (__m512bh)_mm512_loadu_si512(k + i * RS + 32 * c);
      for (int j = 0; j < NG; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], kv, qv[j][c]);
    }
    for (int j = 0; j < NG; ++j) part[j][i] = (v16)acc[j];
  }
  for (int j = 0; j < NG; ++j) {
    for (int64_t i = n; i < 16; ++i) part[j][i] = v16{};
    alignas(64) float tile[16];
    store(tile, reduce16(part[j]) * scale);
    std::memcpy(dst + j * L, tile, n * sizeof(float));
  }
}
#endif

// Whether both sides are bfloat16, as scores_dp takes them.
template <typename A>
constexpr bool both_bf16 =
    std::is_same_v<typename A::Q, bf16> && std::is_same_v<typename A::KV, bf16>;

// Whether request_task's bfloat16 scores go through scores_dp: head_dim a multiple of 32 and a
// CPU with the instruction.
template <typename A, int DC>
bool use_scores_dp() {
#ifdef STRAND_DPBF16
  if constexpr (both_bf16<A> && DC > 0 && (kLanes * DC) % 32 == 0 && kLanes == 16)
    return has_dpbf16();
#endif
  return false;
}

// The scores of query heads h0 .. h0 + NG - 1 against n <= kLanes key rows from k (stride RS),
// in float32 vectors, to s + (h0 + j) * L. FC chunks of kLanes values and rem more a row.
template <typename TQ, typename TKV, int DC, int NG>
void scores_vec(const TQ* qh, const TKV* k, int64_t RS, int64_t n, int64_t FC, int64_t rem,
                int64_t D, float scale, float* dst, int64_t L, Trickle<TKV>& ahead) {
  vl qv[NG][DC > 0 ? DC : kMaxChunks], qt[NG];
  for (int j = 0; j < NG; ++j) {
    for (int64_t c = 0; c < FC; ++c) qv[j][c] = load_l(qh + j * D + kLanes * c) * scale;
    qt[j] = rem ? load_tail_l(qh + j * D + kLanes * FC, rem) * scale : vl{};
  }
  vl part[NG][kLanes];
  for (int64_t i = 0; i < n; ++i) {
    ahead.step();
    const TKV* row = k + i * RS;
    vl acc[NG];
    for (int j = 0; j < NG; ++j) acc[j] = vl{};
    for (int64_t c = 0; c < FC; ++c) {
      const vl kv = load_l(row + kLanes * c);
      for (int j = 0; j < NG; ++j) acc[j] += qv[j][c] * kv;
    }
    if (rem) {
      const vl kv = load_tail_l(row + kLanes * FC, rem);
      for (int j = 0; j < NG; ++j) acc[j] += qt[j] * kv;
    }
    for (int j = 0; j < NG; ++j) part[j][i] = acc[j];
  }
  for (int j = 0; j < NG; ++j) {
    for (int64_t i = n; i < kLanes; ++i) part[j][i] = vl{};
    alignas(64) float tile[kLanes];
    store_l(tile, reduce_lanes(part[j]));
    std::memcpy(dst + j * L, tile, n * sizeof(float));
  }
}

// DC > 0: head_dim == kLanes * DC (the chunk loops unroll and accumulators stay in registers);
// DC == 0: any head_dim, its last D % kLanes lanes handled apart. NG: query heads a pass.
// The task: request r's kv heads [g0, g1) and their query heads. next_r: the request of the
// thread's next task (-1: none), whose first K blocks are fetched during this one's last V blocks.
template <typename A, int DC, int NG>
void request_task(const A& a, int64_t r, int64_t g0, int64_t g1, std::vector<float>& s,
                  std::vector<float>& inv, std::vector<float>& acc_out, int64_t next_r = -1,
                  Heads next_heads = {}) {
  using TQ = typename A::Q;
  using T = typename A::KV;
  const int64_t H = a.H, D = DC > 0 ? kLanes * DC : a.D, G = a.H / a.KVH, RS = a.KVH * D;
  const int64_t len = a.lens[r], FC = DC > 0 ? DC : D / kLanes, rem = DC > 0 ? 0 : D % kLanes;
  const int64_t L = (len + 15) / 16 * 16;  // each head's scores, padded to whole v16s
  const int32_t* blocks = a.bt + r * a.MB;
  s.resize(H * L);
  [[maybe_unused]] const bool dp = use_scores_dp<A, DC>();
  Trickle<T> ahead;
  const Heads mine{g0 * D, (g1 - g0) * D};
  const int64_t passes = (g1 - g0) * (G / NG);  // row reads of a token, per block and phase
  // Scores: for every block, every kv head, NG query heads of its group at a time.
  for (int64_t b = 0, t0 = 0; t0 < len; ++b) {
    const int64_t in_block = std::min(a.BS, len - t0);
    if (b == 0) prefetch_block(a.kc, blocks, 1, a.BS, len, a.BS, RS, mine);
    ahead.start(a.kc, blocks, b + kAhead, t0 + kAhead * a.BS, len, a.BS, RS, passes * in_block,
                mine);
    for (int64_t g = g0; g < g1; ++g) {
      const T* kb = a.kc + (int64_t)blocks[b] * a.BS * RS + g * D;
      for (int64_t h = g * G; h < (g + 1) * G; h += NG) {
        const TQ* qh = a.q + (r * H + h) * D;
        for (int64_t i0 = 0; i0 < in_block; i0 += kLanes) {
          const int64_t n = std::min<int64_t>(kLanes, in_block - i0);
          float* dst = s.data() + h * L + t0 + i0;
#ifdef STRAND_DPBF16
          if constexpr (both_bf16<A> && DC > 0 && (kLanes * DC) % 32 == 0) {
            if (dp) {
              scores_dp<kLanes * DC, NG>(qh, kb + i0 * RS, RS, n, a.scale, dst, L, ahead);
              continue;
            }
          }
#endif
          scores_vec<TQ, T, DC, NG>(qh, kb + i0 * RS, RS, n, FC, rem, D, a.scale, dst, L, ahead);
        }
      }
    }
    ahead.rest();
    t0 += in_block;
  }
  // Softmax numerators in place; each head's 1 / sum scales its output at the end. The first V
  // block is on its way meanwhile.
  prefetch_block(a.vc, blocks, 0, 0, len, a.BS, RS, mine);
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
  // Weighted sums of V rows, block by block, accumulated in float32 rows: each row, read once,
  // goes into NG heads' sums.
  acc_out.assign(H * D, 0.f);
  float* out = acc_out.data();
  for (int64_t b = 0, t0 = 0; t0 < len; ++b) {
    const int64_t in_block = std::min(a.BS, len - t0);
    if (b == 0) prefetch_block(a.vc, blocks, 1, a.BS, len, a.BS, RS, mine);
    ahead.start(a.vc, blocks, b + kAhead, t0 + kAhead * a.BS, len, a.BS, RS, passes * in_block,
                mine);
    const int64_t nb = b + kAhead - (len + a.BS - 1) / a.BS;  // past this request's blocks
    if (nb >= 0 && next_r >= 0) {
      // The next task's first blocks, which it would otherwise start on cold (a request's
      // whole K/V is a few hundred KB, so each start was a stall).
      ahead.start(a.kc, a.bt + next_r * a.MB, nb, nb * a.BS, a.lens[next_r], a.BS, RS,
                  passes * in_block, next_heads);
    }
    for (int64_t g = g0; g < g1; ++g) {
      const T* vb = a.vc + (int64_t)blocks[b] * a.BS * RS + g * D;
      for (int64_t h = g * G; h < (g + 1) * G; h += NG) {
        const float* p[NG];
        vl acc[NG][DC > 0 ? DC : kMaxChunks];
        for (int j = 0; j < NG; ++j) {
          p[j] = s.data() + (h + j) * L + t0;
          for (int64_t c = 0; c < FC; ++c) acc[j][c] = load_l(out + (h + j) * D + kLanes * c);
        }
        for (int64_t i = 0; i < in_block; ++i) {
          ahead.step();
          const T* v = vb + i * RS;
          for (int64_t c = 0; c < FC; ++c) {
            const vl vv = load_l(v + kLanes * c);
            for (int j = 0; j < NG; ++j) acc[j][c] += p[j][i] * vv;
          }
          for (int64_t d = kLanes * FC; d < D; ++d)
            for (int j = 0; j < NG; ++j) out[(h + j) * D + d] += p[j][i] * to_float(v[d]);
        }
        for (int j = 0; j < NG; ++j)
          for (int64_t c = 0; c < FC; ++c) store_l(out + (h + j) * D + kLanes * c, acc[j][c]);
      }
    }
    ahead.rest();
    t0 += in_block;
  }
  TQ* dst = a.o + r * H * D;
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
template <typename A, int DC, int NG>
void run(const A& a, int64_t R) {
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
  // Tasks claimed by free threads, one ahead: a thread knows its next task while it works on
  // the current one, and fetches that task's first blocks before it gets there.
  std::atomic<int64_t> claimed{0};
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> s, inv, acc_out;  // scratch reused across the thread's tasks
    for (int64_t i = claimed.fetch_add(1); i < T_;) {
      const int64_t next = claimed.fetch_add(1);
      const Heads next_heads = next < T_ ? Heads{tasks[next].g0 * a.D,
                                                 (tasks[next].g1 - tasks[next].g0) * a.D}
                                         : Heads{};
      request_task<A, DC, NG>(a, tasks[i].r, tasks[i].g0, tasks[i].g1, s, inv, acc_out,
                              next < T_ ? tasks[next].r : -1, next_heads);
      i = next;
    }
  }
}

template <typename TQ, typename TKV>
Args<TQ, TKV> make_args(const at::Tensor& out, const at::Tensor& query,
                        const at::Tensor& key_cache, const at::Tensor& value_cache,
                        const at::Tensor& block_table, const at::Tensor& seq_lens, double scale) {
  STRAND_CHECK(out.scalar_type() == query.scalar_type() &&
                   value_cache.scalar_type() == key_cache.scalar_type(),
               "out must be in the query's dtype and the value cache in the key cache's");
  const Args<TQ, TKV> a{data_as<TQ>(query), data_as<TKV>(key_cache), data_as<TKV>(value_cache),
                        block_table.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(),
                        data_as<TQ>(out), query.size(1), query.size(2), key_cache.size(1),
                        key_cache.size(2), block_table.size(1), (float)scale};
  STRAND_CHECK(a.D <= kLanes * kMaxChunks, "head_dim must be at most ", kLanes * kMaxChunks);
  return a;
}

// fn(DC, NG), both std::integral_constant: the head_dim's instantiation (DC 0: any head_dim)
// and the most query heads a pass that divide the group and fit the registers.
template <typename A, typename Fn>
void by_shape(const A& a, Fn fn) {
  const int64_t G = a.H / a.KVH;
  const auto with_dc = [&](auto dc) {
    constexpr int DC = decltype(dc)::value;
    using std::integral_constant;
    if constexpr (fits_registers<DC, 4>())
      if (G % 4 == 0) return fn(dc, integral_constant<int, 4>{});
    if constexpr (fits_registers<DC, 3>())
      if (G % 3 == 0) return fn(dc, integral_constant<int, 3>{});
    if constexpr (fits_registers<DC, 2>())
      if (G % 2 == 0) return fn(dc, integral_constant<int, 2>{});
    fn(dc, integral_constant<int, 1>{});
  };
  switch (a.D) {
    case 64: with_dc(std::integral_constant<int, 64 / kLanes>{}); break;
    case 128: with_dc(std::integral_constant<int, 128 / kLanes>{}); break;
    case 32: with_dc(std::integral_constant<int, 32 / kLanes>{}); break;
    case 256: with_dc(std::integral_constant<int, 256 / kLanes>{}); break;
    default: with_dc(std::integral_constant<int, 0>{});
  }
}

template <typename TQ, typename TKV>
void dispatch(at::Tensor out, at::Tensor query, at::Tensor key_cache,
              at::Tensor value_cache, at::Tensor block_table, at::Tensor seq_lens,
              double scale) {
  using A = Args<TQ, TKV>;
  const A a = make_args<TQ, TKV>(out, query, key_cache, value_cache, block_table, seq_lens, scale);
  const int64_t R = query.size(0);
  by_shape(a, [&](auto dc, auto ng) { run<A, decltype(dc)::value, decltype(ng)::value>(a, R); });
}

template <typename TQ, typename TKV>
void dispatch_part(at::Tensor out, at::Tensor query, at::Tensor key_cache,
                   at::Tensor value_cache, at::Tensor block_table, at::Tensor seq_lens,
                   double scale, int64_t r, int64_t g0, int64_t g1) {
  using A = Args<TQ, TKV>;
  const A a = make_args<TQ, TKV>(out, query, key_cache, value_cache, block_table, seq_lens, scale);
  STRAND_CHECK(r >= 0 && r < query.size(0) && g0 >= 0 && g0 < g1 && g1 <= a.KVH,
              "decode_attention_part takes a request of the query and a range of its kv heads");
  std::vector<float> s, inv, acc_out;
  by_shape(a, [&](auto dc, auto ng) {
    request_task<A, decltype(dc)::value, decltype(ng)::value>(a, r, g0, g1, s, inv, acc_out);
  });
}
}  // namespace

void decode_attention(at::Tensor out, at::Tensor query, at::Tensor key_cache,
                      at::Tensor value_cache, at::Tensor block_table,
                      at::Tensor seq_lens, double scale) {
  by_kv_dtypes(query, key_cache, [&](auto* q, auto* kv) {
    using TQ = std::remove_pointer_t<decltype(q)>;
    using TKV = std::remove_pointer_t<decltype(kv)>;
    dispatch<TQ, TKV>(out, query, key_cache, value_cache, block_table, seq_lens, scale);
  });
}

void decode_attention_part(at::Tensor out, at::Tensor query, at::Tensor key_cache,
                           at::Tensor value_cache, at::Tensor block_table, at::Tensor seq_lens,
                           double scale, int64_t r, int64_t g0, int64_t g1) {
  by_kv_dtypes(query, key_cache, [&](auto* q, auto* kv) {
    using TQ = std::remove_pointer_t<decltype(q)>;
    using TKV = std::remove_pointer_t<decltype(kv)>;
    dispatch_part<TQ, TKV>(out, query, key_cache, value_cache, block_table, seq_lens, scale, r,
                           g0, g1);
  });
}
