// bfloat16 weights regrouped once into panels (linear_panels_bf16.cpp): one copy that serves
// every row count, from a decode step's one row to a prefill's thousands. bindings.cpp registers
// these; the decode stack (decode_layer.cpp) calls linear_panels_bf16 too.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>

// Output columns a panel holds: 48 with AVX-512, 16 with AVX2 (as linear_panels).
int64_t linear_panel_bf16_width();

// Whether linear_panels_bf16 multiplies by VDPBF16PS here (this build, the CPU, and
// STRAND_DISABLE_AVX512_BF16 unset); else it widens the weights to float32 first.
bool linear_panels_bf16_dp();

// weight bfloat16 [N, K] contiguous -> panels bfloat16 [ceil(N / W), ceil(K / 2), W, 2]:
// panels[p][i][j][t] = weight[W p + j][2 i + t], zero past N and K.
void pack_panels_bf16(at::Tensor panels, at::Tensor weight);

// out bfloat16 [M, N] = x bfloat16 [M, K] @ weight.T (+ bias, bfloat16 or float32 [N]), the
// weight as pack_panels_bf16 left it. Each output is one float32 sum along k (the bias added
// last), rounded once to bfloat16 (nearest, ties to even): the same for any M and thread count.
void linear_panels_bf16(at::Tensor out, at::Tensor x, at::Tensor panels,
                        c10::optional<at::Tensor> bias);
