#include "check.h"
#include "kernels.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "claim_chunks.h"
#include "gguf_act.h"
#include "gguf_tile_simd.h"
#include "gguf_tiled.h"

// GGUF Q8_0 / Q4_0 / Q4_1 weights (and Strand's Q4_F / Q8_F, llama.cpp's K-quants rewritten
// exactly at load: kernels/gguf_transcode.py) regrouped at load into tiles of 16 rows, so that a decode
// step's integer dot products take 16 rows per instruction (gguf_tile_simd.h) instead of one
// block of one row: the bytes are the file's, only their order changes (llama.cpp does the same
// on load: its AMX/VNNI buffer regroups every weight into 16-row tiles). Profiled on one thread,
// the row-by-row kernel (gguf_linear.cpp) spent ~12 instructions per 20-byte Q4_1 block (two
// float16 conversions, broadcasts, the offset's scalar product, a horizontal sum per row) and
// read SmolLM2's 66 MB of Q4_1 layers at 7.8 GB/s where its 30 MB Q8_0 lm_head read at 14.
//
// Layout: [N / 16, K / 32, 16 * block bytes] uint8. Tile t, block b (the 16 rows' block b):
//   quants: 4 (4-bit types) or 8 (Q8_0) chunks of 64 bytes; chunk c holds bytes 4c..4c+3 of
//           each row's quants, row r's at 4r..4r+3. Q4's byte i holds quant i (low nibble) and
//           quant i + 16 (high), so chunk c's low nibbles are quants 4c..4c+3 and its high
//           nibbles quants 16+4c..19+4c;
//   then the 16 rows' float16 scales d, then (Q4_1) their float16 offsets m; Q4_F: the 16 rows'
//   float32 d, then their float32 m; Q8_F: float32 d_lo, d_hi (the scales of quants 0..15 and
//   16..31), then m.
// kernels/gguf_linear_ref.py (tile_ref, untile_ref) is the pure-torch statement of it.
namespace {
using namespace strand;

constexpr int64_t kBlock = 32, kTileRows = 16;
// A weight is one sequential stream of tiles, but each is read once per step and some are
// small (576 x 576 Q4_1: 207 KB), so the hardware prefetcher's ramp at every weight's start
// shows; software prefetch 4 tile-blocks ahead (Q4_1 1280 bytes, Q8_0 2176). On the loaded
// machine (bimodal timings, best of many): SmolLM2's Q4_1 layers 5.9-6.9 ms at 1 KB ahead
// against 6.7-11.7 without; a 49152 x 576 Q8_0 lm_head 2.2-2.5 ms at 1 KB, 1.2 at 2-4 KB.
constexpr int64_t kPrefetchTileBlocks = 4;
enum QType : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ4_F = 1003, kQ8_F = 1008 };

struct Format {  // a block: head bytes (fields of `field` bytes: d, m, ...) then quant bytes
  int64_t head, quants, field;
  int64_t bytes() const { return head + quants; }
};

Format format(int64_t qtype) {
  switch (qtype) {
    case kQ8_0: return {2, 32, 2};
    case kQ4_0: return {2, 16, 2};
    case kQ4_1: return {4, 16, 2};
    case kQ4_F: return {8, 16, 4};
    case kQ8_F: return {12, 32, 4};
  }
  STRAND_CHECK(false, "GGUF type ", qtype, " is not packed here (Q4_0=2, Q4_1=3, Q8_0=8, "
               "Q4_F=1003, Q8_F=1008 are)");
  return {0, 0, 0};
}

// One tile-block from (tile = true) or to the 16 rows' blocks: rows[r] is row r's block.
void move_tile_block(uint8_t* tile_block, uint8_t* const* rows, const Format& f, bool tile) {
  const int64_t chunks = f.quants / 4, quant_bytes = kTileRows * f.quants;
  for (int64_t r = 0; r < kTileRows; ++r) {
    for (int64_t c = 0; c < chunks; ++c) {
      uint8_t* t = tile_block + c * 64 + r * 4;
      uint8_t* g = rows[r] + f.head + c * 4;
      std::memcpy(tile ? t : g, tile ? g : t, 4);
    }
    for (int64_t h = 0; h < f.head / f.field; ++h) {  // d (and m, ...), grouped by kind
      uint8_t* t = tile_block + quant_bytes + (h * kTileRows + r) * f.field;
      uint8_t* g = rows[r] + h * f.field;
      std::memcpy(tile ? t : g, tile ? g : t, f.field);
    }
  }
}

// Between [N, nb * bytes] rows and [N / 16, nb, 16 * bytes] tiles, either way.
void move_all(uint8_t* rows, uint8_t* tiles, int64_t N, int64_t nb, const Format& f, bool tile) {
  const int64_t row_bytes = nb * f.bytes(), tile_block = kTileRows * f.bytes();
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

// sums[m * ld + 16 (t - t0) + r] for tiles t0..t1: per block, the integer products of the 16
// rows with each of the M activation blocks (16 rows a vector), scaled by d_w * d_x, plus the
// offset part (Q4_0: -8 d_w, Q4_1, Q4_F, Q8_F: m_w, times d_x * sum q_x). Q8_F scales the two
// halves of a block (quants 0..15 and 16..31, the `lo` and `hi` sums) by their own d.
template <int64_t Q, int M>
void tiles_task(const gguf::QuantizedRows& x, const uint8_t* w, float* sums, int64_t ld,
                int64_t K, int64_t t0, int64_t t1) {
  constexpr bool kQ8 = Q == kQ8_0 || Q == kQ8_F, kF32 = Q == kQ4_F || Q == kQ8_F;
  constexpr int64_t kQuant = kQ8 ? 32 : 16;
  constexpr int64_t kHead = Q == kQ8_F ? 12 : Q == kQ4_F ? 8 : Q == kQ4_1 ? 4 : 2;
  constexpr int64_t kTileBlock = kTileRows * (kQuant + kHead), kScales = kTileRows * kQuant;
  const int64_t nb = K / kBlock;
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* tile = w + t * nb * kTileBlock;
    tile::F32 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = tile::fzero();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* p = tile + b * kTileBlock;
      for (int64_t line = 0; line < kTileBlock; line += 64)
        __builtin_prefetch(p + kPrefetchTileBlocks * kTileBlock + line, 0, 3);
      const int8_t* xq[M];
      for (int m = 0; m < M; ++m) xq[m] = x.q.data() + m * K + b * kBlock;
      // Two chains of integer sums per row of x (the low and high halves of a block) halve
      // the chain of dependent dot products the loop waits on.
      tile::I32 lo[M], hi[M];
      for (int m = 0; m < M; ++m) lo[m] = hi[m] = tile::izero();
      for (int64_t c = 0; c < 4; ++c) {
        if constexpr (kQ8) {
          const tile::U8 w0 = tile::load_chunk(p + c * 64), w1 = tile::load_chunk(p + 256 + c * 64);
          for (int m = 0; m < M; ++m) {
            lo[m] = tile::dot_signed(lo[m], w0, tile::load_word(xq[m] + 4 * c));
            hi[m] = tile::dot_signed(hi[m], w1, tile::load_word(xq[m] + 16 + 4 * c));
          }
        } else {
          const tile::U8 v = tile::load_chunk(p + c * 64);
          const tile::U8 w0 = tile::low_nibbles(v), w1 = tile::high_nibbles(v);
          for (int m = 0; m < M; ++m) {
            lo[m] = tile::dot_unsigned(lo[m], w0, tile::load_word(xq[m] + 4 * c));
            hi[m] = tile::dot_unsigned(hi[m], w1, tile::load_word(xq[m] + 16 + 4 * c));
          }
        }
      }
      if constexpr (Q == kQ8_F) {
        const tile::F32 d_lo = tile::floats(p + kScales), d_hi = tile::floats(p + kScales + 64);
        const tile::F32 off = tile::floats(p + kScales + 128);
        for (int m = 0; m < M; ++m) {
          const int64_t xb = m * nb + b;
          tile::I32 l = lo[m], h = hi[m];
          if (tile::kQ8Excess) {
            l = tile::isub(l, tile::kQ8Excess * x.qsum_lo[xb]);
            h = tile::isub(h, tile::kQ8Excess * (x.qsum[xb] - x.qsum_lo[xb]));
          }
          acc[m] = tile::fma(tile::to_f32(l), tile::mul(d_lo, x.d[xb]), acc[m]);
          acc[m] = tile::fma(tile::to_f32(h), tile::mul(d_hi, x.d[xb]), acc[m]);
          acc[m] = tile::fma(off, x.s[xb], acc[m]);
        }
        continue;
      }
      const tile::F32 d = kF32 ? tile::floats(p + kScales) : tile::halves(p + kScales);
      for (int m = 0; m < M; ++m) {
        tile::I32 s = tile::iadd(lo[m], hi[m]);
        const int64_t xb = m * nb + b;
        if (kQ8 && tile::kQ8Excess) s = tile::isub(s, tile::kQ8Excess * x.qsum[xb]);
        acc[m] = tile::fma(tile::to_f32(s), tile::mul(d, x.d[xb]), acc[m]);
        if constexpr (Q == kQ4_0) acc[m] = tile::fma(d, -8.f * x.s[xb], acc[m]);
        if constexpr (Q == kQ4_1) acc[m] = tile::fma(tile::halves(p + kScales + 32), x.s[xb],
                                                     acc[m]);
        if constexpr (Q == kQ4_F) acc[m] = tile::fma(tile::floats(p + kScales + 64), x.s[xb],
                                                     acc[m]);
      }
    }
    for (int m = 0; m < M; ++m) tile::store(sums + m * ld + (t - t0) * kTileRows, acc[m]);
  }
}

template <int64_t Q, int M>
void tiles_gemv(const gguf::QuantizedRows& x, const uint8_t* w, float* sums, int64_t K,
                int64_t N) {
  // At least 4 tiles (64 rows) a chunk, as the row kernels (linear_small.cpp says why); chunks
  // claimed by whichever thread is free (claim_chunks.h).
  at::internal::lazy_init_num_threads();
  const int64_t tiles = N / kTileRows;
  const int64_t chunks = chunk_count(tiles, at::get_num_threads(), 4);
  claim_for(chunks, [&](int64_t i) {
    const int64_t t0 = chunk_begin(tiles, chunks, i), t1 = chunk_begin(tiles, chunks, i + 1);
    tiles_task<Q, M>(x, w, sums + t0 * kTileRows, N, K, t0, t1);
  });
}

template <int64_t Q>
void tiles_by_m(const gguf::QuantizedRows& x, const uint8_t* w, float* sums, int64_t M, int64_t K,
                int64_t N) {
  switch (M) {
    case 1: tiles_gemv<Q, 1>(x, w, sums, K, N); break;
    case 2: tiles_gemv<Q, 2>(x, w, sums, K, N); break;
    case 3: tiles_gemv<Q, 3>(x, w, sums, K, N); break;
    default: tiles_gemv<Q, 4>(x, w, sums, K, N);
  }
}

template <typename T>
void tiled_linear(at::Tensor& out, const at::Tensor& x, const at::Tensor& tiles, int64_t qtype,
                  const c10::optional<at::Tensor>& bias) {
  const int64_t M = x.size(0), K = x.size(1), N = tiles.size(0) * kTileRows;
  gguf::QuantizedRows xq;  // once per call: every tile reads it
  gguf::quantize_input<T>(x, xq);
  std::vector<float> sums(M * N);
  const uint8_t* w = tiles.data_ptr<uint8_t>();
  switch (qtype) {
    case kQ8_0: tiles_by_m<kQ8_0>(xq, w, sums.data(), M, K, N); break;
    case kQ4_0: tiles_by_m<kQ4_0>(xq, w, sums.data(), M, K, N); break;
    case kQ4_F: tiles_by_m<kQ4_F>(xq, w, sums.data(), M, K, N); break;
    case kQ8_F: tiles_by_m<kQ8_F>(xq, w, sums.data(), M, K, N); break;
    default: tiles_by_m<kQ4_1>(xq, w, sums.data(), M, K, N);
  }
  const T* b = bias.has_value() ? static_cast<const T*>(bias->data_ptr()) : nullptr;
  T* o = static_cast<T*>(out.data_ptr());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      store_scalar(o + m * N + n, sums[m * N + n] + (b ? to_float(b[n]) : 0.f));
}

// out[:, 16 t0 .. 16 t1) (+ bias) of tiles t0..t1, a tile at a time through a 16-lane buffer.
template <int64_t Q, int M, typename T>
void tiles_into(T* out, const gguf::QuantizedRows& x, const uint8_t* w, const T* bias, int64_t K,
                int64_t N, int64_t t0, int64_t t1) {
  float sums[M * kTileRows];
  for (int64_t t = t0; t < t1; ++t) {
    tiles_task<Q, M>(x, w, sums, kTileRows, K, t, t + 1);
    for (int m = 0; m < M; ++m)
      for (int64_t r = 0; r < kTileRows; ++r) {
        const int64_t n = t * kTileRows + r;
        store_scalar(out + m * N + n, sums[m * kTileRows + r] + (bias ? to_float(bias[n]) : 0.f));
      }
  }
}

template <int64_t Q, typename T>
void tiles_into_by_m(T* out, const gguf::QuantizedRows& x, const uint8_t* w, const T* bias,
                     int64_t M, int64_t K, int64_t N, int64_t t0, int64_t t1) {
  switch (M) {
    case 1: tiles_into<Q, 1>(out, x, w, bias, K, N, t0, t1); break;
    case 2: tiles_into<Q, 2>(out, x, w, bias, K, N, t0, t1); break;
    case 3: tiles_into<Q, 3>(out, x, w, bias, K, N, t0, t1); break;
    default: tiles_into<Q, 4>(out, x, w, bias, K, N, t0, t1);
  }
}

template <typename T>
void tiled_rows_typed(at::Tensor& out, const gguf::QuantizedRows& x, const at::Tensor& tiles,
                      int64_t qtype, const c10::optional<at::Tensor>& bias, int64_t t0,
                      int64_t t1) {
  const int64_t M = out.size(0), K = tiles.size(1) * kBlock, N = tiles.size(0) * kTileRows;
  T* o = static_cast<T*>(out.data_ptr());
  const T* b = bias.has_value() ? static_cast<const T*>(bias->data_ptr()) : nullptr;
  const uint8_t* w = tiles.data_ptr<uint8_t>();
  switch (qtype) {
    case kQ8_0: tiles_into_by_m<kQ8_0>(o, x, w, b, M, K, N, t0, t1); break;
    case kQ4_0: tiles_into_by_m<kQ4_0>(o, x, w, b, M, K, N, t0, t1); break;
    case kQ4_F: tiles_into_by_m<kQ4_F>(o, x, w, b, M, K, N, t0, t1); break;
    case kQ8_F: tiles_into_by_m<kQ8_F>(o, x, w, b, M, K, N, t0, t1); break;
    default: tiles_into_by_m<kQ4_1>(o, x, w, b, M, K, N, t0, t1);
  }
}

// K after checking tiles' shape: [N / 16, K / 32, 16 * block bytes] contiguous uint8.
int64_t check_tiles(const at::Tensor& tiles, int64_t qtype) {
  const Format f = format(qtype);
  STRAND_CHECK(tiles.scalar_type() == at::kByte && tiles.dim() == 3 && tiles.is_contiguous() &&
                  tiles.size(2) == kTileRows * f.bytes(),
              "tiled GGUF weights of type ", qtype, " are a contiguous [N / 16, K / 32, ",
              kTileRows * f.bytes(), "] uint8 tensor");
  return tiles.size(1) * kBlock;
}
}  // namespace

void gguf_tile(at::Tensor tiles, at::Tensor packed, int64_t qtype) {
  const int64_t K = check_tiles(tiles, qtype), N = tiles.size(0) * kTileRows;
  const Format f = format(qtype);
  STRAND_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 2 &&
                  packed.size(0) == N && packed.size(1) == K / kBlock * f.bytes(),
              "gguf_tile takes [", N, ", ", K / kBlock * f.bytes(), "] uint8 rows");
  move_all(packed.data_ptr<uint8_t>(), tiles.data_ptr<uint8_t>(), N, K / kBlock, f, true);
}

void gguf_untile(at::Tensor packed, at::Tensor tiles, int64_t qtype) {
  const int64_t K = check_tiles(tiles, qtype), N = tiles.size(0) * kTileRows;
  const Format f = format(qtype);
  STRAND_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 2 &&
                  packed.size(0) == N && packed.size(1) == K / kBlock * f.bytes(),
              "gguf_untile writes [", N, ", ", K / kBlock * f.bytes(), "] uint8 rows");
  move_all(packed.data_ptr<uint8_t>(), tiles.data_ptr<uint8_t>(), N, K / kBlock, f, false);
}

void gguf_tiled_linear_small(at::Tensor out, at::Tensor x, at::Tensor tiles, int64_t qtype,
                             c10::optional<at::Tensor> bias) {
  const int64_t M = x.size(0), K = check_tiles(tiles, qtype);
  STRAND_CHECK(M >= 1 && M <= 4 && x.size(1) == K, "gguf_linear_small over tiles takes 1 to 4 rows"
              " of ", K, " values, got [", M, ", ", x.size(1), "]");
  if (x.scalar_type() == at::kBFloat16)
    tiled_linear<bf16>(out, x, tiles, qtype, bias);
  else
    tiled_linear<float>(out, x, tiles, qtype, bias);
}

namespace strand {
namespace gguf {
void tiled_rows(at::Tensor out, const QuantizedRows& x, const at::Tensor& tiles, int64_t qtype,
                const c10::optional<at::Tensor>& bias, int64_t t0, int64_t t1) {
  if (out.scalar_type() == at::kBFloat16)
    tiled_rows_typed<bf16>(out, x, tiles, qtype, bias, t0, t1);
  else
    tiled_rows_typed<float>(out, x, tiles, qtype, bias, t0, t1);
}

void quantize_any(const at::Tensor& x, QuantizedRows& out) {
  if (x.scalar_type() == at::kBFloat16)
    quantize_input<bf16>(x, out);
  else
    quantize_input<float>(x, out);
}
}  // namespace gguf
}  // namespace strand
