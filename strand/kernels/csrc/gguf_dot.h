// Integer dot products of one 32-weight GGUF block with one 32-value int8 activation block, as
// llama.cpp's ggml_vec_dot_q*_q8 do: the quants are never widened to float. Each returns 8
// int32 partial sums (a register-wide vector on x86; lanes of a plain array elsewhere) whose total
// is sum_j a[j] * b[j]; the caller scales them by the two blocks' float scales.
//
// The x86 instructions multiply unsigned by signed bytes:
//   AVX-512 VNNI (with VL): _mm256_dpbusd_epi32, one instruction for the 32 products and sums;
//   AVX2: _mm256_maddubs_epi16 (pairs to int16) then _mm256_madd_epi16 by ones (to int32).
// 4-bit quants are unsigned already (0..15). Q8_0's are signed: |w| times x with w's sign moved
// onto x (_mm256_sign_epi8), llama.cpp's trick; |w| <= 128 and |x| <= 127 keep maddubs' int16
// pair sums (<= 32512) from saturating.
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace strand {
namespace gguf {

constexpr int64_t kBlock = 32;

#if defined(__AVX2__)
#define STRAND_GGUF_SIMD 1
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
constexpr const char* kDotIsa = "avx512-vnni";
#else
constexpr const char* kDotIsa = "avx2";
#endif
typedef __m256i bytes32;  // one block's 32 quants (or activation values), one byte each
typedef __m256i i32x8;
typedef __m256 f32x8;

inline bytes32 load_bytes(const int8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }

// sum over pairs of u[j] * s[j] (u unsigned, s signed bytes) into 8 int32 lanes, added to acc.
inline i32x8 dot_us(i32x8 acc, bytes32 u, bytes32 s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  const __m256i pairs = _mm256_maddubs_epi16(u, s);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
}

// A Q4 block's 16 bytes of nibbles as 32 unsigned bytes: low nibbles (weights 0..15) then high.
inline bytes32 nibbles(const uint8_t* q) {
  const __m128i v = _mm_loadu_si128((const __m128i*)q);
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
  return _mm256_and_si256(both, _mm256_set1_epi8(15));
}

// A Q8_0 block's quants, split for dot_us: |w| and w itself (whose sign goes onto x).
struct SignedBlock {
  bytes32 abs, sign;
};
inline SignedBlock signed_block(const uint8_t* q) {
  const __m256i w = _mm256_loadu_si256((const __m256i*)q);
  return {_mm256_sign_epi8(w, w), w};
}
inline i32x8 dot_signed(const SignedBlock& w, bytes32 x) {
  return dot_us(_mm256_setzero_si256(), w.abs, _mm256_sign_epi8(x, w.sign));
}
inline i32x8 dot_nibbles(bytes32 w, bytes32 x) {
  return dot_us(_mm256_setzero_si256(), w, x);
}

inline f32x8 fzero() { return _mm256_setzero_ps(); }
// acc + float(sums) * scale: the block's integer sum, scaled once, kept in 8 lanes.
inline f32x8 scale_add(f32x8 acc, i32x8 sums, float scale) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(scale), acc);
}
inline float total(f32x8 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#else
// Plain C++ for CPUs without AVX2 (and other architectures): the same integer sums, one lane.
constexpr const char* kDotIsa = "scalar";
struct bytes32 {
  int8_t v[kBlock];
};
typedef int32_t i32x8;
typedef float f32x8;
inline bytes32 load_bytes(const int8_t* p) {
  bytes32 b;
  std::memcpy(b.v, p, kBlock);
  return b;
}
inline bytes32 nibbles(const uint8_t* q) {
  bytes32 b;
  for (int j = 0; j < 16; ++j) {
    b.v[j] = static_cast<int8_t>(q[j] & 15);
    b.v[j + 16] = static_cast<int8_t>(q[j] >> 4);
  }
  return b;
}
struct SignedBlock {
  bytes32 w;
};
inline SignedBlock signed_block(const uint8_t* q) {
  return {load_bytes(reinterpret_cast<const int8_t*>(q))};
}
inline i32x8 dot_bytes(const bytes32& a, const bytes32& b) {
  int32_t s = 0;
  for (int j = 0; j < kBlock; ++j) s += static_cast<int32_t>(a.v[j]) * b.v[j];
  return s;
}
inline i32x8 dot_signed(const SignedBlock& w, const bytes32& x) { return dot_bytes(w.w, x); }
inline i32x8 dot_nibbles(const bytes32& w, const bytes32& x) { return dot_bytes(w, x); }
inline f32x8 fzero() { return 0.f; }
inline f32x8 scale_add(f32x8 acc, i32x8 sums, float scale) {
  return acc + static_cast<float>(sums) * scale;
}
inline float total(f32x8 v) { return v; }
#endif

}  // namespace gguf
}  // namespace strand
