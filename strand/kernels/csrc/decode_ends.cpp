#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <cstring>

#include "check.h"
#include "decode_stack.h"

// The two ends of a decode step around the DecodeStack's layers: the token embedding rows before
// them, the final norm and the lm_head after, so that a step is one call from its token ids to
// its logits. Profiled on one thread (SmolLM2, packed Q4_1, bs=1), the Python between the C++
// step and the sampler (the step's index checks, int casts, the embedding, the final norm and
// the lm_head's wrappers: ~25 small torch calls) took about 5% of the step, several times what
// the same calls take in a tight loop: after the step has streamed ~96 MB of weights
// through the caches, every Python object and torch dispatch path is a cache miss. Here the
// checks are loops over M <= kMaxDecodeRows rows and the embedding is M row copies.

namespace {
// Panels holding `vocab` rows of H values in the layers' dtype: float32 [P, H, W]
// (linear_panels.cpp's layout) or bfloat16 [P, H / 2, W, 2] (linear_panels_bf16.cpp's).
bool panels_of(const at::Tensor& t, int64_t H, int64_t vocab, at::ScalarType dtype) {
  const bool f32 = dtype == at::kFloat && t.dim() == 3 && t.size(1) == H;
  const bool bf16 = dtype == at::kBFloat16 && t.dim() == 4 && t.size(1) * 2 == H &&
                    t.size(3) == 2;
  return (f32 || bf16) && t.scalar_type() == dtype && t.is_contiguous() &&
         vocab > (t.size(0) - 1) * t.size(2) && vocab <= t.size(0) * t.size(2);
}
}  // namespace

void DecodeStack::set_ends(at::Tensor embedding, at::Tensor norm, at::Tensor head_w,
                           int64_t qtype, double eps, int64_t vocab, int64_t head_rows,
                           int64_t embed_qtype) {
  STRAND_CHECK(!layers_.empty(), "set_ends() after the layers");
  const auto dtype = layers_[0].input_norm.scalar_type();
  if (embed_qtype != 0) {
    const bool tiled = embedding.dim() == 3;
    STRAND_CHECK(embedding.scalar_type() == at::kByte && embedding.is_contiguous() &&
                     (embedding.dim() == 2 || tiled) &&
                     embedding.size(0) * (tiled ? 16 : 1) == vocab,
                 "a GGUF embedding table must be contiguous uint8 rows or 16-row tiles of ",
                 vocab, " rows");
    // Its first rows through the dequantization checks the blocks' size against hidden.
    gguf_dequantize(at::empty({tiled ? 16 : 1, hidden_}, norm.options().dtype(at::kFloat)),
                    embedding.narrow(0, 0, 1), embed_qtype);
  } else {
    STRAND_CHECK((embedding.dim() == 2 && embedding.size(0) == vocab &&
                  embedding.size(1) == hidden_ && embedding.scalar_type() == dtype &&
                  embedding.is_contiguous()) ||
                     panels_of(embedding, hidden_, vocab, dtype),
                "the embedding table must be a contiguous [", vocab, ", ", hidden_,
                "] tensor in the layers' dtype, or panels of it");
  }
  STRAND_CHECK(norm.dim() == 1 && norm.size(0) == hidden_ && norm.scalar_type() == dtype,
              "the final norm must be ", hidden_, " values in the layers' dtype");
  STRAND_CHECK(qtype != 0 || (head_w.dim() == 2 && head_w.size(0) == head_rows &&
                             head_w.size(1) == hidden_ && head_w.scalar_type() == dtype) ||
                  (qtype == 0 && panels_of(head_w, hidden_, head_rows, dtype)),
              "a dense lm_head must be [", head_rows, ", ", hidden_,
              "] in the layers' dtype, or panels of it");
  STRAND_CHECK(qtype == 0 || head_w.size(0) * (head_w.dim() == 3 ? 16 : 1) == head_rows,
              "the GGUF lm_head's rows must be ", head_rows);
  // One row through the kernel checks the weight as each call of it would (its shape against
  // hidden, a GGUF type's block size); the phased step's tiles are not checked per call.
  strand::project(at::empty({1, head_rows}, norm.options()),
                  at::zeros({1, hidden_}, norm.options()), head_w, c10::nullopt, qtype);
  head_ = {embedding, norm, head_w, at::Tensor(), qtype, eps, vocab, head_rows, embed_qtype};
}

namespace {
// Rows [0, M) of an index tensor of `dtype`, at least M long, contiguous.
template <typename T>
const T* first_rows(const at::Tensor& t, int64_t M, at::ScalarType dtype, const char* name) {
  STRAND_CHECK(t.scalar_type() == dtype && t.is_contiguous() && t.dim() >= 1 && t.size(0) >= M,
              name, " must be a contiguous ", dtype, " tensor of at least ", M, " rows");
  return t.data_ptr<T>();
}

template <typename T>
void check_range(const T* v, int64_t n, int64_t lo, int64_t hi, const char* name,
                 const char* what) {
  for (int64_t i = 0; i < n; ++i)
    STRAND_CHECK_VALUE(v[i] >= lo && v[i] < hi, name, " must be in [", lo, ", ", hi, ") (", what,
                      "), got ", v[i]);
}
}  // namespace

void DecodeStack::check_step(const at::Tensor& input_ids, const at::Tensor& positions,
                             const std::vector<at::Tensor>& kv_caches, const at::Tensor& slots,
                             const at::Tensor& block_table, const at::Tensor& seq_lens) const {
  const int64_t M = input_ids.size(0);
  STRAND_CHECK(input_ids.dim() == 1 && M >= 1 && M <= kMaxDecodeRows, "DecodeStack takes 1 to ",
              kMaxDecodeRows, " tokens, got ", input_ids.sizes());
  STRAND_CHECK(!kv_caches.empty() && kv_caches[0].dim() == 5,
              "kv caches are [2, blocks, block_size, kv_heads, head_dim]");
  const int64_t blocks = kv_caches[0].size(1), block_size = kv_caches[0].size(2);
  check_range(first_rows<int64_t>(input_ids, M, at::kLong, "input_ids"), M, 0, head_.vocab,
              "input_ids", "the vocabulary");
  check_range(first_rows<int64_t>(positions, M, at::kLong, "positions"), M, 0,
              cos_sin_.size(0), "positions", "the rotary table's rows");
  check_range(first_rows<int64_t>(slots, M, at::kLong, "slot_mapping"), M, 0,
              blocks * block_size, "slot_mapping", "the cache's slots");
  STRAND_CHECK(block_table.dim() == 2, "block_table must be [requests, blocks a request]");
  const int64_t cols = block_table.size(1);
  check_range(first_rows<int32_t>(block_table, M, at::kInt, "block_table"), M * cols, 0, blocks,
              "block_table entries", "the cache's blocks");
  // A decode token's query is 1 long: seq_len >= 1, and its table covers seq_len tokens.
  check_range(first_rows<int32_t>(seq_lens, M, at::kInt, "seq_lens"), M, 1,
              cols * block_size + 1, "seq_lens", "what block_table covers");
}

at::Tensor DecodeStack::logits(at::Tensor input_ids, at::Tensor positions,
                               std::vector<at::Tensor> kv_caches, at::Tensor slots,
                               at::Tensor block_table, at::Tensor seq_lens) {
  STRAND_CHECK(head_.w.defined(), "logits() needs set_ends() first");
  check_step(input_ids, positions, kv_caches, slots, block_table, seq_lens);
  const int64_t M = input_ids.size(0);
  const auto opts = head_.norm.options();  // the layers' dtype (the table may be GGUF bytes)
  at::Tensor hidden = at::empty({M, hidden_}, opts);
  const int64_t row_bytes = hidden_ * hidden.element_size();
  const int64_t* ids = input_ids.data_ptr<int64_t>();
  if (head_.embed_qtype != 0) {  // GGUF blocks: each row's tile (or row) dequantized
    const bool tiled = head_.embedding.dim() == 3;
    const int64_t span = tiled ? 16 : 1;
    at::Tensor rows = at::empty({span, hidden_}, opts.dtype(at::kFloat));
    for (int64_t m = 0; m < M; ++m) {
      gguf_dequantize(rows, head_.embedding.narrow(0, ids[m] / span, 1), head_.embed_qtype);
      hidden.select(0, m).copy_(rows.select(0, ids[m] % span));
    }
  } else if (head_.embedding.dim() == 3) {  // float32 panels: row r is column r % W of panel r / W
    const int64_t W = head_.embedding.size(2);
    const float* table = head_.embedding.data_ptr<float>();
    float* rows = hidden.data_ptr<float>();
    for (int64_t m = 0; m < M; ++m) {
      const float* column = table + ids[m] / W * hidden_ * W + ids[m] % W;
      for (int64_t k = 0; k < hidden_; ++k) rows[m * hidden_ + k] = column[k * W];
    }
  } else if (head_.embedding.dim() == 4) {  // bfloat16 panels: k's pair, column r % W
    const int64_t W = head_.embedding.size(2), pairs = head_.embedding.size(1);
    const auto* table = head_.embedding.data_ptr<at::BFloat16>();
    auto* rows = hidden.data_ptr<at::BFloat16>();
    for (int64_t m = 0; m < M; ++m) {
      const at::BFloat16* column = table + (ids[m] / W * pairs * W + ids[m] % W) * 2;
      for (int64_t k = 0; k < hidden_; ++k) rows[m * hidden_ + k] = column[k / 2 * W * 2 + k % 2];
    }
  } else {
    for (int64_t m = 0; m < M; ++m)
      std::memcpy(static_cast<char*>(hidden.data_ptr()) + m * row_bytes,
                  static_cast<const char*>(head_.embedding.data_ptr()) + ids[m] * row_bytes,
                  row_bytes);
  }
  at::Tensor out = at::empty({M, vocab_size()}, opts);
  std::lock_guard<std::mutex> lock(mutex_);
  run(hidden, positions, kv_caches, slots, block_table, seq_lens, &out);
  return out;
}
