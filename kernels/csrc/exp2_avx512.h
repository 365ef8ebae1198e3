// 2^x for x <= 0 with AVX-512, for the softmax of the bfloat16 prefill attention kernels (AMX and
// VDPBF16PS), which round their probabilities to bfloat16 and keep their scores in base 2.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

namespace strand {

// 2^t for t <= 0, t = (score * scale - max) * log2(e) from one fused multiply-subtract: 2^n
// (VSCALEFPS) times 2^f, f = t - n in [-1/2, 1/2], by its Taylor polynomial of degree 5
// (relative error under 3e-6, against the 2^-9 to which P is rounded for P.V). t is clamped
// at -126: what lies below gives ~1e-38 instead of 0, nothing a sum notices. 10 instructions
// where an e^x with range reduction by ln 2 takes 16: the softmax is half the kernel's time.
inline __m512 exp2_nonpos(__m512 t) {
  t = _mm512_max_ps(t, _mm512_set1_ps(-126.f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.3333558146e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108665e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650696e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718056e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace strand
#endif
