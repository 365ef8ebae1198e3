// The few-row product (linear_small.cpp) split by its caller: x prepared once, then any thread
// computes a range of the output's columns (the weight's rows) on its own. For the phased
// decode step (decode_phased.cpp), which hands a step's work to its threads itself.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <vector>

namespace strand {

// x [M, K] (float32 or bfloat16, contiguous, 1 <= M <= 4) as the kernel reads it: its data as
// it is, or (bfloat16 without AVX512_BF16) laid out in float32 evens then odds per chunk. Views
// x's memory: x must outlive the products that read it, unchanged.
struct SmallX {
  const void* data = nullptr;
  int64_t M = 0, K = 0;
  bool bf16 = false;
  std::vector<float> laid_out;
};
void small_prepare(const at::Tensor& x, SmallX& out);

// Output columns are handed out in units of this many weight rows (a whole row group on every
// path: 8, 4 or 2 rows).
constexpr int64_t kSmallUnit = 8;

// out[:, n0 .. n1) = x @ w[n0 .. n1).T (+ bias) on the calling thread: the same sums as
// linear_small, output by output. out [M, N] contiguous in x's dtype, w [N, K] contiguous.
void small_rows(at::Tensor& out, const SmallX& x, const at::Tensor& w,
                const c10::optional<at::Tensor>& bias, int64_t n0, int64_t n1);

}  // namespace strand
