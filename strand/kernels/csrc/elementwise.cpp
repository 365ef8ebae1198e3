// Rounding must happen where torch's ops round: no a*b+c fused into one FMA in this file
// (the attention sources may fuse; they are compared within a tolerance).
#pragma GCC optimize("fp-contract=off")

#include "kernels.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "check.h"
#include "vec16.h"

// The per-token arithmetic between a decoder layer's matmuls, one pass over memory each where
// torch would make five (RMSNorm: pow, mean, add, rsqrt, two muls; silu-and-mul: silu, mul and
// the chunk; rotary: four muls, two adds and a cat); the KV cache write by slot; and the greedy
// argmax over the logits. float32, rows parallel over ATen's threads.
// Built with -ffp-contract=off so each multiply and add rounds as torch's separate ops do.
//
// The arithmetic is on register-wide vectors (vec16.h's vl: 16 floats with AVX-512, 8 with AVX2),
// walked 16 values a block (kParts vl each) so that every level splits rows into vector and
// scalar parts at the same place and sums in the same order: the same bits at every ISA level.
// On 64-byte v16s under AVX2, GCC lowered the selects of exp and argmax and the carried sums
// through the stack: silu-and-mul, argmax and RMSNorm then took several times (argmax over ten
// times) their AVX-512 time.
namespace {
using namespace strand;

constexpr int64_t kRowsPerTask = 8;
constexpr int kParts = 16 / kLanes;  // vl per 16-value block

// What a torch op in T leaves of a float32 result: itself for float, the value rounded to
// bfloat16 for bf16. The kernels call it after each op HF runs in the model's dtype.
inline vl rnd(vl v, float*) { return v; }
inline vl rnd(vl v, bf16*) { return round_bf16_l(v); }
template <typename T>
inline vl rnd(vl v) { return rnd(v, static_cast<T*>(nullptr)); }
template <typename T>
inline float rnd1(float x) { return rnd<T>(vl{} + x)[0]; }

// out = weight * (x * 1/sqrt(mean(x^2) + eps)), HF Llama's order; with a residual, x is first
// replaced by x + residual, which is also written to new_residual. In bfloat16 the sum is
// rounded (a bfloat16 add), the norm computed in float32 and rounded before the weight.
template <typename T>
void norm_rows(T* out, T* new_residual, const T* x, const T* residual, const T* weight,
               int64_t rows, int64_t hidden, int64_t x_stride, float eps) {
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    std::vector<float> src(hidden);  // the (summed) row in float32
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * x_stride;
      int64_t i = 0;
      for (; i + 16 <= hidden; i += 16) {
        for (int p = 0; p < kParts; ++p) {
          const int64_t j = i + p * kLanes;
          vl v = load_l(xr + j);
          if (residual != nullptr) {
            v = rnd<T>(v + load_l(residual + r * hidden + j));
            store_l(new_residual + r * hidden + j, v);
          }
          store_l(src.data() + j, v);
        }
      }
      for (; i < hidden; ++i) {
        float v = to_float(xr[i]);
        if (residual != nullptr) {
          v = rnd1<T>(v + to_float(residual[r * hidden + i]));
          store_scalar(new_residual + r * hidden + i, v);
        }
        src[i] = v;
      }
      vl acc[kParts];  // acc[p][l]: the squares of lane p * kLanes + l of every block
      for (int p = 0; p < kParts; ++p) acc[p] = vl{};
      for (i = 0; i + 16 <= hidden; i += 16) {
        for (int p = 0; p < kParts; ++p) {
          const vl v = load_l(src.data() + i + p * kLanes);
          acc[p] += v * v;
        }
      }
      float sum = 0.f;
      for (int p = 0; p < kParts; ++p)
        for (int l = 0; l < kLanes; ++l) sum += acc[p][l];
      for (; i < hidden; ++i) sum += src[i] * src[i];
      const float inv = 1.f / std::sqrt(sum / (float)hidden + eps);
      T* o = out + r * hidden;
      for (i = 0; i + 16 <= hidden; i += 16) {
        for (int p = 0; p < kParts; ++p) {
          const int64_t j = i + p * kLanes;
          store_l(o + j, load_l(weight + j) * rnd<T>(load_l(src.data() + j) * inv));
        }
      }
      for (; i < hidden; ++i) store_scalar(o + i, to_float(weight[i]) * rnd1<T>(src[i] * inv));
    }
  });
}

#if defined(__AVX512F__)
// silu(g) = g * sigmoid(g) for float32 without a division: VDIVPS (16 lanes every ~16 cycles)
// and vexp's clamps made silu-and-mul compute-bound, nearly twice the time of a plain product
// over the same bytes (SmolLM2's 30 layers at 512 tokens, one thread).
// sigmoid(g) = 1 / (1 + e^-|g|) for g >= 0 and e^-|g| / (1 + e^-|g|) below: e^-|g| is in
// (0, 1], so nothing overflows, and 1 / (1 + e) comes from RCP14 (14 bits) and one Newton step
// (28 bits, under float32's 24). e^-|g| is vexp's polynomial with 2^n applied by VSCALEFPS
// (arguments under -87 give 0, as in vexp). Within 2 ulp of torch's g / (1 + e^-g) (the
// tests' tolerance is 1e-5 relative); bfloat16 keeps the division, whose rounding it matches
// bit for bit.
inline v16 silu_f32(v16 g) {
  // Explicit FMAs: the file is built without contraction (for the ops that round as torch's).
  const auto fma = [](v16 a, v16 b, float c) {
    return (v16)_mm512_fmadd_ps((__m512)a, (__m512)b, _mm512_set1_ps(c));
  };
  const v16 x = -(v16)_mm512_abs_ps((__m512)g);  // -|g| <= 0
  const __mmask16 live = _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(-87.f), _CMP_GE_OQ);
  const v16 xc = (v16)_mm512_max_ps((__m512)x, _mm512_set1_ps(-87.f));
  const v16 n = (v16)_mm512_roundscale_ps((__m512)(xc * 1.44269504088896341f),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const v16 r = (v16)_mm512_fmadd_ps(
      (__m512)n, _mm512_set1_ps(2.12194440e-4f),
      _mm512_fnmadd_ps((__m512)n, _mm512_set1_ps(0.693359375f), (__m512)xc));
  v16 p = fma(r, splat(1.9875691500e-4f), 1.3981999507e-3f);
  p = fma(p, r, 8.3334519073e-3f);
  p = fma(p, r, 4.1665795894e-2f);
  p = fma(p, r, 1.6666665459e-1f);
  p = fma(p, r, 5.0000001201e-1f);
  const v16 y = (v16)_mm512_fmadd_ps((__m512)(p * r), (__m512)r, (__m512)(r + 1.f));
  const v16 e = (v16)_mm512_maskz_scalef_ps(live, (__m512)y, (__m512)n);
  const v16 d = e + 1.f;  // in [1, 2]
  const v16 inv0 = (v16)_mm512_rcp14_ps((__m512)d);
  const v16 inv = inv0 * fma(-d, inv0, 2.f);
  return g * (g >= 0.f ? inv : e * inv);
}
// On a register-wide vector (vl is v16 under AVX-512).
inline vl silu_vec(vl g, float*) { return silu_f32(g); }
#else
inline vl silu_vec(vl g, float*) { return g / (1.f + vexp(-g)); }
#endif
inline vl silu_vec(vl g, bf16*) { return g / (1.f + vexp(-g)); }

#if defined(__AVX512F__)
// silu(g) rounded to bfloat16 for every bfloat16 g, indexed by g's bits: the vector code's own
// results (silu_vec then rnd, 65536 values, built once), so a lookup gives the same bits. A
// 16-lane gather from the 128 KB table (L2-resident) replaces exp and the division: one
// thread, 512 x 1536 (a SmolLM2 layer's prefill) in well under half the time.
const uint16_t* silu_bf16_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(65536 + 16);  // + 16: gathers read 4 bytes at 2-byte steps
    alignas(64) uint16_t bits[16];
    for (uint32_t b0 = 0; b0 < 65536; b0 += 16) {
      for (uint32_t i = 0; i < 16; ++i) bits[i] = static_cast<uint16_t>(b0 + i);
      const vl g = load_l(reinterpret_cast<const bf16*>(bits));
      store_l(reinterpret_cast<bf16*>(t.data() + b0), rnd<bf16>(silu_vec(g, (bf16*)nullptr)));
    }
    return t;
  }();
  return table.data();
}

// 16 values: silu(g) from the table, times up, rounded to bfloat16 (as the formula path).
inline void silu_mul16_table(bf16* o, const bf16* g, const bf16* u, const uint16_t* table) {
  const __m512i idx =
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
  const __m512i s = _mm512_slli_epi32(_mm512_i32gather_epi32(idx, table, 2), 16);
  store_l(o, reinterpret_cast<const vl&>(s) * load_l(u));
}
#endif

// out[r] = silu(gate_up[r, :n]) * gate_up[r, n:], silu(g) = g / (1 + e^-g) (rounded to T, as
// HF's activation output is, before the product).
template <typename T>
void silu_rows(T* out, const T* gate_up, int64_t rows, int64_t n) {
#if defined(__AVX512F__)
  const uint16_t* table = std::is_same_v<T, bf16> ? silu_bf16_table() : nullptr;
#endif
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gate_up + r * 2 * n;
      const T* u = g + n;
      T* o = out + r * n;
      int64_t i = 0;
#if defined(__AVX512F__)
      if constexpr (std::is_same_v<T, bf16>) {
        for (; i + 16 <= n; i += 16) silu_mul16_table(o + i, g + i, u + i, table);
      }
#endif
      for (; i + 16 <= n; i += 16) {
        for (int p = 0; p < kParts; ++p) {
          const int64_t j = i + p * kLanes;
          const vl gv = load_l(g + j);
          store_l(o + j, rnd<T>(silu_vec(gv, static_cast<T*>(nullptr))) * load_l(u + j));
        }
      }
      for (; i < n; ++i) {
        const float gv = to_float(g[i]);
        store_scalar(o + i, rnd1<T>(gv / (1.f + std::exp(-gv))) * to_float(u[i]));
      }
    }
  });
}

// Rotates heads in place, NeoX pairs (i, i + rot/2): x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin.
// In bfloat16, cos and sin are rounded first and every product, as HF's bfloat16 ops do.
template <typename T>
void rotate_rows(T* x, int64_t tokens, int64_t heads, int64_t token_stride, int64_t head_stride,
                 const int64_t* positions, const float* cos_sin, int64_t rot) {
  const int64_t half = rot / 2;
  at::parallel_for(0, tokens, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cos_sin + positions[t] * rot;
      const float* s = c + half;
      for (int64_t h = 0; h < heads; ++h) {
        T* x1 = x + t * token_stride + h * head_stride;
        T* x2 = x1 + half;
        int64_t i = 0;
        for (; i + 16 <= half; i += 16) {
          for (int p = 0; p < kParts; ++p) {
            const int64_t j = i + p * kLanes;
            const vl a = load_l(x1 + j), b = load_l(x2 + j);
            const vl cv = rnd<T>(load_l(c + j)), sv = rnd<T>(load_l(s + j));
            store_l(x1 + j, rnd<T>(a * cv) - rnd<T>(b * sv));
            store_l(x2 + j, rnd<T>(b * cv) + rnd<T>(a * sv));
          }
        }
        for (; i < half; ++i) {
          const float a = to_float(x1[i]), b = to_float(x2[i]);
          const float cv = rnd1<T>(c[i]), sv = rnd1<T>(s[i]);
          store_scalar(x1 + i, rnd1<T>(a * cv) - rnd1<T>(b * sv));
          store_scalar(x2 + i, rnd1<T>(b * cv) + rnd1<T>(a * sv));
        }
      }
    }
  });
}

// key/value row t -> cache row slots[t] (a negative slot is padding: skipped); rows of `row`
// bytes, any element type.
void write_rows(char* kc, char* vc, const char* k, const char* v, const int64_t* slots,
                int64_t tokens, int64_t row, int64_t k_stride, int64_t v_stride) {
  at::parallel_for(0, tokens, 4 * kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slots[t] < 0) continue;
      std::memcpy(kc + slots[t] * row, k + t * k_stride, row);
      std::memcpy(vc + slots[t] * row, v + t * v_stride, row);
    }
  });
}

// The first index of each row's maximum, NaN counting as the maximum (torch.argmax's rule).
// One vector pass keeps, per lane, the largest value seen and its first index (a NaN, once
// seen, stays); the lanes are then settled by value, ties by the smaller index (so the answer
// does not depend on the lane count). Two sets of lanes, for two independent compare-and-select
// chains: one chain is bound by its latency (8 floats a 3-cycle step under AVX2).
void argmax_rows(int64_t* out, const float* x, int64_t rows, int64_t n, int64_t stride) {
  constexpr int kSets = 2;
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    il lane;
    for (int l = 0; l < kLanes; ++l) lane[l] = l;
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * stride;
      vl best[kSets];
      il at[kSets];
      for (int k = 0; k < kSets; ++k) {
        best[k] = vl{} - __builtin_huge_valf();
        at[k] = il{} - 1;  // -1: nothing seen in this lane
      }
      int64_t i = 0;
      for (; i + kSets * kLanes <= n; i += kSets * kLanes) {
        for (int k = 0; k < kSets; ++k) {
          const vl v = load_l(xr + i + k * kLanes);
          const il take = (v > best[k]) | ((v != v) & (best[k] == best[k])) | (at[k] < 0);
          best[k] = take ? v : best[k];
          at[k] = take ? lane + (int32_t)(i + k * kLanes) : at[k];
        }
      }
      float m = 0.f;
      int64_t found = -1;
      auto consider = [&](float v, int64_t j) {
        const bool v_nan = v != v, m_nan = m != m;
        if (found < 0 || (v_nan && !m_nan) || (!m_nan && v > m) ||
            ((v == m || (v_nan && m_nan)) && j < found)) {
          m = v;
          found = j;
        }
      };
      for (int k = 0; k < kSets; ++k)
        for (int l = 0; l < kLanes; ++l)
          if (at[k][l] >= 0) consider(best[k][l], at[k][l]);
      for (; i < n; ++i) consider(xr[i], i);
      out[r] = found;
    }
  });
}

// write_rows for float32 rows into a bfloat16 cache (kv_cache_dtype="bfloat16"): each value
// rounded as torch's .to(torch.bfloat16) rounds it. n values a row.
void write_rows_bf16(bf16* kc, bf16* vc, const float* k, const float* v, const int64_t* slots,
                     int64_t tokens, int64_t n, int64_t k_stride, int64_t v_stride) {
  const auto row = [n](bf16* dst, const float* src) {
    int64_t d = 0;
    for (; d + 16 <= n; d += 16) store(dst + d, load(src + d));
    for (; d < n; ++d) store_scalar(dst + d, src[d]);
  };
  at::parallel_for(0, tokens, 4 * kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slots[t] < 0) continue;
      row(kc + slots[t] * n, k + t * k_stride);
      row(vc + slots[t] * n, v + t * v_stride);
    }
  });
}

}  // namespace

void write_kv(at::Tensor key_cache, at::Tensor value_cache, at::Tensor key,
              at::Tensor value, at::Tensor slots) {
  if (key_cache.scalar_type() != key.scalar_type()) {
    STRAND_CHECK(key.scalar_type() == at::kFloat && key_cache.scalar_type() == at::kBFloat16,
                 "write_kv converts only float32 rows into a bfloat16 cache, got ",
                 key.scalar_type(), " into ", key_cache.scalar_type());
    write_rows_bf16(static_cast<bf16*>(key_cache.data_ptr()),
                    static_cast<bf16*>(value_cache.data_ptr()), key.data_ptr<float>(),
                    value.data_ptr<float>(), slots.data_ptr<int64_t>(), key.size(0),
                    key.size(1) * key.size(2), key.stride(0), value.stride(0));
    return;
  }
  const int64_t size = key.element_size();
  const auto bytes = [](at::Tensor t) { return static_cast<char*>(t.data_ptr()); };
  write_rows(bytes(key_cache), bytes(value_cache), bytes(key), bytes(value),
             slots.data_ptr<int64_t>(), key.size(0), key.size(1) * key.size(2) * size,
             key.stride(0) * size, value.stride(0) * size);
}


void argmax(at::Tensor out, at::Tensor x) {
  argmax_rows(out.data_ptr<int64_t>(), x.data_ptr<float>(), x.size(0), x.size(1), x.stride(0));
}

template <typename Fn>
void by_dtype(at::Tensor t, Fn fn) {  // fn(T* tag): float or bf16
  if (t.scalar_type() == at::kBFloat16)
    fn(static_cast<bf16*>(nullptr));
  else
    fn(static_cast<float*>(nullptr));
}

template <typename T>
T* ptr(at::Tensor t) {
  return static_cast<T*>(t.data_ptr());
}

void rms_norm(at::Tensor out, at::Tensor x, at::Tensor weight, double eps) {
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    norm_rows<T>(ptr<T>(out), nullptr, ptr<T>(x), nullptr, ptr<T>(weight), x.size(0),
                 x.size(1), x.stride(0), (float)eps);
  });
}

void add_rms_norm(at::Tensor out, at::Tensor new_residual, at::Tensor x,
                  at::Tensor residual, at::Tensor weight, double eps) {
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    norm_rows<T>(ptr<T>(out), ptr<T>(new_residual), ptr<T>(x), ptr<T>(residual),
                 ptr<T>(weight), x.size(0), x.size(1), x.stride(0), (float)eps);
  });
}

void silu_and_mul(at::Tensor out, at::Tensor gate_up) {
  by_dtype(gate_up, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    silu_rows<T>(ptr<T>(out), ptr<T>(gate_up), gate_up.size(0), gate_up.size(1) / 2);
  });
}

void rotary_neox(at::Tensor x, at::Tensor positions, at::Tensor cos_sin) {
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rotate_rows<T>(ptr<T>(x), x.size(0), x.size(1), x.stride(0), x.stride(1),
                   positions.data_ptr<int64_t>(), cos_sin.data_ptr<float>(), cos_sin.size(1));
  });
}
