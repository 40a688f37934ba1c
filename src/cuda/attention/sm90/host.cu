// Host side of the Hopper attention kernel: the sm_90a image probe and the TMA tensor maps.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
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

int variant_bits(int unset) {
  const char* e = std::getenv("SPARGE_SM90_VARIANT");
  if (e == nullptr) return unset;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 0);
  return end != e && v >= 0 && v < 2 * kVariantNoVStaged ? static_cast<int>(v) : 0;
}

DenseTile dense_tile(int head_dim) {
  const int v = variant_bits();
  if (head_dim == 64 && (v & kVariantDenseQ128) == 0) return {192, 128};
  if (head_dim == 128 && (v & kVariantDenseK128) == 0) return {128, 176};
  return {128, 128};
}

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

namespace {
// A 4-D map of a [B, S, H, D] f16/bf16 tensor (dims innermost first: D, S, H, B) with the given box
// columns and rows and swizzle; false where the driver or TMA's stride rules reject it.
bool encode_rows_box(CUtensorMap* out, const Tensor& t, int box_cols, int box_rows, CUtensorMapSwizzle swizzle) {
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
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType dt =
      t.dtype == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult r = fn(out, dt, 4, t.data, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}
}  // namespace

bool encode_tensor_map(CUtensorMap* out, const Tensor& t, int box_rows) {
  return encode_rows_box(out, t, 64, box_rows, CU_TENSOR_MAP_SWIZZLE_128B);
}

bool encode_rows_map(CUtensorMap* out, const Tensor& t, int box_rows) {
  if (t.shape[3] < 8 || t.shape[3] > 256) return false;
  return encode_rows_box(out, t, static_cast<int>(t.shape[3]), box_rows, CU_TENSOR_MAP_SWIZZLE_NONE);
}

namespace {
// A 4-D map of a contiguous byte tensor [d3, d2, d1, d0] (d0 innermost) with the given box.
bool encode_bytes_map(CUtensorMap* out, const void* base, const std::uint64_t (&dims)[4], std::uint32_t box0,
                      std::uint32_t box1, CUtensorMapSwizzle swizzle) {
  const PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn();
  if (fn == nullptr) return false;
  const cuuint64_t d[4] = {dims[0], dims[1], dims[2], dims[3]};
  const cuuint64_t strides[3] = {dims[0], dims[0] * dims[1], dims[0] * dims[1] * dims[2]};
  for (const cuuint64_t st : strides) {
    if (st % 16 != 0 || st >= (1ull << 40)) return false;
  }
  const cuuint32_t box[4] = {box0, box1, 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = fn(out, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<void*>(base), d, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}
}  // namespace

bool encode_fp8_rows_map(CUtensorMap* out, const void* base, std::int64_t b, std::int64_t h, std::int64_t s,
                         int box_rows) {
  const std::uint64_t dims[4] = {128, static_cast<std::uint64_t>(s), static_cast<std::uint64_t>(h),
                                 static_cast<std::uint64_t>(b)};
  return encode_bytes_map(out, base, dims, 128, static_cast<std::uint32_t>(box_rows), CU_TENSOR_MAP_SWIZZLE_128B);
}

bool encode_fp8_vt_map(CUtensorMap* out, const void* base, std::int64_t b, std::int64_t hk, std::int64_t sk_pad) {
  const std::uint64_t dims[4] = {static_cast<std::uint64_t>(sk_pad), 128, static_cast<std::uint64_t>(hk),
                                 static_cast<std::uint64_t>(b)};
  return encode_bytes_map(out, base, dims, 64, 128, CU_TENSOR_MAP_SWIZZLE_64B);
}

}  // namespace sparge::cuda::attn::sm90

namespace sparge::cuda::attn::sm90 {
namespace {

constexpr int kOrderThreads = 1024;
constexpr int kOrderClasses = 33;  // length class 32 - clz(count): 0 for empty rows .. 32

__device__ __forceinline__ int length_class(const KernelParams& p, int tile) {
  const int qb_idx = tile % p.nq;
  const int bh = tile / p.nq;
  const int h = bh % p.hq;
  const int b = bh / p.hq;
  const int qb = p.heavy_first ? p.nq - 1 - qb_idx : qb_idx;  // as the kernel's make_tile
  int c = p.counts[b * p.counts_stride[0] + h * p.counts_stride[1] + qb * p.counts_stride[2]];
  c = c < 0 ? 0 : (c > p.nk_lut ? p.nk_lut : c);
  return 32 - __clz(c);
}

// Stable counting sort by length class, descending: a histogram, the classes' first positions,
// then chunks of 1024 tiles scattered in index order (rank within a warp by __match_any_sync,
// across warps by per-warp counts).
__global__ void __launch_bounds__(kOrderThreads) order_kernel(const __grid_constant__ KernelParams p, int num_tiles,
                                                              std::int32_t* order) {
  __shared__ int base[kOrderClasses];
  __shared__ int warp_count[kOrderThreads / 32][kOrderClasses];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid < kOrderClasses) base[tid] = 0;
  __syncthreads();
  for (int i = tid; i < num_tiles; i += kOrderThreads) atomicAdd(&base[length_class(p, i)], 1);
  __syncthreads();
  if (tid == 0) {
    int run = 0;
    for (int c = kOrderClasses - 1; c >= 0; --c) {
      const int n = base[c];
      base[c] = run;
      run += n;
    }
  }
  __syncthreads();
  for (int c0 = 0; c0 < num_tiles; c0 += kOrderThreads) {
    for (int e = tid; e < (kOrderThreads / 32) * kOrderClasses; e += kOrderThreads) (&warp_count[0][0])[e] = 0;
    __syncthreads();
    const int i = c0 + tid;
    const bool valid = i < num_tiles;
    const int cls = valid ? length_class(p, i) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, cls);
    const int rank = __popc(peers & ((1u << lane) - 1));
    if (valid && rank == 0) warp_count[warp][cls] = __popc(peers);
    __syncthreads();
    if (valid) {
      int before = 0;
      for (int w = 0; w < warp; ++w) before += warp_count[w][cls];
      order[base[cls] + before + rank] = i;
    }
    __syncthreads();
    if (tid < kOrderClasses) {
      int n = 0;
      for (int w = 0; w < kOrderThreads / 32; ++w) n += warp_count[w][tid];
      base[tid] += n;
    }
    __syncthreads();
  }
}

}  // namespace

cudaError_t order_tiles_by_count(const KernelParams& p, int num_tiles, std::int32_t* order, cudaStream_t stream) {
  order_kernel<<<1, kOrderThreads, 0, stream>>>(p, num_tiles, order);
  return cudaGetLastError();
}

namespace {
__global__ void causal_pairs_kernel(int num_tiles, int nq, int grid, int g, std::int32_t* order) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < num_tiles) order[causal_pair_slot(t, nq, num_tiles / nq, grid, g)] = t;
}
}  // namespace

cudaError_t order_tiles_causal_pairs(int num_tiles, int nq, int grid, int g, std::int32_t* order, cudaStream_t stream) {
  if (nq <= 0 || num_tiles % nq != 0 || g < 1 || grid < g || grid % g != 0 || nq % g != 0) return cudaErrorInvalidValue;
  constexpr int kThreads = 256;
  causal_pairs_kernel<<<(num_tiles + kThreads - 1) / kThreads, kThreads, 0, stream>>>(num_tiles, nq, grid, g, order);
  return cudaGetLastError();
}

}  // namespace sparge::cuda::attn::sm90
