// The CPU backend: the executable specification of every operation (docs/semantics.md).
// Entries receive params that detail::validate has already accepted.
#pragma once

#include "sparge/ops.h"

namespace sparge::cpu {

Status build_block_map(const BlockMapParams& p);
Status block_sparse_attention(const BlockSparseAttentionParams& p);
Status dense_attention(const DenseAttentionParams& p);
Status topk_select(const TopkSelectParams& p);
Status compact_mask(const CompactMaskParams& p);
Status gather_attention(const GatherAttentionParams& p);
Status merge_attention(const MergeAttentionParams& p);

}  // namespace sparge::cpu
