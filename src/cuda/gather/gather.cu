// PLACEHOLDER: to be replaced by the real kernel.
#include "cuda/cuda_backend.h"
namespace sparge::cuda {
Status supported(const GatherAttentionParams&) { return unsupported("cuda::gather_attention is not implemented yet"); }
Status gather_attention(const GatherAttentionParams& p) { return sparge::cuda::supported(p); }
}  // namespace sparge::cuda
