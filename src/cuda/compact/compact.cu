// compact_mask on CUDA: per row, the ascending columns of the finite entries of an additive mask
// (docs/semantics.md, "Stage 3"), -1 padded, with counts. One CTA per row walks the row in chunks;
// each thread owns kVec consecutive columns, and its output slot is the block-wide exclusive scan
// of the per-thread finite counts plus the running total of the earlier chunks. No atomics decide
// positions (seed 003: atomic slots made the list order, and so the attention's summation order,
// change between runs; its subgroup-count array overflowed when the block had more warps than
// slots: the scan storage here is sized from the block size at compile time).
//
// A row with more than n_max finite entries records an overflow (only slots < n_max are written,
// so nothing lands out of bounds); NaN and +inf record an input error. The host entry synchronises
// and reports the lowest failing row, as the CPU backend does.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cpu/token_order.h"
#include "cuda/cuda_backend.h"
#include "cuda/topk/block_scan.cuh"
#include "cuda/topk/error_flags.cuh"
#include "sparge/half.h"
#include "validate/validate.h"

namespace sparge::cuda {

namespace {

constexpr const char* kOp = "compact_mask";
constexpr int kThreads = 256;

struct CompactArgs {
  const void* mask;
  std::int64_t m0, m1;
  std::int64_t n;
  int n_max;
  std::int32_t* indices;
  std::int64_t i0, i1;
  std::int32_t* counts;
  std::int64_t c0;
  unsigned long long* bad_flag;       // lowest (row, column) holding NaN or +inf
  unsigned long long* overflow_flag;  // lowest (row, count) with count > n_max
};

template <class T>
__device__ __forceinline__ float as_float(T v);
template <>
__device__ __forceinline__ float as_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float as_float<__half>(__half v) { return __half2float(v); }

template <class T, int kVec>
__global__ void __launch_bounds__(kThreads) compact_kernel(const CompactArgs a) {
  constexpr std::int64_t kChunk = static_cast<std::int64_t>(kThreads) * kVec;
  __shared__ scan::BlockScanStorage<kThreads> scan_storage;
  const std::int64_t r = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const T* row = static_cast<const T*>(a.mask) + r * a.m0;
  std::int32_t* out = a.indices + r * a.i0;
  const std::int64_t n = a.n;
  std::uint32_t base = 0;  // finite entries in the chunks before this one (row counts fit: n < 2^31)
#pragma unroll 1
  for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const std::int64_t c = c0 + static_cast<std::int64_t>(tid) * kVec;
    float x[kVec];
    bool valid[kVec];
    if (kVec > 1 && c + kVec <= n) {
      const uint4 raw = *reinterpret_cast<const uint4*>(row + c);  // aligned: select_compact
      const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        x[e] = as_float(v[e]);
        valid[e] = true;
      }
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        valid[e] = c + e < n;
        x[e] = valid[e] ? as_float(row[(c + e) * a.m1]) : -INFINITY;
      }
    }
    std::uint32_t keep = 0, cnt = 0;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      if (!valid[e]) continue;
      if (isnan(x[e]) || x[e] == INFINITY) flags::record(a.bad_flag, r, static_cast<std::uint32_t>(c + e));
      const bool k = x[e] != -INFINITY;
      keep |= static_cast<std::uint32_t>(k) << e;
      cnt += k;
    }
    std::uint32_t total = 0;
    std::uint32_t slot = base + scan::block_exclusive_sum<kThreads>(cnt, scan_storage, total);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      if ((keep >> e) & 1u) {
        if (slot < static_cast<std::uint32_t>(a.n_max)) out[static_cast<std::int64_t>(slot) * a.i1] = static_cast<std::int32_t>(c + e);
        ++slot;
      }
    }
    base += total;
  }
  for (std::int64_t s = base + tid; s < a.n_max; s += kThreads) out[s * a.i1] = -1;
  if (tid == 0) {
    a.counts[r * a.c0] = static_cast<std::int32_t>(base);
    if (base > static_cast<std::uint32_t>(a.n_max)) flags::record(a.overflow_flag, r, base);
  }
}

using KernelFn = void (*)(const CompactArgs);

struct CompactPlan {
  Status status;
  KernelFn kernel = nullptr;
};

// The one selection function of compact_mask (run and supported share it).
CompactPlan select_compact(const CompactMaskParams& p) {
  CompactPlan plan;
  const Tensor& m = p.mask;
  if (m.ndim != 2 || p.indices.ndim != 2 || p.counts.ndim != 1) {
    return CompactPlan{detail::bad(kOp, "mask and indices must be 2-d and counts 1-d (mask.ndim = ", m.ndim,
                              ", indices.ndim = ", p.indices.ndim, ", counts.ndim = ", p.counts.ndim, ")")};
  }
  if (m.dtype != DType::f32 && m.dtype != DType::f16) {
    return CompactPlan{unsupported(detail::cat(kOp, ": mask.dtype = ", to_string(m.dtype), " is not supported on cuda (expected f32 or f16)"))};
  }
  if (m.shape[1] > INT32_MAX || p.n_max < 0) {
    return CompactPlan{detail::bad(kOp, "mask.shape[1] = ", m.shape[1], ", n_max = ", p.n_max, " (expected N < 2^31 and n_max >= 0)")};
  }
  const std::int64_t per16 = 16 / static_cast<std::int64_t>(dtype_size(m.dtype));
  const bool vec = m.stride[1] == 1 && (reinterpret_cast<std::uintptr_t>(m.data) % 16 == 0) && (m.stride[0] % per16 == 0);
  if (m.dtype == DType::f32) {
    plan.kernel = vec ? compact_kernel<float, 4> : compact_kernel<float, 1>;
  } else {
    plan.kernel = vec ? compact_kernel<__half, 8> : compact_kernel<__half, 1>;
  }
  return plan;
}

}  // namespace

Status supported(const CompactMaskParams& p) { return select_compact(p).status; }

Status compact_mask(const CompactMaskParams& p) {
  const CompactPlan plan = select_compact(p);
  SPARGE_RETURN_IF_ERROR(plan.status);
  const std::int64_t rows = p.mask.shape[0];
  if (rows == 0) return {};
  if (rows > INT32_MAX) return detail::bad(kOp, "mask.shape[0] = ", rows, " exceeds the grid limit");
  auto stream = static_cast<cudaStream_t>(p.exec.stream);
  flags::DeviceFlags<2> fl(stream);
  cudaError_t e = fl.init();
  if (e != cudaSuccess) return runtime_error(detail::cat(kOp, ": ", cudaGetErrorString(e)));
  CompactArgs a{};
  a.mask = p.mask.data;
  a.m0 = p.mask.stride[0];
  a.m1 = p.mask.stride[1];
  a.n = p.mask.shape[1];
  a.n_max = p.n_max;
  a.indices = p.indices.ptr<std::int32_t>();
  a.i0 = p.indices.stride[0];
  a.i1 = p.indices.stride[1];
  a.counts = p.counts.ptr<std::int32_t>();
  a.c0 = p.counts.stride[0];
  a.bad_flag = fl.device();
  a.overflow_flag = fl.device() + 1;
  plan.kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(a);
  e = cudaGetLastError();
  if (e != cudaSuccess) return runtime_error(detail::cat(kOp, ": kernel launch failed: ", cudaGetErrorString(e)));
  e = fl.fetch();
  if (e != cudaSuccess) return runtime_error(detail::cat(kOp, ": ", cudaGetErrorString(e)));
  // The CPU backend reports the lowest failing row, and within a row a bad value before an
  // overflow (it finishes scanning the row before it checks the count).
  const unsigned long long bad = fl[0], over = fl[1];
  if (bad != flags::kNone && (over == flags::kNone || flags::row_of(bad) <= flags::row_of(over))) {
    const auto row = static_cast<std::int64_t>(flags::row_of(bad));
    const auto col = static_cast<std::int64_t>(flags::col_of(bad));
    float x = 0.0f;
    const std::int64_t off = p.mask.offset(row, col);
    if (p.mask.dtype == DType::f32) {
      cudaMemcpy(&x, p.mask.ptr<float>() + off, 4, cudaMemcpyDeviceToHost);
    } else {
      std::uint16_t h = 0;
      cudaMemcpy(&h, p.mask.ptr<std::uint16_t>() + off, 2, cudaMemcpyDeviceToHost);
      x = half_to_float(h);
    }
    return detail::bad(kOp, "mask[", row, ", ", col, "] = ", x, " (row ", row, ", column ", col,
                       "); mask entries must be finite (keep) or -inf (drop)");
  }
  if (over != flags::kNone) {
    return Status(StatusCode::overflow, detail::cat(kOp, ": row ", flags::row_of(over), " has ", flags::col_of(over),
                                                    " finite entries, more than n_max = ", p.n_max));
  }
  return {};
}

}  // namespace sparge::cuda
