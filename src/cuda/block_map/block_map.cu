// PLACEHOLDER: to be replaced by the real kernel.
#include "cuda/cuda_backend.h"
namespace sparge::cuda {
Status supported(const BlockMapParams&) { return unsupported("cuda::build_block_map is not implemented yet"); }
Status build_block_map(const BlockMapParams& p) { return sparge::cuda::supported(p); }
}  // namespace sparge::cuda
