// Per-call host costs of kernel configuration, paid once per (device, kernel) instead.
//
// cudaFuncSetAttribute and cudaFuncGetAttributes are driver calls of about a microsecond each; an
// op that sets two or three of them on every call (gather_attention did) spends a measurable part
// of a short call on the host while the GPU waits. These keep what was set or read in a small
// process-wide table (thread safe) keyed by the current device and the kernel.
#pragma once

#include <cuda_runtime.h>

namespace sparge::cuda {

// Makes `fn` accept `bytes` of dynamic shared memory on the current device: calls
// cudaFuncSetAttribute only when no earlier call on this device set at least `bytes`.
cudaError_t ensure_dynamic_smem(const void* fn, int bytes);

// The shared-memory carveout hint cudaSharedmemCarveoutMaxShared for `fn`, once per device (a
// hint: its failure is cleared and ignored).
void prefer_max_shared(const void* fn);

// cudaFuncGetAttributes(fn).ptxVersion on the current device (0 on failure), read once.
int func_ptx_version(const void* fn);

// The compute capability major of the current device (0 on failure), read once per device.
int current_device_major();

}  // namespace sparge::cuda
