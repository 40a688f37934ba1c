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

namespace {

// The calling thread's helper streams, by device; destroyed with the thread (errors ignored: at
// process exit the runtime may already be gone).
struct ThreadHelpers {
  static constexpr int kMaxDevices = 64;
  HelperStream h[kMaxDevices] = {};
  ThreadHelpers() = default;
  ThreadHelpers(const ThreadHelpers&) = delete;
  ThreadHelpers& operator=(const ThreadHelpers&) = delete;
  ~ThreadHelpers() {
    for (HelperStream& x : h) {
      if (x.fork != nullptr) (void)cudaEventDestroy(x.fork);
      if (x.stream != nullptr) (void)cudaStreamDestroy(x.stream);
    }
  }
};

}  // namespace

cudaError_t helper_stream(HelperStream& out) {
  thread_local ThreadHelpers helpers;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= ThreadHelpers::kMaxDevices) return cudaErrorInvalidDevice;
  HelperStream& h = helpers.h[dev];
  if (h.stream == nullptr) {
    HelperStream made;
    if ((e = cudaStreamCreateWithFlags(&made.stream, cudaStreamNonBlocking)) != cudaSuccess) return e;
    if ((e = cudaEventCreateWithFlags(&made.fork, cudaEventDisableTiming)) != cudaSuccess) {
      (void)cudaStreamDestroy(made.stream);
      return e;
    }
    h = made;
  }
  out = h;
  return cudaSuccess;
}

}  // namespace sparge::cuda
