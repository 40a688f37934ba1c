// A device probe for the next step of the gather attention kernel (docs/token_sparse.md, "Next"):
// can TMA gather K/V rows into the 128-byte-swizzled wgmma layout, and does it move scattered
// rows faster than the 16-byte cp.async the kernels use today? Measurement only: nothing in
// gather_attention depends on it.
#pragma once

#include <string>

namespace sparge::cuda::gather {

struct TmaProbe {
  bool ran = false;              // false: no sm_90 device / build, or a CUDA error (see note)
  int swizzle_mismatches = -1;   // 16-byte chunks of 64 TMA-gathered rows not where sw128 puts them
  double cp_async_gbs = 0;       // gathered bytes per second, 16-byte cp.async, 3 steps in flight
  double tma_gbs = 0;            // the same rows by TMA boxes of 64 columns x 1 row
  std::string note;
};

// 264 CTAs (two waves of one per SM), each gathering 32 steps of 64 random K rows and 64 V rows
// (hd128 f16, 32 KB per step) of a [1, 16384, 8, 128] tensor into a ring of 4 stages.
TmaProbe tma_gather_probe();

}  // namespace sparge::cuda::gather
