// The one place that routes an operation to a backend. Every entry validates first (backend-
// independent semantics), then asks the backend whether it supports the params, then runs it.
#include "cpu/cpu.h"
#include "cuda/cuda_backend.h"
#include "validate/validate.h"

namespace sparge {

namespace {
template <class P>
Status supported_impl(const P& p) {
  SPARGE_RETURN_IF_ERROR(detail::validate(p));
  if (p.exec.backend == Backend::cpu) return {};
  return cuda::supported(p);
}
}  // namespace

#define SPARGE_DEFINE_OP(name, Params)                                                    \
  Status supported(const Params& p) { return supported_impl(p); }                         \
  Status name(const Params& p) {                                                          \
    SPARGE_RETURN_IF_ERROR(supported_impl(p));                                            \
    return p.exec.backend == Backend::cpu ? cpu::name(p) : cuda::name(p);                 \
  }

SPARGE_DEFINE_OP(build_block_map, BlockMapParams)
SPARGE_DEFINE_OP(block_sparse_attention, BlockSparseAttentionParams)
SPARGE_DEFINE_OP(dense_attention, DenseAttentionParams)
SPARGE_DEFINE_OP(topk_select, TopkSelectParams)
SPARGE_DEFINE_OP(compact_mask, CompactMaskParams)
SPARGE_DEFINE_OP(gather_attention, GatherAttentionParams)
SPARGE_DEFINE_OP(merge_attention, MergeAttentionParams)

#undef SPARGE_DEFINE_OP

bool cuda_available() { return cuda::available(); }

}  // namespace sparge
