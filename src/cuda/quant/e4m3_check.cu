// A check of the rule's software e4m3 encoder against the device's conversion instruction over
// every float bit pattern (the GPU test calls it; quant.h's e4m3_device_check). Both bytes of the
// instruction's result are compared: x in the low byte, -x in the high byte.
#include "cuda/quant/quant.h"
#include "quant/quant_rule.h"

namespace sparge::cuda::quant {

namespace rule = ::sparge::quant;

namespace {
__global__ void e4m3_check_kernel(unsigned long long* mismatches, std::uint32_t* first_bad) {
  const std::uint64_t n = std::uint64_t{1} << 32;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const auto u = static_cast<std::uint32_t>(i);
    const float x = __uint_as_float(u), y = __uint_as_float(u ^ 0x80000000u);
    const std::uint16_t hw = rule::e4m3x2_device(x, y);
    const std::uint16_t sw =
        static_cast<std::uint16_t>(rule::e4m3_encode_soft(x) | (rule::e4m3_encode_soft(y) << 8));
    if (hw != sw) {
      atomicAdd(mismatches, 1ull);
      atomicMin(first_bad, u);
    }
  }
}
}  // namespace

cudaError_t e4m3_device_check(unsigned long long* mismatches, std::uint32_t* first_bad) {
  unsigned long long* d_count = nullptr;
  std::uint32_t* d_first = nullptr;
  cudaError_t e = cudaMalloc(&d_count, sizeof(unsigned long long));
  if (e == cudaSuccess) e = cudaMalloc(&d_first, sizeof(std::uint32_t));
  if (e == cudaSuccess) e = cudaMemset(d_count, 0, sizeof(unsigned long long));
  if (e == cudaSuccess) e = cudaMemset(d_first, 0xff, sizeof(std::uint32_t));
  if (e == cudaSuccess) {
    e4m3_check_kernel<<<1024, 256>>>(d_count, d_first);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(mismatches, d_count, sizeof(unsigned long long), cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) e = cudaMemcpy(first_bad, d_first, sizeof(std::uint32_t), cudaMemcpyDeviceToHost);
  if (d_count != nullptr) cudaFree(d_count);
  if (d_first != nullptr) cudaFree(d_first);
  return e;
}

}  // namespace sparge::cuda::quant
