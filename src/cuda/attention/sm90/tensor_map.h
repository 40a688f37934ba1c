// TMA tensor maps of the Hopper attention kernel, encoded on the host through the driver entry
// point (cudaGetDriverEntryPointByVersion: no -lcuda link needed).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "sparge/types.h"

namespace sparge::cuda::attn::sm90 {

// A 4-D map of a [B, S, H, D] f16/bf16 tensor with 64-bit element strides (stride[3] == 1): dims
// innermost first (D, S, H, B), boxes of 64 columns x `box_rows` rows, 128-byte swizzle, rows
// outside [0, S) zero-filled. Returns false (and leaves *out unspecified) when the driver rejects
// the layout, e.g. a stride TMA cannot express; the caller then uses the portable kernel.
bool encode_tensor_map(CUtensorMap* out, const Tensor& t, int box_rows);

// The same tensor with whole rows as the box: D (at most 256) columns x `box_rows` rows, no swizzle,
// so a box lands in shared memory as box_rows dense rows of D values (the block map's pooling ring).
bool encode_rows_map(CUtensorMap* out, const Tensor& t, int box_rows);

}  // namespace sparge::cuda::attn::sm90
