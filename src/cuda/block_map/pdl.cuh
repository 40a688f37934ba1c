// Programmatic dependent launch (PDL, sm_90+) for the block map's launches: a kernel launched with
// launch_kernel(..., pdl = true, ...) may start while the kernel before it on the stream is still
// running, and must call pdl_wait() before it touches anything that kernel (or an earlier one)
// writes or reads: griddepcontrol.wait returns once every prerequisite grid has completed and its
// memory is visible. A kernel launched without PDL returns from pdl_wait() at once, so a kernel
// that calls it at its top is correct with either launch. pdl_launch_dependents() lets the next
// PDL launch start early (its CTAs then wait in pdl_wait(), holding their SM resources); without
// it the next launch starts when this grid completes, which still hides the launch latency.
// On sm_80 both calls compile to nothing and the host never asks for PDL (pdl_enabled()).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

namespace sparge::cuda::block_map {

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

// SPARGE_BLOCKMAP_PDL=1 (read per call) on a device of compute capability 9.0 or more: the scores
// and selection launches use PDL (block_map.cu lists which launches do). Off by default until a
// device round measures it.
bool pdl_enabled();

// Launches kernel<<<grid, block, smem, st>>>(args...), with the programmatic stream serialization
// attribute when pdl is set.
template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), int grid, int block, std::size_t smem, cudaStream_t st, bool pdl,
                          Args&&... args) {
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

}  // namespace sparge::cuda::block_map
