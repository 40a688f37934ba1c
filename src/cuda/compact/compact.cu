// PLACEHOLDER: to be replaced by the real kernel.
#include "cuda/cuda_backend.h"
namespace sparge::cuda {
Status supported(const CompactMaskParams&) { return unsupported("cuda::compact_mask is not implemented yet"); }
Status compact_mask(const CompactMaskParams& p) { return sparge::cuda::supported(p); }
}  // namespace sparge::cuda
