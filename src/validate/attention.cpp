// Host-side checks of block_sparse_attention and dense_attention (docs/semantics.md, Stage 2).
// Shapes, dtypes and parameter ranges for every backend; on the cpu backend also the contents the
// CPU reads (cu_seqlens via check_qkv, every LUT entry and count), so no read is ever out of
// bounds. The CUDA backend cannot read device memory here; its kernels clamp instead.
#include <cmath>
#include <limits>

#include "validate/validate.h"

namespace sparge::detail {

namespace {
constexpr const char* kSparse = "block_sparse_attention";
constexpr const char* kDense = "dense_attention";

const char* batch_what(const Varlen& v) { return v.enabled() ? "varlen.num_seqs" : "q.shape[0] (batch)"; }

Status check_scale(const char* op, float scale) {
  if (!std::isfinite(scale) || scale < 0.0f) {
    return bad(op, "scale = ", scale, " is out of range (expected a finite value >= 0; 0 = 1/sqrt(D))");
  }
  return {};
}

// maybe_lse: f32 [B, Hq, Sq] (Sq = max_seqlen_q with varlen), an output.
Status check_lse(const char* op, const Tensor& lse, const Dims& d, const Varlen& v) {
  if (!lse.present()) return {};
  SPARGE_RETURN_IF_ERROR(check_tensor(op, "maybe_lse", lse, 3, {DType::f32}));
  SPARGE_RETURN_IF_ERROR(check_dim(op, "maybe_lse", lse, 0, d.batch, batch_what(v)));
  SPARGE_RETURN_IF_ERROR(check_dim(op, "maybe_lse", lse, 1, d.hq, "q.shape[2] (Hq)"));
  SPARGE_RETURN_IF_ERROR(check_dim(op, "maybe_lse", lse, 2, d.sq, v.enabled() ? "varlen.max_seqlen_q" : "q.shape[1] (Sq)"));
  return check_strides(op, "maybe_lse", lse, false);
}

Status check_block_size(const char* name, int blk) {
  if (blk != 64 && blk != 128) {
    return unsupported(cat(kSparse, ": ", name, " = ", blk, " is not supported (expected 64 or 128)"));
  }
  return {};
}

// Every count in [0, NK] and every listed block inside its own sequence's key blocks, read on
// the host (cpu backend only). Messages name the position and the value.
Status check_lut_host(const BlockSparseAttentionParams& p, const Dims& d, std::int64_t nq, std::int64_t nk) {
  const auto* lut = p.lut.ptr<const std::int32_t>();
  const auto* counts = p.counts.ptr<const std::int32_t>();
  for (std::int64_t b = 0; b < d.batch; ++b) {
    const std::int64_t sk = p.varlen.enabled() ? p.varlen.cu_seqlens_k[b + 1] - p.varlen.cu_seqlens_k[b] : d.sk;
    const std::int64_t nk_seq = num_blocks(sk, p.blkk);
    for (std::int64_t h = 0; h < d.hq; ++h) {
      for (std::int64_t qb = 0; qb < nq; ++qb) {
        const std::int32_t c = counts[p.counts.offset(b, h, qb)];
        if (c < 0 || c > nk) {
          return bad(kSparse, "counts[b=", b, ", h=", h, ", qb=", qb, "] = ", c, " is out of range (expected 0..NK = ", nk, ")");
        }
        for (std::int32_t e = 0; e < c; ++e) {
          const std::int32_t kb = lut[p.lut.offset(b, h, qb, e)];
          if (kb < 0 || kb >= nk_seq) {
            return bad(kSparse, "lut[b=", b, ", h=", h, ", qb=", qb, ", ", e, "] = ", kb,
                       " is not a key block of the sequence (expected 0..", nk_seq - 1, ", its Sk = ", sk,
                       ", blkk = ", p.blkk, ")");
          }
        }
      }
    }
  }
  return {};
}
}  // namespace

Status validate(const BlockSparseAttentionParams& p) {
  SPARGE_RETURN_IF_ERROR(check_exec(kSparse, p.exec));
  SPARGE_RETURN_IF_ERROR(check_qkv(kSparse, p.q, p.k, &p.v, &p.o, p.varlen, p.exec.backend));
  SPARGE_RETURN_IF_ERROR(check_block_size("blkq", p.blkq));
  SPARGE_RETURN_IF_ERROR(check_block_size("blkk", p.blkk));
  SPARGE_RETURN_IF_ERROR(check_scale(kSparse, p.scale));
  if (p.recipe != Recipe::none && p.recipe != Recipe::fp8) {
    return bad(kSparse, "recipe = ", static_cast<int>(p.recipe), " is out of range (expected Recipe::none or Recipe::fp8)");
  }
  if (p.recipe == Recipe::fp8 && p.varlen.enabled()) {
    return unsupported(cat(kSparse, ": recipe = fp8 with varlen is not supported"));
  }
  const Dims d = attention_dims(p.q, p.k, p.varlen);
  // Thresholds must be > 0: with 0 (or less) a row's first visible block, whose max equals the
  // running max, would pass the test and lose its values.
  SPARGE_RETURN_IF_ERROR(check_per_head(kSparse, "pv_threshold", p.pv_threshold, static_cast<int>(d.hq), 0.0f,
                                        std::numeric_limits<float>::max(), true));
  SPARGE_RETURN_IF_ERROR(check_lse(kSparse, p.maybe_lse, d, p.varlen));

  const std::int64_t nq = num_blocks(d.sq, p.blkq);
  const std::int64_t nk = num_blocks(d.sk, p.blkk);
  const bool vl = p.varlen.enabled();
  const char* nq_what = vl ? "NQ = ceil(varlen.max_seqlen_q / blkq)" : "NQ = ceil(Sq / blkq)";
  const char* nk_what = vl ? "NK = ceil(varlen.max_seqlen_k / blkk)" : "NK = ceil(Sk / blkk)";
  SPARGE_RETURN_IF_ERROR(check_tensor(kSparse, "lut", p.lut, 4, {DType::i32}));
  SPARGE_RETURN_IF_ERROR(check_dim(kSparse, "lut", p.lut, 0, d.batch, batch_what(p.varlen)));
  SPARGE_RETURN_IF_ERROR(check_dim(kSparse, "lut", p.lut, 1, d.hq, "q.shape[2] (Hq)"));
  SPARGE_RETURN_IF_ERROR(check_dim(kSparse, "lut", p.lut, 2, nq, nq_what));
  SPARGE_RETURN_IF_ERROR(check_dim(kSparse, "lut", p.lut, 3, nk, nk_what));
  SPARGE_RETURN_IF_ERROR(check_strides(kSparse, "lut", p.lut, true));
  SPARGE_RETURN_IF_ERROR(check_tensor(kSparse, "counts", p.counts, 3, {DType::i32}));
  SPARGE_RETURN_IF_ERROR(check_dim(kSparse, "counts", p.counts, 0, d.batch, batch_what(p.varlen)));
  SPARGE_RETURN_IF_ERROR(check_dim(kSparse, "counts", p.counts, 1, d.hq, "q.shape[2] (Hq)"));
  SPARGE_RETURN_IF_ERROR(check_dim(kSparse, "counts", p.counts, 2, nq, nq_what));
  SPARGE_RETURN_IF_ERROR(check_strides(kSparse, "counts", p.counts, true));
  if (p.maybe_fp8_qk.present()) {
    if (p.recipe != Recipe::fp8) {
      return bad(kSparse, "maybe_fp8_qk is given with recipe = ", to_string(p.recipe), " (it is an input of recipe = fp8 only)");
    }
    SPARGE_RETURN_IF_ERROR(check_quantized_qk(kSparse, "maybe_fp8_qk", p.maybe_fp8_qk, d, p.blkk, p.smooth_k, p.varlen));
  }
  if (p.exec.backend == Backend::cpu) SPARGE_RETURN_IF_ERROR(check_lut_host(p, d, nq, nk));
  return {};
}

Status validate(const DenseAttentionParams& p) {
  SPARGE_RETURN_IF_ERROR(check_exec(kDense, p.exec));
  SPARGE_RETURN_IF_ERROR(check_qkv(kDense, p.q, p.k, &p.v, &p.o, p.varlen, p.exec.backend));
  SPARGE_RETURN_IF_ERROR(check_scale(kDense, p.scale));
  const Dims d = attention_dims(p.q, p.k, p.varlen);
  SPARGE_RETURN_IF_ERROR(check_lse(kDense, p.maybe_lse, d, p.varlen));
  if (p.maybe_mask.present()) {
    if (p.exec.backend != Backend::cpu) {
      return unsupported(cat(kDense, ": maybe_mask is given but the ", to_string(p.exec.backend),
                             " backend does not support it (the mask is a cpu-only test aid)"));
    }
    const bool vl = p.varlen.enabled();
    SPARGE_RETURN_IF_ERROR(check_tensor(kDense, "maybe_mask", p.maybe_mask, 4, {DType::u8}));
    SPARGE_RETURN_IF_ERROR(check_dim(kDense, "maybe_mask", p.maybe_mask, 0, d.batch, batch_what(p.varlen)));
    SPARGE_RETURN_IF_ERROR(check_dim(kDense, "maybe_mask", p.maybe_mask, 1, d.hq, "q.shape[2] (Hq)"));
    SPARGE_RETURN_IF_ERROR(check_dim(kDense, "maybe_mask", p.maybe_mask, 2, d.sq, vl ? "varlen.max_seqlen_q" : "q.shape[1] (Sq)"));
    SPARGE_RETURN_IF_ERROR(check_dim(kDense, "maybe_mask", p.maybe_mask, 3, d.sk, vl ? "varlen.max_seqlen_k" : "k.shape[1] (Sk)"));
    SPARGE_RETURN_IF_ERROR(check_strides(kDense, "maybe_mask", p.maybe_mask, true));
  }
  return {};
}

}  // namespace sparge::detail
