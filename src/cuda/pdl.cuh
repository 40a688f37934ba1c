// Programmatic dependent launch (PDL, sm_90+), shared by the CUDA modules: a kernel launched with
// launch_maybe_pdl(..., pdl = true, ...) may start while the kernel before it on the stream is still
// running, and must call pdl_wait() before it touches anything that kernel (or an earlier one)
// writes or reads: griddepcontrol.wait returns once every prerequisite grid has completed and its
// memory is visible. A kernel launched without PDL returns from pdl_wait() at once, so a kernel
// that calls it at its top is correct with either launch. pdl_launch_dependents() lets the next
// PDL launch start early (its CTAs then wait in pdl_wait(), holding their SM resources); without
// it the next launch starts when this grid completes, which still hides the launch latency.
// On sm_80 both calls compile to nothing; the host asks for PDL on sm_90+ only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

namespace sparge::cuda {

#ifdef __CUDACC__
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
#endif  // __CUDACC__

// Launches kernel<<<grid, block, smem, st>>>(args...), with the programmatic stream serialization
// attribute when pdl is set (the caller checks that the device is sm_90+).
template <class... Params, class... Args>
cudaError_t launch_maybe_pdl(void (*kernel)(Params...), int grid, int block, std::size_t smem, cudaStream_t st,
                            bool pdl, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(static_cast<unsigned>(block));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace sparge::cuda
