// PLACEHOLDER: to be replaced by the real kernel.
#include "cuda/cuda_backend.h"
namespace sparge::cuda {
Status supported(const TopkSelectParams&) { return unsupported("cuda::topk_select is not implemented yet"); }
Status topk_select(const TopkSelectParams& p) { return sparge::cuda::supported(p); }
}  // namespace sparge::cuda
