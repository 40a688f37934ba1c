// Reading the prepass inputs: 8 consecutive head-dim values of one (b, s, h) per thread, as one
// 16-byte load when the tensor allows it (Src::vec: unit stride, 16-byte aligned base, every
// other stride a multiple of 8 elements), else as 8 strided 2-byte loads (any strides, any
// alignment: HND, NHD, slices, broadcasts).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/rows16.cuh"

namespace sparge::cuda::quant {

struct Src {
  const std::uint16_t* data;
  std::int64_t stride[4];  // elements, logical [B, S, H, D]
  bool vec;
};

// The 16-bit row readers (cuda/rows16.cuh, shared with the other module).
using rows16::load8;
using rows16::to_float;
using rows16::unpack8;

}  // namespace sparge::cuda::quant
