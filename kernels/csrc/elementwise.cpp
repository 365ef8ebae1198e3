#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>

#include "vec16.h"

// The per-token arithmetic between a decoder layer's matmuls, one pass over memory each where
// torch would make five (RMSNorm: pow, mean, add, rsqrt, two muls; silu-and-mul: silu, mul and
// the chunk; rotary: four muls, two adds and a cat). float32, rows parallel over ATen's threads.
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
}  // namespace

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
}
