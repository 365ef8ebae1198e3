// A range of a panel-packed float32 weight's product (linear_panels.cpp), on the calling thread:
// for the phased decode step (decode_phased.cpp), which hands a step's work to its threads
// itself. Only decode_phased.cpp and linear_panels.cpp include this.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

namespace strand {

// out[:, p0 * W .. min(N, p1 * W)) = x @ w.T (+ bias) for panels [p0, p1) of `panels` (W =
// linear_panel_width()); x float32 [M, K] row-major (M rows, any M), out [M, N] float32
// contiguous. The same sums as linear_panels, output by output.
void panels_rows(at::Tensor& out, const float* x, int64_t M, const at::Tensor& panels,
                 const c10::optional<at::Tensor>& bias, int64_t p0, int64_t p1);

}  // namespace strand
