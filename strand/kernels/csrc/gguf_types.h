// The GGUF block types the CPU kernels read (gguf_linear.cpp over rows, gguf_tiled.cpp over
// 16-row tiles), by GGML's numbers, and Strand's own (strand/kernels/gguf_transcode.py rewrites llama.cpp's
// other K-quants into them at load; strand/kernels/gguf_linear_ref.py states every layout).
#pragma once

#include <cstdint>
#include <type_traits>

#include "check.h"

namespace strand {

enum QType : int64_t {
  kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kIQ4_NL = 20,
  kQ3_F = 1003, kIQ4_F = 1004, kQ5_F = 1005, kQ6_F = 1006, kQ8_F = 1008
};

// The 16 int8 levels an IQ4 code indexes (llama.cpp's kvalues_iq4nl): w = d * level.
alignas(16) constexpr int8_t kIQ4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};

// A block of 32 weights in rows: `head` bytes of fields (`field` bytes each: d, m, ...),
// `planes` words of extra bits (4 bytes each), then `quants` bytes (16 of nibbles or 32 of int8).
// Q4_K's head covers 256 weights (144 bytes a row): 18 bytes per 32, for sizes only.
struct GGUFFormat {
  int64_t head, planes, quants, field;
  constexpr int64_t bytes() const { return head + 4 * planes + quants; }
};

constexpr GGUFFormat gguf_format_of(int64_t qtype) {
  switch (qtype) {
    case kQ8_0: return {2, 0, 32, 2};
    case kQ4_0: return {2, 0, 16, 2};
    case kQ4_1: return {4, 0, 16, 2};
    case kQ5_0: return {2, 1, 16, 2};
    case kQ5_1: return {4, 1, 16, 2};
    case kQ4_K: return {2, 0, 16, 2};
    case kIQ4_NL: return {2, 0, 16, 2};  // Q4_0's bytes; the codes index kIQ4Levels
    case kIQ4_F: return {4, 0, 16, 4};  // the same with a float32 d (from IQ4_XS)
    case kQ5_F: return {8, 1, 16, 4};
    case kQ6_F: return {4, 2, 16, 2};  // float16 d, then int8 scales (lo, hi) as one field
    case kQ3_F: return {4, 0, 16, 2};  // Q6_F's head, nibbles of q + 4 (from Q3_K)
    case kQ8_F: return {12, 0, 32, 4};
    default: return {0, 0, 0, 0};
  }
}

// The format of a type the kernels read; an error naming the ones they do for any other.
inline GGUFFormat gguf_format(int64_t qtype) {
  const GGUFFormat f = gguf_format_of(qtype);
  STRAND_CHECK(f.quants != 0, "GGUF type ", qtype, " is not packed here (Q4_0=2, Q4_1=3, "
               "Q5_0=6, Q5_1=7, Q8_0=8, Q4_K=12, IQ4_NL=20, Q3_F=1003, IQ4_F=1004, Q5_F=1005, "
               "Q6_F=1006, Q8_F=1008 are)");
  return f;
}

// A block of a bit-plane type (Q5_0, Q5_1, Q5_F, Q6_F; and Q3_F, Q6_F's head over nibbles) as
// float32 weights of its quants q (nibble | planes): from its head's d and m (Q6_F, Q3_F: d
// and its two int8 scales), the one formula
// the dequantization over rows (gguf_linear.cpp) and over tiles (gguf_tiled.cpp) use, the
// reference's float32 ops (strand/kernels/gguf_linear_ref.py).
template <int64_t Q>
struct PlaneBlock {
  float lo, hi, m;  // the scale of quants 0..15 and of 16..31; the offset
  PlaneBlock(float d, float m_or_zero, const uint8_t* sc) : lo(d), hi(d), m(m_or_zero) {
    if constexpr (Q == kQ6_F || Q == kQ3_F) {
      lo = d * static_cast<float>(static_cast<int8_t>(sc[0]));
      hi = d * static_cast<float>(static_cast<int8_t>(sc[1]));
    }
  }
  float weight(int32_t q, bool low) const {
    if constexpr (Q == kQ5_0) return lo * static_cast<float>(q - 16);
    else if constexpr (Q == kQ6_F) return (low ? lo : hi) * static_cast<float>(q - 32);
    else if constexpr (Q == kQ3_F) return (low ? lo : hi) * static_cast<float>(q - 4);
    else return lo * static_cast<float>(q) + m;
  }
};

// f(std::integral_constant<int64_t, Q>{}) for the type Q a number names (Q4_1 for any other:
// callers check the type first).
template <typename F>
void by_gguf_type(int64_t qtype, F&& f) {
  switch (qtype) {
    case kQ8_0: f(std::integral_constant<int64_t, kQ8_0>{}); break;
    case kQ4_0: f(std::integral_constant<int64_t, kQ4_0>{}); break;
    case kQ5_0: f(std::integral_constant<int64_t, kQ5_0>{}); break;
    case kQ5_1: f(std::integral_constant<int64_t, kQ5_1>{}); break;
    case kQ4_K: f(std::integral_constant<int64_t, kQ4_K>{}); break;
    case kIQ4_NL: f(std::integral_constant<int64_t, kIQ4_NL>{}); break;
    case kIQ4_F: f(std::integral_constant<int64_t, kIQ4_F>{}); break;
    case kQ5_F: f(std::integral_constant<int64_t, kQ5_F>{}); break;
    case kQ6_F: f(std::integral_constant<int64_t, kQ6_F>{}); break;
    case kQ3_F: f(std::integral_constant<int64_t, kQ3_F>{}); break;
    case kQ8_F: f(std::integral_constant<int64_t, kQ8_F>{}); break;
    default: f(std::integral_constant<int64_t, kQ4_1>{});
  }
}

}  // namespace strand
