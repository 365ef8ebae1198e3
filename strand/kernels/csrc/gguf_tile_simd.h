// 16-row vectors for the tiled GGUF kernel (gguf_tiled.cpp): one lane per weight row of a tile.
// A 64-byte chunk of a tile holds 4 consecutive quants of each of its 16 rows (row r's in bytes
// 4r..4r+3), which is what the x86 integer dot products take: AVX-512 VNNI's vpdpbusd sums each
// 32-bit lane's 4 byte products into that lane, so one instruction multiplies 16 rows by the
// same 4 activation values (broadcast), and the 16 rows' sums never need a horizontal add.
//   avx512: one zmm per vector; vpdpbusd with VNNI, else vpmaddubsw + vpmaddwd (AVX-512 BW);
//   avx2:   two ymm; vpdpbusd on 256 bits with AVX-512 VL VNNI, else vpmaddubsw + vpmaddwd;
//   below:  plain C++ arrays of 16.
// The products are unsigned (weights) by signed (activations) bytes. 4-bit quants are unsigned.
// Q8_0's signed quants: with VNNI, w ^ 0x80 = w + 128 as unsigned, so each lane gets
// sum w x + 128 sum x, and the caller's sums start at -kQ8Excess * sum(x) per block (exact,
// integers); with vpmaddubsw (whose int16 pair sums would saturate at 255 * 127 * 2), |w| times
// x with w's sign moved onto x, so the excess is 0.
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace strand {
namespace tile {

inline int32_t load_word(const int8_t* p) {  // 4 activation bytes as one 32-bit lane
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

#if defined(__AVX512F__)
#if defined(__AVX512VNNI__)
constexpr int32_t kQ8Excess = 128;
#else
constexpr int32_t kQ8Excess = 0;
#endif
struct U8 { __m512i v; };   // a 64-byte chunk of quants
struct I32 { __m512i v; };  // 16 int32 lanes
struct F32 { __m512 v; };   // 16 float lanes

inline U8 load_chunk(const uint8_t* p) { return {_mm512_loadu_si512((const void*)p)}; }
inline U8 low_nibbles(U8 a) { return {_mm512_and_si512(a.v, _mm512_set1_epi8(15))}; }
inline U8 high_nibbles(U8 a) {
  return {_mm512_and_si512(_mm512_srli_epi16(a.v, 4), _mm512_set1_epi8(15))};
}
// a | ((b shifted left by s bits, right by -s) & mask) in each byte lane: 16-bit lanes shift,
// and the mask keeps only bits that came from the same byte.
inline U8 or_shifted(U8 a, U8 b, int s, uint8_t mask) {
  const __m512i sh = s >= 0 ? _mm512_sll_epi16(b.v, _mm_cvtsi32_si128(s))
                            : _mm512_srl_epi16(b.v, _mm_cvtsi32_si128(-s));
  return {_mm512_or_si512(a.v, _mm512_and_si512(sh, _mm512_set1_epi8(static_cast<char>(mask))))};
}
// Each byte (a code 0..15) replaced by table[code]: 16 signed levels (IQ4's), by vpshufb.
inline U8 lookup16(U8 codes, const int8_t* table) {
  const __m512i t = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i*)table));
  return {_mm512_shuffle_epi8(t, codes.v)};
}
inline I32 izero() { return {_mm512_setzero_si512()}; }
inline __m512i dot_us(__m512i acc, __m512i u, __m512i s) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, u, s);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s),
                                                 _mm512_set1_epi16(1)));
#endif
}
// dot_us with the 4 signed bytes at x broadcast to every lane. With VNNI the broadcast is the
// instruction's own memory operand ({1to16}): GCC kept a separate vpbroadcastd for each of
// these, as many instructions again as the dot products themselves.
inline __m512i dot_us(__m512i acc, __m512i u, const int8_t* x) {
#if defined(__AVX512VNNI__)
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t*)x));
  return acc;
#else
  return dot_us(acc, u, _mm512_set1_epi32(load_word(x)));
#endif
}
// acc[r] += sum_j u[4r + j] * x[j] (x: 4 signed bytes)
inline I32 dot_unsigned(I32 acc, U8 u, const int8_t* x) { return {dot_us(acc.v, u.v, x)}; }
// acc[r] += sum_j w[4r + j] * x[j] + kQ8Excess * sum_j x[j] (w signed)
inline I32 dot_signed(I32 acc, U8 w, const int8_t* x) {
#if defined(__AVX512VNNI__)
  return {dot_us(acc.v, _mm512_xor_si512(w.v, _mm512_set1_epi8(-128)), x)};
#else
  const __m512i xv = _mm512_set1_epi32(load_word(x));
  const __m512i xs = _mm512_mask_sub_epi8(xv, _mm512_movepi8_mask(w.v), _mm512_setzero_si512(),
                                          xv);
  return {dot_us(acc.v, _mm512_abs_epi8(w.v), xs)};
#endif
}
inline I32 iset(int32_t c) { return {_mm512_set1_epi32(c)}; }  // every lane c
inline I32 iadd(I32 a, I32 b) { return {_mm512_add_epi32(a.v, b.v)}; }
// A block's sums chunk by chunk, as dot_unsigned. Without VNNI too: AVX2's pair sums (below)
// measured slower here than widening a chunk at a time (STRAND_DISABLE_VNNI, one thread,
// 1536 x 1536 at 32 and 256 rows, Q4_K and Q4_1 alike).
constexpr bool kPairSums = false;
using P16 = I32;
inline P16 pzero() { return izero(); }
inline P16 pdot(P16 acc, U8 u, const int8_t* x) { return dot_unsigned(acc, u, x); }
inline I32 widen(P16 a) { return a; }
inline F32 fzero() { return {_mm512_setzero_ps()}; }
inline F32 halves(const uint8_t* p) {  // 16 float16 values
  return {_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p))};
}
inline F32 floats(const uint8_t* p) { return {_mm512_loadu_ps((const float*)p)}; }  // 16 float32
inline F32 from_u8(const uint8_t* p) {  // 16 unsigned bytes
  return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)))};
}
// Byte K of 16 two-byte pairs (Q6_F's scales of quants 0..15 and 16..31), signed.
template <int K>
inline F32 from_i8_pair(const uint8_t* p) {
  const __m512i w = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i*)p));
  return {_mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(w, 24 - 8 * K), 24))};
}
inline F32 mul(F32 a, F32 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline F32 to_f32(I32 a) { return {_mm512_cvtepi32_ps(a.v)}; }
inline F32 mul(F32 a, float b) { return {_mm512_mul_ps(a.v, _mm512_set1_ps(b))}; }
inline F32 fma(F32 a, F32 b, F32 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline F32 fma(F32 a, float b, F32 c) { return {_mm512_fmadd_ps(a.v, _mm512_set1_ps(b), c.v)}; }
// c - a b, rounded once: the same value as fma(a, -b, c), without negating b on its own.
inline F32 fnma(F32 a, float b, F32 c) { return {_mm512_fnmadd_ps(a.v, _mm512_set1_ps(b), c.v)}; }
inline void store(float* p, F32 a) { _mm512_storeu_ps(p, a.v); }

#elif defined(__AVX2__)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
constexpr int32_t kQ8Excess = 128;
#else
constexpr int32_t kQ8Excess = 0;
#endif
struct U8 { __m256i v[2]; };  // rows 0..7, rows 8..15
struct I32 { __m256i v[2]; };
struct F32 { __m256 v[2]; };

inline U8 load_chunk(const uint8_t* p) {
  return {{_mm256_loadu_si256((const __m256i*)p), _mm256_loadu_si256((const __m256i*)(p + 32))}};
}
inline U8 low_nibbles(U8 a) {
  const __m256i m = _mm256_set1_epi8(15);
  return {{_mm256_and_si256(a.v[0], m), _mm256_and_si256(a.v[1], m)}};
}
inline U8 high_nibbles(U8 a) {
  const __m256i m = _mm256_set1_epi8(15);
  return {{_mm256_and_si256(_mm256_srli_epi16(a.v[0], 4), m),
           _mm256_and_si256(_mm256_srli_epi16(a.v[1], 4), m)}};
}
inline U8 or_shifted(U8 a, U8 b, int s, uint8_t mask) {
  const __m128i count = _mm_cvtsi32_si128(s >= 0 ? s : -s);
  const __m256i m = _mm256_set1_epi8(static_cast<char>(mask));
  U8 out;
  for (int h = 0; h < 2; ++h) {
    const __m256i sh = s >= 0 ? _mm256_sll_epi16(b.v[h], count) : _mm256_srl_epi16(b.v[h], count);
    out.v[h] = _mm256_or_si256(a.v[h], _mm256_and_si256(sh, m));
  }
  return out;
}
inline U8 lookup16(U8 codes, const int8_t* table) {
  const __m256i t = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)table));
  return {{_mm256_shuffle_epi8(t, codes.v[0]), _mm256_shuffle_epi8(t, codes.v[1])}};
}
inline I32 izero() { return {{_mm256_setzero_si256(), _mm256_setzero_si256()}}; }
inline __m256i dot_us(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s),
                                                 _mm256_set1_epi16(1)));
#endif
}
inline I32 dot_unsigned(I32 acc, U8 u, const int8_t* x) {
  const __m256i xv = _mm256_set1_epi32(load_word(x));
  return {{dot_us(acc.v[0], u.v[0], xv), dot_us(acc.v[1], u.v[1], xv)}};
}
inline I32 dot_signed(I32 acc, U8 w, const int8_t* x) {
  const __m256i xv = _mm256_set1_epi32(load_word(x));
  I32 out;
  for (int h = 0; h < 2; ++h) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    out.v[h] = dot_us(acc.v[h], _mm256_xor_si256(w.v[h], _mm256_set1_epi8(-128)), xv);
#else
    out.v[h] = dot_us(acc.v[h], _mm256_sign_epi8(w.v[h], w.v[h]), _mm256_sign_epi8(xv, w.v[h]));
#endif
  }
  return out;
}
inline I32 iadd(I32 a, I32 b) {
  return {{_mm256_add_epi32(a.v[0], b.v[0]), _mm256_add_epi32(a.v[1], b.v[1])}};
}
inline I32 iset(int32_t c) {
  const __m256i cv = _mm256_set1_epi32(c);
  return {{cv, cv}};
}
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
constexpr bool kPairSums = false;
using P16 = I32;
inline P16 pzero() { return izero(); }
inline P16 pdot(P16 acc, U8 u, const int8_t* x) { return dot_unsigned(acc, u, x); }
inline I32 widen(P16 a) { return a; }
#else
// Without VNNI (an AVX2-only CPU): vpmaddubsw's int16 pair sums of a block's chunks are added
// first, and widened by one vpmaddwd a block instead of one a chunk.
constexpr bool kPairSums = true;
struct P16 { __m256i v[2]; };
inline P16 pzero() { return {{_mm256_setzero_si256(), _mm256_setzero_si256()}}; }
inline P16 pdot(P16 acc, U8 u, const int8_t* x) {
  const __m256i xv = _mm256_set1_epi32(load_word(x));
  return {{_mm256_add_epi16(acc.v[0], _mm256_maddubs_epi16(u.v[0], xv)),
           _mm256_add_epi16(acc.v[1], _mm256_maddubs_epi16(u.v[1], xv))}};
}
inline I32 widen(P16 a) {
  const __m256i one = _mm256_set1_epi16(1);
  return {{_mm256_madd_epi16(a.v[0], one), _mm256_madd_epi16(a.v[1], one)}};
}
#endif
inline F32 fzero() { return {{_mm256_setzero_ps(), _mm256_setzero_ps()}}; }
inline F32 halves(const uint8_t* p) {
  return {{_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)),
           _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 16)))}};
}
inline F32 floats(const uint8_t* p) {
  return {{_mm256_loadu_ps((const float*)p), _mm256_loadu_ps((const float*)(p + 32))}};
}
inline F32 from_u8(const uint8_t* p) {
  return {{_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p))),
           _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8))))}};
}
template <int K>
inline F32 from_i8_pair(const uint8_t* p) {
  const auto eight = [](const uint8_t* q) {
    const __m256i w = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i*)q));
    return _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(w, 24 - 8 * K), 24));
  };
  return {{eight(p), eight(p + 16)}};
}
inline F32 mul(F32 a, F32 b) {
  return {{_mm256_mul_ps(a.v[0], b.v[0]), _mm256_mul_ps(a.v[1], b.v[1])}};
}
inline F32 to_f32(I32 a) { return {{_mm256_cvtepi32_ps(a.v[0]), _mm256_cvtepi32_ps(a.v[1])}}; }
inline F32 mul(F32 a, float b) {
  const __m256 bv = _mm256_set1_ps(b);
  return {{_mm256_mul_ps(a.v[0], bv), _mm256_mul_ps(a.v[1], bv)}};
}
inline F32 fma(F32 a, F32 b, F32 c) {
  return {{_mm256_fmadd_ps(a.v[0], b.v[0], c.v[0]), _mm256_fmadd_ps(a.v[1], b.v[1], c.v[1])}};
}
inline F32 fma(F32 a, float b, F32 c) {
  const __m256 bv = _mm256_set1_ps(b);
  return {{_mm256_fmadd_ps(a.v[0], bv, c.v[0]), _mm256_fmadd_ps(a.v[1], bv, c.v[1])}};
}
inline F32 fnma(F32 a, float b, F32 c) {
  const __m256 bv = _mm256_set1_ps(b);
  return {{_mm256_fnmadd_ps(a.v[0], bv, c.v[0]), _mm256_fnmadd_ps(a.v[1], bv, c.v[1])}};
}
inline void store(float* p, F32 a) {
  _mm256_storeu_ps(p, a.v[0]);
  _mm256_storeu_ps(p + 8, a.v[1]);
}

#else
// Plain C++ (CPUs below AVX2, other architectures): the same integer sums, lane by lane.
constexpr int32_t kQ8Excess = 0;
struct U8 { uint8_t v[64]; };
struct I32 { int32_t v[16]; };
struct F32 { float v[16]; };

inline U8 load_chunk(const uint8_t* p) {
  U8 a;
  std::memcpy(a.v, p, 64);
  return a;
}
inline U8 low_nibbles(U8 a) {
  for (auto& b : a.v) b &= 15;
  return a;
}
inline U8 high_nibbles(U8 a) {
  for (auto& b : a.v) b >>= 4;
  return a;
}
inline U8 or_shifted(U8 a, U8 b, int s, uint8_t mask) {
  for (int i = 0; i < 64; ++i)
    a.v[i] |= static_cast<uint8_t>((s >= 0 ? b.v[i] << s : b.v[i] >> -s) & mask);
  return a;
}
inline U8 lookup16(U8 codes, const int8_t* table) {
  for (auto& b : codes.v) b = static_cast<uint8_t>(table[b & 15]);
  return codes;
}
inline I32 izero() { return {}; }
inline I32 dot_unsigned(I32 acc, U8 u, const int8_t* x) {
  int8_t xb[4];
  std::memcpy(xb, x, 4);
  for (int r = 0; r < 16; ++r)
    for (int j = 0; j < 4; ++j) acc.v[r] += static_cast<int32_t>(u.v[4 * r + j]) * xb[j];
  return acc;
}
inline I32 dot_signed(I32 acc, U8 w, const int8_t* x) {
  int8_t xb[4];
  std::memcpy(xb, x, 4);
  for (int r = 0; r < 16; ++r)
    for (int j = 0; j < 4; ++j)
      acc.v[r] += static_cast<int32_t>(static_cast<int8_t>(w.v[4 * r + j])) * xb[j];
  return acc;
}
inline I32 iadd(I32 a, I32 b) {
  for (int r = 0; r < 16; ++r) a.v[r] += b.v[r];
  return a;
}
inline I32 iset(int32_t c) {
  I32 a;
  for (auto& v : a.v) v = c;
  return a;
}
constexpr bool kPairSums = false;
using P16 = I32;
inline P16 pzero() { return izero(); }
inline P16 pdot(P16 acc, U8 u, const int8_t* x) { return dot_unsigned(acc, u, x); }
inline I32 widen(P16 a) { return a; }
inline F32 fzero() { return {}; }
inline F32 halves(const uint8_t* p) {
  F32 a;
  for (int r = 0; r < 16; ++r) {
    uint16_t h;
    std::memcpy(&h, p + 2 * r, 2);
    a.v[r] = c10::detail::fp16_ieee_to_fp32_value(h);
  }
  return a;
}
inline F32 floats(const uint8_t* p) {
  F32 a;
  std::memcpy(a.v, p, sizeof(a.v));
  return a;
}
inline F32 from_u8(const uint8_t* p) {
  F32 a;
  for (int r = 0; r < 16; ++r) a.v[r] = static_cast<float>(p[r]);
  return a;
}
template <int K>
inline F32 from_i8_pair(const uint8_t* p) {
  F32 a;
  for (int r = 0; r < 16; ++r) a.v[r] = static_cast<float>(static_cast<int8_t>(p[2 * r + K]));
  return a;
}
inline F32 mul(F32 a, F32 b) {
  for (int r = 0; r < 16; ++r) a.v[r] *= b.v[r];
  return a;
}
inline F32 to_f32(I32 a) {
  F32 f;
  for (int r = 0; r < 16; ++r) f.v[r] = static_cast<float>(a.v[r]);
  return f;
}
inline F32 mul(F32 a, float b) {
  for (auto& v : a.v) v *= b;
  return a;
}
inline F32 fma(F32 a, F32 b, F32 c) {
  for (int r = 0; r < 16; ++r) c.v[r] += a.v[r] * b.v[r];
  return c;
}
inline F32 fma(F32 a, float b, F32 c) {
  for (int r = 0; r < 16; ++r) c.v[r] += a.v[r] * b;
  return c;
}
inline F32 fnma(F32 a, float b, F32 c) {
  for (int r = 0; r < 16; ++r) c.v[r] += a.v[r] * -b;
  return c;
}
inline void store(float* p, F32 a) { std::memcpy(p, a.v, sizeof(a.v)); }
#endif

}  // namespace tile
}  // namespace strand
