// Built when sparge has no CUDA backend: every CUDA entry reports that plainly.
#include "cuda/cuda_backend.h"

namespace sparge::cuda {

namespace {
Status no_cuda() { return unsupported("exec.backend = cuda, but this build of sparge has no CUDA backend (configure with SPARGE_CUDA=ON on a machine with nvcc)"); }
}  // namespace

bool available() { return false; }

#define SPARGE_STUB(name, Params)                          \
  Status supported(const Params&) { return no_cuda(); }   \
  Status name(const Params&) { return no_cuda(); }

SPARGE_STUB(build_block_map, BlockMapParams)
SPARGE_STUB(block_sparse_attention, BlockSparseAttentionParams)
SPARGE_STUB(dense_attention, DenseAttentionParams)
SPARGE_STUB(topk_select, TopkSelectParams)
SPARGE_STUB(compact_mask, CompactMaskParams)
SPARGE_STUB(gather_attention, GatherAttentionParams)
SPARGE_STUB(merge_attention, MergeAttentionParams)

#undef SPARGE_STUB

}  // namespace sparge::cuda
