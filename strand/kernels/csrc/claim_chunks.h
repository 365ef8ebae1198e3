// Work split into chunks that threads claim as they come free (one atomic counter), instead of
// at::parallel_for's even split. With an even split a step waits for the slowest thread's whole
// share, and on a machine with no core to spare that thread is often one waiting for a core;
// claimed chunks let the running threads take the rest of its share. Used by the tiled GGUF
// products (gguf_tiled.cpp) and the phased decode step (decode_phased.cpp).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace strand {

// Chunks per thread: enough for balance when one thread falls behind, few enough that a claim
// (an atomic add on a shared line) is small beside a chunk's work.
constexpr int64_t kChunksPerThread = 4;

// The chunk count for `items` units of work at `threads` threads, at least `min_items` a chunk.
inline int64_t chunk_count(int64_t items, int threads, int64_t min_items) {
  if (threads <= 1) return 1;
  return std::max<int64_t>(1, std::min<int64_t>(threads * kChunksPerThread,
                                                 items / std::max<int64_t>(1, min_items)));
}

// Guided claims: the next piece [begin, end) of `items` units from the shared `next`, about
// 1 / (2 threads) of what is left and at least `min_units`: large pieces while much is left,
// small ones at the end, so that the threads finish a phase close together. With a fixed number
// of chunks a thread that takes the last one leaves the others spinning for most of a chunk,
// after every product of a decode step. False when nothing is left.
inline bool claim_guided(std::atomic<int64_t>& next, int64_t items, int threads,
                         int64_t min_units, int64_t& begin, int64_t& end) {
  int64_t b = next.load(std::memory_order_relaxed);
  for (;;) {
    if (b >= items) return false;
    const int64_t size = std::max<int64_t>(min_units, (items - b) / (2 * std::max(threads, 1)));
    const int64_t e = std::min(items, b + size);
    if (next.compare_exchange_weak(b, e, std::memory_order_relaxed)) {
      begin = b;
      end = e;
      return true;
    }
  }
}

// [begin, end) of chunk i of `chunks` over `items`.
inline int64_t chunk_begin(int64_t items, int64_t chunks, int64_t i) { return items * i / chunks; }

// fn(i) once for each i in [0, chunks), on up to at::get_num_threads() threads; inline on the
// calling thread inside another parallel region (ATen does not nest them either). fn must not
// throw.
template <typename Fn>
void claim_for(int64_t chunks, Fn fn) {
  const int threads = static_cast<int>(std::min<int64_t>(at::get_num_threads(), chunks));
  if (threads <= 1 || at::in_parallel_region()) {
    for (int64_t i = 0; i < chunks; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
#pragma omp parallel num_threads(threads)
  for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) fn(i);
}

}  // namespace strand
