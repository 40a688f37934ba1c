#include "cpu/block_map_select.h"

#include <algorithm>
#include <cmath>

namespace sparge::cpu {

std::int64_t select_row(std::span<const double> scores, std::span<const unsigned char> forced_col,
                        bool forced_row, const SelectionRule& rule, SelectionScratch& scratch,
                        std::span<unsigned char> keep) {
  const auto nv = static_cast<std::int64_t>(scores.size());
  if (forced_row) {
    std::fill(keep.begin(), keep.end(), 1);
    return nv;
  }
  std::fill(keep.begin(), keep.end(), 0);

  // The rankable blocks: visible with a finite score (forced columns carry -inf).
  auto& order = scratch.order;
  order.clear();
  for (std::int64_t kb = 0; kb < nv; ++kb) {
    if (std::isfinite(scores[kb])) order.push_back(static_cast<std::int32_t>(kb));
  }
  const auto r = static_cast<std::int64_t>(order.size());
  // Descending score, ties toward the lower block index: a strict total order on the rankable
  // blocks, so the selection never depends on the sort algorithm.
  const auto before = [&](std::int32_t a, std::int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };

  std::int64_t n = 0;
  if (rule.use_topk) {
    const auto want = static_cast<std::int64_t>(std::floor(rule.topk * static_cast<double>(nv)));
    n = std::min(r, std::max<std::int64_t>(1, want));
    // Only the set matters (the lut is ascending): under a strict total order the first n after
    // nth_element are exactly the n best, in O(R).
    if (n > 0 && n < r) std::nth_element(order.begin(), order.begin() + (n - 1), order.end(), before);
  } else if (r > 0) {
    std::sort(order.begin(), order.end(), before);
    // Softmax over the rankable blocks, shifted by the largest score (the first in order).
    const double m = scores[order[0]];
    double z = 0.0;
    for (std::int32_t kb : order) z += std::exp(scores[kb] - m);
    // The smallest prefix whose mass reaches the threshold, the crossing block included; when
    // rounding keeps the total below the threshold the loop runs out and keeps every block.
    double cum = 0.0;
    while (n < r) {
      cum += std::exp(scores[order[n]] - m) / z;
      ++n;
      if (cum >= rule.cdfthreshd) break;
    }
  }
  for (std::int64_t i = 0; i < n; ++i) keep[order[i]] = 1;

  for (std::int64_t kb = 0; kb < nv; ++kb) {
    if (forced_col[kb]) keep[kb] = 1;
  }
  if (rule.attention_sink && nv > 0) keep[0] = 1;

  std::int64_t count = 0;
  for (unsigned char k : keep) count += k;
  return count;
}

}  // namespace sparge::cpu
