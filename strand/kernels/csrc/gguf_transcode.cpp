// Q6_K rows rewritten as Q6_F blocks at load, byte for byte what strand/kernels/gguf_transcode.py
// writes (its module docstring states both layouts), without numpy's whole-array temporaries: a
// Q4_K_M file's head and half its down projections are Q6_K.
#include "check.h"
#include "kernels.h"

#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t kQ6KBytes = 210, kQ6FBytes = 28, kSuperWeights = 256;

// One super-block (256 weights): its quants q (0..63, the file's q + 32) as llama.cpp unpacks
// them, then per 32 weights: the super-block's float16 d, the two int8 scales of its 16s, the
// words of fifth and sixth bits (bit j of the little-endian word: q_j's), and 16 bytes of
// nibbles (byte i: q_i low, q_{i + 16} high).
void q6k_super(const uint8_t* in, uint8_t* out) {
  const uint8_t *ql = in, *qh = in + 128, *scales = in + 192, *d = in + 208;
  uint8_t q[kSuperWeights];
  for (int h = 0; h < 2; ++h)  // per 128 weights: 64 bytes of low 4 bits, 32 of top 2 bits
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) {
        const uint8_t low = ql[64 * h + 32 * (j & 1) + l] >> (4 * (j >> 1)) & 15;
        const uint8_t top = qh[32 * h + l] >> (2 * j) & 3;
        q[128 * h + 32 * j + l] = static_cast<uint8_t>(low | top << 4);
      }
  for (int b = 0; b < 8; ++b) {
    uint8_t* o = out + b * kQ6FBytes;
    const uint8_t* qb = q + 32 * b;
    o[0] = d[0];
    o[1] = d[1];
    o[2] = scales[2 * b];
    o[3] = scales[2 * b + 1];
    std::memset(o + 4, 0, 8);
    for (int i = 0; i < 32; ++i) {
      o[4 + i / 8] |= static_cast<uint8_t>((qb[i] >> 4 & 1) << (i % 8));
      o[8 + i / 8] |= static_cast<uint8_t>((qb[i] >> 5 & 1) << (i % 8));
    }
    for (int i = 0; i < 16; ++i)
      o[12 + i] = static_cast<uint8_t>((qb[i] & 15) | (qb[i + 16] & 15) << 4);
  }
}

}  // namespace

void gguf_q6k_to_q6f(at::Tensor out, at::Tensor rows) {
  STRAND_CHECK(rows.scalar_type() == at::kByte && rows.dim() == 2 && rows.is_contiguous() &&
                  rows.size(1) % kQ6KBytes == 0,
              "gguf_q6k_to_q6f reads contiguous uint8 Q6_K rows [N, K / 256 * 210]");
  const int64_t supers = rows.numel() / kQ6KBytes;
  STRAND_CHECK(out.scalar_type() == at::kByte && out.is_contiguous() &&
                  out.numel() == supers * 8 * kQ6FBytes,
              "gguf_q6k_to_q6f writes contiguous uint8 Q6_F rows [N, K / 32 * 28]");
  const uint8_t* in = rows.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  at::parallel_for(0, supers, 256, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) q6k_super(in + s * kQ6KBytes, o + s * 8 * kQ6FBytes);
  });
}
