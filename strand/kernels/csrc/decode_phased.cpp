#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "claim_chunks.h"
#include "decode_stack.h"
#include "gguf_tiled.h"
#include "linear_panels.h"
#include "linear_small.h"

// A decode step over GGUF-tiled weights, or dense float32/bfloat16 ones, as one OpenMP parallel
// region instead of one per kernel. The op-by-op step (decode_layer.cpp) enters ~5 parallel regions a layer, 150 a step:
// each is a fork and a join at which every thread waits for the slowest, and on a shared
// machine the slowest is often a thread waiting for a core (at 2 threads under load, perf put
// ~50% of the step's samples in libgomp's barrier spin). Here a step is a fixed sequence of
// phases (10 a layer: norm, qkv, rotary and KV write, attention, ..., down); a phase is a number
// of units (tiles of a weight or groups of its rows, attention tasks; 1 for the small serial
// parts), and any thread takes the next unclaimed piece of the current phase: a product's a
// guided piece of its units (claim_chunks.h), others one unit. A thread moves on to a phase once
// every unit of the one before is done (a counter), so no thread waits for another one to
// arrive, only for work in progress: one that is descheduled costs at most the piece it holds,
// and the others take the rest of its share. Each unit runs the same code on the same data as
// the op-by-op step, whatever the pieces, so the outputs are the same bit for bit. A step that
// ends in logits (DecodeStack::logits) adds the final norm and the lm_head's tiles as two more
// phases, with no parallel region (and no Python call) of their own.
namespace {
using strand::gguf::QuantizedRows;

enum Kind : int64_t {
  kNormIn,    // (residual add +) input norm, x rounded (GGUF) or laid out (dense) for qkv
  kQkv,       // qkv projection, tiles
  kRotary,    // rotary on q and k, k and v into the cache
  kAttn,      // decode attention, one task (request, kv heads) a unit
  kAttnQuant,  // the attention output rounded for o
  kO,         // o projection, tiles
  kNormPost,  // residual add + post-attention norm, rounded for gate_up
  kGateUp,    // gate_up projection, tiles
  kSilu,      // silu(gate) * up, rounded for down
  kDown,      // down projection, tiles
  kKinds,     // the phases of a layer; then, after the last layer, with logits:
  kHeadNorm = kKinds,  // residual add + the final norm, rounded for the lm_head
  kHead,      // the lm_head, tiles
  kAllKinds
};

// Spins (pause instructions, ~40-140 cycles each) before a waiting thread yields its core at
// each check: the wait between phases is usually a piece (microseconds), and on a machine with
// no core to spare the thread being waited for may need this one.
constexpr int kSpinsBeforeYield = 2000;

// The smallest piece of a product a thread claims: 4 units (64 rows of GGUF tiles), as the
// standalone products' chunks (gguf_tiled.cpp), so that a piece is more than its start's ramp.
constexpr int64_t kMinClaim = 4;

struct alignas(64) Counter {  // one phase's units claimed and done, on a cache line of its own
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

inline void pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

void wait_done(const Counter& c, int64_t units) {
  for (int spins = 0; c.done.load(std::memory_order_acquire) < units;) {
    if (spins < kSpinsBeforeYield) {
      pause();
      ++spins;
    } else {
      std::this_thread::yield();
    }
  }
}

// The units a product's pieces are made of: 16-row tiles of a GGUF weight, panels of a
// panel-packed float32 one (3-D), groups of kSmallUnit rows of a dense one.
int64_t units_of(const at::Tensor& w, bool dense) {
  return dense && w.dim() == 2 ? (w.size(0) + strand::kSmallUnit - 1) / strand::kSmallUnit
                               : w.size(0);
}

// q_dense [M, Q] = the first Q values of each qkv row: a plain copy, as an ATen op here (off the
// calling thread) would not see the caller's inference mode and refuse its tensors.
void copy_query(const at::Tensor& q_dense, const at::Tensor& qkv, int64_t M, int64_t Q) {
  const int64_t size = qkv.element_size();
  const char* src = static_cast<const char*>(qkv.data_ptr());
  char* dst = static_cast<char*>(q_dense.data_ptr());
  for (int64_t m = 0; m < M; ++m) std::memcpy(dst + m * Q * size, src + m * qkv.size(1) * size,
                                              Q * size);
}

struct AttnTask {
  int64_t r, g0, g1;
};
}  // namespace

void DecodeStack::forward_phased(Buffers& b, const at::Tensor& hidden,
                                 const at::Tensor& positions, const at::Tensor& q_dense,
                                 const at::Tensor& slots, const at::Tensor& block_table,
                                 const at::Tensor& seq_lens, at::Tensor* logits) {
  at::internal::lazy_init_num_threads();
  const int64_t M = hidden.size(0), L = static_cast<int64_t>(layers_.size());
  const int threads = at::get_num_threads();
  // Attention as decode_attention splits it: per request, or per request and kv head when
  // there are fewer requests than threads.
  std::vector<AttnTask> attn;
  for (int64_t r = 0; r < M; ++r) {
    if (M >= threads)
      attn.push_back({r, 0, num_kv_heads_});
    else
      for (int64_t g = 0; g < num_kv_heads_; ++g) attn.push_back({r, g, g + 1});
  }
  const Layer& first = layers_[0];
  const bool dense = all_dense_;
  // A projection's units: its first weight's and those of its parts of other types (add_part),
  // which every layer has alike (each layer's rows are the first one's).
  const auto projection_units = [&](const Layer& W, int64_t proj, const at::Tensor& w) {
    int64_t units = units_of(w, dense);
    for (const Part& p : W.more[proj]) units += p.w.size(0);
    return units;
  };
  // A phase's units: a product's (claimed a guided piece at a time: claim_chunks.h), the
  // attention tasks, or 1 (the serial parts), claimed one at a time.
  int64_t units[kAllKinds];
  bool guided[kAllKinds] = {};
  for (int64_t k = 0; k < kAllKinds; ++k) units[k] = 1;
  units[kQkv] = projection_units(first, 0, first.qkv_w);
  units[kAttn] = static_cast<int64_t>(attn.size());
  units[kO] = projection_units(first, 1, first.o_w);
  units[kGateUp] = projection_units(first, 2, first.gate_up_w);
  units[kDown] = projection_units(first, 3, first.down_w);
  for (Kind k : {kQkv, kO, kGateUp, kDown, kHead}) guided[k] = true;
  // The head's tiles as any product's: each tile's sums are the same whatever the pieces, so the
  // logits are the standalone tiled product's (gguf_tiled.cpp).
  if (logits != nullptr) units[kHead] = units_of(head_.w, false);

  QuantizedRows x_hidden, x_attn, x_act;  // the rounded inputs of the four products (GGUF)
  strand::SmallX d_hidden, d_attn, d_act;  // or as the dense kernel reads them
  const auto prepare = [&](const at::Tensor& x, QuantizedRows& q, strand::SmallX& d) {
    if (dense)
      strand::small_prepare(x, d);
    else
      strand::gguf::quantize_any(x, q);
  };
  const bool q_rows = M == 1;
  // Units [u0, u1) of layer l's phase `kind` (one unit where the kind is not guided).
  const auto run_units = [&](int64_t l, int64_t kind, int64_t u0, int64_t u1) {
    const Layer& W = layers_[l];
    const at::Tensor& res = l == 0 ? hidden : b.res_a;
    const auto product = [&](at::Tensor& out, const QuantizedRows& x, const strand::SmallX& xd,
                             const at::Tensor& w, int64_t qtype,
                             const c10::optional<at::Tensor>& bias, int64_t proj = -1) {
      const std::vector<Part>* more = proj >= 0 ? &W.more[proj] : nullptr;
      if (dense && w.dim() == 3) {  // float32 panels: x as it is (small_prepare keeps float32)
        strand::panels_rows(out, static_cast<const float*>(xd.data), xd.M, w, bias, u0, u1);
        return;
      }
      if (dense) {
        strand::small_rows(out, xd, w, bias, u0 * strand::kSmallUnit,
                           std::min(w.size(0), u1 * strand::kSmallUnit));
        return;
      }
      // The piece's tiles [u0, u1) over the parts: the first weight's, then each add_part's, its
      // rows the output's next columns.
      int64_t first_tile = 0;
      const auto part = [&](const at::Tensor& tiles, int64_t type) {
        const int64_t count = tiles.size(0);
        const int64_t t0 = std::max(u0, first_tile), t1 = std::min(u1, first_tile + count);
        if (t0 < t1)
          strand::gguf::tiled_rows(out, x, tiles, type, bias, t0 - first_tile, t1 - first_tile,
                                   first_tile * 16);
        first_tile += count;
      };
      part(w, qtype);
      if (more)
        for (const Part& p : *more) part(p.w, p.qtype);
    };
    switch (kind) {
      case kNormIn:
        if (l == 0)
          rms_norm(b.normed, hidden, W.input_norm, eps_);
        else
          add_rms_norm(b.normed, b.res_a, b.out, b.res_b, W.input_norm, eps_);
        prepare(b.normed, x_hidden, d_hidden);
        break;
      case kQkv: product(b.qkv, x_hidden, d_hidden, W.qkv_w, W.qtypes[0], W.qkv_b, 0); break;
      case kRotary:
        rotary_neox(b.q, positions, cos_sin_);
        rotary_neox(b.k, positions, cos_sin_);
        write_kv(keys_[l], values_[l], b.k, b.v, slots);
        if (!q_rows) copy_query(q_dense, b.qkv, M, num_heads_ * head_dim_);
        break;
      case kAttn:
        decode_attention_part(b.attn, q_dense, keys_[l], values_[l], block_table, seq_lens,
                              scale_, attn[u0].r, attn[u0].g0, attn[u0].g1);
        break;
      case kAttnQuant: prepare(b.attn_rows, x_attn, d_attn); break;
      case kO: product(b.o, x_attn, d_attn, W.o_w, W.qtypes[1], W.o_b, 1); break;
      case kNormPost:
        add_rms_norm(b.normed2, b.res_b, b.o, res, W.post_norm, eps_);
        prepare(b.normed2, x_hidden, d_hidden);
        break;
      case kGateUp:
        product(b.gate_up, x_hidden, d_hidden, W.gate_up_w, W.qtypes[2], c10::nullopt, 2);
        break;
      case kSilu:
        silu_and_mul(b.act, b.gate_up);
        prepare(b.act, x_act, d_act);
        break;
      case kDown: product(b.out, x_act, d_act, W.down_w, W.qtypes[3], c10::nullopt, 3); break;
      case kHeadNorm:  // as the op-by-op step's head (decode_layer.cpp); only with GGUF tiles
        add_rms_norm(b.normed, b.res_a, b.out, b.res_b, head_.norm, head_.eps);
        strand::gguf::quantize_any(b.normed, x_hidden);
        break;
      default: product(*logits, x_hidden, d_hidden, head_.w, head_.qtype, c10::nullopt);
    }
  };

  // Phase p < L * kKinds is layer p / kKinds's kind p % kKinds; then the head's two.
  const int64_t layer_phases = L * kKinds, phases = layer_phases + (logits ? 2 : 0);
  const auto kind_of = [&](int64_t p) {
    return p < layer_phases ? p % kKinds : kHeadNorm + (p - layer_phases);
  };
  std::unique_ptr<Counter[]> counters(new Counter[phases]);
  std::exception_ptr error;
  std::mutex error_mutex;
  // Inside the region the kernels' own at::parallel_for calls run inline (ATen does not nest).
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    for (int64_t p = 0; p < phases; ++p) {
      const int64_t kind = kind_of(p);
      if (p > 0) wait_done(counters[p - 1], units[kind_of(p - 1)]);
      Counter& c = counters[p];
      const auto run = [&](int64_t u0, int64_t u1) {
        try {
          run_units(std::min(p / kKinds, L - 1), kind, u0, u1);
        } catch (...) {  // an exception may not leave the region: kept, rethrown after it
          std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
        }
        c.done.fetch_add(u1 - u0, std::memory_order_release);  // even after an error: no hang
      };
      int64_t u0, u1;
      if (guided[kind])
        while (strand::claim_guided(c.next, units[kind], threads, kMinClaim, u0, u1)) run(u0, u1);
      else
        for (int64_t i; (i = c.next.fetch_add(1, std::memory_order_relaxed)) < units[kind];)
          run(i, i + 1);
    }
  }
  if (error) std::rethrow_exception(error);
}
