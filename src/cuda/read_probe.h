// A plain streaming read of device memory: the `sparge bench` tool's reference for how fast the
// GPU reads what the block map reads (docs/tool.md). Not part of the public API.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace sparge::cuda {

// Reads `bytes` (a multiple of 16) from the 16-byte aligned `data` once, with 16-byte loads over a
// grid of the resident CTAs, and keeps the loads alive through `sink` (4 bytes of device memory,
// written only if an XOR of everything read equals a fixed value). Returns the launch's error.
cudaError_t read_probe(const void* data, std::size_t bytes, unsigned* sink, cudaStream_t stream);

}  // namespace sparge::cuda
