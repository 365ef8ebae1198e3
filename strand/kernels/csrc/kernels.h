// The CPU kernels' entry points, shared by their sources and bindings.cpp.
//
// The kernel sources include ATen's tensor and parallel headers only: <torch/extension.h> costs
// about ten times their compile time per source file. Only bindings.cpp pays for pybind11's
// tensor casters, once for the whole extension.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>

#include <vector>

// decode_attention.cpp
void decode_attention(at::Tensor out, at::Tensor query, at::Tensor key_cache,
                      at::Tensor value_cache, at::Tensor block_table, at::Tensor seq_lens,
                      double scale);
// Request r's kv heads g0..g1 of the same (one task of decode_attention, the same sums), on the
// calling thread: for callers that hand a step's tasks to their threads (decode_phased.cpp).
void decode_attention_part(at::Tensor out, at::Tensor query, at::Tensor key_cache,
                           at::Tensor value_cache, at::Tensor block_table, at::Tensor seq_lens,
                           double scale, int64_t r, int64_t g0, int64_t g1);

// prefill_attention.cpp
void prefill_attention(at::Tensor out, at::Tensor query, at::Tensor key_cache,
                       at::Tensor value_cache, at::Tensor block_table, at::Tensor q_starts,
                       at::Tensor q_lens, at::Tensor seq_lens, double scale);

// The same for bfloat16, the products by AVX512_BF16's VDPBF16PS (P rounded to bfloat16 for
// P.V), where the build and the CPU have it.
bool prefill_attention_pairs_available();
void prefill_attention_pairs(at::Tensor out, at::Tensor query, at::Tensor key_cache,
                             at::Tensor value_cache, at::Tensor block_table, at::Tensor q_starts,
                             at::Tensor q_lens, at::Tensor seq_lens, double scale);

// prefill_attention_amx.cpp: the same for bfloat16 on AMX tiles, where the CPU and OS allow it.
bool prefill_attention_amx_available();
void prefill_attention_amx(at::Tensor out, at::Tensor query, at::Tensor key_cache,
                           at::Tensor value_cache, at::Tensor block_table, at::Tensor q_starts,
                           at::Tensor q_lens, at::Tensor seq_lens, double scale);

// linear_small.cpp
void linear_small(at::Tensor out, at::Tensor x, at::Tensor weight, c10::optional<at::Tensor> bias);

// linear_batch.cpp
void linear_batch(at::Tensor out, at::Tensor x, at::Tensor weight, c10::optional<at::Tensor> bias);

// linear_panels.cpp: float32 weights regrouped into panels of linear_panel_width() columns.
int64_t linear_panel_width();
void pack_panels(at::Tensor panels, at::Tensor weight);
void linear_panels(at::Tensor out, at::Tensor x, at::Tensor panels, c10::optional<at::Tensor> bias);

// gguf_linear.cpp
void gguf_linear_small(at::Tensor out, at::Tensor x, at::Tensor packed, int64_t qtype,
                       c10::optional<at::Tensor> bias);
void gguf_dequantize(at::Tensor out, at::Tensor packed, int64_t qtype);

// gguf_tiled.cpp: the same weights regrouped into 16-row tiles (gguf_linear_small and
// gguf_dequantize take a 3-D tiled tensor as well as GGUF rows).
void gguf_tile(at::Tensor tiles, at::Tensor packed, int64_t qtype);
void gguf_untile(at::Tensor packed, at::Tensor tiles, int64_t qtype);
// out = the tiles' weights in float32, for the types with bit planes (false for the others:
// gguf_dequantize then untiles them first).
bool gguf_dequantize_tiles(at::Tensor out, at::Tensor tiles, int64_t qtype);
// Any number of rows over tiles, x rounded once (a decode batch's 32 rows, a prefill's).
void gguf_tiled_linear(at::Tensor out, at::Tensor x, at::Tensor tiles, int64_t qtype,
                       c10::optional<at::Tensor> bias);

// gguf_transcode.cpp: Q6_K rows as Q6_F blocks, as strand/kernels/gguf_transcode.py writes them.
void gguf_q6k_to_q6f(at::Tensor out, at::Tensor rows);

// decode_layer.cpp: the DecodeStack class (decode_stack.h)

// elementwise.cpp
void rms_norm(at::Tensor out, at::Tensor x, at::Tensor weight, double eps);
void add_rms_norm(at::Tensor out, at::Tensor new_residual, at::Tensor x, at::Tensor residual,
                  at::Tensor weight, double eps);
void silu_and_mul(at::Tensor out, at::Tensor gate_up);
void rotary_neox(at::Tensor x, at::Tensor positions, at::Tensor cos_sin);
void write_kv(at::Tensor key_cache, at::Tensor value_cache, at::Tensor key, at::Tensor value,
              at::Tensor slots);
void argmax(at::Tensor out, at::Tensor x);
