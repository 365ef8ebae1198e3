// 16-float vectors for the CPU kernels, written with GCC/Clang vector extensions: AVX-512
// registers where the CPU has them (the kernels are built with -march=native), split by the
// compiler into narrower ones elsewhere. One source for every x86 or ARM machine.
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace strand {

typedef float v16 __attribute__((vector_size(64)));

// Hardware registers one v16 takes: 1 with AVX-512 (32 of them), 2 with AVX2 (16 ymm), 4 below
// (16 xmm). A kernel that keeps k v16 accumulators live needs k * kRegsPerV16 of them: past the
// register file the compiler spills every accumulator to the stack in every iteration (the
// prefill kernel's 8x2 blocks ran 4x slower than torch's SDPA on an AVX2-only CPU that way).
#if defined(__AVX512F__)
constexpr int kRegsPerV16 = 1;
#elif defined(__AVX__)
constexpr int kRegsPerV16 = 2;
#else
constexpr int kRegsPerV16 = 4;
#endif

// The widest vector one register holds: what a kernel should carry from one loop iteration to
// the next (a 64-byte v16 carried that way under AVX2 is kept on the stack and moved through it
// in 16-byte pieces).
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
typedef float vl __attribute__((vector_size(4 * kLanes)));
typedef float vlu __attribute__((vector_size(4 * kLanes), aligned(4)));
typedef int32_t il __attribute__((vector_size(4 * kLanes)));
inline vl load_l(const float* p) { return *reinterpret_cast<const vlu*>(p); }
// *p in every lane, as one broadcast from memory. `vl{} + *p` adds +0 first (it must: -0 + +0
// is +0), a scalar add and a register broadcast on every row of every k.
inline vl broadcast(const float* p) {
#if defined(__AVX512F__)
  return (vl)_mm512_set1_ps(*p);
#elif defined(__AVX2__)
  return (vl)_mm256_set1_ps(*p);
#else
  return vl{} + *p;
#endif
}

// acc[m][v] += the bias of a panel of V vectors, of which the first `cols` columns are real (the
// bias has only N values: a copy, zero past cols).
template <int MR, int V>
inline void add_panel_bias(vl (&acc)[MR][V], const float* bias, int cols) {
  alignas(64) float padded[V * kLanes] = {};
  std::memcpy(padded, bias, cols * sizeof(float));
  for (int v = 0; v < V; ++v) {
    const vl c = load_l(padded + v * kLanes);
    for (int m = 0; m < MR; ++m) acc[m][v] += c;
  }
}
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef int32_t i16 __attribute__((vector_size(64)));

inline v16 load(const float* p) { return *reinterpret_cast<const v16u*>(p); }
inline void store(float* p, v16 v) { *reinterpret_cast<v16u*>(p) = v; }
inline v16 splat(float x) { return v16{} + x; }
inline v16 load_tail(const float* p, int64_t n) {  // the first n < 16 floats, zeros after
  v16 v = v16{};
  std::memcpy(&v, p, n * sizeof(float));
  return v;
}
inline float to_float(float x) { return x; }

// bfloat16, stored as its 16 bits (the layout of torch's at::BFloat16): the top half of a
// float32. Kernels read it into float32 vectors and compute there; only what they store is
// rounded back (to nearest, ties to even, as torch rounds).
struct bf16 {
  uint16_t bits;
};
typedef uint16_t u16x16 __attribute__((vector_size(32), aligned(2)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

inline v16 load(const bf16* p) {
  const u32x16 wide = __builtin_convertvector(*reinterpret_cast<const u16x16*>(p), u32x16) << 16;
  return reinterpret_cast<const v16&>(wide);
}
inline v16 load_tail(const bf16* p, int64_t n) {
  u16x16 h = u16x16{};
  std::memcpy(&h, p, n * sizeof(bf16));
  const u32x16 wide = __builtin_convertvector(h, u32x16) << 16;
  return reinterpret_cast<const v16&>(wide);
}
inline float to_float(bf16 x) {
  const uint32_t wide = (uint32_t)x.bits << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}
// The bfloat16 bits of each lane, rounded to nearest, ties to even. A NaN stays a (quiet) NaN:
// rounding could carry its mantissa into the exponent.
inline u32x16 bf16_bits(v16 v) {
  const u32x16 u = reinterpret_cast<const u32x16&>(v);
  const u32x16 rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (v != v) ? u32x16{} + 0x7FC0u : rounded;
}
inline void store(bf16* p, v16 v) {
  *reinterpret_cast<u16x16*>(p) = __builtin_convertvector(bf16_bits(v), u16x16);
}
// v rounded to bfloat16 and widened again: what a torch op in bfloat16 leaves behind.
inline v16 round_bf16(v16 v) {
  const u32x16 wide = bf16_bits(v) << 16;
  return reinterpret_cast<const v16&>(wide);
}
inline void store_scalar(float* p, float x) { *p = x; }
inline void store_scalar(bf16* p, float x) {  // bf16_bits on one value, without vectors
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  p->bits = x != x ? 0x7FC0u : (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// e^x lane by lane (Cephes expf: 2^n * p(r), |r| <= ln2/2, about 1 ulp). Below -87 it gives 0
// (attention scores that far under their row's maximum weigh nothing beside its e^0 = 1) and
// above 88.7 infinity, as expf would.
template <typename V>
inline V vexp(V x) {
  using I = decltype(x < x);
  const V zero = V{};
  const I tiny = x < -87.f, huge = x > 88.7f;
  x = tiny ? zero - 87.f : (huge ? zero : x);
  const V magic = zero + 12582912.f;  // 1.5 * 2^23: adding it rounds to the nearest integer
  const V n = (x * 1.44269504088896341f + magic) - magic;
  const V r = x - n * 0.693359375f + n * 2.12194440e-4f;
  V p = zero + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const V y = p * r * r + r + 1.f;
  // exp(x) for x in (88.38, 88.7] is finite but rounds n to 128, past the exponent field:
  // scale by 2^(n-1) and then by 2 there (silu of g = -88.5 was -0 instead of torch's -3e-37).
  const I top = n > 127.f;
  const V n1 = top ? n - 1.f : n;
  const I bits = (__builtin_convertvector(n1, I) + 127) << 23;  // 2^n1
  const V e = (top ? y + y : y) * reinterpret_cast<const V&>(bits);
  return tiny ? zero : (huge ? zero + __builtin_huge_valf() : e);
}

// Lane sums of 16 vectors at once: out[i] = sum(a[i]). Each level halves the lanes per source
// and doubles the sources per vector (15 adds in all, against 16 separate horizontal sums).
#define HALVES(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
inline v16 reduce16(const v16* a) {
  v16 c[8], d[4], e[2];
  for (int k = 0; k < 8; ++k)
    c[k] = HALVES(a[2 * k], a[2 * k + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           HALVES(a[2 * k], a[2 * k + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int k = 0; k < 4; ++k)
    d[k] = HALVES(c[2 * k], c[2 * k + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           HALVES(c[2 * k], c[2 * k + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int k = 0; k < 2; ++k)
    e[k] = HALVES(d[2 * k], d[2 * k + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           HALVES(d[2 * k], d[2 * k + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return HALVES(e[0], e[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         HALVES(e[0], e[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// ---- register-wide lane vectors (vl): loads, stores, lane sums ----
inline void store_l(float* p, vl v) { *reinterpret_cast<vlu*>(p) = v; }
typedef uint16_t u16l __attribute__((vector_size(2 * kLanes), aligned(2)));
typedef uint32_t u32l __attribute__((vector_size(4 * kLanes)));
#if defined(__AVX2__) && !defined(__AVX512F__)
// At -march=x86-64-v3 GCC 12 turns the generic widening below into a 16-byte load, two
// vpmovzxwd, a vpsrldq and a vinserti128: four shuffle-port uops per 8 values, where
// vpmovzxwd from memory is one. Every bfloat16 kernel under AVX2 loads through here (norms,
// silu-and-mul, rotary, decode attention's K/V, the decode-batch linear's weights); the bits are
// the same.
inline vl load_l(const bf16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return (vl)_mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
#else
inline vl load_l(const bf16* p) {
  const u32l wide = __builtin_convertvector(*reinterpret_cast<const u16l*>(p), u32l) << 16;
  return reinterpret_cast<const vl&>(wide);
}
#endif
// bf16_bits, round_bf16 and store(bf16*) on register-wide vectors: the same rounding lane by lane.
inline u32l bf16_bits_l(vl v) {
  const u32l u = reinterpret_cast<const u32l&>(v);
  const u32l rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (v != v) ? u32l{} + 0x7FC0u : rounded;
}
inline void store_l(bf16* p, vl v) {
  *reinterpret_cast<u16l*>(p) = __builtin_convertvector(bf16_bits_l(v), u16l);
}
inline vl round_bf16_l(vl v) {
  const u32l wide = bf16_bits_l(v) << 16;
  return reinterpret_cast<const vl&>(wide);
}
template <typename T>
inline vl load_tail_l(const T* p, int64_t n) {  // the first n < kLanes values, zeros after
  alignas(64) T tmp[kLanes] = {};
  std::memcpy(tmp, p, n * sizeof(T));
  return load_l(tmp);
}

// Lane sums of kLanes vectors at once: out[i] = sum(a[i]), by the same halving tree as reduce16.
inline vl reduce_lanes(const vl* a) {
#if defined(__AVX512F__)
  return reduce16(a);
#else
  vl c[4], d[2];
  for (int k = 0; k < 4; ++k)
    c[k] = HALVES(a[2 * k], a[2 * k + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           HALVES(a[2 * k], a[2 * k + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  for (int k = 0; k < 2; ++k)
    d[k] = HALVES(c[2 * k], c[2 * k + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
           HALVES(c[2 * k], c[2 * k + 1], 2, 3, 6, 7, 10, 11, 14, 15);
  return HALVES(d[0], d[1], 0, 2, 4, 6, 8, 10, 12, 14) + HALVES(d[0], d[1], 1, 3, 5, 7, 9, 11, 13, 15);
#endif
}

}  // namespace strand
