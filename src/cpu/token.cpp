// CPU token-level selection (docs/semantics.md, "Stage 3"): topk_select and compact_mask.
//
// Both are row-independent and run one row per task. Errors found in the data (NaN scores, a NaN
// or +inf mask entry) are StatusCode::invalid_argument: they are bad arguments, found while reading
// the values rather than by the host checks. A row of compact_mask with more than n_max finite
// entries is StatusCode::overflow. Whatever the thread count, the error returned is the one of the
// lowest failing row (and, within it, of the lowest column); the outputs are then unspecified.
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "cpu/cpu.h"
#include "cpu/token_order.h"
#include "cpu/token_rows.h"
#include "sparge/half.h"
#include "validate/validate.h"

namespace sparge::cpu {

namespace {

// Ranking keys of one row of scores (token_order.h), and the number of selectable (not -inf)
// entries. Fails on the first NaN.
Status load_keys(const Tensor& scores, std::int64_t r, std::vector<std::uint32_t>& keys,
                 std::int64_t& selectable) {
  const std::int64_t n = scores.shape[1];
  keys.resize(static_cast<size_t>(n));
  selectable = 0;
  for (std::int64_t c = 0; c < n; ++c) {
    const std::uint32_t bits = float_to_bits(load_as_float(scores.data, scores.dtype, scores.offset(r, c)));
    if (token::is_nan_bits(bits)) {
      return detail::bad("topk_select", "scores[", r, ", ", c, "] is NaN (row ", r, ", column ", c,
                         "); scores must not contain NaN");
    }
    keys[static_cast<size_t>(c)] = token::order_key(bits);
    selectable += keys[static_cast<size_t>(c)] != token::kNegInfKey;
  }
  return {};
}

Status topk_row(const TopkSelectParams& p, std::int64_t r) {
  thread_local std::vector<std::uint32_t> keys, work;
  std::int64_t selectable = 0;
  SPARGE_RETURN_IF_ERROR(load_keys(p.scores, r, keys, selectable));
  const std::int64_t n = p.scores.shape[1];
  const int k = p.k;
  auto* out = p.indices.ptr<std::int32_t>();
  int slot = 0;
  auto put = [&](std::int64_t c) { out[p.indices.offset(r, slot++)] = static_cast<std::int32_t>(c); };

  if (selectable < k) {
    // No k-th largest selectable value: every selectable index counts as "above" it, in
    // ascending order, and the rest of the row is padding. (With exactly k selectable values the
    // k-th largest exists, and the general path below puts its ties last, as documented.)
    for (std::int64_t c = 0; c < n; ++c) {
      if (keys[static_cast<size_t>(c)] != token::kNegInfKey) put(c);
    }
  } else {
    // threshold = the k-th largest key. With at least k selectable entries it is above the key of
    // -inf, so -inf can never reach the output below.
    work.assign(keys.begin(), keys.end());
    std::nth_element(work.begin(), work.begin() + (k - 1), work.end(), std::greater<>());
    const std::uint32_t threshold = work[static_cast<size_t>(k - 1)];
    for (std::int64_t c = 0; c < n; ++c) {
      if (keys[static_cast<size_t>(c)] > threshold) put(c);
    }
    for (std::int64_t c = 0; c < n && slot < k; ++c) {
      if (keys[static_cast<size_t>(c)] == threshold) put(c);
    }
  }
  const int valid = slot;
  while (slot < k) out[p.indices.offset(r, slot++)] = -1;
  if (p.maybe_counts.present()) p.maybe_counts.ptr<std::int32_t>()[p.maybe_counts.offset(r)] = valid;
  return {};
}

Status compact_row(const CompactMaskParams& p, std::int64_t r) {
  const std::int64_t n = p.mask.shape[1];
  auto* out = p.indices.ptr<std::int32_t>();
  std::int64_t count = 0;
  for (std::int64_t c = 0; c < n; ++c) {
    const float x = load_as_float(p.mask.data, p.mask.dtype, p.mask.offset(r, c));
    if (std::isnan(x) || x == INFINITY) {
      return detail::bad("compact_mask", "mask[", r, ", ", c, "] = ", x, " (row ", r, ", column ", c,
                         "); mask entries must be finite (keep) or -inf (drop)");
    }
    if (x == -INFINITY) continue;
    // Keep counting past n_max so the overflow message reports the row's real count; a NaN later
    // in the row is still reported as such.
    if (count < p.n_max) out[p.indices.offset(r, count)] = static_cast<std::int32_t>(c);
    ++count;
  }
  if (count > p.n_max) {
    return Status(StatusCode::overflow, detail::cat("compact_mask: row ", r, " has ", count,
                                                    " finite entries, more than n_max = ", p.n_max));
  }
  for (std::int64_t s = count; s < p.n_max; ++s) out[p.indices.offset(r, s)] = -1;
  p.counts.ptr<std::int32_t>()[p.counts.offset(r)] = static_cast<std::int32_t>(count);
  return {};
}

}  // namespace

Status topk_select(const TopkSelectParams& p) {
  return for_each_row(p.scores.shape[0], p.exec.cpu_threads, [&](std::int64_t r) { return topk_row(p, r); });
}

Status compact_mask(const CompactMaskParams& p) {
  return for_each_row(p.mask.shape[0], p.exec.cpu_threads, [&](std::int64_t r) { return compact_row(p, r); });
}

}  // namespace sparge::cpu
