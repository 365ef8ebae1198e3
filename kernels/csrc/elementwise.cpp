#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstring>

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
// key/value row t -> cache row slots[t] (a negative slot is padding: skipped).
void write_rows(float* kc, float* vc, const float* k, const float* v, const int64_t* slots,
                int64_t tokens, int64_t row, int64_t k_stride, int64_t v_stride) {
  at::parallel_for(0, tokens, 4 * kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slots[t] < 0) continue;
      std::memcpy(kc + slots[t] * row, k + t * k_stride, row * sizeof(float));
      std::memcpy(vc + slots[t] * row, v + t * v_stride, row * sizeof(float));
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
  write_rows(key_cache.data_ptr<float>(), value_cache.data_ptr<float>(), key.data_ptr<float>(),
             value.data_ptr<float>(), slots.data_ptr<int64_t>(), key.size(0),
             key.size(1) * key.size(2), key.stride(0), value.stride(0));
}

void argmax(torch::Tensor out, torch::Tensor x) {
  argmax_rows(out.data_ptr<int64_t>(), x.data_ptr<float>(), x.size(0), x.size(1), x.stride(0));
}

void rms_norm(torch::Tensor out, torch::Tensor x, torch::Tensor weight, double eps) {
  norm_rows(out.data_ptr<float>(), nullptr, x.data_ptr<float>(), nullptr,
            weight.data_ptr<float>(), x.size(0), x.size(1), x.stride(0), (float)eps);
}

void add_rms_norm(torch::Tensor out, torch::Tensor new_residual, torch::Tensor x,
                  torch::Tensor residual, torch::Tensor weight, double eps) {
  norm_rows(out.data_ptr<float>(), new_residual.data_ptr<float>(), x.data_ptr<float>(),
            residual.data_ptr<float>(), weight.data_ptr<float>(), x.size(0), x.size(1),
            x.stride(0), (float)eps);
}

void silu_and_mul(torch::Tensor out, torch::Tensor gate_up) {
  silu_rows(out.data_ptr<float>(), gate_up.data_ptr<float>(), gate_up.size(0),
            gate_up.size(1) / 2);
}

void rotary_neox(torch::Tensor x, torch::Tensor positions, torch::Tensor cos_sin) {
  rotate_rows(x.data_ptr<float>(), x.size(0), x.size(1), x.stride(0), x.stride(1),
              positions.data_ptr<int64_t>(), cos_sin.data_ptr<float>(), cos_sin.size(1));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "RMSNorm over rows, float32");
  m.def("add_rms_norm", &add_rms_norm, "residual add then RMSNorm, float32");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up over rows, float32");
  m.def("rotary_neox", &rotary_neox, "NeoX rotary embedding in place, float32");
  m.def("write_kv", &write_kv, "key/value rows into the paged cache by slot, float32");
  m.def("argmax", &argmax, "first index of each row's maximum, float32");
}
