// dist::sparse_attention: host-side validation (before any launch or communication; every error
// names the parameter and the value), then the NCCL backend (ring.cpp) or the stub.
#include <cmath>

#include "dist/plan.h"
#include "dist/run.h"
#include "validate/validate.h"

namespace sparge::dist {

namespace {

constexpr const char* kOp = "dist::sparse_attention";
using sparge::detail::bad;
using sparge::detail::cat;

Status check_block(const char* name, int blk) {
  if (blk != 64 && blk != 128) return unsupported(cat(kOp, ": ", name, " = ", blk, " is not supported (expected 64 or 128)"));
  return {};
}

Status check_output(const char* name, const Tensor& t, std::initializer_list<std::int64_t> shape,
                    std::initializer_list<const char*> what, DType dtype) {
  SPARGE_RETURN_IF_ERROR(sparge::detail::check_tensor(kOp, name, t, static_cast<int>(shape.size()), {dtype}));
  int i = 0;
  auto w = what.begin();
  for (std::int64_t expected : shape) {
    SPARGE_RETURN_IF_ERROR(sparge::detail::check_dim(kOp, name, t, i++, expected, *w++));
  }
  return sparge::detail::check_strides(kOp, name, t, false);
}

Status validate(const SparseAttentionParams& p) {
  SPARGE_RETURN_IF_ERROR(sparge::detail::check_exec(kOp, p.exec));
  if (p.exec.backend != Backend::cuda) {
    return unsupported(cat(kOp, ": exec.backend = ", to_string(p.exec.backend), " is not supported (expected cuda)"));
  }
  const Communicator& c = p.comm;
  if (c.nccl_comm == nullptr) return bad(kOp, "comm.nccl_comm is missing (nullptr)");
  if (c.size < 1) return bad(kOp, "comm.size = ", c.size, " (must be at least 1)");
  if (c.rank < 0 || c.rank >= c.size) return bad(kOp, "comm.rank = ", c.rank, " is out of range [0, ", c.size, ")");
  if (c.stream != nullptr && c.stream == p.exec.stream) {
    return bad(kOp, "comm.stream is exec.stream (the transfers need their own stream to overlap the compute)");
  }
  if (p.seq_len < 1 || p.seq_len > (std::int64_t{1} << 30)) {
    return bad(kOp, "seq_len = ", p.seq_len, " is out of range (expected 1 .. 2^30)");
  }
  if (!(p.timeout_seconds > 0.0) || !std::isfinite(p.timeout_seconds)) {
    return bad(kOp, "timeout_seconds = ", p.timeout_seconds, " (expected a finite value > 0)");
  }
  SPARGE_RETURN_IF_ERROR(sparge::detail::check_qkv(kOp, p.q, p.k, &p.v, &p.o, Varlen{}, p.exec.backend));
  const Shard shard = shard_of(p.seq_len, c.size, c.rank);
  const std::string what = cat("the shard length of rank ", c.rank, " of ", c.size, " for seq_len ", p.seq_len);
  SPARGE_RETURN_IF_ERROR(sparge::detail::check_dim(kOp, "q", p.q, 1, shard.len, what.c_str()));
  SPARGE_RETURN_IF_ERROR(sparge::detail::check_dim(kOp, "k", p.k, 1, shard.len, what.c_str()));
  SPARGE_RETURN_IF_ERROR(check_block("blkq", p.blkq));
  SPARGE_RETURN_IF_ERROR(check_block("blkk", p.blkk));

  const int hq = static_cast<int>(p.q.shape[2]);
  if (p.topk.empty() == p.cdfthreshd.empty()) {
    return bad(kOp, "exactly one of topk and cdfthreshd must be given (topk has ", p.topk.size(),
               " values, cdfthreshd has ", p.cdfthreshd.size(), ")");
  }
  SPARGE_RETURN_IF_ERROR(sparge::detail::check_per_head(kOp, "topk", p.topk, hq, 0.0f, 1.0f, true));
  SPARGE_RETURN_IF_ERROR(sparge::detail::check_per_head(kOp, "cdfthreshd", p.cdfthreshd, hq, 0.0f, 1.0f, true));
  SPARGE_RETURN_IF_ERROR(sparge::detail::check_per_head(kOp, "simthreshd1", p.simthreshd1, hq, -1.0f, 1.0f, false));
  if (!std::isfinite(p.scale) || p.scale < 0.0f) {
    return bad(kOp, "scale = ", p.scale, " is out of range (expected a finite value >= 0; 0 = 1/sqrt(D))");
  }

  const std::int64_t b = p.q.shape[0];
  const std::int64_t nql = num_blocks(shard.len, p.blkq);
  const std::int64_t nk = num_blocks(p.seq_len, p.blkk);
  if (p.maybe_lse.present()) {
    SPARGE_RETURN_IF_ERROR(check_output("maybe_lse", p.maybe_lse, {b, hq, shard.len},
                                        {"q.shape[0] (batch)", "q.shape[2] (Hq)", "q.shape[1] (L)"}, DType::f32));
  }
  if (p.maybe_lut.present() != p.maybe_counts.present()) {
    return bad(kOp, "maybe_lut and maybe_counts must be given together (maybe_lut ",
               p.maybe_lut.present() ? "present" : "absent", ", maybe_counts ", p.maybe_counts.present() ? "present" : "absent", ")");
  }
  if (p.maybe_lut.present()) {
    SPARGE_RETURN_IF_ERROR(check_output("maybe_lut", p.maybe_lut, {b, hq, nql, nk},
                                        {"q.shape[0] (batch)", "q.shape[2] (Hq)", "NQL = ceil(L / blkq)",
                                         "NK = ceil(seq_len / blkk)"},
                                        DType::i32));
    SPARGE_RETURN_IF_ERROR(check_output("maybe_counts", p.maybe_counts, {b, hq, nql},
                                        {"q.shape[0] (batch)", "q.shape[2] (Hq)", "NQL = ceil(L / blkq)"}, DType::i32));
  }
  return {};
}

}  // namespace

bool available() { return detail::nccl_built(); }

Status sparse_attention(const SparseAttentionParams& p) {
  SPARGE_RETURN_IF_ERROR(validate(p));
  return detail::run(p);
}

}  // namespace sparge::dist
