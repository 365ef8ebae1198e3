// What the two bfloat16 prefill attention kernels that round P to bfloat16 (AMX tiles,
// prefill_attention_amx.cpp; VDPBF16PS, prefill_attention.cpp's Pairs) share, with AVX-512: the
// softmax's 2^x over scores kept in base 2, and the interleave that puts two rows' bfloat16
// values in the (even, odd) pairs both instructions multiply.
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


// Lanes 2j and 2j+1 of the result: lane j of x's low and high 256 bits (two rows of 16 bfloat16
// values, or the bfloat16 probabilities of keys 2p and 2p+1 from _mm512_cvtne2ps_pbh).
inline __m512i interleave16(__m512i x) {
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
  return _mm512_permutexvar_epi16(order, x);
}

}  // namespace strand
#endif
