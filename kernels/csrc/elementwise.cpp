#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "vec16.h"

// The per-token arithmetic between a decoder layer's matmuls, one pass over memory each where
// torch would make five (RMSNorm: pow, mean, add, rsqrt, two muls; silu-and-mul: silu, mul and
// the chunk; rotary: four muls, two adds and a cat); the KV cache write by slot; and the greedy
// argmax over the logits. float32, rows parallel over ATen's threads.
// Built with -ffp-contract=off so each multiply and add rounds as torch's separate ops do.
namespace {
using namespace strand;

constexpr int64_t kRowsPerTask = 8;

// out = weight * (x * 1/sqrt(mean(x^2) + eps)), HF Llama's order; with a residual, x is first
// replaced by x + residual, which is also written to new_residual.
void norm_rows(float* out, float* new_residual, const float* x, const float* residual,
               const float* weight, int64_t rows, int64_t hidden, int64_t x_stride, float eps) {
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * x_stride;
      float* o = out + r * hidden;
      const float* src = xr;
      if (residual != nullptr) {
        float* nr = new_residual + r * hidden;
        const float* rr = residual + r * hidden;
        for (int64_t i = 0; i < hidden; ++i) nr[i] = xr[i] + rr[i];
        src = nr;
      }
      v16 acc = v16{};
      int64_t i = 0;
      for (; i + 16 <= hidden; i += 16) {
        const v16 v = load(src + i);
        acc += v * v;
      }
      float sum = 0.f;
      for (int l = 0; l < 16; ++l) sum += acc[l];
      for (; i < hidden; ++i) sum += src[i] * src[i];
      const float inv = 1.f / std::sqrt(sum / (float)hidden + eps);
      for (i = 0; i + 16 <= hidden; i += 16) store(o + i, load(weight + i) * (load(src + i) * inv));
      for (; i < hidden; ++i) o[i] = weight[i] * (src[i] * inv);
    }
  });
}

// out[r] = silu(gate_up[r, :n]) * gate_up[r, n:], silu(g) = g / (1 + e^-g).
void silu_rows(float* out, const float* gate_up, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gate_up + r * 2 * n;
      const float* u = g + n;
      float* o = out + r * n;
      int64_t i = 0;
      for (; i + 16 <= n; i += 16) {
        const v16 gv = load(g + i);
        store(o + i, gv / (1.f + vexp(-gv)) * load(u + i));
      }
      for (; i < n; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    }
  });
}

// Rotates heads in place, NeoX pairs (i, i + rot/2): x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin.
void rotate_rows(float* x, int64_t tokens, int64_t heads, int64_t token_stride,
                 int64_t head_stride, const int64_t* positions, const float* cos_sin,
                 int64_t rot) {
  const int64_t half = rot / 2;
  at::parallel_for(0, tokens, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cos_sin + positions[t] * rot;
      const float* s = c + half;
      for (int64_t h = 0; h < heads; ++h) {
        float* x1 = x + t * token_stride + h * head_stride;
        float* x2 = x1 + half;
        int64_t i = 0;
        for (; i + 16 <= half; i += 16) {
          const v16 a = load(x1 + i), b = load(x2 + i), cv = load(c + i), sv = load(s + i);
          store(x1 + i, a * cv - b * sv);
          store(x2 + i, b * cv + a * sv);
        }
        for (; i < half; ++i) {
          const float a = x1[i], b = x2[i];
          x1[i] = a * c[i] - b * s[i];
          x2[i] = b * c[i] + a * s[i];
        }
      }
    }
  });
}
// HF's bfloat16 RMSNorm: x + residual rounded (a bfloat16 add), the norm in float32, rounded,
// then times the weight, rounded again.
void norm_rows_bf16(bf16* out, bf16* new_residual, const bf16* x, const bf16* residual,
                    const bf16* weight, int64_t rows, int64_t hidden, int64_t x_stride,
                    float eps) {
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    std::vector<float> src(hidden);
    for (int64_t r = begin; r < end; ++r) {
      const bf16* xr = x + r * x_stride;
      int64_t i = 0;
      for (; i + 16 <= hidden; i += 16) {
        v16 v = load(xr + i);
        if (residual != nullptr) {
          v = round_bf16(v + load(residual + r * hidden + i));
          store(new_residual + r * hidden + i, v);
        }
        store(src.data() + i, v);
      }
      for (; i < hidden; ++i) {
        float v = to_float(xr[i]);
        if (residual != nullptr) {
          v = round_bf16(splat(v + to_float(residual[r * hidden + i])))[0];
          store_scalar(new_residual + r * hidden + i, v);
        }
        src[i] = v;
      }
      v16 acc = v16{};
      for (i = 0; i + 16 <= hidden; i += 16) {
        const v16 v = load(src.data() + i);
        acc += v * v;
      }
      float sum = 0.f;
      for (int l = 0; l < 16; ++l) sum += acc[l];
      for (; i < hidden; ++i) sum += src[i] * src[i];
      const float inv = 1.f / std::sqrt(sum / (float)hidden + eps);
      bf16* o = out + r * hidden;
      for (i = 0; i + 16 <= hidden; i += 16)
        store(o + i, load(weight + i) * round_bf16(load(src.data() + i) * inv));
      for (; i < hidden; ++i)
        store_scalar(o + i, to_float(weight[i]) * round_bf16(splat(src[i] * inv))[0]);
    }
  });
}

// HF's bfloat16 gated MLP activation: silu(gate) rounded, times up, rounded.
void silu_rows_bf16(bf16* out, const bf16* gate_up, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const bf16* g = gate_up + r * 2 * n;
      const bf16* u = g + n;
      bf16* o = out + r * n;
      int64_t i = 0;
      for (; i + 16 <= n; i += 16) {
        const v16 gv = load(g + i);
        store(o + i, round_bf16(gv / (1.f + vexp(-gv))) * load(u + i));
      }
      for (; i < n; ++i) {
        const float gv = to_float(g[i]);
        store_scalar(o + i, round_bf16(splat(gv / (1.f + std::exp(-gv))))[0] * to_float(u[i]));
      }
    }
  });
}

// HF's bfloat16 rotary: cos and sin rounded to bfloat16, and every product and sum rounded.
void rotate_rows_bf16(bf16* x, int64_t tokens, int64_t heads, int64_t token_stride,
                      int64_t head_stride, const int64_t* positions, const float* cos_sin,
                      int64_t rot) {
  const int64_t half = rot / 2;
  at::parallel_for(0, tokens, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cos_sin + positions[t] * rot;
      const float* s = c + half;
      for (int64_t h = 0; h < heads; ++h) {
        bf16* x1 = x + t * token_stride + h * head_stride;
        bf16* x2 = x1 + half;
        int64_t i = 0;
        for (; i + 16 <= half; i += 16) {
          const v16 a = load(x1 + i), b = load(x2 + i);
          const v16 cv = round_bf16(load(c + i)), sv = round_bf16(load(s + i));
          store(x1 + i, round_bf16(a * cv) - round_bf16(b * sv));
          store(x2 + i, round_bf16(b * cv) + round_bf16(a * sv));
        }
        for (; i < half; ++i) {
          const float a = to_float(x1[i]), b = to_float(x2[i]);
          const float cv = round_bf16(splat(c[i]))[0], sv = round_bf16(splat(s[i]))[0];
          store_scalar(x1 + i, round_bf16(splat(a * cv))[0] - round_bf16(splat(b * sv))[0]);
          store_scalar(x2 + i, round_bf16(splat(b * cv))[0] + round_bf16(splat(a * sv))[0]);
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
// seen, stays); the 16 lanes are then settled by value, ties by the smaller index.
void argmax_rows(int64_t* out, const float* x, int64_t rows, int64_t n, int64_t stride) {
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    const i16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * stride;
      v16 best = splat(-__builtin_huge_valf());
      i16 at = i16{} - 1;  // -1: nothing seen in this lane
      int64_t i = 0;
      for (; i + 16 <= n; i += 16) {
        const v16 v = load(xr + i);
        const i16 take = (v > best) | ((v != v) & (best == best)) | (at < 0);
        best = take ? v : best;
        at = take ? lane + (int32_t)i : at;
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
      for (int l = 0; l < 16; ++l)
        if (at[l] >= 0) consider(best[l], at[l]);
      for (; i < n; ++i) consider(xr[i], i);
      out[r] = found;
    }
  });
}
}  // namespace

void write_kv(torch::Tensor key_cache, torch::Tensor value_cache, torch::Tensor key,
              torch::Tensor value, torch::Tensor slots) {
  const int64_t size = key.element_size();
  const auto bytes = [](torch::Tensor t) { return static_cast<char*>(t.data_ptr()); };
  write_rows(bytes(key_cache), bytes(value_cache), bytes(key), bytes(value),
             slots.data_ptr<int64_t>(), key.size(0), key.size(1) * key.size(2) * size,
             key.stride(0) * size, value.stride(0) * size);
}

static bf16* bf16_ptr(torch::Tensor t) { return reinterpret_cast<bf16*>(t.data_ptr<at::BFloat16>()); }

void argmax(torch::Tensor out, torch::Tensor x) {
  argmax_rows(out.data_ptr<int64_t>(), x.data_ptr<float>(), x.size(0), x.size(1), x.stride(0));
}

void rms_norm(torch::Tensor out, torch::Tensor x, torch::Tensor weight, double eps) {
  if (x.scalar_type() == at::kBFloat16)
    return norm_rows_bf16(bf16_ptr(out), nullptr, bf16_ptr(x), nullptr, bf16_ptr(weight),
                          x.size(0), x.size(1), x.stride(0), (float)eps);
  norm_rows(out.data_ptr<float>(), nullptr, x.data_ptr<float>(), nullptr,
            weight.data_ptr<float>(), x.size(0), x.size(1), x.stride(0), (float)eps);
}

void add_rms_norm(torch::Tensor out, torch::Tensor new_residual, torch::Tensor x,
                  torch::Tensor residual, torch::Tensor weight, double eps) {
  if (x.scalar_type() == at::kBFloat16)
    return norm_rows_bf16(bf16_ptr(out), bf16_ptr(new_residual), bf16_ptr(x),
                          bf16_ptr(residual), bf16_ptr(weight), x.size(0), x.size(1),
                          x.stride(0), (float)eps);
  norm_rows(out.data_ptr<float>(), new_residual.data_ptr<float>(), x.data_ptr<float>(),
            residual.data_ptr<float>(), weight.data_ptr<float>(), x.size(0), x.size(1),
            x.stride(0), (float)eps);
}

void silu_and_mul(torch::Tensor out, torch::Tensor gate_up) {
  if (gate_up.scalar_type() == at::kBFloat16)
    return silu_rows_bf16(bf16_ptr(out), bf16_ptr(gate_up), gate_up.size(0),
                          gate_up.size(1) / 2);
  silu_rows(out.data_ptr<float>(), gate_up.data_ptr<float>(), gate_up.size(0),
            gate_up.size(1) / 2);
}

void rotary_neox(torch::Tensor x, torch::Tensor positions, torch::Tensor cos_sin) {
  if (x.scalar_type() == at::kBFloat16)
    return rotate_rows_bf16(bf16_ptr(x), x.size(0), x.size(1), x.stride(0), x.stride(1),
                            positions.data_ptr<int64_t>(), cos_sin.data_ptr<float>(),
                            cos_sin.size(1));
  rotate_rows(x.data_ptr<float>(), x.size(0), x.size(1), x.stride(0), x.stride(1),
              positions.data_ptr<int64_t>(), cos_sin.data_ptr<float>(), cos_sin.size(1));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "RMSNorm over rows, float32 or bfloat16");
  m.def("add_rms_norm", &add_rms_norm, "residual add then RMSNorm, float32 or bfloat16");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up over rows, float32 or bfloat16");
  m.def("rotary_neox", &rotary_neox, "NeoX rotary embedding in place, float32 or bfloat16");
  m.def("write_kv", &write_kv, "key/value rows into the paged cache by slot, any dtype");
  m.def("argmax", &argmax, "first index of each row's maximum, float32");
}
