// Row loops of the token-level operations (topk_select, compact_mask, gather_attention) with
// deterministic error reporting: rows run in parallel and each may find bad input, but the error
// returned is always the one of the lowest failing row, whatever the thread count or scheduling.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>

#include "cpu/parallel.h"
#include "sparge/types.h"

namespace sparge::cpu {

// row_fn(r) processes row r and returns its Status. When some rows fail, the lowest failing row is
// run once more, serially, to produce the message (row_fn must therefore be repeatable; it may
// have written that row's outputs already, which is fine: outputs are unspecified on error).
template <class RowFn>
Status for_each_row(std::int64_t rows, int threads, RowFn&& row_fn, std::int64_t grain = 8) {
  constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
  std::atomic<std::int64_t> first_bad{kNone};
  parallel_for(
      rows, threads,
      [&](std::int64_t r) {
        if (r > first_bad.load(std::memory_order_relaxed)) return;  // a lower row already failed
        if (row_fn(r).ok()) return;
        std::int64_t cur = first_bad.load(std::memory_order_relaxed);
        while (r < cur && !first_bad.compare_exchange_weak(cur, r, std::memory_order_relaxed)) {
        }
      },
      grain);
  const std::int64_t bad = first_bad.load();
  if (bad == kNone) return {};
  return row_fn(bad);
}

}  // namespace sparge::cpu
