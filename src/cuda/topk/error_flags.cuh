// Device-side error reporting of the token kernels. A kernel that finds bad data (a NaN score, an
// index out of range, a row over n_max) records the lowest (row, column) with an atomicMin on a
// packed 64-bit word, so the report does not depend on which thread or block saw it first; the
// host entry synchronises on the stream (or, with fork() / fetch_forked(), only on the kernels
// before the fork), reads the words and turns them into a Status.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/scratch_pool.h"

namespace sparge::cuda::flags {

inline constexpr unsigned long long kNone = ~0ull;

__host__ __device__ inline unsigned long long pack(std::uint64_t row, std::uint32_t col) {
  return (static_cast<unsigned long long>(row) << 32) | col;
}
inline std::uint64_t row_of(unsigned long long w) { return w >> 32; }
inline std::uint32_t col_of(unsigned long long w) { return static_cast<std::uint32_t>(w & 0xffffffffu); }

__device__ __forceinline__ void record(unsigned long long* word, std::uint64_t row, std::uint32_t col) {
  atomicMin(word, pack(row, col));
}

// A small block of flag words in device memory, allocated on the stream (ScopedScratch: the retained scratch pool),
// set to kNone, and read back after the kernels with a stream synchronisation.
template <int kWords>
class DeviceFlags {
 public:
  explicit DeviceFlags(cudaStream_t s) : stream_(s), dev_(s) {}
  ~DeviceFlags() {
    if (forked_) (void)fetch_forked();  // an early return: the helper's copy must not outlive dev_ (freed after this body)
  }
  DeviceFlags(const DeviceFlags&) = delete;
  DeviceFlags& operator=(const DeviceFlags&) = delete;

  cudaError_t init() {
    cudaError_t e = dev_.alloc(sizeof(host_));
    if (e != cudaSuccess) return e;
    return cudaMemsetAsync(device(), 0xff, sizeof(host_), stream_);  // every word = kNone
  }
  unsigned long long* device() { return dev_.as<unsigned long long>(); }
  // Copies the words back and waits for the stream.
  cudaError_t fetch() {
    cudaError_t e = cudaMemcpyAsync(host_, device(), sizeof(host_), cudaMemcpyDeviceToHost, stream_);
    if (e != cudaSuccess) return e;
    return cudaStreamSynchronize(stream_);
  }
  // The read-back without waiting for what the caller enqueues later: fork(s) after the last kernel
  // that writes the words (on stream s: the caller's stream or one that joins it), then launch the
  // rest, then fetch_forked(), which returns once the words are here. The copy runs on this
  // thread's helper stream after an event on s; its destination is pageable, so the copy call
  // itself returns only when the words have landed (no pinned buffer, no event wait).
  cudaError_t fork(cudaStream_t s) {
    cudaError_t e = helper_stream(helper_);
    if (e == cudaSuccess) e = cudaEventRecord(helper_.fork, s);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(helper_.stream, helper_.fork, 0);
    forked_ = e == cudaSuccess;
    return e;
  }
  cudaError_t fetch_forked() {
    forked_ = false;
    return cudaMemcpyAsync(host_, device(), sizeof(host_), cudaMemcpyDeviceToHost, helper_.stream);
  }
  unsigned long long operator[](int i) const { return host_[i]; }

 private:
  HelperStream helper_;
  bool forked_ = false;
  cudaStream_t stream_;
  ScopedScratch dev_;  // the words on the device, freed (stream ordered) after the destructor's body
  unsigned long long host_[kWords] = {};
};

}  // namespace sparge::cuda::flags
