// The CUDA backend's entries, as the dispatcher sees them. `supported` and the entry share one
// selection function per operation, so they never disagree. Without a CUDA build every entry
// returns `unsupported` (src/cuda/stub.cpp).
#pragma once

#include "sparge/ops.h"

namespace sparge::cuda {

bool available();

Status supported(const BlockMapParams& p);
Status supported(const BlockSparseAttentionParams& p);
Status supported(const DenseAttentionParams& p);
Status supported(const TopkSelectParams& p);
Status supported(const CompactMaskParams& p);
Status supported(const GatherAttentionParams& p);
Status supported(const MergeAttentionParams& p);

Status build_block_map(const BlockMapParams& p);
Status block_sparse_attention(const BlockSparseAttentionParams& p);
Status dense_attention(const DenseAttentionParams& p);
Status topk_select(const TopkSelectParams& p);
Status compact_mask(const CompactMaskParams& p);
Status gather_attention(const GatherAttentionParams& p);
Status merge_attention(const MergeAttentionParams& p);

}  // namespace sparge::cuda
