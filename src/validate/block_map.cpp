// Host-side checks of build_block_map (docs/semantics.md, Stage 1). Everything a backend relies on
// is established here: block sizes, exactly one selection rule, parameter ranges, and the exact
// shapes of every output, so the backends only index.
#include <cmath>

#include "validate/validate.h"

namespace sparge::detail {

namespace {
constexpr const char* kOp = "build_block_map";

Status check_block_size(const char* name, int blk) {
  if (blk != 64 && blk != 128) return unsupported(cat(kOp, ": ", name, " = ", blk, " is not supported (expected 64 or 128)"));
  return {};
}

// An output tensor of the given dtype and exact shape, with positive strides.
Status check_output(const char* name, const Tensor& t, DType dtype, std::initializer_list<std::int64_t> shape,
                    std::initializer_list<const char*> what) {
  const int ndim = static_cast<int>(shape.size());
  SPARGE_RETURN_IF_ERROR(check_tensor(kOp, name, t, ndim, {dtype}));
  int i = 0;
  auto w = what.begin();
  for (std::int64_t expected : shape) {
    SPARGE_RETURN_IF_ERROR(check_dim(kOp, name, t, i, expected, *w));
    ++i;
    ++w;
  }
  return check_strides(kOp, name, t, false);
}
}  // namespace

Status validate(const BlockMapParams& p) {
  SPARGE_RETURN_IF_ERROR(check_exec(kOp, p.exec));
  SPARGE_RETURN_IF_ERROR(check_qkv(kOp, p.q, p.k, nullptr, nullptr, p.varlen, p.exec.backend));
  SPARGE_RETURN_IF_ERROR(check_block_size("blkq", p.blkq));
  SPARGE_RETURN_IF_ERROR(check_block_size("blkk", p.blkk));

  const Dims d = attention_dims(p.q, p.k, p.varlen);
  const int hq = static_cast<int>(d.hq);
  if (p.topk.empty() == p.cdfthreshd.empty()) {
    return bad(kOp, "exactly one of topk and cdfthreshd must be given (topk has ", p.topk.size(),
               " values, cdfthreshd has ", p.cdfthreshd.size(), ")");
  }
  SPARGE_RETURN_IF_ERROR(check_per_head(kOp, "topk", p.topk, hq, 0.0f, 1.0f, true));
  SPARGE_RETURN_IF_ERROR(check_per_head(kOp, "cdfthreshd", p.cdfthreshd, hq, 0.0f, 1.0f, true));
  SPARGE_RETURN_IF_ERROR(check_per_head(kOp, "simthreshd1", p.simthreshd1, hq, -1.0f, 1.0f, false));
  if (!std::isfinite(p.scale) || p.scale < 0.0f) {
    return bad(kOp, "scale = ", p.scale, " is out of range (expected a finite value >= 0; 0 = 1/sqrt(D))");
  }

  const std::int64_t nq = num_blocks(d.sq, p.blkq);
  const std::int64_t nk = num_blocks(d.sk, p.blkk);
  const char* batch = p.varlen.enabled() ? "varlen.num_seqs" : "q.shape[0] (batch)";
  const char* nq_what = p.varlen.enabled() ? "NQ = ceil(varlen.max_seqlen_q / blkq)" : "NQ = ceil(Sq / blkq)";
  const char* nk_what = p.varlen.enabled() ? "NK = ceil(varlen.max_seqlen_k / blkk)" : "NK = ceil(Sk / blkk)";
  SPARGE_RETURN_IF_ERROR(check_output("lut", p.lut, DType::i32, {d.batch, d.hq, nq, nk},
                                      {batch, "q.shape[2] (Hq)", nq_what, nk_what}));
  SPARGE_RETURN_IF_ERROR(check_output("counts", p.counts, DType::i32, {d.batch, d.hq, nq},
                                      {batch, "q.shape[2] (Hq)", nq_what}));
  if (p.maybe_scores.present()) {
    SPARGE_RETURN_IF_ERROR(check_output("maybe_scores", p.maybe_scores, DType::f32, {d.batch, d.hq, nq, nk},
                                        {batch, "q.shape[2] (Hq)", nq_what, nk_what}));
  }
  if (p.maybe_q_sim.present()) {
    SPARGE_RETURN_IF_ERROR(check_output("maybe_q_sim", p.maybe_q_sim, DType::f32, {d.batch, d.hq, nq},
                                        {batch, "q.shape[2] (Hq)", nq_what}));
  }
  if (p.maybe_k_sim.present()) {
    SPARGE_RETURN_IF_ERROR(check_output("maybe_k_sim", p.maybe_k_sim, DType::f32, {d.batch, d.hk, nk},
                                        {batch, "k.shape[2] (Hk)", nk_what}));
  }
  if (p.maybe_fp8_qk.present()) {
    SPARGE_RETURN_IF_ERROR(check_quantized_qk(kOp, "maybe_fp8_qk", p.maybe_fp8_qk, d, p.blkk, p.smooth_k, p.varlen));
  }
  return {};
}

}  // namespace sparge::detail
