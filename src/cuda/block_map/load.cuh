// Reading rows of q / k: 8 consecutive head-dim values per thread, as one 16-byte load when the
// tensor allows it (Rows::vec), else as 8 strided 2-byte loads (any strides, any alignment).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/rows16.cuh"

#include "cuda/block_map/block_map.cuh"

namespace sparge::cuda::block_map {

// The 16-bit row readers (cuda/rows16.cuh, shared with the other module).
using rows16::load8;
using rows16::to_float;
using rows16::unpack8;

// cp.async (sm_80+) of 16 bytes from global to shared memory, through L2 only; ok == false copies
// nothing and zero-fills the 16 bytes (src must still be a valid address). Completion: a thread
// waits for its own groups (cp_async_wait), after which it may read what it copied.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
  const auto d = static_cast<std::uint32_t>(__cvta_generic_to_shared(dst));
  const int n = ok ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n) : "memory");
}
// A 4-byte load through L2 (data another kernel wrote), kept in program order with the other
// volatile loads, so that a batch of them is in flight before the adds that use them (unit_k_mean).
__device__ __forceinline__ float ld_cg_in_order(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace sparge::cuda::block_map
