// Reading rows of q / k: 8 consecutive head-dim values per thread, as one 16-byte load when the
// tensor allows it (Rows::vec), else as 8 strided 2-byte loads (any strides, any alignment).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/block_map/block_map.cuh"

namespace sparge::cuda::block_map {

template <class T>
__device__ __forceinline__ float to_float(std::uint16_t bits);
template <>
__device__ __forceinline__ float to_float<__half>(std::uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(std::uint16_t bits) {
  return __uint_as_float(static_cast<std::uint32_t>(bits) << 16);  // exact
}

// The raw 16-bit values [c*8, c*8+8) of row (b, row, h).
__device__ __forceinline__ uint4 load8(const Rows& x, std::int64_t b, std::int64_t row, std::int64_t h, int c) {
  const std::uint16_t* p = x.data + b * x.stride[0] + row * x.stride[1] + h * x.stride[2];
  if (x.vec) return __ldg(reinterpret_cast<const uint4*>(p + c * 8));
  const std::int64_t s3 = x.stride[3];
  std::uint16_t v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = __ldg(p + (c * 8 + j) * s3);
  uint4 r;
  r.x = v[0] | (static_cast<std::uint32_t>(v[1]) << 16);
  r.y = v[2] | (static_cast<std::uint32_t>(v[3]) << 16);
  r.z = v[4] | (static_cast<std::uint32_t>(v[5]) << 16);
  r.w = v[6] | (static_cast<std::uint32_t>(v[7]) << 16);
  return r;
}

template <class T>
__device__ __forceinline__ void unpack8(const uint4& r, float (&x)[8]) {
  const std::uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = to_float<T>(static_cast<std::uint16_t>(w[i] & 0xffffu));
    x[2 * i + 1] = to_float<T>(static_cast<std::uint16_t>(w[i] >> 16));
  }
}

// cp.async (sm_80+) of 16 bytes from global to shared memory, through L2 only; ok == false copies
// nothing and zero-fills the 16 bytes (src must still be a valid address). Completion: a thread
// waits for its own groups (cp_async_wait), after which it may read what it copied.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
  const auto d = static_cast<std::uint32_t>(__cvta_generic_to_shared(dst));
  const int n = ok ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace sparge::cuda::block_map
