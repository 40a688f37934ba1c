// cuda::merge_attention: combines two partial attention results by their LSE (docs/semantics.md,
// Merge). One warp per (b, s, h) row: every lane reads the row's two LSE values, the warp
// synchronizes, and only then lane 0 writes the merged LSE, so the outputs may alias the inputs
// (each element of o is read and written by the same lane).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/cuda_backend.h"
#include "validate/validate.h"

namespace sparge::cuda {
namespace {

struct MergeView {
  void* data;
  int dtype;  // 0 f32, 1 f16, 2 bf16
  std::int64_t stride[4];
};

struct MergeParams {
  MergeView o_a, o_b, o;
  const float *lse_a, *lse_b;
  float* lse;
  std::int64_t lse_a_stride[3], lse_b_stride[3], lse_stride[3];
  std::int64_t batch, seq, heads, dim;
};

__device__ __forceinline__ float load(const MergeView& t, std::int64_t off) {
  switch (t.dtype) {
    case 1: return __half2float(static_cast<const __half*>(t.data)[off]);
    case 2: return __bfloat162float(static_cast<const __nv_bfloat16*>(t.data)[off]);
    default: return static_cast<const float*>(t.data)[off];
  }
}

__device__ __forceinline__ void store(const MergeView& t, std::int64_t off, float x) {
  switch (t.dtype) {
    case 1: static_cast<__half*>(t.data)[off] = __float2half_rn(x); break;
    case 2: static_cast<__nv_bfloat16*>(t.data)[off] = __float2bfloat16_rn(x); break;
    default: static_cast<float*>(t.data)[off] = x; break;
  }
}

__global__ void merge_kernel(const __grid_constant__ MergeParams p) {
  const int lane = threadIdx.x % 32;
  const std::int64_t rows = p.batch * p.seq * p.heads;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps) {
    const std::int64_t h = row % p.heads;
    const std::int64_t s = (row / p.heads) % p.seq;
    const std::int64_t b = row / (p.heads * p.seq);
    const float la = p.lse_a[b * p.lse_a_stride[0] + h * p.lse_a_stride[1] + s * p.lse_a_stride[2]];
    const float lb = p.lse_b[b * p.lse_b_stride[0] + h * p.lse_b_stride[1] + s * p.lse_b_stride[2]];
    __syncwarp();  // every lane has read the LSEs before lane 0 may overwrite an aliased one
    const float hi = fmaxf(la, lb);
    const float lo = fminf(la, lb);
    const bool empty = hi == -INFINITY;
    const float lse = empty ? -INFINITY : hi + log1pf(expf(lo - hi));
    const float wa = empty ? 0.0f : expf(la - lse);
    const float wb = empty ? 0.0f : expf(lb - lse);
    const std::int64_t base_a = b * p.o_a.stride[0] + s * p.o_a.stride[1] + h * p.o_a.stride[2];
    const std::int64_t base_b = b * p.o_b.stride[0] + s * p.o_b.stride[1] + h * p.o_b.stride[2];
    const std::int64_t base_o = b * p.o.stride[0] + s * p.o.stride[1] + h * p.o.stride[2];
    for (std::int64_t d = lane; d < p.dim; d += 32) {
      // A side with zero weight is not read into the sum: 0 * (an empty row's O) stays 0 even if
      // that O were not finite.
      float acc = 0.0f;
      if (wa != 0.0f) acc += wa * load(p.o_a, base_a + d * p.o_a.stride[3]);
      if (wb != 0.0f) acc += wb * load(p.o_b, base_b + d * p.o_b.stride[3]);
      store(p.o, base_o + d * p.o.stride[3], acc);
    }
    if (lane == 0) p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + s * p.lse_stride[2]] = lse;
  }
}

int dtype_code(DType t) { return t == DType::f16 ? 1 : t == DType::bf16 ? 2 : 0; }

Status select(const MergeAttentionParams& p) {
  const Tensor* os[3] = {&p.o_a, &p.o_b, &p.o};
  const char* names[3] = {"o_a", "o_b", "o"};
  for (int i = 0; i < 3; ++i) {
    const DType t = os[i]->dtype;
    if (t != DType::f32 && t != DType::f16 && t != DType::bf16) {
      return unsupported(detail::cat("merge_attention: ", names[i], ".dtype = ", to_string(t),
                                     " is not supported on cuda (f32, f16, bf16)"));
    }
  }
  return {};
}

MergeView view(const Tensor& t) {
  MergeView v{t.data, dtype_code(t.dtype), {}};
  for (int i = 0; i < 4; ++i) v.stride[i] = t.stride[i];
  return v;
}

}  // namespace

Status supported(const MergeAttentionParams& p) { return select(p); }

Status merge_attention(const MergeAttentionParams& p) {
  SPARGE_RETURN_IF_ERROR(select(p));
  MergeParams mp{};
  mp.o_a = view(p.o_a);
  mp.o_b = view(p.o_b);
  mp.o = view(p.o);
  mp.lse_a = p.lse_a.ptr<const float>();
  mp.lse_b = p.lse_b.ptr<const float>();
  mp.lse = p.lse.ptr<float>();
  for (int i = 0; i < 3; ++i) {
    mp.lse_a_stride[i] = p.lse_a.stride[i];
    mp.lse_b_stride[i] = p.lse_b.stride[i];
    mp.lse_stride[i] = p.lse.stride[i];
  }
  mp.batch = p.o.shape[0];
  mp.seq = p.o.shape[1];
  mp.heads = p.o.shape[2];
  mp.dim = p.o.shape[3];
  const std::int64_t rows = mp.batch * mp.seq * mp.heads;
  if (rows == 0) return {};
  constexpr int kThreads = 256;
  const std::int64_t want = (rows + kThreads / 32 - 1) / (kThreads / 32);
  const int blocks = static_cast<int>(want < 65536 ? want : 65536);
  merge_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(p.exec.stream)>>>(mp);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return runtime_error(detail::cat("merge_attention: kernel launch failed: ", cudaGetErrorString(err)));
  return {};
}

}  // namespace sparge::cuda
