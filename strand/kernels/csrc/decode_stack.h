// A model's decoder layers for decode steps of 1 to kMaxDecodeRows requests, held in C++ between
// steps (decode_layer.cpp). Only bindings.cpp and decode_layer.cpp include this.
#pragma once

#include <mutex>

#include "kernels.h"

// Rows up to which the few-row kernels run (strand/kernels/cpu_linear.py's SMALL_M), and up to which a
// step is taken at all (strand/kernels/cpu_linear_batch.py's BATCH_M: linear_batch above kSmallRows).
constexpr int64_t kSmallRows = 4, kMaxDecodeRows = 64;

namespace strand {
// out = x @ w.T (+ b) for a step's rows: w dense (qtype 0: linear_small, linear_batch past
// kSmallRows), GGUF rows (gguf_linear_small, up to kSmallRows) or tiles (gguf_tiled_linear).
void project(at::Tensor out, const at::Tensor& x, const at::Tensor& w,
             const c10::optional<at::Tensor>& b, int64_t qtype);
}  // namespace strand

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
  // The last added layer's projection `projection` (0 qkv, 1 o, 2 gate_up, 3 down) goes on with
  // more rows in GGUF 16-row tiles of another type (a Q4_K_M file's q and k in Q4_K, its v in
  // Q6_K): its output's next columns. Only for a projection whose first part is tiles too.
  void add_part(int64_t projection, at::Tensor w, int64_t qtype);
  // hidden [M, H] (the embeddings), one kv cache per layer ([2, blocks, block_size, kv_heads,
  // head_dim]); returns (the last layer's output, the residual stream), new tensors.
  std::vector<at::Tensor> forward(at::Tensor hidden, at::Tensor positions,
                                  std::vector<at::Tensor> kv_caches, at::Tensor slots,
                                  at::Tensor block_table, at::Tensor seq_lens);
  // The model's ends, for logits(): the token embedding table ([vocab, H] in the layers'
  // dtype, or float32 panels [P, H, W] of a tied head's only copy), the final norm, and the
  // lm_head: head_w dense ([V, H] in the layers' dtype, or float32 panels [P, H, W]; qtype 0)
  // or GGUF blocks (rows, or 16-row tiles; qtype its GGML type). vocab and head_rows: the
  // table's rows and the head's (V, or a classifier's labels), which panels, padded to whole
  // panels, do not tell.
  // embed_qtype: 0, or the GGML type of an embedding table kept in GGUF blocks (rows, or
  // 16-row tiles: each row looked up is dequantized from them).
  void set_ends(at::Tensor embedding, at::Tensor norm, at::Tensor head_w, int64_t qtype,
                double eps, int64_t vocab, int64_t head_rows, int64_t embed_qtype);
  // The packed copies of the weights (strand/kernels/cpu_linear.py's pack_weight: float32 panels for
  // linear_panels, or mkldnn::_linear_pointwise's copies), 4 a layer (qkv, o, gate_up, down) and the lm_head's where set_ends() was
  // called: a decode batch of more than kSmallRows rows then runs its products through them, as
  // the layer-by-layer path does wherever linear_batch is not chosen.
  void set_batch_weights(std::vector<at::Tensor> packed, c10::optional<at::Tensor> head);
  // A whole decode step of M = input_ids.size(0) requests from their token ids: the embedding
  // rows, forward, norm(hidden + residual) and the lm_head, returning the logits [M, V] in the
  // layers' dtype (a new tensor). The same kernels on the same data as the embedding, forward
  // and the Python norm and lm_head, so the same bits; where every weight is GGUF tiles the
  // head's phases join the step's one parallel region (decode_phased.cpp). The step's indices
  // are checked first (ValueError), as fused_decode._check_step does before forward: token ids
  // and positions ([>= M] int64), slots ([>= M] int64), the block table ([>= M, cols] int32)
  // and seq_lens ([>= M] int32), of which the first M rows are read.
  at::Tensor logits(at::Tensor input_ids, at::Tensor positions, std::vector<at::Tensor> kv_caches,
                    at::Tensor slots, at::Tensor block_table, at::Tensor seq_lens);

  struct Part {
    at::Tensor w;  // GGUF 16-row tiles
    int64_t qtype;
  };
  struct Layer {
    at::Tensor input_norm, qkv_w;
    c10::optional<at::Tensor> qkv_b;
    at::Tensor o_w;
    c10::optional<at::Tensor> o_b;
    at::Tensor post_norm, gate_up_w, down_w;
    std::vector<int64_t> qtypes;
    std::vector<at::Tensor> batch_w;  // set_batch_weights: the packed copies, or empty
    std::vector<Part> more[4];  // add_part: each projection's rows after its first weight's
  };
  // Every intermediate of a layer at M rows, and views of them; made once per M and reused by
  // every layer of every step, so a layer creates no tensor (each at::empty, narrow or select
  // costs microseconds through the dispatcher: ~20 a layer were a few percent of a step).
  struct Buffers {
    at::Tensor normed, res_a, res_b, qkv, q, k, v, attn, attn_rows, o, normed2, gate_up, act,
        out;
  };

 private:
  // The lm_head's rows: a GGUF weight's first dimension counts rows, or tiles of 16 of them.
  int64_t vocab_size() const { return head_.rows; }
  struct Head {
    at::Tensor embedding, norm, w, batch_w;
    int64_t qtype = 0;
    double eps = 0;
    int64_t vocab = 0, rows = 0;  // the embedding table's rows, the head's
    int64_t embed_qtype = 0;  // the table's GGML type where it is kept in GGUF blocks
  };
  Buffers& buffers(int64_t M, const at::TensorOptions& opts);
  // b.q, b.k and b.v as views of b.qkv's rows.
  void qkv_views(Buffers& b) const;
  // What logits() reads unchecked, checked (decode_ends.cpp).
  void check_step(const at::Tensor& input_ids, const at::Tensor& positions,
                  const std::vector<at::Tensor>& kv_caches, const at::Tensor& slots,
                  const at::Tensor& block_table, const at::Tensor& seq_lens) const;
  // Every layer of a step, into the buffers of M rows it returns (out and res_b: the last
  // layer's output and residual); with logits, the head as well (into *logits, [M, V]). The
  // caller holds mutex_.
  Buffers& run(const at::Tensor& hidden, const at::Tensor& positions,
               const std::vector<at::Tensor>& kv_caches, const at::Tensor& slots,
               const at::Tensor& block_table, const at::Tensor& seq_lens, at::Tensor* logits);
  // The layers kernel by kernel, each kernel its own parallel region (any weights).
  void forward_layers(Buffers& b, const at::Tensor& hidden, const at::Tensor& positions,
                      const at::Tensor& q_dense, const at::Tensor& slots,
                      const at::Tensor& block_table, const at::Tensor& seq_lens);
  // The step when every projection is GGUF tiles, or every one dense (decode_phased.cpp): one
  // parallel region; with logits (GGUF tiles only, and a tiled head), the final norm and the
  // lm_head's tiles as two more phases.
  void forward_phased(Buffers& b, const at::Tensor& hidden, const at::Tensor& positions,
                      const at::Tensor& q_dense, const at::Tensor& slots,
                      const at::Tensor& block_table, const at::Tensor& seq_lens,
                      at::Tensor* logits);

  at::Tensor cos_sin_;
  int64_t num_heads_, num_kv_heads_, head_dim_, hidden_ = 0, intermediate_ = 0;
  double eps_, scale_;
  std::vector<Layer> layers_;
  Head head_;  // head_.w undefined until set_ends
  bool all_tiled_ = true;  // every layer's four weights are GGUF 16-row tiles
  bool all_dense_ = true;  // every layer's four weights are dense (float32 or bfloat16)
  bool phased_ = true;  // STRAND_DECODE_PHASED=0: the op-by-op step (A/B runs)
  std::vector<Buffers> by_m_;  // [M - 1], made on first use
  // Each layer's key and value cache views, and the tensor they were taken from.
  std::vector<at::Tensor> caches_, keys_, values_;
  std::mutex mutex_;  // one step at a time: the buffers are shared
};
