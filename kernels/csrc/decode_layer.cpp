#include "kernels.h"
#include <ATen/ops/empty.h>

// One Llama-family decoder layer for a decode step of a few requests (1 to 4 rows, one new token
// each), as one call: the same kernels the Python layers call one by one (RMSNorm with the
// residual add, the few-row linear, rotary, KV write, paged decode attention, silu-and-mul), in
// the same order on the same data. At one row a layer's weights take ~1 ms to read on 2 cores,
// and the ~11 Python-level calls of the layer (module dispatch, argument checks, tensor
// bookkeeping) took ~0.6 ms more; here they are C++ calls. The caller checks once per step what
// the Python wrappers check per call (engine_core/model_executor/layers/fused_decode.py).
// qtypes: per projection (qkv, o, gate_up, down), 0 for a dense weight, else the GGML type of a
// weight packed in GGUF blocks (gguf_linear.cpp).
namespace {
void project(at::Tensor out, const at::Tensor& x, const at::Tensor& w,
             const c10::optional<at::Tensor>& b, int64_t qtype) {
  if (qtype == 0)
    linear_small(out, x, w, b);
  else
    gguf_linear_small(out, x, w, qtype, b);
}
}  // namespace

std::vector<at::Tensor> decode_layer(at::Tensor hidden, c10::optional<at::Tensor> residual,
                                     at::Tensor input_norm, at::Tensor qkv_w,
                                     c10::optional<at::Tensor> qkv_b, at::Tensor o_w,
                                     c10::optional<at::Tensor> o_b, at::Tensor post_norm,
                                     at::Tensor gate_up_w, at::Tensor down_w,
                                     at::Tensor positions, at::Tensor cos_sin, at::Tensor kv_cache,
                                     at::Tensor slots, at::Tensor block_table,
                                     at::Tensor seq_lens, int64_t num_heads,
                                     int64_t num_kv_heads, int64_t head_dim, double eps,
                                     double scale, std::vector<int64_t> qtypes) {
  TORCH_CHECK(qtypes.size() == 4, "decode_layer takes 4 qtypes (qkv, o, gate_up, down)");
  const int64_t M = hidden.size(0), H = hidden.size(1);
  const int64_t Q = num_heads * head_dim, KV = num_kv_heads * head_dim;
  // gate_up's rows: a GGUF weight regrouped into 16-row tiles is [rows / 16, ...] (gguf_tiled.cpp)
  const int64_t I = gate_up_w.size(0) * (gate_up_w.dim() == 3 ? 16 : 1) / 2;
  const auto opts = hidden.options();
  // [M, H]: norm(hidden + residual), and hidden + residual (the residual stream)
  at::Tensor normed = at::empty({M, H}, opts), res = hidden;
  if (residual.has_value()) {
    res = at::empty({M, H}, opts);
    add_rms_norm(normed, res, hidden, *residual, input_norm, eps);
  } else {
    rms_norm(normed, hidden, input_norm, eps);
  }
  at::Tensor qkv = at::empty({M, Q + 2 * KV}, opts);
  project(qkv, normed, qkv_w, qkv_b, qtypes[0]);
  // Views of qkv's rows: [M, heads, head_dim], token stride Q + 2 KV.
  at::Tensor q = qkv.narrow(1, 0, Q).view({M, num_heads, head_dim});
  at::Tensor k = qkv.narrow(1, Q, KV).view({M, num_kv_heads, head_dim});
  at::Tensor v = qkv.narrow(1, Q + KV, KV).view({M, num_kv_heads, head_dim});
  rotary_neox(q, positions, cos_sin);
  rotary_neox(k, positions, cos_sin);
  write_kv(kv_cache.select(0, 0), kv_cache.select(0, 1), k, v, slots);
  at::Tensor attn = at::empty({M, num_heads, head_dim}, opts);
  decode_attention(attn, q.contiguous(), kv_cache.select(0, 0), kv_cache.select(0, 1),
                   block_table, seq_lens, scale);
  at::Tensor o = at::empty({M, H}, opts);
  project(o, attn.view({M, Q}), o_w, o_b, qtypes[1]);
  at::Tensor normed2 = at::empty({M, H}, opts), res2 = at::empty({M, H}, opts);
  add_rms_norm(normed2, res2, o, res, post_norm, eps);
  at::Tensor gate_up = at::empty({M, 2 * I}, opts);
  project(gate_up, normed2, gate_up_w, c10::nullopt, qtypes[2]);
  at::Tensor act = at::empty({M, I}, opts);
  silu_and_mul(act, gate_up);
  at::Tensor out = at::empty({M, H}, opts);
  project(out, act, down_w, c10::nullopt, qtypes[3]);
  return {out, res2};
}
