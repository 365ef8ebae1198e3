// A model's decoder layers for decode steps of 1 to kMaxDecodeRows requests, held in C++ between
// steps (decode_layer.cpp). Only bindings.cpp and decode_layer.cpp include this.
#pragma once

#include <mutex>

#include "kernels.h"

// Rows up to which the few-row kernels run (kernels/cpu_linear.py's SMALL_M), and up to which a
// step is taken at all (kernels/cpu_linear_batch.py's BATCH_M: linear_batch above kSmallRows).
constexpr int64_t kSmallRows = 4, kMaxDecodeRows = 64;

class DecodeStack {
 public:
  // The sizes every layer shares (checked as each is added) and the rotary table.
  DecodeStack(at::Tensor cos_sin, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
              double eps, double scale);
  // qtypes: per projection (qkv, o, gate_up, down), 0 for a dense weight, else the GGML type of
  // a weight packed in GGUF blocks (gguf_linear.cpp).
  void add_layer(at::Tensor input_norm, at::Tensor qkv_w, c10::optional<at::Tensor> qkv_b,
                 at::Tensor o_w, c10::optional<at::Tensor> o_b, at::Tensor post_norm,
                 at::Tensor gate_up_w, at::Tensor down_w, std::vector<int64_t> qtypes);
  // hidden [M, H] (the embeddings), one kv cache per layer ([2, blocks, block_size, kv_heads,
  // head_dim]); returns (the last layer's output, the residual stream), new tensors.
  std::vector<at::Tensor> forward(at::Tensor hidden, at::Tensor positions,
                                  std::vector<at::Tensor> kv_caches, at::Tensor slots,
                                  at::Tensor block_table, at::Tensor seq_lens);

  struct Layer {
    at::Tensor input_norm, qkv_w;
    c10::optional<at::Tensor> qkv_b;
    at::Tensor o_w;
    c10::optional<at::Tensor> o_b;
    at::Tensor post_norm, gate_up_w, down_w;
    std::vector<int64_t> qtypes;
  };
  // Every intermediate of a layer at M rows, and views of them; made once per M and reused by
  // every layer of every step, so a layer creates no tensor (each at::empty, narrow or select
  // costs 1-2 us through the dispatcher: ~20 a layer were 1.3 ms of a 35 ms bfloat16 step).
  struct Buffers {
    at::Tensor normed, res_a, res_b, qkv, q, k, v, attn, attn_rows, o, normed2, gate_up, act,
        out;
  };

 private:
  Buffers& buffers(int64_t M, const at::TensorOptions& opts);
  // The step when every projection is GGUF tiles (decode_phased.cpp): one parallel region.
  void forward_phased(Buffers& b, const at::Tensor& hidden, const at::Tensor& positions,
                      const at::Tensor& q_dense, const at::Tensor& slots,
                      const at::Tensor& block_table, const at::Tensor& seq_lens);

  at::Tensor cos_sin_;
  int64_t num_heads_, num_kv_heads_, head_dim_, hidden_ = 0, intermediate_ = 0;
  double eps_, scale_;
  std::vector<Layer> layers_;
  bool all_tiled_ = true;  // every layer's four weights are GGUF 16-row tiles
  std::vector<Buffers> by_m_;  // [M - 1], made on first use
  // Each layer's key and value cache views, and the tensor they were taken from.
  std::vector<at::Tensor> caches_, keys_, values_;
  std::mutex mutex_;  // one step at a time: the buffers are shared
};
