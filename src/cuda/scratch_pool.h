// A private stream-ordered memory pool per device that keeps its memory between calls.
//
// With the device's default pool (release threshold 0) every synchronization hands freed memory
// back to the driver and the next call maps it again: for the block map's small scratch that costs
// more host time than its kernels, and for context parallelism's gigabytes of K/V slots and fp32
// accumulators it costs milliseconds per call. The pool holds at most the largest total that was
// in use at one time (concurrent calls on several streams add up) and lives as long as the
// process. Allocations from it stay stream ordered, so calls on different streams are safe.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace sparge::cuda {

// The pool of the current device (created on first use; thread safe).
cudaError_t scratch_pool(cudaMemPool_t& out);

// `bytes` of stream-ordered scratch from that pool (free it with cudaFreeAsync on the stream).
// Every per-call allocation of the CUDA backend comes from here.
cudaError_t scratch_alloc(void** ptr, std::size_t bytes, cudaStream_t stream);

// Stream-ordered scratch from scratch_alloc that frees itself (cudaFreeAsync on the same stream) when it
// goes out of scope, i.e. after the work the owner enqueued on that stream.
class ScopedScratch {
 public:
  explicit ScopedScratch(cudaStream_t stream) : stream_(stream) {}
  ~ScopedScratch() {
    if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
  }
  ScopedScratch(const ScopedScratch&) = delete;
  ScopedScratch& operator=(const ScopedScratch&) = delete;
  // At least one byte, so that a zero-sized request still yields a valid pointer. Once per object.
  cudaError_t alloc(std::size_t bytes) { return scratch_alloc(&ptr_, bytes == 0 ? 1 : bytes, stream_); }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

// A non-blocking helper stream and an event of the current device, one pair per host thread,
// created on first use and kept for the thread's life (like the pools above, they do not survive a
// cudaDeviceReset). For small read-backs that must not wait for work enqueued after them on the
// caller's stream: record `fork` on the caller's stream, make `stream` wait for it, copy there.
struct HelperStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr;
};
cudaError_t helper_stream(HelperStream& out);

}  // namespace sparge::cuda
