#include "check.h"
#include "kernels.h"
#include <ATen/ops/empty.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <vector>

#include "gguf_act.h"
#include "gguf_dot.h"
#include "gguf_types.h"
#include "vec16.h"

// Linear layers whose weights stay in GGUF's block layout (llama.cpp's Q8_0, Q4_0, Q4_1): each
// weight row is K / 32 blocks, each block one float16 scale d (Q4_1: and a float16 offset m)
// then 32 quants. Q8_0: w = d * q (q int8). Q4_0: w = d * (q - 8). Q4_1: w = d * q + m (q the
// low nibbles for the block's first 16 weights, the high ones for the last 16).
//
// gguf_linear_small: out[M, N] = x[M, K] @ w^T for a decode step's few rows (M <= 4), the way
// llama.cpp does it: x's rows are quantized once per call to int8 blocks of 32 with a float scale
// each, and every weight block meets them in an integer dot product (gguf_dot.h: AVX-512 VNNI,
// AVX2, or plain C++), scaled once per block by d_w * d_x; the offset part of Q4_0/Q4_1 (-8 d or
// m, times the block's sum of x) uses the activation blocks' sums. The earlier kernel widened
// every quant to float32 in registers: its per-block conversions, not memory, bounded it
// (on one thread it read a third of the bytes a second that float32 reads). The int8 rounding
// of x differs from the float product by at most sum_b (d_x,b / 2) * sum_j |w_j| per output (as
// llama.cpp's does).
// A weight regrouped into 16-row tiles (a 3-D tensor, gguf_tiled.cpp: what GGUFLinear keeps on
// CPU) goes to the tiled kernel, which reads 16 rows per vector instruction.
// gguf_dequantize: the float32 weights, for products of many rows (a GEMM library then reuses
// each weight across the rows; the unpacking is paid once per call, not once per row).
namespace {
using namespace strand;

constexpr int64_t kBlock = 32;
constexpr int kChunks = kBlock / kLanes;  // register-wide vectors per block: 2 (AVX-512) or 4
// GGML's type numbers (gguf.GGMLQuantizationType), as Python passes them.
// Q5_0, Q5_1, Q4_K and Strand's Q3_F, Q5_F, Q6_F, Q8_F (gguf_types.h) are read over 16-row tiles
// only (gguf_tiled.cpp); here they are unpacked to float32 for the GEMM library.

// kLanes bytes to floats. GCC lowers a vector-extension conversion from 8-bit lanes into one
// scalar load and convert per lane (16 of each a block, 4x the time of the product itself), so
// x86 takes the widening instructions directly; other CPUs the plain loop.
inline vl load_i8(const uint8_t* p) {  // signed bytes
#if defined(__AVX512F__)
  return (vl)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
#elif defined(__AVX2__)
  return (vl)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
#else
  vl v;
  for (int l = 0; l < kLanes; ++l) v[l] = static_cast<float>(static_cast<int8_t>(p[l]));
  return v;
#endif
}

inline void load_nibbles(const uint8_t* p, vl& lo, vl& hi) {  // kLanes bytes' low, high halves
#if defined(__AVX512F__) || defined(__AVX2__)
  const __m128i mask = _mm_set1_epi8(15);
#if defined(__AVX512F__)
  const __m128i v = _mm_loadu_si128((const __m128i*)p);
  lo = (vl)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, mask)));
  hi = (vl)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), mask)));
#else
  const __m128i v = _mm_loadl_epi64((const __m128i*)p);
  lo = (vl)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(v, mask)));
  hi = (vl)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), mask)));
#endif
#else
  for (int l = 0; l < kLanes; ++l) {
    lo[l] = static_cast<float>(p[l] & 15);
    hi[l] = static_cast<float>(p[l] >> 4);
  }
#endif
}

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
#if defined(__F16C__)
  return _cvtsh_ss(h);  // one instruction; c10's bit manipulation is ~10 per block
#else
  return c10::detail::fp16_ieee_to_fp32_value(h);
#endif
}

inline float float_at(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, sizeof(f));
  return f;
}

// One block's quants as float vectors (w[c] holds weights c*kLanes .. c*kLanes + kLanes - 1),
// its scale d and the offset m every weight gets (w = d * q + m).
template <int64_t Q>
struct Block;

template <>
struct Block<kQ8_0> {
  static constexpr int64_t kBytes = 2 + kBlock;
  static inline void unpack(const uint8_t* b, vl* w, float& d, float& m) {
    d = half_at(b);
    m = 0.f;
    for (int c = 0; c < kChunks; ++c)
      w[c] = load_i8(b + 2 + c * kLanes);
  }
};

// Both 4-bit types: 16 bytes of nibbles after `kHead` bytes of scale(s).
template <int64_t kHead>
inline void unpack_nibbles(const uint8_t* q, vl* w) {
  for (int c = 0; c < kChunks / 2; ++c) {
    load_nibbles(q + kHead + c * kLanes, w[c], w[kChunks / 2 + c]);
  }
}

template <>
struct Block<kQ4_0> {
  static constexpr int64_t kBytes = 2 + kBlock / 2;
  static inline void unpack(const uint8_t* b, vl* w, float& d, float& m) {
    d = half_at(b);
    m = -8.f * d;  // d * (q - 8) = d * q - 8 d, exactly (both products are exact in float32)
    unpack_nibbles<2>(b, w);
  }
};

template <>
struct Block<kQ4_1> {
  static constexpr int64_t kBytes = 4 + kBlock / 2;
  static inline void unpack(const uint8_t* b, vl* w, float& d, float& m) {
    d = half_at(b);
    m = half_at(b + 2);
    unpack_nibbles<4>(b, w);
  }
};

// ---- the few-row product: int8 activations, integer dot products per block ----

using gguf::QuantizedRows;  // x's rows rounded once per call (gguf_act.h)

// One weight block for the integer product: its quants as dot() takes them, its scale d, and
// the offset every weight of it gets (w = d * q + offset): 0, -8 d (Q4_0) or m (Q4_1).
template <int64_t Q>
struct IntBlock;

template <>
struct IntBlock<kQ8_0> {
  gguf::SignedBlock w;
  float d;
  static constexpr float offset = 0.f;
  explicit IntBlock(const uint8_t* b) : w(gguf::signed_block(b + 2)), d(half_at(b)) {}
  gguf::i32x8 dot(const gguf::bytes32& x) const { return gguf::dot_signed(w, x); }
};

template <>
struct IntBlock<kQ4_0> {
  gguf::bytes32 w;
  float d, offset;
  explicit IntBlock(const uint8_t* b)
      : w(gguf::nibbles(b + 2)), d(half_at(b)), offset(-8.f * d) {}
  gguf::i32x8 dot(const gguf::bytes32& x) const { return gguf::dot_nibbles(w, x); }
};

template <>
struct IntBlock<kQ4_1> {
  gguf::bytes32 w;
  float d, offset;
  explicit IntBlock(const uint8_t* b)
      : w(gguf::nibbles(b + 4)), d(half_at(b)), offset(half_at(b + 2)) {}
  gguf::i32x8 dot(const gguf::bytes32& x) const { return gguf::dot_nibbles(w, x); }
};

// Weight rows whose dot products run together: kRows * M float accumulators and M activation
// blocks stay in registers (AVX-512's 32, AVX2's 16 at M = 4).
#if defined(__AVX512F__)
constexpr int kRows = 4;
#else
constexpr int kRows = 2;
#endif

// Software prefetch kPrefetchRows weight rows ahead of the rows being read. The row group reads
// kRows rows side by side, each only K / 32 blocks long (360 bytes for K = 576), too short for
// the hardware prefetchers to ramp up: with it one thread read SmolLM2's Q4_1 layers about three
// times as fast as without (1 row at a time, sequential but one accumulator chain, gained little).
// One prefetch a cache line: every other block of the 4-bit types (18-20 bytes), every block of
// Q8_0 (34).
constexpr int64_t kPrefetchRows = 8;

// sum_b [d_w d_x * sum_j q_w q_x + offset_w * s_x] for rows n0..n1 of w and M rows of x.
template <int64_t Q, int M>
void rows_task(const QuantizedRows& x, const uint8_t* w, float* sums, int64_t K, int64_t N,
               int64_t n0, int64_t n1) {
  constexpr int64_t kBytes = Block<Q>::kBytes;
  const int64_t nb = K / kBlock, row_bytes = nb * kBytes;
  for (int64_t n = n0; n < n1; n += kRows) {
    const int64_t nr = std::min<int64_t>(kRows, n1 - n);
    gguf::f32x8 acc[kRows][M];
    float off[kRows][M];
    for (int r = 0; r < kRows; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = gguf::fzero(), off[r][m] = 0.f;
    const uint8_t* rows[kRows];
    for (int r = 0; r < kRows; ++r) rows[r] = w + (n + std::min<int64_t>(r, nr - 1)) * row_bytes;
    const int64_t ahead = kPrefetchRows * row_bytes;
    int64_t first[M];  // row m's block b is entry first[m] + b * x.together (gguf_act.h)
    for (int m = 0; m < M; ++m) first[m] = x.at(m, 0);
    for (int64_t b = 0; b < nb; ++b) {
      if (kBytes > 32 || (b & 1) == 0)
        for (int r = 0; r < kRows; ++r) __builtin_prefetch(rows[r] + b * kBytes + ahead, 0, 3);
      gguf::bytes32 xb[M];
      float xd[M];
      for (int m = 0; m < M; ++m) {
        xb[m] = gguf::load_bytes(x.q.data() + (first[m] + b * x.together) * kBlock);
        xd[m] = x.d[first[m] + b * x.together];
      }
      for (int r = 0; r < kRows; ++r) {
        const IntBlock<Q> blk(rows[r] + b * kBytes);
        for (int m = 0; m < M; ++m) {
          acc[r][m] = gguf::scale_add(acc[r][m], blk.dot(xb[m]), blk.d * xd[m]);
          if (Q != kQ8_0) off[r][m] += blk.offset * x.s[first[m] + b * x.together];
        }
      }
    }
    for (int r = 0; r < nr; ++r)
      for (int m = 0; m < M; ++m) sums[m * N + n + r] = gguf::total(acc[r][m]) + off[r][m];
  }
}

template <int64_t Q, int M>
void gemv(const QuantizedRows& x, const uint8_t* w, float* sums, int64_t K, int64_t N) {
  // Whole row groups per thread, at least 64 rows each (linear_small.cpp says why).
  at::parallel_for(0, (N + kRows - 1) / kRows, 64 / kRows, [&](int64_t g0, int64_t g1) {
    rows_task<Q, M>(x, w, sums, K, N, g0 * kRows, std::min(N, g1 * kRows));
  });
}

template <int64_t Q>
void gemv_by_m(const QuantizedRows& x, const uint8_t* w, float* sums, int64_t M, int64_t K,
               int64_t N) {
  switch (M) {
    case 1: gemv<Q, 1>(x, w, sums, K, N); break;
    case 2: gemv<Q, 2>(x, w, sums, K, N); break;
    case 3: gemv<Q, 3>(x, w, sums, K, N); break;
    default: gemv<Q, 4>(x, w, sums, K, N);
  }
}

constexpr int64_t kQ8FBytes = gguf_format_of(kQ8_F).bytes();  // d_lo, d_hi, m, 32 int8 quants

int64_t block_bytes(int64_t qtype) { return gguf_format(qtype).bytes(); }

// K, after checking the packed weight's shape against it: [N, K / 32 * block bytes] uint8.
int64_t check_packed(const at::Tensor& packed, int64_t qtype, int64_t K) {
  STRAND_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous(),
              "the packed weight must be a contiguous [N, row bytes] uint8 tensor");
  STRAND_CHECK(K % kBlock == 0 && packed.size(1) == K / kBlock * block_bytes(qtype),
              "a packed row of type ", qtype, " holding ", K, " weights takes ",
              K / kBlock * block_bytes(qtype), " bytes (K a multiple of 32), got ",
              packed.size(1));
  STRAND_CHECK(qtype != kQ4_K || K % 256 == 0, "Q4_K rows are whole 256-weight super-blocks, "
               "got ", K, " weights");
  return K;
}

template <typename T>
void finish(T* out, const float* sums, const T* bias, int64_t M, int64_t N) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      store_scalar(out + m * N + n, sums[m * N + n] + (bias ? to_float(bias[n]) : 0.f));
}

template <typename T>
void linear_typed(at::Tensor& out, const at::Tensor& x, const at::Tensor& packed, int64_t qtype,
                  const c10::optional<at::Tensor>& bias) {
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0);
  std::vector<float> sums(M * N);
  QuantizedRows xq;  // once per call: every weight row reads it
  gguf::quantize_input<T>(x, xq);
  const uint8_t* w = packed.data_ptr<uint8_t>();
  switch (qtype) {
    case kQ8_0: gemv_by_m<kQ8_0>(xq, w, sums.data(), M, K, N); break;
    case kQ4_0: gemv_by_m<kQ4_0>(xq, w, sums.data(), M, K, N); break;
    default: gemv_by_m<kQ4_1>(xq, w, sums.data(), M, K, N);
  }
  const T* b = bias.has_value() ? static_cast<const T*>(bias->data_ptr()) : nullptr;
  finish<T>(static_cast<T*>(out.data_ptr()), sums.data(), b, M, N);
}

template <int64_t Q>
void dequantize_rows(const uint8_t* w, float* out, int64_t N, int64_t K) {
  using B = Block<Q>;
  const int64_t nb = K / kBlock;
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t b = 0; b < nb; ++b) {
        vl wv[kChunks];
        float d, m;
        B::unpack(w + (n * nb + b) * B::kBytes, wv, d, m);
        float* o = out + n * K + b * kBlock;
        for (int c = 0; c < kChunks; ++c) store_l(o + c * kLanes, wv[c] * d + m);
      }
  });
}
// IQ4_NL / IQ4_F: w = d * level[code], code j the low nibble of byte j, code 16 + j its high
// one (strand/kernels/gguf_linear_ref.dequantize_ref's float32 ops).
template <int64_t Q>
void dequantize_iq4(const uint8_t* w, float* out, int64_t N, int64_t K) {
  constexpr GGUFFormat kF = gguf_format_of(Q);
  const int64_t nb = K / kBlock;
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + (n * nb + b) * kF.bytes();
        const float d = kF.field == 4 ? float_at(blk) : half_at(blk);
        float* o = out + n * K + b * kBlock;
        for (int64_t j = 0; j < 16; ++j) {
          o[j] = d * static_cast<float>(kIQ4Levels[blk[kF.head + j] & 15]);
          o[16 + j] = d * static_cast<float>(kIQ4Levels[blk[kF.head + j] >> 4]);
        }
      }
  });
}
// Q8_F: w = d * q + m, d_lo for quants 0..15 and d_hi for 16..31.
void dequantize_q8f(const uint8_t* w, float* out, int64_t N, int64_t K) {
  const int64_t nb = K / kBlock;
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + (n * nb + b) * kQ8FBytes;
        const float d[2] = {float_at(blk), float_at(blk + 4)}, m = float_at(blk + 8);
        float* o = out + n * K + b * kBlock;
        for (int c = 0; c < kChunks; ++c)
          store_l(o + c * kLanes, load_i8(blk + 12 + c * kLanes) * d[c * kLanes / 16] + m);
      }
  });
}
// The 5- and 6-bit types: head (d, and m or d_hi), bit words, 16 bytes of nibbles; quant j is
// nibble j | bit j of the first word << 4 (| of the second << 5). The same float32 ops as
// strand/kernels/gguf_linear_ref.dequantize_ref: d * (q - 16), d * q + m, (d * sc_half) * (q - 32).
template <int64_t Q>
void dequantize_planes(const uint8_t* w, float* out, int64_t N, int64_t K) {
  constexpr GGUFFormat kF = gguf_format_of(Q);
  constexpr bool kF32 = kF.field == 4;
  constexpr int64_t kHead = kF.head, kPlanes = kF.planes, kBytes = kF.bytes();
  const int64_t nb = K / kBlock;
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + (n * nb + b) * kBytes;
        const float d = kF32 ? float_at(blk) : half_at(blk);
        const float m =
            Q == kQ5_0 || Q == kQ6_F || Q == kQ3_F ? 0.f : kF32 ? float_at(blk + 4) : half_at(blk + 2);
        const PlaneBlock<Q> block(d, m, blk + 2);  // Q6_F, Q3_F: scales follow the float16 d
        uint32_t words[kPlanes > 0 ? kPlanes : 1];
        std::memcpy(words, blk + kHead, sizeof(words));
        const uint8_t* nib = blk + kHead + 4 * kPlanes;
        float* o = out + n * K + b * kBlock;
        for (int64_t j = 0; j < kBlock; ++j) {
          int32_t q = j < 16 ? nib[j] & 15 : nib[j - 16] >> 4;
          for (int64_t p = 0; p < kPlanes; ++p) q |= static_cast<int32_t>((words[p] >> j) & 1) << (4 + p);
          o[j] = block.weight(q, j < 16);
        }
      }
  });
}
// Q4_K (strand/kernels/gguf_linear_ref.py): per 256 weights d, dmin, 12 bytes of 6-bit scales and
// mins, 128 bytes of nibbles; w = (d sc) q - (dmin mn) per 32, llama.cpp's float32 ops.
void dequantize_q4k(const uint8_t* w, float* out, int64_t N, int64_t K) {
  const int64_t supers = K / 256;
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t s = 0; s < supers; ++s) {
        const uint8_t* sb = w + (n * supers + s) * 144;
        const uint8_t* b = sb + 4;
        const float d = half_at(sb), dmin = half_at(sb + 2);
        float* o = out + n * K + s * 256;
        for (int64_t j = 0; j < 8; ++j) {
          const int sc = j < 4 ? b[j] & 63 : (b[j + 4] & 15) | ((b[j - 4] >> 6) << 4);
          const int mn = j < 4 ? b[j + 4] & 63 : (b[j + 4] >> 4) | ((b[j] >> 6) << 4);
          const float scale = d * static_cast<float>(sc), min = dmin * static_cast<float>(mn);
          const uint8_t* qs = sb + 16 + 32 * (j / 2);
          for (int64_t l = 0; l < 32; ++l) {
            const int q = j % 2 ? qs[l] >> 4 : qs[l] & 15;
            o[32 * j + l] = scale * static_cast<float>(q) - min;
          }
        }
      }
  });
}
}  // namespace

void gguf_linear_small(at::Tensor out, at::Tensor x, at::Tensor packed, int64_t qtype,
                       c10::optional<at::Tensor> bias) {
  const int64_t M = x.size(0);
  STRAND_CHECK(M >= 1 && M <= 4, "gguf_linear_small takes 1 to 4 rows, got ", M);
  if (packed.dim() == 3) return gguf_tiled_linear(out, x, packed, qtype, bias);
  block_bytes(qtype);  // an unknown type: named as such
  STRAND_CHECK(qtype == kQ4_0 || qtype == kQ4_1 || qtype == kQ8_0, "GGUF type ", qtype,
               " is read over 16-row tiles (gguf_tile), not as rows (Q4_0, Q4_1, Q8_0 are)");
  check_packed(packed, qtype, x.size(1));
  if (x.scalar_type() == at::kBFloat16)
    linear_typed<bf16>(out, x, packed, qtype, bias);
  else
    linear_typed<float>(out, x, packed, qtype, bias);
}

void gguf_dequantize(at::Tensor out, at::Tensor packed, int64_t qtype) {
  if (packed.dim() == 3 && gguf_dequantize_tiles(out, packed, qtype)) return;
  if (packed.dim() == 3) {  // 16-row tiles (gguf_tiled.cpp): back to rows first
    at::Tensor rows = at::empty({out.size(0), out.size(1) / kBlock * block_bytes(qtype)},
                                packed.options());
    gguf_untile(rows, packed, qtype);
    packed = rows;
  }
  const int64_t N = out.size(0), K = check_packed(packed, qtype, out.size(1));
  STRAND_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && packed.size(0) == N,
              "gguf_dequantize writes a contiguous float32 [N, K]");
  const uint8_t* w = packed.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  switch (qtype) {
    case kQ8_0: dequantize_rows<kQ8_0>(w, o, N, K); break;
    case kQ4_0: dequantize_rows<kQ4_0>(w, o, N, K); break;
    case kQ4_K: dequantize_q4k(w, o, N, K); break;
    case kQ8_F: dequantize_q8f(w, o, N, K); break;
    case kIQ4_NL: dequantize_iq4<kIQ4_NL>(w, o, N, K); break;
    case kIQ4_F: dequantize_iq4<kIQ4_F>(w, o, N, K); break;
    case kQ5_0: dequantize_planes<kQ5_0>(w, o, N, K); break;
    case kQ5_1: dequantize_planes<kQ5_1>(w, o, N, K); break;
    case kQ5_F: dequantize_planes<kQ5_F>(w, o, N, K); break;
    case kQ6_F: dequantize_planes<kQ6_F>(w, o, N, K); break;
    case kQ3_F: dequantize_planes<kQ3_F>(w, o, N, K); break;
    default: dequantize_rows<kQ4_1>(w, o, N, K);
  }
}
