// Kernel and device properties the CUDA backend asks on every call, read once instead.
//
// cudaFuncGetAttributes and cudaDeviceGetAttribute are driver calls (about a microsecond each): the
// ptx version of a kernel (which code the device runs), the device's compute capability and its SM
// count do not change while the process lives, so these keep them in a small process-wide table (thread safe)
// keyed by the current device (and kernel). Shared-memory attributes are set by the launchers on
// every call instead: a cached "already set" would not survive a cudaDeviceReset (session 11
// measured no difference at gather_attention's PERF.md shape, docs/token_sparse.md).
#pragma once

#include <cuda_runtime.h>

namespace sparge::cuda {

// cudaFuncGetAttributes(fn).ptxVersion on the current device (0 on failure), read once.
int func_ptx_version(const void* fn);

// The compute capability major of the current device (0, with the error cleared, on failure),
// read once per device.
int current_device_major();

// The current device's SM count (0, with the error cleared, on failure), read once per device.
int current_device_sms();

}  // namespace sparge::cuda
