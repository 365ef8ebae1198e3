// The element types of a query and the paged KV cache it attends over, for the attention
// kernels and the KV write.
//
// A cache in the query's dtype (float32 or bfloat16), or a bfloat16 cache under float32
// activations: vLLM's kv_cache_dtype="bfloat16" with float32 weights. Such a cache holds half
// the bytes, and decode attention's time is the time to read them; the kernels widen each
// bfloat16 row as they load it (exact) and compute in float32, as they do for bfloat16 models.
#pragma once

#include <ATen/core/Tensor.h>

#include "check.h"
#include "vec16.h"

namespace strand {

// fn(Q* tag, KV* tag) with Q, KV in {float, bf16}: (float, float), (bf16, bf16), (float, bf16).
template <typename Fn>
void by_kv_dtypes(const at::Tensor& query, const at::Tensor& cache, Fn fn) {
  const auto q = query.scalar_type(), kv = cache.scalar_type();
  const bool known = (q == at::kFloat || q == at::kBFloat16) &&
                     (kv == at::kFloat || kv == at::kBFloat16);
  STRAND_CHECK(known && !(q == at::kBFloat16 && kv == at::kFloat),
               "query and kv cache must be float32/float32, bfloat16/bfloat16 or "
               "float32/bfloat16, got ", q, "/", kv);
  if (q == at::kBFloat16)
    fn(static_cast<bf16*>(nullptr), static_cast<bf16*>(nullptr));
  else if (kv == at::kBFloat16)
    fn(static_cast<float*>(nullptr), static_cast<bf16*>(nullptr));
  else
    fn(static_cast<float*>(nullptr), static_cast<float*>(nullptr));
}

template <typename T>
T* data_as(const at::Tensor& t) {  // after by_kv_dtypes checked the element type
  return static_cast<T*>(t.data_ptr());
}

}  // namespace strand
