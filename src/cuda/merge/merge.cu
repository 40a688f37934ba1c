// PLACEHOLDER: to be replaced by the real kernel.
#include "cuda/cuda_backend.h"
namespace sparge::cuda {
Status supported(const MergeAttentionParams&) { return unsupported("cuda::merge_attention is not implemented yet"); }
Status merge_attention(const MergeAttentionParams& p) { return sparge::cuda::supported(p); }
}  // namespace sparge::cuda
