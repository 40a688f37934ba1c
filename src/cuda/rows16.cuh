// Reading rows of 16-bit (f16 / bf16) tensors: 8 consecutive head-dim values per thread, as one
// 16-byte load when the tensor allows it (`vec`: unit innermost stride, 16-byte aligned rows), else
// as 8 strided 2-byte loads (any strides, any alignment). Shared by the block map's passes and the
// fp8 prepass; R is any struct with `const std::uint16_t* data`, `std::int64_t stride[4]` (elements,
// logical [B, S, H, D]) and `bool vec`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace sparge::cuda::rows16 {

template <class T>
__device__ __forceinline__ float to_float(std::uint16_t bits);
template <>
__device__ __forceinline__ float to_float<__half>(std::uint16_t bits) {
  return __half2float(__ushort_as_half(bits));  // exact
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(std::uint16_t bits) {
  return __uint_as_float(static_cast<std::uint32_t>(bits) << 16);  // exact
}

// The raw 16-bit values [8c, 8c + 8) of (b, row, h).
template <class R>
__device__ __forceinline__ uint4 load8(const R& x, std::int64_t b, std::int64_t row, std::int64_t h, int c) {
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

}  // namespace sparge::cuda::rows16
