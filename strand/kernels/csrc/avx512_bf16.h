// AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4) for the bfloat16 kernels: VDPBF16PS
// multiplies 32 bfloat16 pairs and adds them to 16 float32 sums in one instruction, where the
// portable path widens each bfloat16 value to float32 first (a zero-extend and a shift per 16
// values before the multiply-add). Products of bfloat16 values are exact in float32; the sums
// are float32, as in the portable path (in another order: the last bits differ). Built only at
// the avx512 level (so never under STRAND_CPU_ISA=avx2), used only where the CPU reports it and
// STRAND_DISABLE_AVX512_BF16 is unset: with it set, an AVX-512 CPU takes the path AVX-512 CPUs
// without AVX512_BF16 take (Skylake-X, Ice Lake), for tests and A/B measurements.
#pragma once

#include <cstdlib>

#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define STRAND_DPBF16 1
#define BF16_TARGET __attribute__((target("avx512bf16,avx512bw,avx512vl,avx512f")))

namespace strand {
inline bool has_dpbf16() {
  static const bool yes =
      __builtin_cpu_supports("avx512bf16") && std::getenv("STRAND_DISABLE_AVX512_BF16") == nullptr;
  return yes;
}
}  // namespace strand
#endif
