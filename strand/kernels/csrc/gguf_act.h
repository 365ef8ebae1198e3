// A decode step's activations rounded once per call to int8 blocks of 32 for the GGUF kernels'
// integer dot products (gguf_linear.cpp over GGUF rows, gguf_tiled.cpp over 16-row tiles), as
// llama.cpp rounds them (its Q8_0 / Q8_1 for activations).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "vec16.h"

namespace strand {
namespace gguf {

// x's rows per 32-value block: d = max|x| / 127, q = round(x / d) (ties to even), so x ~ d * q
// with an error of at most d / 2 per value. s = d * sum(q), for the 4-bit types' offsets;
// qsum = sum(q) itself, for the exact integer correction of the tiled Q8_0 product (gguf_tiled.cpp);
// qsum_lo the same over a block's first 16 values (Q8_F's two halves are scaled apart).
//
// Rows are kept in groups of up to kRowsTogether, block-major within a group: block b of the
// group's rows one after another. The tiled kernel takes up to 8 rows a pass, and so reads every
// row's block b from one pointer at fixed offsets; with each row at its own pointer (K apart, K
// known only at run time) the 8-row Q4_K pass ran out of general registers and moved them
// through vector registers and the stack inside its inner loop. A single row is laid out as
// before (block b at 32 b).
constexpr int64_t kRowsTogether = 8;

struct QuantizedRows {
  int64_t nb = 0;        // blocks a row
  int64_t together = 1;  // rows a group: min(M, kRowsTogether)
  std::vector<int8_t> q;  // [groups, nb, together, 32]
  std::vector<float> d, s;  // [groups, nb, together]
  std::vector<int32_t> qsum, qsum_lo;  // [groups, nb, together]

  // Where row m's block b is among the blocks: its d, s, qsum, qsum_lo; its bytes at 32 times it.
  // Within a group, block b + 1 of a row is `together` entries on: the kernels take at(m, 0)
  // once and step by it, with no division in their loops.
  int64_t at(int64_t m, int64_t b) const {
    return ((m / together) * nb + b) * together + m % together;
  }
};

// Block xb (32 values) into out's entries i, in two 16-lane vectors (vec16.h): the
// scalar loop (a max the compiler may not reorder, a libm rounding per value) was 7% of a
// 32-request decode step of SmolLM2 on one thread.
template <typename T>
inline void quantize_block(const T* xb, int64_t i, QuantizedRows& out) {
  typedef int32_t i32x16 __attribute__((vector_size(64)));
  typedef int8_t i8x16 __attribute__((vector_size(16)));
  const v16 lo = load(xb), hi = load(xb + 16);
  const i32x16 abs_mask = i32x16{} + 0x7FFFFFFF;
  const v16 a_lo = (v16)((i32x16)lo & abs_mask), a_hi = (v16)((i32x16)hi & abs_mask);
  const v16 inf = splat(__builtin_huge_valf());
  const i32x16 finite_lanes = (a_lo < inf) & (a_hi < inf);  // NaN < inf is false too
  const v16 m = a_lo > a_hi ? a_lo : a_hi;
  float amax = 0.f;
  bool finite = true;
  for (int j = 0; j < 16; ++j) {
    amax = std::max(amax, m[j]);
    finite = finite && finite_lanes[j] != 0;
  }
  int8_t* q = out.q.data() + i * 32;
  if (!finite) {  // a NaN or infinity: the block's scale is NaN, so every output it meets is
    std::memset(q, 0, 32);  // NaN, as the float product's would be (not a silent 0)
    out.d[i] = out.s[i] = std::numeric_limits<float>::quiet_NaN();
    out.qsum[i] = out.qsum_lo[i] = 0;
    return;
  }
  const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
  // Rounded to nearest, ties to even, lane by lane (the compiler makes one vector rounding of
  // it); the product is rounded to float first, as a separate op (no fused multiply-add).
  v16 r_lo = lo * id, r_hi = hi * id;
  for (int j = 0; j < 16; ++j) {
    r_lo[j] = std::nearbyint(r_lo[j]);
    r_hi[j] = std::nearbyint(r_hi[j]);
  }
  const i32x16 q_lo = __builtin_convertvector(r_lo, i32x16);
  const i32x16 q_hi = __builtin_convertvector(r_hi, i32x16);
  const i8x16 b_lo = __builtin_convertvector(q_lo, i8x16), b_hi = __builtin_convertvector(q_hi, i8x16);
  std::memcpy(q, &b_lo, 16);
  std::memcpy(q + 16, &b_hi, 16);
  int32_t sum_lo = 0, sum = 0;
  for (int j = 0; j < 16; ++j) {
    sum_lo += q_lo[j];
    sum += q_hi[j];
  }
  sum += sum_lo;
  out.d[i] = d;
  out.s[i] = d * static_cast<float>(sum);
  out.qsum[i] = sum;
  out.qsum_lo[i] = sum_lo;
}

// Blocks at a time per thread when many rows are rounded (a prefill's: 512 rows of 1536 values
// took ~2 ms on one thread, per product): a block is ~40 ns, so chunks of ~40 us.
constexpr int64_t kQuantizeGrain = 1024;

// x ([M, K], float32 or bfloat16) rounded as above; rows are K long and K % 32 == 0, so block i
// of the flat x is row i / nb's block i % nb. Many rows are split among ATen's threads (inline
// inside a parallel region: the phased decode step's few rows).
template <typename T>
void quantize_input(const at::Tensor& x, QuantizedRows& out) {
  const int64_t M = x.size(0), K = x.size(1);
  out.nb = K / 32;
  out.together = std::min(M, kRowsTogether);
  const int64_t groups = (M + out.together - 1) / out.together;
  const int64_t blocks = groups * out.together * out.nb;  // a last group's missing rows unused
  out.q.resize(blocks * 32);
  out.d.resize(blocks);
  out.s.resize(blocks);
  out.qsum.resize(blocks);
  out.qsum_lo.resize(blocks);
  const T* xp = static_cast<const T*>(x.data_ptr());
  at::parallel_for(0, M * out.nb, kQuantizeGrain, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i)
      quantize_block(xp + i * 32, out.at(i / out.nb, i % out.nb), out);
  });
}

}  // namespace gguf
}  // namespace strand
