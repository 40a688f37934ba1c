// The small CUDA kernels of context parallelism (kernels.cu): restricting the global LUT rows to
// one ring call, and moving rows between the caller's strided tensors and the ring's packed
// buffers. Host-callable; each returns the launch's cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dist/plan.h"

namespace sparge::dist::kernels {

// A strided i32 tensor of up to 4 dimensions.
struct I32View {
  std::int32_t* data = nullptr;
  std::int64_t stride[4] = {0, 0, 0, 0};
};

// For every (b, h, query block j of call c): the global LUT row of the rank's block
// c.q_block_begin + j restricted to c (plan::map_block), written to out_lut[b, h, j, :] (width
// c.kv_blocks, -1 padded) and its count to out_counts[b, h, j]. With out_lut.data == nullptr only
// the total number of entries is added to *total (device memory).
struct FilterArgs {
  plan::Call call;
  std::int64_t batch = 0, heads = 0;
  I32View lut, counts;  // the rank's rows of the global map
  I32View out_lut, out_counts;
  unsigned long long* total = nullptr;
};
cudaError_t launch_filter(const FilterArgs& a, cudaStream_t st);

// Copies a strided [B, L, H, D] tensor of 16-bit elements into contiguous rows.
struct Rows16 {
  const std::uint16_t* data = nullptr;
  std::int64_t shape[4] = {0, 0, 0, 0};
  std::int64_t stride[4] = {0, 0, 0, 0};
};
cudaError_t launch_pack(const Rows16& src, std::uint16_t* dst, cudaStream_t st);

// Fills n floats with value.
cudaError_t launch_fill(float* p, std::int64_t n, float value, cudaStream_t st);

// Writes the accumulated result (contiguous f32 o [B, L, H, D], lse [B, H, L]) to the caller's
// o (f32 / f16 / bf16, strided) and, when lse_out is given, its lse (strided).
struct FinishArgs {
  const float* o = nullptr;
  const float* lse = nullptr;
  std::int64_t batch = 0, rows = 0, heads = 0, dim = 0;
  void* out = nullptr;
  int out_dtype = 0;  // 0 f32, 1 f16, 2 bf16
  std::int64_t out_stride[4] = {0, 0, 0, 0};
  float* lse_out = nullptr;
  std::int64_t lse_stride[3] = {0, 0, 0};
};
cudaError_t launch_finish(const FinishArgs& a, cudaStream_t st);

}  // namespace sparge::dist::kernels
