#include "check.h"
#include "decode_stack.h"
#include "linear_panels_bf16.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>

#include <cstdlib>
#include <string>

// The decoder layers of a Llama-family model for a decode step (1 to kMaxDecodeRows rows, one
// new token each), run from C++: the same kernels the Python layers call one by one (RMSNorm
// with the residual add, the few-row linear, rotary, KV write, paged decode attention,
// silu-and-mul), in the same order on the same data. At one row the ~11 Python-level calls of
// a small model's layer (module dispatch, argument checks, tensor bookkeeping) cost more than
// half the time its weights take to read; a call per layer from Python still cost tens of
// microseconds of argument conversion and tensor creation (intermediates, views) a layer, a few
// percent of a bfloat16 step. So the layers' weights are handed over once (add_layer),
// each step is one call, and a layer's intermediates live in buffers made once per row count.
// The caller checks once per step what the Python wrappers check per call
// (strand/engine_core/model_executor/models/llama_fused_decode.py).
// A decode batch of 5 or more rows (32 requests, say) takes the same path with the kernel the
// layer-by-layer path runs for its dense projections: linear_batch where it is chosen
// (strand/kernels/cpu_linear_batch.py: the avx2 level), else the packed weights (set_batch_weights):
// float32 panels (linear_panels.cpp) at the avx512 level, oneDNN's copies otherwise; GGUF tiles
// take their int8 kernel at any row count (gguf_tiled.cpp). SmolLM2's 30 layers of Python calls
// were several percent of a one-thread step of 32 rows, serial at any thread count.
void strand::project(at::Tensor out, const at::Tensor& x, const at::Tensor& w,
                     const c10::optional<at::Tensor>& b, int64_t qtype) {
  const int64_t M = x.size(0);
  if (qtype == 0 && w.dim() == 3) {  // float32 panels, the layer's only copy: any rows
    linear_panels(out, x, w, b);
  } else if (qtype == 0 && w.dim() == 4) {  // bfloat16 panels, the layer's only copy: any rows
    linear_panels_bf16(out, x, w, b);
  } else if (qtype == 0) {
    if (M <= kSmallRows)
      linear_small(out, x, w, b);
    else
      linear_batch(out, x, w, b);
  } else if (w.dim() == 3) {  // 16-row tiles: any number of rows, as GGUFLinear runs them
    gguf_tiled_linear(out, x, w, qtype, b);
  } else {
    STRAND_CHECK(M <= kSmallRows, "GGUF projections over rows take 1 to ", kSmallRows,
                 " rows, got ", M);
    gguf_linear_small(out, x, w, qtype, b);
  }
}

using strand::project;

namespace {
// x @ W.T (+ b) through oneDNN's packed copy of W: the op layers/linear.py calls for products
// of many rows. It has no out= form, so the caller puts the new tensor where its buffer was.
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& packed,
                         const c10::optional<at::Tensor>& bias) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
                            c10::string_view, c10::List<c10::optional<at::Scalar>>,
                            c10::optional<c10::string_view>)>();
  return op.call(x, packed, bias, "none", c10::List<c10::optional<at::Scalar>>(), c10::nullopt);
}

// x @ panels (+ b) into out. Float32 panels of bfloat16 weights (the copy the layers make where
// oneDNN has no bfloat16 kernels) take x and b widened and give float32 sums, rounded once into
// out: what layers/linear.py's `linear_packed(x.float(), ...).to(bfloat16)` gives.
void panels_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& panels,
                 const c10::optional<at::Tensor>& b) {
  if (x.scalar_type() == at::kFloat) {
    linear_panels(out, x, panels, b);
    return;
  }
  const c10::optional<at::Tensor> wide_b =
      b.has_value() ? c10::optional<at::Tensor>(b->to(at::kFloat)) : c10::nullopt;
  at::Tensor sums = at::empty(out.sizes(), out.options().dtype(at::kFloat));
  linear_panels(sums, x.to(at::kFloat), panels, wide_b);
  out.copy_(sums);
}

// out[:, col ...] = x @ w.T (+ b[col ...]) for a projection's part after its first
// (DecodeStack::add_part): the kernel the layer's Python calls for that part, into a new tensor
// then the part's columns, as the Python concatenates them.
int64_t part_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                  const c10::optional<at::Tensor>& b, int64_t qtype, int64_t col) {
  const int64_t rows = w.size(0) * (w.dim() == 3 ? 16 : 1);
  at::Tensor part = at::empty({x.size(0), rows}, out.options());
  project(part, x, w, b.has_value() ? c10::optional<at::Tensor>(b->narrow(0, col, rows))
                                    : c10::nullopt, qtype);
  out.narrow(1, col, rows).copy_(part);
  return col + rows;
}

// out = x @ w.T (+ b), choosing as the layers' Python does: the packed copy (when there is one)
// for more than kSmallRows rows: float32 panels (3-D, strand/kernels/cpu_linear_panels.py) into the
// buffer, or oneDNN's copy, its result taking the buffer's place; else project() into the buffer.
void project_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                  const at::Tensor& packed, const c10::optional<at::Tensor>& b, int64_t qtype) {
  if (x.size(0) > kSmallRows && packed.defined() && packed.dim() == 3)
    panels_into(out, x, packed, b);
  else if (x.size(0) > kSmallRows && packed.defined() && packed.dim() == 4)
    linear_panels_bf16(out, x, packed, b);  // bfloat16 panels kept beside the dense weight
  else if (x.size(0) > kSmallRows && packed.defined())
    out = onednn_linear(x, packed, b);
  else
    project(out, x, w, b, qtype);
}
}  // namespace

DecodeStack::DecodeStack(at::Tensor cos_sin, int64_t num_heads, int64_t num_kv_heads,
                         int64_t head_dim, double eps, double scale)
    : cos_sin_(cos_sin), num_heads_(num_heads), num_kv_heads_(num_kv_heads),
      head_dim_(head_dim), eps_(eps), scale_(scale) {
  const char* phased = std::getenv("STRAND_DECODE_PHASED");
  phased_ = phased == nullptr || std::string(phased) != "0";
  STRAND_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0,
              "num_heads must be a positive multiple of num_kv_heads");
}

void DecodeStack::add_part(int64_t projection, at::Tensor w, int64_t qtype) {
  STRAND_CHECK(!layers_.empty() && projection >= 0 && projection < 4,
              "add_part takes a projection 0..3 of a layer already added");
  Layer& L = layers_.back();
  const at::Tensor* firsts[4] = {&L.qkv_w, &L.o_w, &L.gate_up_w, &L.down_w};
  STRAND_CHECK(L.qtypes[projection] != 0 && firsts[projection]->dim() == 3 && qtype != 0 &&
                  w.dim() == 3 && w.size(1) == firsts[projection]->size(1),
              "add_part: a projection's parts are GGUF 16-row tiles of the same input length");
  L.more[projection].push_back({w, qtype});
}

void DecodeStack::add_layer(at::Tensor input_norm, at::Tensor qkv_w,
                            c10::optional<at::Tensor> qkv_b, at::Tensor o_w,
                            c10::optional<at::Tensor> o_b, at::Tensor post_norm,
                            at::Tensor gate_up_w, at::Tensor down_w,
                            std::vector<int64_t> qtypes) {
  STRAND_CHECK(qtypes.size() == 4, "add_layer takes 4 qtypes (qkv, o, gate_up, down)");
  // A packed GGUF gate_up weight is [rows, bytes a row], or [rows / 16, ...] regrouped into
  // 16-row tiles (gguf_tiled.cpp): its row count is still 2 I. Float32 panels (qtype 0, 3-D)
  // are padded to whole panels: there I is down's input length.
  const int64_t H = input_norm.size(0);
  // bfloat16 panels (4-D) hold the input in pairs: down's [P, I / 2, W, 2].
  const int64_t I = qtypes[2] == 0 && gate_up_w.dim() == 4   ? down_w.size(1) * 2
                    : qtypes[2] == 0 && gate_up_w.dim() == 3 ? down_w.size(1)
                    : gate_up_w.size(0) * (gate_up_w.dim() == 3 ? 16 : 1) / 2;
  STRAND_CHECK(layers_.empty() || (H == hidden_ && I == intermediate_),
              "every layer must have the first one's hidden and intermediate sizes");
  hidden_ = H;
  intermediate_ = I;
  const at::Tensor* weights[4] = {&qkv_w, &o_w, &gate_up_w, &down_w};
  for (int i = 0; i < 4; ++i) {
    all_tiled_ = all_tiled_ && qtypes[i] != 0 && weights[i]->dim() == 3;
    // bfloat16 panels take the kernel-by-kernel step: the phased one reads 2-D rows or
    // float32 panels (the panels' own threads ran no faster there).
    all_dense_ = all_dense_ && qtypes[i] == 0 && weights[i]->dim() != 4;
  }
  layers_.push_back({input_norm, qkv_w, qkv_b, o_w, o_b, post_norm, gate_up_w, down_w, qtypes});
}

DecodeStack::Buffers& DecodeStack::buffers(int64_t M, const at::TensorOptions& opts) {
  if (by_m_.empty()) by_m_.resize(kMaxDecodeRows);
  Buffers& b = by_m_[M - 1];
  if (b.out.defined()) return b;
  const int64_t H = hidden_, Q = num_heads_ * head_dim_, KV = num_kv_heads_ * head_dim_;
  const auto rows = [&](int64_t n) { return at::empty({M, n}, opts); };
  b.normed = rows(H);
  b.res_a = rows(H);
  b.res_b = rows(H);
  b.qkv = rows(Q + 2 * KV);
  qkv_views(b);
  b.attn = at::empty({M, num_heads_, head_dim_}, opts);
  b.attn_rows = b.attn.view({M, Q});
  b.o = rows(H);
  b.normed2 = rows(H);
  b.gate_up = rows(2 * intermediate_);
  b.act = rows(intermediate_);
  b.out = rows(H);
  return b;
}

void DecodeStack::qkv_views(Buffers& b) const {
  // [M, heads, head_dim], token stride Q + 2 KV.
  const int64_t M = b.qkv.size(0), Q = num_heads_ * head_dim_, KV = num_kv_heads_ * head_dim_;
  b.q = b.qkv.narrow(1, 0, Q).view({M, num_heads_, head_dim_});
  b.k = b.qkv.narrow(1, Q, KV).view({M, num_kv_heads_, head_dim_});
  b.v = b.qkv.narrow(1, Q + KV, KV).view({M, num_kv_heads_, head_dim_});
}

void DecodeStack::set_batch_weights(std::vector<at::Tensor> packed,
                                    c10::optional<at::Tensor> head) {
  STRAND_CHECK(packed.size() == 4 * layers_.size(), "set_batch_weights takes 4 weights a layer (",
              4 * layers_.size(), "), got ", packed.size());
  STRAND_CHECK(all_dense_, "oneDNN weights are for a stack of dense projections");
  STRAND_CHECK(!head.has_value() || (head_.w.defined() && head_.qtype == 0),
              "a head's oneDNN weight needs set_ends() with a dense lm_head first");
  // oneDNN's copies and bfloat16 panels (4-D) are in the layers' dtype; float32 panels (3-D)
  // are float32 whatever the layers'.
  const auto dtype = layers_[0].input_norm.scalar_type();
  const auto fits = [&](const at::Tensor& t) {
    return t.defined() && t.scalar_type() == (t.dim() == 3 ? at::kFloat : dtype);
  };
  for (size_t i = 0; i < packed.size(); ++i)
    STRAND_CHECK(fits(packed[i]), "set_batch_weights: packed[", i, "] must be in the layers' "
                "dtype (", dtype, "), or float32 panels");
  STRAND_CHECK(!head.has_value() || fits(*head),
              "set_batch_weights: head must be in the layers' dtype (", dtype, "), or float32 "
              "panels");
  for (size_t l = 0; l < layers_.size(); ++l)
    layers_[l].batch_w.assign(packed.begin() + 4 * l, packed.begin() + 4 * (l + 1));
  head_.batch_w = head.has_value() ? *head : at::Tensor();
}

DecodeStack::Buffers& DecodeStack::run(const at::Tensor& hidden, const at::Tensor& positions,
                                       const std::vector<at::Tensor>& kv_caches,
                                       const at::Tensor& slots, const at::Tensor& block_table,
                                       const at::Tensor& seq_lens, at::Tensor* logits) {
  const int64_t M = hidden.size(0);
  STRAND_CHECK(M >= 1 && M <= kMaxDecodeRows, "DecodeStack takes 1 to ", kMaxDecodeRows,
              " rows, got ", M);
  STRAND_CHECK(!layers_.empty() && hidden.size(1) == hidden_, "hidden must be [M, ", hidden_,
              "] for a stack of at least one layer");
  STRAND_CHECK(kv_caches.size() == layers_.size(), "one kv cache per layer: ", layers_.size(),
              ", got ", kv_caches.size());
  STRAND_CHECK(hidden.scalar_type() == layers_[0].input_norm.scalar_type(),
              "hidden must be in the weights' dtype");
  caches_.resize(layers_.size());
  keys_.resize(layers_.size());
  values_.resize(layers_.size());
  Buffers& b = buffers(M, hidden.options());
  // The decode attention kernel indexes the query as [M, heads, head_dim] rows; at M = 1 the
  // view of qkv is one (its token stride is never used).
  const bool q_rows = M == 1;
  at::Tensor q_dense = q_rows ? b.q : at::empty({M, num_heads_, head_dim_}, hidden.options());
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (!caches_[l].is_same(kv_caches[l])) {  // a new cache (first step, or reallocated)
      const auto kv = kv_caches[l].scalar_type();
      STRAND_CHECK((kv == hidden.scalar_type() || kv == at::kBFloat16) &&
                      kv_caches[l].is_contiguous() && kv_caches[l].device().is_cpu() &&
                      kv_caches[l].dim() == 5,
                  "kv caches must be contiguous [2, blocks, block_size, kv_heads, head_dim] "
                  "CPU tensors in the layers' dtype or bfloat16");
      caches_[l] = kv_caches[l];
      keys_[l] = kv_caches[l].select(0, 0);
      values_[l] = kv_caches[l].select(0, 1);
    }
  }
  // The head joins the step's region where it and the layers are GGUF tiles; otherwise it
  // runs after the step.
  const bool tiled_head =
      all_tiled_ && logits != nullptr && head_.qtype != 0 && head_.w.dim() == 3;
  // The dense phased step reads x with the few-row kernel's layout: up to kSmallRows rows;
  // a decode batch runs its projections through linear_batch, op by op.
  if ((all_tiled_ || (all_dense_ && M <= kSmallRows)) && phased_) {
    forward_phased(b, hidden, positions, q_dense, slots, block_table, seq_lens,
                   tiled_head ? logits : nullptr);
    if (tiled_head) return b;
  } else {
    forward_layers(b, hidden, positions, q_dense, slots, block_table, seq_lens);
  }
  if (logits != nullptr) {
    // What a next layer's input norm would do, with the final norm's weight: b.normed and
    // b.res_a are free once the last layer is done.
    add_rms_norm(b.normed, b.res_a, b.out, b.res_b, head_.norm, head_.eps);
    project_into(*logits, b.normed, head_.w, head_.batch_w, c10::nullopt, head_.qtype);
  }
  return b;
}

void DecodeStack::forward_layers(Buffers& b, const at::Tensor& hidden,
                                 const at::Tensor& positions, const at::Tensor& q_dense,
                                 const at::Tensor& slots, const at::Tensor& block_table,
                                 const at::Tensor& seq_lens) {
  const bool q_rows = hidden.size(0) == 1;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    // Projection i of the layer into `out` (oneDNN's result may take the buffer's place).
    const auto product = [&](at::Tensor& out, const at::Tensor& x, int i, const at::Tensor& w,
                             const c10::optional<at::Tensor>& bias) {
      if (!L.more[i].empty()) {  // parts of different types (add_part): tiles, so M <= 4
        int64_t col = part_into(out, x, w, bias, L.qtypes[i], 0);
        for (const Part& p : L.more[i]) col = part_into(out, x, p.w, bias, p.qtype, col);
        return;
      }
      project_into(out, x, w, L.batch_w.empty() ? at::Tensor() : L.batch_w[i], bias,
                   L.qtypes[i]);
    };
    // [M, H]: norm(hidden + residual), and hidden + residual (the residual stream); the first
    // layer has no residual yet: its input is the stream.
    const at::Tensor& in = l == 0 ? hidden : b.out;
    if (l == 0)
      rms_norm(b.normed, in, L.input_norm, eps_);
    else
      add_rms_norm(b.normed, b.res_a, in, b.res_b, L.input_norm, eps_);
    const at::Tensor& res = l == 0 ? hidden : b.res_a;
    const void* qkv_buffer = b.qkv.data_ptr();
    product(b.qkv, b.normed, 0, L.qkv_w, L.qkv_b);
    // oneDNN gave a new tensor (allocated while the old one lived: a new address): the q, k
    // and v views must follow it.
    if (b.qkv.data_ptr() != qkv_buffer) qkv_views(b);
    rotary_neox(b.q, positions, cos_sin_);
    rotary_neox(b.k, positions, cos_sin_);
    write_kv(keys_[l], values_[l], b.k, b.v, slots);
    if (!q_rows) q_dense.copy_(b.q);
    decode_attention(b.attn, q_dense, keys_[l], values_[l], block_table, seq_lens, scale_);
    product(b.o, b.attn_rows, 1, L.o_w, L.o_b);
    add_rms_norm(b.normed2, b.res_b, b.o, res, L.post_norm, eps_);
    product(b.gate_up, b.normed2, 2, L.gate_up_w, c10::nullopt);
    silu_and_mul(b.act, b.gate_up);
    product(b.out, b.act, 3, L.down_w, c10::nullopt);
  }
}

std::vector<at::Tensor> DecodeStack::forward(at::Tensor hidden, at::Tensor positions,
                                             std::vector<at::Tensor> kv_caches,
                                             at::Tensor slots, at::Tensor block_table,
                                             at::Tensor seq_lens) {
  std::lock_guard<std::mutex> lock(mutex_);
  Buffers& b = run(hidden, positions, kv_caches, slots, block_table, seq_lens, nullptr);
  // New tensors: the buffers are overwritten by the next step.
  return {b.out.clone(), b.res_b.clone()};
}
