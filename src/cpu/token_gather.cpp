// CPU gather attention (docs/semantics.md, "Stage 3"): query row (b, h, i) attends the keys
// indices[b, l, i, 0:counts[b, l, i]], in list order, where l = h with one list per query head
// (indices.shape[1] == Hq) and l = h / (Hq / Hk) with one list per kv head (indices.shape[1] ==
// Hk), with fp64 accumulation (two passes per row: max, then sum), like the dense oracle.
//
// group_union has no effect here: the union of a group's lists is a loading strategy of the GPU
// kernel, and since every row stays masked to its own list the per-row computation below is the
// result the union path must reproduce (up to summation order).
//
// The list of every row is checked before it is attended: counts in [0, n_max], every listed key in
// [0, Sk) (also those that causal masking would skip), and no key listed twice (the union path would
// count it once, the per-row path twice, so a repeated key has no single meaning). These errors are
// StatusCode::invalid_argument naming the list's b, h (its indices dim 1), i, the list position and
// the value; the lowest failing row is reported (with kv-head lists: the list of the lowest failing
// query row, which is also the lowest failing list), and the outputs are then unspecified.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/cpu.h"
#include "cpu/token_rows.h"
#include "sparge/half.h"
#include "validate/validate.h"

namespace sparge::cpu {

namespace {

constexpr const char* kOp = "gather_attention";

struct Geometry {
  std::int64_t sq, sk, hq, d, n_max;
  std::int64_t group;  // query heads per kv head
  bool kv_lists;       // one list per kv head: query head h reads list h / group
  double scale;
};

// Reads list (b, h, i) (h: the list's head, indices dim 1) into `list` after checking it; `seen` is an all-zero scratch of Sk
// flags and is all-zero again on return.
Status read_list(const GatherAttentionParams& p, const Geometry& g, std::int64_t b, std::int64_t h,
                 std::int64_t i, std::vector<std::int32_t>& list, std::vector<std::uint8_t>& seen) {
  const std::int32_t n = p.counts.ptr<const std::int32_t>()[p.counts.offset(b, h, i)];
  if (n < 0 || n > g.n_max) {
    return detail::bad(kOp, "counts[", b, ", ", h, ", ", i, "] = ", n, " is out of range (expected 0..",
                       g.n_max, " = indices.shape[3])");
  }
  list.resize(static_cast<size_t>(n));
  Status st;
  for (std::int32_t t = 0; t < n; ++t) {
    const std::int32_t j = p.indices.ptr<const std::int32_t>()[p.indices.offset(b, h, i, t)];
    if (j < 0 || j >= g.sk) {
      st = detail::bad(kOp, "indices[", b, ", ", h, ", ", i, ", ", t, "] = ", j,
                       " is out of range (expected 0..", g.sk - 1, " = Sk - 1; b = ", b, ", h = ", h,
                       ", i = ", i, ", within counts = ", n, ")");
      list.resize(static_cast<size_t>(t));
      break;
    }
    if (seen[static_cast<size_t>(j)]) {
      st = detail::bad(kOp, "indices[", b, ", ", h, ", ", i, ", ", t, "] = ", j,
                       " repeats an earlier entry of the same list (b = ", b, ", h = ", h, ", i = ", i,
                       "); a key may be listed once per row");
      list.resize(static_cast<size_t>(t));
      break;
    }
    seen[static_cast<size_t>(j)] = 1;
    list[static_cast<size_t>(t)] = j;
  }
  for (std::int32_t j : list) seen[static_cast<size_t>(j)] = 0;
  return st;
}

Status gather_row(const GatherAttentionParams& p, const Geometry& g, std::int64_t row) {
  const std::int64_t b = row / (g.hq * g.sq);
  const std::int64_t h = (row / g.sq) % g.hq;
  const std::int64_t i = row % g.sq;
  const std::int64_t hk = h / g.group;

  thread_local std::vector<std::int32_t> list;
  thread_local std::vector<std::uint8_t> seen;
  thread_local std::vector<double> q, logit, acc;
  if (seen.size() < static_cast<size_t>(g.sk)) seen.assign(static_cast<size_t>(g.sk), 0);
  SPARGE_RETURN_IF_ERROR(read_list(p, g, b, g.kv_lists ? hk : h, i, list, seen));

  q.resize(static_cast<size_t>(g.d));
  for (std::int64_t e = 0; e < g.d; ++e) q[static_cast<size_t>(e)] = load_as_float(p.q.data, p.q.dtype, p.q.offset(b, i, h, e));

  // Pass 1: logits of the attended keys (causally visible ones), and their max.
  const std::int64_t bound = i + g.sk - g.sq;  // causal: key j is visible iff j <= bound
  logit.assign(list.size(), 0.0);
  double m = -std::numeric_limits<double>::infinity();
  bool any = false;
  for (size_t t = 0; t < list.size(); ++t) {
    const std::int64_t j = list[t];
    if (p.is_causal && j > bound) continue;
    double dot = 0.0;
    for (std::int64_t e = 0; e < g.d; ++e) {
      dot += q[static_cast<size_t>(e)] * load_as_float(p.k.data, p.k.dtype, p.k.offset(b, j, hk, e));
    }
    logit[t] = g.scale * dot;
    m = any ? std::max(m, logit[t]) : logit[t];
    any = true;
  }

  // Pass 2: softmax weights and the weighted sum of V, in list order.
  acc.assign(static_cast<size_t>(g.d), 0.0);
  double l = 0.0;
  if (any) {
    for (size_t t = 0; t < list.size(); ++t) {
      const std::int64_t j = list[t];
      if (p.is_causal && j > bound) continue;
      const double w = std::exp(logit[t] - m);
      l += w;
      for (std::int64_t e = 0; e < g.d; ++e) {
        acc[static_cast<size_t>(e)] += w * load_as_float(p.v.data, p.v.dtype, p.v.offset(b, j, hk, e));
      }
    }
  }
  // l >= 1 whenever a key was attended (the max term contributes exp(0)); an empty row keeps l = 0.
  const double inv = l > 0.0 ? 1.0 / l : 0.0;
  for (std::int64_t e = 0; e < g.d; ++e) {
    store_from_float(p.o.data, p.o.dtype, p.o.offset(b, i, h, e), static_cast<float>(acc[static_cast<size_t>(e)] * inv));
  }
  if (p.maybe_lse.present()) {
    const double lse = l > 0.0 ? m + std::log(l) : -std::numeric_limits<double>::infinity();
    p.maybe_lse.ptr<float>()[p.maybe_lse.offset(b, h, i)] = static_cast<float>(lse);
  }
  return {};
}

}  // namespace

Status gather_attention(const GatherAttentionParams& p) {
  Geometry g{};
  g.sq = p.q.shape[1];
  g.sk = p.k.shape[1];
  g.hq = p.q.shape[2];
  g.d = p.q.shape[3];
  g.n_max = p.indices.shape[3];
  g.group = p.q.shape[2] / p.k.shape[2];
  g.kv_lists = p.indices.shape[1] != g.hq;  // validated: Hq or Hk (equal when Hq == Hk)
  g.scale = p.scale == 0.0f ? 1.0 / std::sqrt(static_cast<double>(g.d)) : static_cast<double>(p.scale);
  const std::int64_t rows = p.q.shape[0] * g.hq * g.sq;
  return for_each_row(rows, p.exec.cpu_threads, [&](std::int64_t r) { return gather_row(p, g, r); });
}

}  // namespace sparge::cpu
