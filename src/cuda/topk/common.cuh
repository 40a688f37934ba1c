// Pieces shared by the topk_select kernels: the kernel arguments and the float bits of a score.
// Scores are ranked by the order-preserving uint32 keys of cpu/token_order.h (shared with the CPU
// backend, so -0.0 == +0.0 and f16 is widened to f32 first: both backends agree on every tie).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cpu/token_order.h"
#include "cuda/topk/block_scan.cuh"
#include "cuda/topk/error_flags.cuh"

namespace sparge::cuda::topk {

struct TopkArgs {
  const void* scores;
  std::int64_t s0, s1;  // element strides of scores
  std::int64_t n;
  int k;
  std::int32_t* indices;
  std::int64_t i0, i1;
  std::int32_t* counts;  // nullptr when absent
  std::int64_t c0;
  unsigned long long* nan_flag;  // lowest (row, column) holding a NaN
};

template <class T>
__device__ __forceinline__ std::uint32_t float_bits(T v);
template <>
__device__ __forceinline__ std::uint32_t float_bits<float>(float v) { return __float_as_uint(v); }
template <>
__device__ __forceinline__ std::uint32_t float_bits<__half>(__half v) { return __float_as_uint(__half2float(v)); }

}  // namespace sparge::cuda::topk
