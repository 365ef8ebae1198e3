// A share of a tiled GGUF product (gguf_tiled.cpp) for callers that split a decode step's work
// among threads themselves (decode_phased.cpp): x is rounded once, and each thread takes tiles.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include "gguf_act.h"

namespace strand {
namespace gguf {

// x ([M, K] float32 or bfloat16, contiguous) rounded to int8 blocks (quantize_input).
void quantize_any(const at::Tensor& x, QuantizedRows& out);

// out[:, col0 + 16 t0 .. col0 + 16 t1) = (x @ w.T + bias[col0 + ...]) over tiles t0..t1 of w
// ([N / 16, K / 32, 16 * block bytes], already checked), x rounded by quantize_any; out
// [M, >= col0 + N] contiguous, x's dtype (col0: where w's rows start among a projection's parts
// of different types, DecodeStack::add_part). The same sums, in the same order, as
// gguf_tiled_linear_small.
void tiled_rows(at::Tensor out, const QuantizedRows& x, const at::Tensor& tiles, int64_t qtype,
                const c10::optional<at::Tensor>& bias, int64_t t0, int64_t t1, int64_t col0 = 0);

}  // namespace gguf
}  // namespace strand
