// topk_select on CUDA: radix select of the k largest scores of each row (docs/semantics.md,
// "Stage 3"), bit-identical to the CPU backend. The kernel is two_pass.cuh (two reads of the row
// in the common case); this file holds the host entry: the checks, the kernel choice shared with
// supported(), the launch and the NaN report.
//
// Run-time switches (read on every call, for the device rounds; results never depend on them):
//   SPARGE_TOPK_VARIANT=0  one_pass.cuh: the keys above a sampled threshold kept in shared memory
//                          on the way, so the row is read once; rows it cannot serve (the sample
//                          misjudged the row, the kept keys overflow, k too large) take variant 6's
//                          path from the start (default since session 15, 2026-12-01);
//                          =6 two-pass kernel, next chunk's loads issued before the current one is
//                          processed, every key counted in the histogram pass (the default from the
//                          second H200 round of 2026-11-30 to session 15: f32 0.226 / f16 0.177 ms
//                          against 0.248 / 0.202 with the sample filter, same process; the first
//                          round measured 0.313 / 0.261 against 0.320 / 0.281);
//                          =1 variant 4 without that prefetch (64 B of f32 per thread per chunk);
//                          =4 the histogram pass filtered by a sample of the row (the default
//                             before that round);
//                          =5 variant 4 plus an L2 prefetch 4 chunks beyond the register prefetch
//                             (more bytes in flight; strided rows as variant 4).
//   (The earlier four-read kernel and the first two-pass kernel, once variants 2 and 3, measured
//   slower in the same round, 0.381 / 0.370 ms for the latter, and were deleted.)
//   SPARGE_TOPK_NO_SYNC=1  measurement only: return without reading the NaN flag back, so without
//                          synchronising the stream; a NaN score is then NOT reported. It exists to
//                          measure what the synchronisation costs; see docs/token_sparse.md.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cpu/token_order.h"
#include "cuda/cuda_backend.h"
#include "cuda/topk/one_pass.cuh"
#include "cuda/topk/two_pass.cuh"
#include "validate/validate.h"

namespace sparge::cuda {

namespace {

constexpr const char* kOp = "topk_select";

using topk::TopkArgs;

bool env_is(const char* name, const char* value) {
  const char* e = std::getenv(name);
  return e != nullptr && std::strcmp(e, value) == 0;
}

using KernelFn = void (*)(const TopkArgs);

// The one selection function: run and supported() both use it, so they never disagree.
struct TopkPlan {
  Status status;
  KernelFn kernel = nullptr;
  int threads = 0;
  int smem = 0;  // dynamic shared memory (the one-pass kernel; the two-pass kernels' is static)
};

// Tuning only (changes speed, never results; the GPU tests compare the default's output with the
// CPU backend): which kernel serves a dtype and load width.
//   one-pass (one_pass.cuh, variant 0): 256 threads, ~53 KB of dynamic shared memory (4 CTAs per
//   SM); per warp step each thread owns 8 consecutive scores (32 B of f32, 16 B of f16) with the
//   next step's loads in flight; its fallback is the two-pass default below.
//   two-pass (two_pass.cuh): 256 threads; per chunk each thread owns 32 B of consecutive scores
//   and the next chunk's loads are in flight while it works (variant 6), or 64 B without that
//   prefetch (variant 1; f16 stays at 32 B); 63-64 registers (4 CTAs per SM), variant 6 without
//   spills on sm_90a for f32, 12 B for f16. The strided path loads one score at a time, 16 per
//   thread, no prefetch. Variants 1, 4, 5 filter the histogram pass with a sample of the row
//   (two_pass.cuh); variant 6 counts every key, on the strided path too.
template <class T, int kVec>
void pick_kernel(TopkPlan& plan, int variant) {
  constexpr int kBytes16 = kVec * static_cast<int>(sizeof(T)) / 16;  // 16-byte loads per kVec (1 or 0)
  plan.threads = topk::kThreads;
  if (variant == 0) {  // one read of the row, 8 scores per thread and step (16 f16 scores spilled in the loop)
    plan.kernel = topk::one_pass_kernel<T, kVec, kBytes16 == 0 ? 8 : 8 / kVec>;
    plan.smem = topk::kOnePassSmemBytes;
    return;
  }
  if constexpr (kBytes16 == 0) {
    switch (variant) {
      case 1: case 4: case 5: plan.kernel = topk::two_pass_kernel<T, kVec, 16, false, true>; break;
      default: plan.kernel = topk::two_pass_kernel<T, kVec, 16, false, false>; break;
    }
  } else {
    // f16 keeps 2 loads in variant 1 too: 32 scores per thread spill.
    constexpr int kLoadsNoPrefetch = sizeof(T) == 2 ? 2 : 4;
    switch (variant) {
      case 1: plan.kernel = topk::two_pass_kernel<T, kVec, kLoadsNoPrefetch, false, true>; break;
      case 4: plan.kernel = topk::two_pass_kernel<T, kVec, 2, true, true>; break;
      case 5: plan.kernel = topk::two_pass_kernel<T, kVec, 2, true, true, 4>; break;
      default: plan.kernel = topk::two_pass_kernel<T, kVec, 2, true, false>; break;
    }
  }
}

int variant_from_env() {
  for (const char* v : {"1", "4", "5", "6"}) {
    if (env_is("SPARGE_TOPK_VARIANT", v)) return *v - '0';
  }
  return 0;
}

TopkPlan select_topk(const TopkSelectParams& p) {
  TopkPlan plan;
  const Tensor& s = p.scores;
  if (s.ndim != 2 || p.indices.ndim != 2) {
    return TopkPlan{detail::bad(kOp, "scores and indices must be 2-d (scores.ndim = ", s.ndim, ", indices.ndim = ", p.indices.ndim, ")")};
  }
  if (s.dtype != DType::f32 && s.dtype != DType::f16) {
    return TopkPlan{unsupported(detail::cat(kOp, ": scores.dtype = ", to_string(s.dtype), " is not supported on cuda (expected f32 or f16)"))};
  }
  if (s.shape[1] > INT32_MAX || p.k < 1 || p.k > s.shape[1]) {
    return TopkPlan{detail::bad(kOp, "k = ", p.k, " with N = ", s.shape[1], " (expected 1 <= k <= N <= 2^31 - 1)")};
  }
  // The vector path needs contiguous rows starting on 16-byte boundaries; anything else takes the
  // strided path (one element per load), which is slower but exact.
  const std::int64_t esize = static_cast<std::int64_t>(dtype_size(s.dtype));
  const std::int64_t per16 = 16 / esize;
  const bool vec = s.stride[1] == 1 && (reinterpret_cast<std::uintptr_t>(s.data) % 16 == 0) &&
                   (s.stride[0] % per16 == 0);
  const int variant = variant_from_env();
  if (s.dtype == DType::f32) {
    vec ? pick_kernel<float, 4>(plan, variant) : pick_kernel<float, 1>(plan, variant);
  } else {
    vec ? pick_kernel<__half, 8>(plan, variant) : pick_kernel<__half, 1>(plan, variant);
  }
  return plan;
}

}  // namespace

Status supported(const TopkSelectParams& p) { return select_topk(p).status; }

Status topk_select(const TopkSelectParams& p) {
  const TopkPlan plan = select_topk(p);
  SPARGE_RETURN_IF_ERROR(plan.status);
  const std::int64_t rows = p.scores.shape[0];
  if (rows == 0) return {};
  if (rows > INT32_MAX) return detail::bad(kOp, "scores.shape[0] = ", rows, " exceeds the grid limit");
  auto stream = static_cast<cudaStream_t>(p.exec.stream);
  flags::DeviceFlags<1> fl(stream);
  cudaError_t e = fl.init();
  if (e != cudaSuccess) return runtime_error(detail::cat(kOp, ": ", cudaGetErrorString(e)));
  TopkArgs a{};
  a.scores = p.scores.data;
  a.s0 = p.scores.stride[0];
  a.s1 = p.scores.stride[1];
  a.n = p.scores.shape[1];
  a.k = p.k;
  a.indices = p.indices.ptr<std::int32_t>();
  a.i0 = p.indices.stride[0];
  a.i1 = p.indices.stride[1];
  a.counts = p.maybe_counts.present() ? p.maybe_counts.ptr<std::int32_t>() : nullptr;
  a.c0 = p.maybe_counts.present() ? p.maybe_counts.stride[0] : 0;
  a.nan_flag = fl.device();
  if (plan.smem > 0) {  // set on every call (func_attr.h: a cached "already set" would not survive a device reset)
    e = cudaFuncSetAttribute(reinterpret_cast<const void*>(plan.kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                             plan.smem);
    if (e != cudaSuccess) return runtime_error(detail::cat(kOp, ": ", cudaGetErrorString(e)));
  }
  plan.kernel<<<static_cast<unsigned>(rows), plan.threads, static_cast<std::size_t>(plan.smem), stream>>>(a);
  e = cudaGetLastError();
  if (e != cudaSuccess) return runtime_error(detail::cat(kOp, ": kernel launch failed: ", cudaGetErrorString(e)));
  // The synchronisation below is what lets the call report a NaN (the Status is returned now);
  // SPARGE_TOPK_NO_SYNC=1 skips it to measure its cost, at the price of the report.
  if (env_is("SPARGE_TOPK_NO_SYNC", "1")) return {};
  e = fl.fetch();
  if (e != cudaSuccess) return runtime_error(detail::cat(kOp, ": ", cudaGetErrorString(e)));
  if (fl[0] != flags::kNone) {
    const auto row = flags::row_of(fl[0]);
    const auto col = flags::col_of(fl[0]);
    return detail::bad(kOp, "scores[", row, ", ", col, "] is NaN (row ", row, ", column ", col,
                       "); scores must not contain NaN");
  }
  return {};
}

}  // namespace sparge::cuda
