#include "check.h"
#include "kernels.h"

#include <ATen/ops/empty.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "claim_chunks.h"
#include "gguf_act.h"
#include "gguf_tile_simd.h"
#include "gguf_tiled.h"
#include "gguf_types.h"

// GGUF Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q4_K / IQ4_NL weights (and Strand's IQ4_F / Q5_F / Q6_F /
// Q8_F,
// llama.cpp's other K-quants rewritten exactly at load: strand/kernels/gguf_transcode.py) regrouped at
// load into tiles of 16 rows, so that a decode step's integer dot products take 16 rows per
// instruction (gguf_tile_simd.h) instead of one block of one row: the bytes are the file's, only their order changes (llama.cpp does the same
// on load: its AMX/VNNI buffer regroups every weight into 16-row tiles). Profiled on one thread,
// the row-by-row kernel (gguf_linear.cpp) spent ~12 instructions per 20-byte Q4_1 block (two
// float16 conversions, broadcasts, the offset's scalar product, a horizontal sum per row) and
// read SmolLM2's Q4_1 layers at about half the rate of its Q8_0 lm_head's bytes.
//
// Layout: [N / 16, K / 32, 16 * block bytes] uint8. Tile t, block b (the 16 rows' block b):
//   quants: 4 (4-bit types) or 8 (Q8_0) chunks of 64 bytes; chunk c holds bytes 4c..4c+3 of
//           each row's quants, row r's at 4r..4r+3. Q4's byte i holds quant i (low nibble) and
//           quant i + 16 (high), so chunk c's low nibbles are quants 4c..4c+3 and its high
//           nibbles quants 16+4c..19+4c;
//   then (Q5_0, Q5_1, Q5_F: one; Q6_F: two) 64-byte vectors of the fifth (and sixth) bits, laid
//   out as the nibble lanes: byte 4r + j holds row r's bits of quants 4g + j for the 8 groups g
//   of 4 quants (chunk g's low nibbles for g < 4, chunk g - 4's high ones after): bit g; Q6_F
//   vector g / 4, bits 2k, 2k + 1 the fifth and sixth bits of group 4 (g / 4) + k. One shift
//   and one mask put a group's bits in place for 64 lanes (AVX2 has no mask-to-bytes move;
//   expanding a 64-bit mask took it ~10 instructions a group);
//   then the head's fields, each as the 16 rows' values: float16 d (and Q4_1's, Q5_1's m);
//   float32 d and m (Q5_F); float16 d, then the int8 scale pairs (Q6_F: of quants 0..15 and
//   16..31, each times d); float32 d_lo, d_hi, m (Q8_F).
// Q4_K goes by its 256-weight super-blocks, 8 tile-blocks of 288 bytes each (the file's bytes,
// 144 a row): tile-block j = 2g + h holds, as the 4 chunks above, bytes 16h..16h+15 of each
// row's 32 nibble bytes of group g (low nibbles: quants 16h + 4c.. of sub-block 2g; high: of
// sub-block 2g + 1), then 32 bytes of the super-block's head laid out by field: the 16 rows' d
// (float16), their dmin, then each of the 12 scale bytes as the 16 rows' bytes; tile-block j
// holds the head's bytes 32j..32j+31.
// strand/kernels/gguf_linear_ref.py (tile_ref, untile_ref) is the pure-torch statement of it.
namespace {
using namespace strand;

constexpr int64_t kBlock = 32, kTileRows = 16;
// A weight is one sequential stream of tiles, but each is read once per step and some are
// small (576 x 576 Q4_1: 207 KB), so the hardware prefetcher's ramp at every weight's start
// shows; software prefetch 4 tile-blocks ahead (Q4_1 1280 bytes, Q8_0 2176). Measured (bimodal
// timings, best of many): SmolLM2's Q4_1 layers ran faster 1 KB ahead than without, and a
// 49152 x 576 Q8_0 lm_head about twice as fast 2-4 KB ahead as 1 KB ahead.
constexpr int64_t kPrefetchTileBlocks = 4;
constexpr int64_t kSuper = 256, kQ4KBytes = 144, kQ4KTileBlock = 288;
using Format = GGUFFormat;

// One tile-block from (tile = true) or to the 16 rows' blocks: rows[r] is row r's block.
void move_tile_block(uint8_t* tile_block, uint8_t* const* rows, const Format& f, bool tile) {
  const int64_t chunks = f.quants / 4, quant_bytes = kTileRows * f.quants;
  const int64_t quant_at = f.head + 4 * f.planes, fields_at = quant_bytes + 64 * f.planes;
  for (int64_t r = 0; r < kTileRows; ++r) {
    for (int64_t c = 0; c < chunks; ++c) {
      uint8_t* t = tile_block + c * 64 + r * 4;
      uint8_t* g = rows[r] + quant_at + c * 4;
      std::memcpy(tile ? t : g, tile ? g : t, 4);
    }
    // Bit q = 4g + j of plane p's word <-> lane 4r + j of vector `vec`, bit `bit` (the layout
    // above), gathered in registers: a read-modify-write of memory per bit made untiling a
    // Q6_F weight for a prefill 5x slower than dequantizing it.
    uint8_t* lanes = tile_block + quant_bytes;
    if (tile && f.planes > 0)
      for (int64_t vec = 0; vec < f.planes; ++vec)
        for (int64_t j = 0; j < 4; ++j) {
          uint32_t byte = 0;
          for (int64_t bit = 0; bit < 8; ++bit) {
            const int64_t p = f.planes == 1 ? 0 : bit % 2;
            const int64_t g = f.planes == 1 ? bit : 4 * vec + bit / 2;
            uint32_t word;
            std::memcpy(&word, rows[r] + f.head + 4 * p, 4);
            byte |= ((word >> (4 * g + j)) & 1u) << bit;
          }
          lanes[64 * vec + 4 * r + j] = static_cast<uint8_t>(byte);
        }
    else
      for (int64_t p = 0; p < f.planes; ++p) {
        uint32_t word = 0;
        for (int64_t q = 0; q < kBlock; ++q) {
          const int64_t g = q / 4;
          const int64_t vec = f.planes == 1 ? 0 : g / 4, bit = f.planes == 1 ? g : 2 * (g % 4) + p;
          word |= static_cast<uint32_t>((lanes[64 * vec + 4 * r + q % 4] >> bit) & 1) << q;
        }
        std::memcpy(rows[r] + f.head + 4 * p, &word, 4);
      }
    for (int64_t h = 0; h < f.head / f.field; ++h) {  // d (and m, ...), grouped by kind
      uint8_t* t = tile_block + fields_at + (h * kTileRows + r) * f.field;
      uint8_t* g = rows[r] + h * f.field;
      std::memcpy(tile ? t : g, tile ? g : t, f.field);
    }
  }
}

// One Q4_K super-block of 16 rows from (tile = true) or to its 8 tile-blocks.
void move_q4k_super(uint8_t* tb, uint8_t* const* rows, bool tile) {
  auto move = [tile](uint8_t* t, uint8_t* g, int64_t n) {
    std::memcpy(tile ? t : g, tile ? g : t, n);
  };
  for (int64_t r = 0; r < kTileRows; ++r) {
    for (int64_t j = 0; j < 8; ++j)
      for (int64_t c = 0; c < 4; ++c)
        move(tb + j * kQ4KTileBlock + c * 64 + r * 4, rows[r] + 16 + 16 * j + 4 * c, 4);
    // The head by field: byte offset a of the 256 lands in tile-block a / 32 at 256 + a % 32.
    auto head = [tb](int64_t a) { return tb + (a / 32) * kQ4KTileBlock + 256 + a % 32; };
    move(head(2 * r), rows[r], 2);  // d
    move(head(32 + 2 * r), rows[r] + 2, 2);  // dmin
    for (int64_t k = 0; k < 12; ++k) move(head(64 + 16 * k + r), rows[r] + 4 + k, 1);
  }
}

// A head field of a tile-block's row r: float16 or float32, as the format stores it.
template <int64_t kField>
inline float field_at(const uint8_t* fields, int64_t h, int64_t r) {
  const uint8_t* p = fields + (h * kTileRows + r) * kField;
  if constexpr (kField == 4) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t half;
  std::memcpy(&half, p, 2);
  return c10::detail::fp16_ieee_to_fp32_value(half);
}

// The types with bit planes (Q5_0, Q5_1, Q5_F, Q6_F) from their tiles straight to float32
// rows, for products of many rows: untiling them first moved each fifth and sixth bit on its
// own: most of the wide 0.63B model's prefill step went to unpacking its Q6_F rows.
// The same float32 ops as gguf_linear.cpp's dequantize_planes over rows (and the reference).
template <int64_t Q>
void dequantize_plane_tiles(const uint8_t* w, float* out, int64_t N, int64_t K) {
  constexpr Format kF = gguf_format_of(Q);
  constexpr int64_t kTileBlock = kTileRows * kF.bytes(), kLanes = kTileRows * kF.quants;
  constexpr int64_t kFields = kLanes + 64 * kF.planes;
  const int64_t nb = K / kBlock;
  at::parallel_for(0, N / kTileRows, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = w + (t * nb + b) * kTileBlock;
        const uint8_t* fields = p + kFields;
        for (int64_t r = 0; r < kTileRows; ++r) {
          float m = 0.f;
          if constexpr (Q != kQ5_0 && Q != kQ6_F && Q != kQ3_F)
            m = field_at<kF.field>(fields, 1, r);
          // Q6_F's second field is the row's two int8 scales.
          const PlaneBlock<Q> block(field_at<kF.field>(fields, 0, r), m,
                                    fields + 2 * kTileRows + 2 * r);
          float* o = out + (t * kTileRows + r) * K + b * kBlock;
          // Quant 4c + i (chunk c's low nibble, group c) and 16 + 4c + i (its high nibble,
          // group 4 + c): lane 4r + i of chunk c and of the bit vectors.
          for (int64_t c = 0; c < 4; ++c)
            for (int64_t i = 0; i < 4; ++i) {
              const int64_t lane = 4 * r + i;
              const uint8_t byte = p[64 * c + lane];
              int32_t lo = byte & 15, hi = byte >> 4;
              if constexpr (kF.planes == 1) {
                const uint8_t bits = p[kLanes + lane];
                lo |= ((bits >> c) & 1) << 4;
                hi |= ((bits >> (4 + c)) & 1) << 4;
              } else if constexpr (kF.planes == 2) {  // vector 0: groups 0..3, vector 1: 4..7
                const uint8_t bits_lo = p[kLanes + lane], bits_hi = p[kLanes + 64 + lane];
                lo |= ((bits_lo >> (2 * c)) & 3) << 4;
                hi |= ((bits_hi >> (2 * c)) & 3) << 4;
              }
              o[4 * c + i] = block.weight(lo, true);
              o[16 + 4 * c + i] = block.weight(hi, false);
            }
        }
      }
  });
}

// Between [N, nb * bytes] rows and [N / 16, nb, 16 * bytes] tiles, either way.
void move_all(uint8_t* rows, uint8_t* tiles, int64_t N, int64_t nb, const Format& f, bool tile,
              bool q4k) {
  const int64_t row_bytes = nb * f.bytes(), tile_block = kTileRows * f.bytes();
  if (q4k) {
    const int64_t supers = nb * kBlock / kSuper;
    at::parallel_for(0, N / kTileRows, 16, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t s = 0; s < supers; ++s) {
          uint8_t* blocks[kTileRows];
          for (int64_t r = 0; r < kTileRows; ++r)
            blocks[r] = rows + (t * kTileRows + r) * row_bytes + s * kQ4KBytes;
          move_q4k_super(tiles + (t * nb + 8 * s) * tile_block, blocks, tile);
        }
    });
    return;
  }
  at::parallel_for(0, N / kTileRows, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* blocks[kTileRows];
        for (int64_t r = 0; r < kTileRows; ++r)
          blocks[r] = rows + (t * kTileRows + r) * row_bytes + b * f.bytes();
        move_tile_block(tiles + (t * nb + b) * tile_block, blocks, f, tile);
      }
  });
}

// The 16 rows' field f of a tile-block's head (float16 or float32 values).
template <int64_t Q>
inline tile::F32 field(const uint8_t* fields, int f) {
  if constexpr (gguf_format_of(Q).field == 4) return tile::floats(fields + 64 * f);
  return tile::halves(fields + 32 * f);
}

// A Q4_K super-block's 16 rows' scales d sc_j (out[j]) and offsets dmin mn_j (out[8 + j]) of
// its 8 sub-blocks, from the 6-bit fields of its tile-block's head (get_scale_min_k4).
#if defined(__AVX512BW__)
// With AVX-512 the 12 scale bytes of the 16 rows are three 64-byte vectors, 4 bytes k each, and
// each field is one or two byte operations on all of them. At one row, where nothing shares the
// scales, the plain 16-byte version (the last below) was a large share of the Q4_K pass
// (benchmarks/README.md): its 12 pointers, live beside the pass's own, went through vector
// registers.
inline void q4k_scales(const uint8_t* sb, tile::F32 out[16]) {
  auto head = [sb](int64_t a) { return sb + (a / 32) * kQ4KTileBlock + 256 + a % 32; };
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)head(0)));
  const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)head(32)));
  // Bytes k..k+3 of the 16 rows (k even: bytes k and k + 1 are one tile-block's 32 head bytes).
  auto four = [&](int64_t k) {
    const __m256i lo = _mm256_loadu_si256((const __m256i*)head(64 + 16 * k));
    const __m256i hi = _mm256_loadu_si256((const __m256i*)head(64 + 16 * (k + 2)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  };
  const __m512i b0 = four(0), b4 = four(4), b8 = four(8);
  const __m512i low6 = _mm512_set1_epi8(63), low4 = _mm512_set1_epi8(15);
  const __m512i bits45 = _mm512_set1_epi8(0x30);
  // (b >> 6) << 4 of each byte is (b >> 2) & 0x30: the 16-bit shift's bits from the byte
  // above land in bits 6 and 7, which the mask drops.
  alignas(64) uint8_t f[4][64];  // sc 0..3, sc 4..7, mn 0..3, mn 4..7: 16 rows' bytes each
  _mm512_store_si512(f[0], _mm512_and_si512(b0, low6));
  _mm512_store_si512(f[1], _mm512_or_si512(_mm512_and_si512(b8, low4),
                                           _mm512_and_si512(_mm512_srli_epi16(b0, 2), bits45)));
  _mm512_store_si512(f[2], _mm512_and_si512(b4, low6));
  _mm512_store_si512(f[3], _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(b8, 4), low4),
                                           _mm512_and_si512(_mm512_srli_epi16(b4, 2), bits45)));
  for (int64_t q = 0; q < 4; ++q)
    for (int64_t j = 0; j < 4; ++j) {
      const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
          _mm_load_si128((const __m128i*)(f[q] + 16 * j))));
      out[4 * q + j] = {_mm512_mul_ps(q < 2 ? d : dmin, v)};
    }
}
#elif defined(__AVX2__)
// The same with 32-byte vectors: bytes k and k + 1 of the 16 rows, one tile-block's head part.
inline void q4k_scales(const uint8_t* sb, tile::F32 out[16]) {
  auto head = [sb](int64_t a) { return sb + (a / 32) * kQ4KTileBlock + 256 + a % 32; };
  const tile::F32 d = tile::halves(head(0)), dmin = tile::halves(head(32));
  __m256i b[6];
  for (int64_t i = 0; i < 6; ++i) b[i] = _mm256_loadu_si256((const __m256i*)head(64 + 32 * i));
  const __m256i low6 = _mm256_set1_epi8(63), low4 = _mm256_set1_epi8(15);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  alignas(32) uint8_t f[8][32];  // sc 0-1, 2-3, 4-5, 6-7, then mn likewise
  for (int64_t i = 0; i < 2; ++i) {
    const __m256i sc_lo = b[i], mn_lo = b[2 + i], hi = b[4 + i];
    _mm256_store_si256((__m256i*)f[i], _mm256_and_si256(sc_lo, low6));
    _mm256_store_si256((__m256i*)f[2 + i], _mm256_or_si256(
        _mm256_and_si256(hi, low4), _mm256_and_si256(_mm256_srli_epi16(sc_lo, 2), bits45)));
    _mm256_store_si256((__m256i*)f[4 + i], _mm256_and_si256(mn_lo, low6));
    _mm256_store_si256((__m256i*)f[6 + i], _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16(hi, 4), low4),
        _mm256_and_si256(_mm256_srli_epi16(mn_lo, 2), bits45)));
  }
  for (int64_t j = 0; j < 8; ++j) {
    out[j] = tile::mul(d, tile::from_u8(f[j / 2] + 16 * (j % 2)));
    out[8 + j] = tile::mul(dmin, tile::from_u8(f[4 + j / 2] + 16 * (j % 2)));
  }
}
#else
inline void q4k_scales(const uint8_t* sb, tile::F32 out[16]) {
  auto head = [sb](int64_t a) { return sb + (a / 32) * kQ4KTileBlock + 256 + a % 32; };
  const tile::F32 d = tile::halves(head(0)), dmin = tile::halves(head(32));
  uint8_t sc[8][kTileRows], mn[8][kTileRows];
  const uint8_t* b[12];
  for (int64_t k = 0; k < 12; ++k) b[k] = head(64 + 16 * k);
  for (int64_t j = 0; j < 4; ++j)  // rows innermost: 16-byte vector operations
    for (int64_t r = 0; r < kTileRows; ++r) {
      sc[j][r] = b[j][r] & 63;
      mn[j][r] = b[j + 4][r] & 63;
      sc[j + 4][r] = (b[j + 8][r] & 15) | ((b[j][r] >> 6) << 4);
      mn[j + 4][r] = (b[j + 8][r] >> 4) | ((b[j + 4][r] >> 6) << 4);
    }
  for (int64_t j = 0; j < 8; ++j) {
    out[j] = tile::mul(d, tile::from_u8(sc[j]));
    out[8 + j] = tile::mul(dmin, tile::from_u8(mn[j]));
  }
}
#endif

// Q4_K's tiles t0..t1 (the layout above): per super-block its 16 rows' scales and offsets
// (q4k_scales, or `scales`: tile t0's made once for all its row groups, 16 vectors a
// super-block, with t1 = t0 + 1),
// then per 64 weights two sub-blocks' integer sums (the low nibbles are sub-block 2g's, the
// high 2g + 1's, against their own activation blocks), each scaled by d * sc * d_x, less
// dmin * mn * d_x * sum q_x: w = d sc q - dmin mn, as llama.cpp.
template <int M>
void q4k_task(const gguf::QuantizedRows& x, const uint8_t* w, float* sums, int64_t ld, int64_t K,
              int64_t t0, int64_t t1, int64_t m0, const tile::F32* scales) {
  const int64_t nb = K / kBlock, supers = K / kSuper, x_m0 = x.at(m0, 0);
  for (int64_t t = t0; t < t1; ++t) {
    tile::F32 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = tile::fzero();
    for (int64_t s = 0; s < supers; ++s) {
      const uint8_t* sb = w + (t * nb + 8 * s) * kQ4KTileBlock;
      tile::F32 own[16];
      const tile::F32* sm = own;
      if (scales != nullptr) sm = scales + 16 * s;
      else q4k_scales(sb, own);
      for (int64_t g = 0; g < 4; ++g) {
        // Row m0 + m's sub-blocks 2g and 2g + 1 are entries xa + m and xb + m (tiles_into).
        const int64_t xa = x_m0 + (8 * s + 2 * g) * x.together, xb = xa + x.together;
        const int8_t* qa = x.q.data() + xa * kBlock;
        const int8_t* qb = x.q.data() + xb * kBlock;
        // Nibbles (<= 15) by int8 (|x| <= 127): 8 chunks' int16 pair sums stay <= 30480.
        tile::P16 sa[M], sbm[M];
        for (int m = 0; m < M; ++m) sa[m] = sbm[m] = tile::pzero();
        for (int64_t h = 0; h < 2; ++h) {
          const uint8_t* p = sb + (2 * g + h) * kQ4KTileBlock;
          for (int64_t line = 0; line < kQ4KTileBlock; line += 64)
            __builtin_prefetch(p + kPrefetchTileBlocks * kQ4KTileBlock + line, 0, 3);
          for (int64_t c = 0; c < 4; ++c) {
            const tile::U8 v = tile::load_chunk(p + c * 64);
            const tile::U8 wa = tile::low_nibbles(v), wb = tile::high_nibbles(v);
            const int64_t at = 16 * h + 4 * c;
            for (int m = 0; m < M; ++m) {
              sa[m] = tile::pdot(sa[m], wa, qa + m * kBlock + at);
              sbm[m] = tile::pdot(sbm[m], wb, qb + m * kBlock + at);
            }
          }
        }
        const tile::F32 scale_a = sm[2 * g], scale_b = sm[2 * g + 1];
        const tile::F32 min_a = sm[8 + 2 * g], min_b = sm[8 + 2 * g + 1];
        for (int m = 0; m < M; ++m) {
          acc[m] = tile::fma(tile::to_f32(tile::widen(sa[m])), tile::mul(scale_a, x.d[xa + m]),
                             acc[m]);
          acc[m] = tile::fma(tile::to_f32(tile::widen(sbm[m])), tile::mul(scale_b, x.d[xb + m]),
                             acc[m]);
          acc[m] = tile::fnma(min_a, x.s[xa + m], acc[m]);
          acc[m] = tile::fnma(min_b, x.s[xb + m], acc[m]);
        }
      }
    }
    for (int m = 0; m < M; ++m) tile::store(sums + m * ld + (t - t0) * kTileRows, acc[m]);
  }
}

// sums[m * ld + 16 (t - t0) + r] for tiles t0..t1: per block, the integer products of the 16
// rows with each of the M activation blocks (16 rows a vector), scaled by d_w * d_x. A quant's
// integer offset (Q4_0 -8, Q5_0 -16, Q6_F -32, Q3_F -4; Q8_0's VNNI excess, below) times sum q_x
// starts the integer sums, so they are exact sums of (q - offset) q_x before they meet a float:
// no float cancellation of sum q q_x against offset * sum q_x, and no float ops for it a block.
// Q4_1, Q5_1, Q5_F and Q8_F add m_w times d_x * sum q_x.
// Q6_F, Q3_F and Q8_F scale the two halves of a block (quants 0..15 and 16..31, the `lo` and `hi`
// sums) by their own d, then the two by d_x at once. The 5- and 6-bit quants are nibbles with
// their bit planes or-ed in.
// q4k_scales_of_t0: Q4_K's scales of tile t0 made once for all its row groups, as q4k_task
// takes them (other types: nullptr).
template <int64_t Q, int M>
void tiles_task(const gguf::QuantizedRows& x, const uint8_t* w, float* sums, int64_t ld,
                int64_t K, int64_t t0, int64_t t1, int64_t m0,
                const tile::F32* q4k_scales_of_t0 = nullptr) {
  if constexpr (Q == kQ4_K) return q4k_task<M>(x, w, sums, ld, K, t0, t1, m0, q4k_scales_of_t0);
  constexpr Format kF = gguf_format_of(Q);
  // Q6_F and Q3_F: float16 d times an int8 scale per half block.
  constexpr bool kScaled = Q == kQ6_F || Q == kQ3_F;
  constexpr bool kQ8 = kF.quants == 32, kHalves = kScaled || Q == kQ8_F;
  // IQ4's codes become signed levels by a table lookup in registers: signed products, as Q8_0's.
  constexpr bool kIQ4 = Q == kIQ4_NL || Q == kIQ4_F, kSigned = kQ8 || kIQ4;
  // Unsigned quants of up to 5 bits (<= 31) by int8 (|x| <= 127): a block's 4 chunks' int16
  // pair sums stay <= 31496, so they are widened once a block (tile::pdot).
  constexpr bool kPairs = !kSigned && kF.planes < 2;
  constexpr int64_t kTileBlock = kTileRows * kF.bytes(), kPlanes = kTileRows * kF.quants;
  constexpr int64_t kFields = kPlanes + 64 * kF.planes;
  // What sum q_x times starts a block's integer sums (signed quants: VNNI's unsigned excess).
  constexpr int32_t kOffset = Q == kQ4_0 ? -8 : Q == kQ5_0 ? -16 : Q == kQ6_F ? -32
                              : Q == kQ3_F ? -4 : kSigned ? -tile::kQ8Excess : 0;
  const int64_t nb = K / kBlock, x_m0 = x.at(m0, 0);
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* tile = w + t * nb * kTileBlock;
    tile::F32 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = tile::fzero();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* p = tile + b * kTileBlock;
      for (int64_t line = 0; line < kTileBlock; line += 64)
        __builtin_prefetch(p + kPrefetchTileBlocks * kTileBlock + line, 0, 3);
      // Row m0 + m's block b is entry x0 + m (tiles_into), its bytes at xq + 32 m.
      const int64_t x0 = x_m0 + b * x.together;
      const int8_t* xq = x.q.data() + x0 * kBlock;
      // Two chains of integer sums per row of x (the low and high halves of a block) halve
      // the chain of dependent dot products the loop waits on. Each starts at its offset.
      tile::I32 lo[M], hi[M];
      int32_t off_lo[M], off_hi[M];
      for (int m = 0; m < M; ++m) {
        const int64_t xb = x0 + m;
        const int32_t sum_lo = kHalves ? x.qsum_lo[xb] : x.qsum[xb];
        off_lo[m] = kOffset * sum_lo;
        off_hi[m] = kHalves ? kOffset * (x.qsum[xb] - sum_lo) : 0;
        lo[m] = kPairs ? tile::izero() : tile::iset(off_lo[m]);
        hi[m] = kPairs ? tile::izero() : tile::iset(off_hi[m]);
      }
      [[maybe_unused]] tile::P16 plo[kPairs ? M : 1], phi[kPairs ? M : 1];
      if constexpr (kPairs)
        for (int m = 0; m < M; ++m) plo[m] = phi[m] = tile::pzero();
      // The fifth (and sixth) bits of the whole block: one vector per plane, read once.
      const tile::U8 bits0 = kF.planes ? tile::load_chunk(p + kPlanes) : tile::U8{};
      const tile::U8 bits1 = kF.planes == 2 ? tile::load_chunk(p + kPlanes + 64) : tile::U8{};
      for (int64_t c = 0; c < 4; ++c) {
        if constexpr (kQ8) {
          const tile::U8 w0 = tile::load_chunk(p + c * 64), w1 = tile::load_chunk(p + 256 + c * 64);
          for (int m = 0; m < M; ++m) {
            lo[m] = tile::dot_signed(lo[m], w0, xq + m * kBlock + 4 * c);
            hi[m] = tile::dot_signed(hi[m], w1, xq + m * kBlock + 16 + 4 * c);
          }
        } else {
          const tile::U8 v = tile::load_chunk(p + c * 64);
          tile::U8 w0 = tile::low_nibbles(v), w1 = tile::high_nibbles(v);
          if constexpr (kF.planes == 1) {  // group g's bit is bit g: to bit 4
            w0 = tile::or_shifted(w0, bits0, static_cast<int>(4 - c), 16);
            w1 = tile::or_shifted(w1, bits0, static_cast<int>(-c), 16);
          } else if constexpr (kF.planes == 2) {  // group 4v + k's at bits 2k, 2k + 1: to 4, 5
            w0 = tile::or_shifted(w0, bits0, static_cast<int>(4 - 2 * c), 0x30);
            w1 = tile::or_shifted(w1, bits1, static_cast<int>(4 - 2 * c), 0x30);
          }
          if constexpr (kIQ4) {
            w0 = tile::lookup16(w0, kIQ4Levels);
            w1 = tile::lookup16(w1, kIQ4Levels);
          }
          for (int m = 0; m < M; ++m) {
            if constexpr (kIQ4) {  // signed levels, as Q8_0's quants
              lo[m] = tile::dot_signed(lo[m], w0, xq + m * kBlock + 4 * c);
              hi[m] = tile::dot_signed(hi[m], w1, xq + m * kBlock + 16 + 4 * c);
            } else if constexpr (kPairs) {
              plo[m] = tile::pdot(plo[m], w0, xq + m * kBlock + 4 * c);
              phi[m] = tile::pdot(phi[m], w1, xq + m * kBlock + 16 + 4 * c);
            } else {
              lo[m] = tile::dot_unsigned(lo[m], w0, xq + m * kBlock + 4 * c);
              hi[m] = tile::dot_unsigned(hi[m], w1, xq + m * kBlock + 16 + 4 * c);
            }
          }
        }
      }
      if constexpr (kPairs)  // int16 pair sums: the offsets join once they are widened
        for (int m = 0; m < M; ++m) {
          lo[m] = tile::iadd(tile::widen(plo[m]), tile::iset(off_lo[m]));
          hi[m] = tile::iadd(tile::widen(phi[m]), tile::iset(off_hi[m]));
        }
      const uint8_t* fields = p + kFields;
      if constexpr (kHalves) {
        tile::F32 d_lo, d_hi;
        if constexpr (kScaled) {  // float16 d times each half's int8 scale: exact in float32
          const tile::F32 d = field<Q>(fields, 0);
          d_lo = tile::mul(d, tile::from_i8_pair<0>(fields + 32));
          d_hi = tile::mul(d, tile::from_i8_pair<1>(fields + 32));
        } else {
          d_lo = field<Q>(fields, 0);
          d_hi = field<Q>(fields, 1);
        }
        for (int m = 0; m < M; ++m) {
          const int64_t xb = x0 + m;
          const tile::F32 halves =
              tile::fma(tile::to_f32(hi[m]), d_hi, tile::mul(tile::to_f32(lo[m]), d_lo));
          acc[m] = tile::fma(halves, x.d[xb], acc[m]);
          if constexpr (Q == kQ8_F) acc[m] = tile::fma(field<Q>(fields, 2), x.s[xb], acc[m]);
        }
        continue;
      }
      const tile::F32 d = field<Q>(fields, 0);
      for (int m = 0; m < M; ++m) {
        const tile::I32 s = tile::iadd(lo[m], hi[m]);
        const int64_t xb = x0 + m;
        acc[m] = tile::fma(tile::to_f32(s), tile::mul(d, x.d[xb]), acc[m]);
        if constexpr (Q == kQ4_1 || Q == kQ5_1 || Q == kQ5_F)
          acc[m] = tile::fma(field<Q>(fields, 1), x.s[xb], acc[m]);
      }
    }
    for (int m = 0; m < M; ++m) tile::store(sums + m * ld + (t - t0) * kTileRows, acc[m]);
  }
}

// Rows of x one tiles_task takes together: each row's sums are its own two chains of
// instructions, and more rows a pass reuse each unpacked chunk of weights more. With AVX-512's
// 32 registers, 8 rows (24 accumulators): one thread over SmolLM2's Q4_K_M layers at 32-512
// rows ran about a quarter faster than at 4 rows, and ahead of 12 rows or 8 in one chain each.
// AVX2's 16 registers hold a 4-row pass's 24 halves already spilled; 2 rows there differed from
// 4 within the noise.
#if defined(__AVX512F__)
constexpr int64_t kRowGroup = 8;
#else
constexpr int64_t kRowGroup = 4;
#endif
// A pass's rows share one group of x (gguf_act.h), so that row m0 + m's block is m0's entry + m:
// passes start at multiples of kRowGroup, or take all of x's rows (fewer than a group).
static_assert(gguf::kRowsTogether % kRowGroup == 0, "a pass's rows are one group's");

// f(std::integral_constant<int, m>{}) for m = rows (1..kRowGroup).
template <int N = 1, typename F>
void by_rows(int64_t rows, F&& f) {
  if constexpr (N < kRowGroup) {
    if (rows == N) return f(std::integral_constant<int, N>{});
    return by_rows<N + 1>(rows, f);
  } else {
    f(std::integral_constant<int, N>{});
  }
}

// out[:, 16 t0 .. 16 t1) (+ bias) of tiles t0..t1 for all M rows of x, a tile and kRowGroup
// rows at a time through a buffer; out's rows are ld apart (out and bias already offset to the
// part's first column). A tile is read from memory once a call and from cache for its other
// row groups, and x is rounded once for them all: a decode batch of 32 rows or a prefill
// unpacked every weight to float32 per call for the GEMM library before (one thread, SmolLM2's
// Q4_K_M linears at 32 rows: about eight times the time they take here). Each row's
// sums are the same instructions whatever the other rows, so a row's outputs do not depend on
// the rows beside it.
template <int64_t Q, typename T>
void tiles_into(T* out, const gguf::QuantizedRows& x, int64_t M, const uint8_t* w, const T* bias,
                int64_t K, int64_t ld, int64_t t0, int64_t t1) {
  float sums[kRowGroup * kTileRows];
  // Rows a block at a time where x is large (a prefill's): a block's activations stay in L2
  // while every tile of the chunk passes over them. Tile by tile over all of x, each tile read
  // x whole from L3 or memory: 16 MB for 2,048 rows of a K = 8,192 down projection, once per
  // 16 output columns. A decode batch's x (up to 64 rows) is one block: blocks would read the
  // chunk's weights once a block. Blocks are whole row groups, so every row's instructions are
  // the same.
  constexpr int64_t kRowBlockBytes = 256 << 10, kOneBlockBytes = 512 << 10;
  const int64_t row_block =
      M * K <= kOneBlockBytes
          ? M
          : std::max<int64_t>(kRowGroup, kRowBlockBytes / K / kRowGroup * kRowGroup);
  // Q4_K under more than one row group: a tile's scales unpacked once, not once a group.
  std::vector<tile::F32> scales;
  if (Q == kQ4_K && M > kRowGroup) scales.resize(16 * (K / kSuper));
  for (int64_t r0 = 0; r0 < M; r0 += row_block) {
    const int64_t r1 = std::min(M, r0 + row_block);
    const bool shared = !scales.empty() && r1 - r0 > kRowGroup;
    for (int64_t t = t0; t < t1; ++t) {
      if (shared)
        for (int64_t s = 0; s < K / kSuper; ++s)
          q4k_scales(w + (t * (K / kBlock) + 8 * s) * kQ4KTileBlock, scales.data() + 16 * s);
      for (int64_t m0 = r0; m0 < r1; m0 += kRowGroup) {
        const int64_t rows = std::min(kRowGroup, r1 - m0);
        // float32 out and no bias: the pass stores its vectors in place, not through sums.
        const bool direct = std::is_same_v<T, float> && bias == nullptr;
        float* into = direct ? reinterpret_cast<float*>(out) + m0 * ld + t * kTileRows : sums;
        by_rows(rows, [&](auto m) {
          tiles_task<Q, decltype(m)::value>(x, w, into, direct ? ld : kTileRows, K, t, t + 1,
                                            m0, shared ? scales.data() : nullptr);
        });
        if (direct) continue;
        for (int64_t m = 0; m < rows; ++m)
          for (int64_t r = 0; r < kTileRows; ++r) {
            const int64_t n = t * kTileRows + r;
            store_scalar(out + (m0 + m) * ld + n,
                         sums[m * kTileRows + r] + (bias ? to_float(bias[n]) : 0.f));
          }
      }
    }
  }
}

// out = x @ w.T (+ bias), x rounded once a call; chunks of at least 4 tiles (64 rows: the row
// kernels' reason, linear_small.cpp), claimed by whichever thread is free (claim_chunks.h).
template <typename T>
void tiled_linear(at::Tensor& out, const at::Tensor& x, const at::Tensor& tiles, int64_t qtype,
                  const c10::optional<at::Tensor>& bias) {
  const int64_t M = x.size(0), K = x.size(1), tiles_n = tiles.size(0);
  gguf::QuantizedRows xq;
  gguf::quantize_input<T>(x, xq);
  const uint8_t* w = tiles.data_ptr<uint8_t>();
  const T* b = bias.has_value() ? static_cast<const T*>(bias->data_ptr()) : nullptr;
  T* o = static_cast<T*>(out.data_ptr());
  at::internal::lazy_init_num_threads();
  const int64_t chunks = chunk_count(tiles_n, at::get_num_threads(), 4);
  by_gguf_type(qtype, [&](auto q) {
    claim_for(chunks, [&](int64_t i) {
      tiles_into<decltype(q)::value>(o, xq, M, w, b, K, tiles_n * kTileRows,
                                     chunk_begin(tiles_n, chunks, i),
                                     chunk_begin(tiles_n, chunks, i + 1));
    });
  });
}

template <typename T>
void tiled_rows_typed(at::Tensor& out, const gguf::QuantizedRows& x, const at::Tensor& tiles,
                      int64_t qtype, const c10::optional<at::Tensor>& bias, int64_t t0,
                      int64_t t1, int64_t col0) {
  const int64_t M = out.size(0), K = tiles.size(1) * kBlock, ld = out.size(1);
  T* o = static_cast<T*>(out.data_ptr()) + col0;
  const T* b = bias.has_value() ? static_cast<const T*>(bias->data_ptr()) + col0 : nullptr;
  const uint8_t* w = tiles.data_ptr<uint8_t>();
  by_gguf_type(qtype, [&](auto q) {
    tiles_into<decltype(q)::value>(o, x, M, w, b, K, ld, t0, t1);
  });
}

// K after checking tiles' shape: [N / 16, K / 32, 16 * block bytes] contiguous uint8.
int64_t check_tiles(const at::Tensor& tiles, int64_t qtype) {
  const Format f = gguf_format(qtype);
  STRAND_CHECK(tiles.scalar_type() == at::kByte && tiles.dim() == 3 && tiles.is_contiguous() &&
                  tiles.size(2) == kTileRows * f.bytes(),
              "tiled GGUF weights of type ", qtype, " are a contiguous [N / 16, K / 32, ",
              kTileRows * f.bytes(), "] uint8 tensor");
  STRAND_CHECK(qtype != kQ4_K || tiles.size(1) % (kSuper / kBlock) == 0,
               "Q4_K rows are whole 256-weight super-blocks, got ", tiles.size(1) * kBlock);
  return tiles.size(1) * kBlock;
}
}  // namespace

void gguf_tile(at::Tensor tiles, at::Tensor packed, int64_t qtype) {
  const int64_t K = check_tiles(tiles, qtype), N = tiles.size(0) * kTileRows;
  const Format f = gguf_format(qtype);
  STRAND_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 2 &&
                  packed.size(0) == N && packed.size(1) == K / kBlock * f.bytes(),
              "gguf_tile takes [", N, ", ", K / kBlock * f.bytes(), "] uint8 rows");
  move_all(packed.data_ptr<uint8_t>(), tiles.data_ptr<uint8_t>(), N, K / kBlock, f, true,
           qtype == kQ4_K);
}

void gguf_untile(at::Tensor packed, at::Tensor tiles, int64_t qtype) {
  const int64_t K = check_tiles(tiles, qtype), N = tiles.size(0) * kTileRows;
  const Format f = gguf_format(qtype);
  STRAND_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 2 &&
                  packed.size(0) == N && packed.size(1) == K / kBlock * f.bytes(),
              "gguf_untile writes [", N, ", ", K / kBlock * f.bytes(), "] uint8 rows");
  move_all(packed.data_ptr<uint8_t>(), tiles.data_ptr<uint8_t>(), N, K / kBlock, f, false,
           qtype == kQ4_K);
}

bool gguf_dequantize_tiles(at::Tensor out, at::Tensor tiles, int64_t qtype) {
  const Format f = gguf_format(qtype);
  if (f.planes == 0) return false;
  const int64_t K = check_tiles(tiles, qtype), N = tiles.size(0) * kTileRows;
  STRAND_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.dim() == 2 &&
                  out.size(0) == N && out.size(1) == K,
              "gguf_dequantize writes a contiguous float32 [", N, ", ", K, "]");
  const uint8_t* w = tiles.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  switch (qtype) {
    case kQ5_0: dequantize_plane_tiles<kQ5_0>(w, o, N, K); break;
    case kQ5_1: dequantize_plane_tiles<kQ5_1>(w, o, N, K); break;
    case kQ5_F: dequantize_plane_tiles<kQ5_F>(w, o, N, K); break;
    default: dequantize_plane_tiles<kQ6_F>(w, o, N, K);
  }
  return true;
}

void gguf_tiled_linear(at::Tensor out, at::Tensor x, at::Tensor tiles, int64_t qtype,
                       c10::optional<at::Tensor> bias) {
  const int64_t M = x.size(0), K = check_tiles(tiles, qtype);
  STRAND_CHECK(M >= 1 && x.size(1) == K, "gguf_tiled_linear takes [M >= 1, ", K, "], got [", M,
               ", ", x.size(1), "]");
  if (x.scalar_type() == at::kBFloat16)
    tiled_linear<bf16>(out, x, tiles, qtype, bias);
  else
    tiled_linear<float>(out, x, tiles, qtype, bias);
}

namespace strand {
namespace gguf {
void tiled_rows(at::Tensor out, const QuantizedRows& x, const at::Tensor& tiles, int64_t qtype,
                const c10::optional<at::Tensor>& bias, int64_t t0, int64_t t1, int64_t col0) {
  if (out.scalar_type() == at::kBFloat16)
    tiled_rows_typed<bf16>(out, x, tiles, qtype, bias, t0, t1, col0);
  else
    tiled_rows_typed<float>(out, x, tiles, qtype, bias, t0, t1, col0);
}

void quantize_any(const at::Tensor& x, QuantizedRows& out) {
  if (x.scalar_type() == at::kBFloat16)
    quantize_input<bf16>(x, out);
  else
    quantize_input<float>(x, out);
}
}  // namespace gguf
}  // namespace strand
