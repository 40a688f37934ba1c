// PLACEHOLDER: to be replaced by the real kernel.
#include "cuda/cuda_backend.h"
namespace sparge::cuda {
Status supported(const BlockSparseAttentionParams&) { return unsupported("cuda::block_sparse_attention is not implemented yet"); }
Status block_sparse_attention(const BlockSparseAttentionParams& p) { return sparge::cuda::supported(p); }
Status supported(const DenseAttentionParams&) { return unsupported("cuda::dense_attention is not implemented yet"); }
Status dense_attention(const DenseAttentionParams& p) { return sparge::cuda::supported(p); }
}  // namespace sparge::cuda
