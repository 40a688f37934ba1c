#include "cuda/scratch_pool.h"

#include <cstdint>
#include <mutex>

namespace sparge::cuda {

cudaError_t scratch_pool(cudaMemPool_t& out) {
  constexpr int kMaxDevices = 64;
  static std::mutex mu;
  static cudaMemPool_t pools[kMaxDevices] = {};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidDevice;
  const std::lock_guard<std::mutex> lock(mu);
  if (pools[dev] == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaMemPool_t pool = nullptr;
    if ((e = cudaMemPoolCreate(&pool, &props)) != cudaSuccess) return e;
    const std::uint64_t keep = ~std::uint64_t{0};
    if ((e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, const_cast<std::uint64_t*>(&keep))) !=
        cudaSuccess) {
      (void)cudaMemPoolDestroy(pool);
      return e;
    }
    pools[dev] = pool;
  }
  out = pools[dev];
  return cudaSuccess;
}

cudaError_t scratch_alloc(void** ptr, std::size_t bytes, cudaStream_t stream) {
  cudaMemPool_t pool = nullptr;
  const cudaError_t e = scratch_pool(pool);
  if (e != cudaSuccess) return e;
  return cudaMallocFromPoolAsync(ptr, bytes, pool, stream);
}

}  // namespace sparge::cuda
