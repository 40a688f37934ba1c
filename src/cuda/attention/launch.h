// The host's handle on one kernel instantiation. The definitions live in kernel.cuh and are
// instantiated once per (dtype, head dim, BLKQ, BLKK) in inst/ (one translation unit each, so the
// build compiles them in parallel and a variant can be dropped from the build by deleting its file
// and its row in entry.cu's table).
#pragma once

#include <cuda_runtime.h>

#include "cuda/attention/params.h"

namespace sparge::cuda::attn {

// Dynamic shared memory a CTA may need: the Q tile plus two stages each of K and V (all 2-byte) with
// whole-block key tiles, the largest of the shapes an instantiation launches (traits.cuh; the
// streaming shape's 64-key tiles need less).
constexpr int smem_bytes(int head_dim, int blkq, int blkk) { return (blkq * head_dim + 4 * blkk * head_dim) * 2; }

template <class T, int HD, int BLKQ, int BLKK>
struct Kernel {
  // cudaErrorInvalidDeviceFunction when this build has no image for the current device.
  static cudaError_t attributes(cudaFuncAttributes* attr);
  static cudaError_t launch(const KernelParams& p, int num_tiles, cudaStream_t stream);
};

}  // namespace sparge::cuda::attn
