// Host checks of the token-level operations: topk_select, compact_mask, gather_attention.
// Only shapes, dtypes, strides and scalars are checked here (backend-independent). The contents
// (NaN scores, non-finite masks, out-of-range lists) are checked by the CPU backend as it reads
// them; the CUDA backend cannot read device memory on the host.
#include <cstdint>
#include <limits>

#include "validate/validate.h"

namespace sparge::detail {

namespace {

constexpr std::int64_t kMaxIndex = std::numeric_limits<std::int32_t>::max();

// A required i32 output of logical shape `shape` (rank = shape.size()).
Status check_i32_output(const char* op, const char* name, const Tensor& t,
                        std::initializer_list<std::pair<std::int64_t, const char*>> shape) {
  SPARGE_RETURN_IF_ERROR(check_tensor(op, name, t, static_cast<int>(shape.size()), {DType::i32}));
  SPARGE_RETURN_IF_ERROR(check_strides(op, name, t, false));
  int d = 0;
  for (const auto& [extent, what] : shape) SPARGE_RETURN_IF_ERROR(check_dim(op, name, t, d++, extent, what));
  return {};
}

// The [R, N] float input of topk_select / compact_mask.
Status check_rows_input(const char* op, const char* name, const Tensor& t) {
  SPARGE_RETURN_IF_ERROR(check_tensor(op, name, t, 2, {DType::f32, DType::f16}));
  SPARGE_RETURN_IF_ERROR(check_strides(op, name, t, true));
  if (t.shape[1] > kMaxIndex) {
    return bad(op, name, ".shape[1] = ", t.shape[1], " exceeds the int32 range of the output indices");
  }
  return {};
}

}  // namespace

Status validate(const TopkSelectParams& p) {
  const char* op = "topk_select";
  SPARGE_RETURN_IF_ERROR(check_exec(op, p.exec));
  SPARGE_RETURN_IF_ERROR(check_rows_input(op, "scores", p.scores));
  const std::int64_t rows = p.scores.shape[0], n = p.scores.shape[1];
  if (n == 0) return bad(op, "scores.shape[1] = 0 (each row needs at least one score)");
  if (p.k < 1 || p.k > n) return bad(op, "k = ", p.k, " is out of range (expected 1..", n, " = scores.shape[1])");
  SPARGE_RETURN_IF_ERROR(check_i32_output(op, "indices", p.indices, {{rows, "scores.shape[0] (rows)"}, {p.k, "k"}}));
  if (p.maybe_counts.present()) {
    SPARGE_RETURN_IF_ERROR(check_i32_output(op, "maybe_counts", p.maybe_counts, {{rows, "scores.shape[0] (rows)"}}));
  }
  return {};
}

Status validate(const CompactMaskParams& p) {
  const char* op = "compact_mask";
  SPARGE_RETURN_IF_ERROR(check_exec(op, p.exec));
  SPARGE_RETURN_IF_ERROR(check_rows_input(op, "mask", p.mask));
  if (p.n_max < 1) return bad(op, "n_max = ", p.n_max, " (must be at least 1)");
  const std::int64_t rows = p.mask.shape[0];
  SPARGE_RETURN_IF_ERROR(check_i32_output(op, "indices", p.indices, {{rows, "mask.shape[0] (rows)"}, {p.n_max, "n_max"}}));
  SPARGE_RETURN_IF_ERROR(check_i32_output(op, "counts", p.counts, {{rows, "mask.shape[0] (rows)"}}));
  return {};
}

Status validate(const GatherAttentionParams& p) {
  const char* op = "gather_attention";
  SPARGE_RETURN_IF_ERROR(check_exec(op, p.exec));
  SPARGE_RETURN_IF_ERROR(check_qkv(op, p.q, p.k, &p.v, &p.o, Varlen{}, p.exec.backend));
  // The same rule as the dense and block-sparse attention entries.
  if (!std::isfinite(p.scale) || p.scale < 0.0f) {
    return bad(op, "scale = ", p.scale, " is out of range (expected a finite value >= 0; 0 = 1/sqrt(D))");
  }
  const std::int64_t batch = p.q.shape[0], sq = p.q.shape[1], hq = p.q.shape[2];
  if (p.k.shape[1] > kMaxIndex) return bad(op, "k.shape[1] (Sk) = ", p.k.shape[1], " exceeds the int32 range of indices");

  SPARGE_RETURN_IF_ERROR(check_tensor(op, "indices", p.indices, 4, {DType::i32}));
  SPARGE_RETURN_IF_ERROR(check_strides(op, "indices", p.indices, true));
  SPARGE_RETURN_IF_ERROR(check_dim(op, "indices", p.indices, 0, batch, "q.shape[0] (batch)"));
  // One list per query head (dim 1 = Hq) or one per kv head (dim 1 = Hk: query head h reads list
  // h / (Hq / Hk), as NSA / DSA-style selectors produce); counts has the same dim 1.
  const std::int64_t hk = p.k.shape[2];
  if (p.indices.shape[1] != hq && p.indices.shape[1] != hk) {
    return bad(op, "indices.shape[1] = ", p.indices.shape[1], " (expected ", hq, " = q.shape[2] (Hq), one list per query head, or ", hk,
               " = k.shape[2] (Hk), one list per kv head)");
  }
  const std::int64_t list_heads = p.indices.shape[1];
  SPARGE_RETURN_IF_ERROR(check_dim(op, "indices", p.indices, 2, sq, "q.shape[1] (Sq)"));
  if (p.indices.shape[3] < 1) return bad(op, "indices.shape[3] (n_max) = ", p.indices.shape[3], " (must be at least 1)");
  if (p.indices.shape[3] > kMaxIndex) return bad(op, "indices.shape[3] (n_max) = ", p.indices.shape[3], " exceeds the int32 range of counts");

  SPARGE_RETURN_IF_ERROR(check_tensor(op, "counts", p.counts, 3, {DType::i32}));
  SPARGE_RETURN_IF_ERROR(check_strides(op, "counts", p.counts, true));
  SPARGE_RETURN_IF_ERROR(check_dim(op, "counts", p.counts, 0, batch, "q.shape[0] (batch)"));
  SPARGE_RETURN_IF_ERROR(check_dim(op, "counts", p.counts, 1, list_heads, "indices.shape[1] (list heads)"));
  SPARGE_RETURN_IF_ERROR(check_dim(op, "counts", p.counts, 2, sq, "q.shape[1] (Sq)"));

  if (p.maybe_lse.present()) {
    SPARGE_RETURN_IF_ERROR(check_tensor(op, "maybe_lse", p.maybe_lse, 3, {DType::f32}));
    SPARGE_RETURN_IF_ERROR(check_strides(op, "maybe_lse", p.maybe_lse, false));
    SPARGE_RETURN_IF_ERROR(check_dim(op, "maybe_lse", p.maybe_lse, 0, batch, "q.shape[0] (batch)"));
    SPARGE_RETURN_IF_ERROR(check_dim(op, "maybe_lse", p.maybe_lse, 1, hq, "q.shape[2] (Hq)"));
    SPARGE_RETURN_IF_ERROR(check_dim(op, "maybe_lse", p.maybe_lse, 2, sq, "q.shape[1] (Sq)"));
  }
  if (p.group_union && p.union_rows < 1) {
    return bad(op, "union_rows = ", p.union_rows, " (must be at least 1 when group_union is set)");
  }
  return {};
}

}  // namespace sparge::detail
