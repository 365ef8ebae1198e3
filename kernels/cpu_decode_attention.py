"""Decode attention straight from the paged KV cache on CPU: a C++ kernel built on first use.

The pure-torch backend gathers every decode's context out of the paged cache into a padded batch
before SDPA, which per layer and step copies the whole context twice (K and V). This kernel reads
each K/V row where it lies, once, parallel over requests with ATen's thread pool. In the engine
at 64 decodes on the 2-core CPU, attention took 34 ms per step with it against 49 ms with
gather + SDPA; it is then bound by memory bandwidth (fp32 K/V read once per step).
Its reference is kernels/paged_attention_ref.py (tests/kernels/test_cpu_decode_attention.py).

Built with torch.utils.cpp_extension (a C++ compiler and ninja). Where that fails, or with
STRAND_DISABLE_CPU_KERNELS=1, the caller keeps the pure-torch path; `unavailable_reason()` says why.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

_SOURCE = r"""#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>
#include <algorithm>
// out[r, h] = softmax(q[r, h] . K[r, :len] * scale) @ V[r, :len], K/V read through the block table
// where they lie. float32, contiguous tensors (the Python wrapper checks). One task per request:
// each token's K (then V) row, all kv heads side by side, is read once for every query head, so
// the cache is streamed block by block. At 64 decodes this runs at about one core's memory
// bandwidth, which is what fp32 K/V reads cost.
void decode_attention(torch::Tensor out, torch::Tensor query, torch::Tensor key_cache,
                      torch::Tensor value_cache, torch::Tensor block_table,
                      torch::Tensor seq_lens, double scale) {
  const int64_t R = query.size(0), H = query.size(1), D = query.size(2);
  const int64_t BS = key_cache.size(1), KVH = key_cache.size(2), G = H / KVH;
  const int64_t MB = block_table.size(1);
  const float* q = query.data_ptr<float>();
  const float* kc = key_cache.data_ptr<float>();
  const float* vc = value_cache.data_ptr<float>();
  const int32_t* bt = block_table.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  float* o = out.data_ptr<float>();
  const int64_t RS = KVH * D;
  const float sc = (float)scale;
  at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s, acc;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t len = lens[r];
      s.resize(H * len);
      const float* qr = q + r * H * D;
      const int32_t* blocks = bt + r * MB;
      const int64_t nblk = (len + BS - 1) / BS;
      // Scores: every K row (all kv heads, contiguous) is read once, for all H query heads.
      for (int64_t b = 0; b < nblk; ++b) {
        const float* kb = kc + (int64_t)blocks[b] * BS * RS;
        const int64_t n = std::min(BS, len - b * BS);
        for (int64_t i = 0; i < n; ++i) {
          const float* krow = kb + i * RS;
          const int64_t t = b * BS + i;
          for (int64_t h = 0; h < H; ++h) {
            const float* k = krow + (h / G) * D;
            const float* qh = qr + h * D;
            float dot = 0.f;
#pragma omp simd reduction(+:dot)
            for (int64_t d = 0; d < D; ++d) dot += qh[d] * k[d];
            s[h * len + t] = dot * sc;
          }
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        float* sh = s.data() + h * len;
        float m = sh[0];
        for (int64_t t = 1; t < len; ++t) m = sh[t] > m ? sh[t] : m;
#pragma omp simd
        for (int64_t t = 0; t < len; ++t) sh[t] = std::exp(sh[t] - m);
        float sum = 0.f;
#pragma omp simd reduction(+:sum)
        for (int64_t t = 0; t < len; ++t) sum += sh[t];
        const float inv = 1.f / sum;
#pragma omp simd
        for (int64_t t = 0; t < len; ++t) sh[t] *= inv;
      }
      acc.assign(H * D, 0.f);
      for (int64_t b = 0; b < nblk; ++b) {
        const float* vb = vc + (int64_t)blocks[b] * BS * RS;
        const int64_t n = std::min(BS, len - b * BS);
        for (int64_t i = 0; i < n; ++i) {
          const float* vrow = vb + i * RS;
          const int64_t t = b * BS + i;
          for (int64_t h = 0; h < H; ++h) {
            const float* v = vrow + (h / G) * D;
            const float p = s[h * len + t];
            float* a = acc.data() + h * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) a[d] += p * v[d];
          }
        }
      }
      std::copy(acc.begin(), acc.end(), o + r * H * D);
    }
  });
}
"""

_module: ModuleType | None = None
_error: str | None = None


def _build() -> ModuleType | None:
    global _module, _error
    if _module is not None or _error is not None:
        return _module
    if os.environ.get("STRAND_DISABLE_CPU_KERNELS"):
        _error = "disabled by STRAND_DISABLE_CPU_KERNELS"
        return None
    try:
        from torch.utils.cpp_extension import load_inline

        logger.info("building the CPU decode attention kernel (once; cached afterwards)")
        _module = load_inline(
            name="strand_cpu_decode_attention_v2",
            cpp_sources=_SOURCE,
            functions=["decode_attention"],
            extra_cflags=["-O3", "-march=native", "-fopenmp", "-fno-math-errno"],
            extra_ldflags=["-fopenmp"],
        )
    except Exception as exc:  # no compiler or ninja: keep the torch path, and say why once
        _error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        logger.warning("CPU decode attention kernel unavailable (%s); using the torch path",
                       _error)
    return _module


def is_available() -> bool:
    """Builds on the first call."""
    return _build() is not None


def unavailable_reason() -> str | None:
    _build()
    return _error


def decode_attention(
    query: torch.Tensor,  # [num_reqs, num_heads, head_dim] float32, one token per request
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim] float32
    block_table: torch.Tensor,  # [num_reqs, max_num_blocks] int32, covering seq_lens
    seq_lens: torch.Tensor,  # [num_reqs] int32, each >= 1
    scale: float,
) -> torch.Tensor:  # [num_reqs, num_heads, head_dim]
    module = _build()
    if module is None:
        raise RuntimeError(f"CPU decode attention kernel unavailable: {_error}")
    if query.dtype != torch.float32 or kv_cache.dtype != torch.float32:
        raise ValueError(f"decode_attention needs float32, got {query.dtype} and "
                         f"{kv_cache.dtype}")
    if query.shape[1] % kv_cache.shape[3]:
        raise ValueError(f"num_heads ({query.shape[1]}) must be a multiple of num_kv_heads "
                         f"({kv_cache.shape[3]})")
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache must be contiguous")
    out = torch.empty_like(query)
    module.decode_attention(out, query.contiguous(), kv_cache[0], kv_cache[1],
                            block_table.to(torch.int32).contiguous(),
                            seq_lens.to(torch.int32).contiguous(), float(scale))
    return out
