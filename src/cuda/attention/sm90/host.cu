// Host side of the Hopper attention kernel: the sm_90a image probe and the TMA tensor maps.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <mutex>

#include "cuda/attention/sm90/launch.h"
#include "cuda/attention/sm90/tensor_map.h"

namespace sparge::cuda::attn::sm90 {
namespace {

// Writes 1 only from an sm_90a image (wgmma/setmaxnreg need the architecture-specific features);
// any other image that the device might run writes 0, and no image at all fails the launch.
__global__ void probe_kernel(int* out) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *out = 1;
#else
  *out = 0;
#endif
}

int probe(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return 0;
  if (prop.major != 9 || prop.minor != 0) return 0;
  int* d = nullptr;
  int h = 0;
  if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  probe_kernel<<<1, 1>>>(d);
  const bool ok = cudaGetLastError() == cudaSuccess && cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
  cudaFree(d);
  cudaGetLastError();
  return ok ? h : 0;
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

bool image_available(int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];  // 0 unknown, 1 no, 2 yes
  static std::mutex mu;
  if (device < 0 || device >= kMaxDevices) return false;
  int v = cache[device].load(std::memory_order_acquire);
  if (v == 0) {
    std::lock_guard<std::mutex> lock(mu);
    v = cache[device].load(std::memory_order_relaxed);
    if (v == 0) {
      v = probe(device) == 1 ? 2 : 1;
      cache[device].store(v, std::memory_order_release);
    }
  }
  return v == 2;
}

bool encode_tensor_map(CUtensorMap* out, const Tensor& t, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn();
  if (fn == nullptr) return false;
  if (t.dtype != DType::f16 && t.dtype != DType::bf16) return false;
  const std::uint64_t es = 2;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(t.shape[3]), static_cast<cuuint64_t>(t.shape[1]),
                              static_cast<cuuint64_t>(t.shape[2]), static_cast<cuuint64_t>(t.shape[0])};
  // Byte strides of dims 1..3 (S, H, B); TMA needs them positive multiples of 16 below 2^40.
  const std::int64_t st[3] = {t.stride[1], t.stride[2], t.stride[0]};
  cuuint64_t strides[3];
  for (int i = 0; i < 3; ++i) {
    if (st[i] <= 0) return false;
    strides[i] = static_cast<cuuint64_t>(st[i]) * es;
    if (strides[i] % 16 != 0 || strides[i] >= (1ull << 40)) return false;
  }
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType dt =
      t.dtype == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult r = fn(out, dt, 4, t.data, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

}  // namespace sparge::cuda::attn::sm90
