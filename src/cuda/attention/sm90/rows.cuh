// Per-row pieces of the Hopper attention kernel that the portable kernel also has, kept here so
// the two kernels can change their register layouts independently: the exponential, the
// pv_threshold row test and the epilogue of the two accumulator rows a thread holds (g and g + 8
// of its warp's 16 rows; the wgmma m64nN accumulator is, per warp, the mma.sync m16n8 layout).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/attention/params.h"
#include "cuda/attention/primitives.cuh"

namespace sparge::cuda::attn::sm90 {

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// pv_threshold's per-row test (docs/semantics.md Stage 2): the block's PV product may be skipped
// for this row when (x - m) + thr <= 0 in log2 units, x the block's row max and m the running max
// including this block. Written as !(... > 0), so that a NaN difference passes: x = m = -inf (no
// visible key in the block, nor before it) passes as the definition's x = -inf must, and x = -inf
// against a finite m gives -inf, which passes too, so no separate -inf test is needed. (+inf or
// NaN scores, where this could differ from "<= 0", make the row's denominator NaN whatever is
// skipped.) thr = -inf (a row outside the sequence) passes every value.
__device__ __forceinline__ bool pv_skippable(float block_max, float running_max, float thr) {
  return !((block_max - running_max) + thr > 0.0f);
}

// Normalizes the two rows by their denominators (l: this thread's partial sums, summed over the
// quad here) and stores O (input dtype or f32) and the optional LSE from registers. Every row that
// exists in the sequence is written; an empty row (l == 0, or -0.0) gets O = 0 and LSE = -inf.
// m is the running max in log2 units.
template <class T, int kDTiles>
__device__ __forceinline__ void store_rows(const KernelParams& p, const float (&o)[kDTiles][4], const float (&m)[2],
                                           const float (&l)[2], const int (&row_in_seq)[2], int sq,
                                           const std::int64_t (&o_row)[2], std::int64_t lse_base, int lane) {
  const int t = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l_row = quad_sum(l[r]);
    const bool empty = !(l_row > 0.0f);
    const float inv = empty ? 0.0f : 1.0f / l_row;
    if (row_in_seq[r] >= sq) continue;
    if (p.o_is_f32) {
      float* dst = static_cast<float*>(p.o) + o_row[r];
#pragma unroll
      for (int j = 0; j < kDTiles; ++j) {
        *reinterpret_cast<float2*>(dst + j * 8 + 2 * t) = make_float2(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
      }
    } else {
      T* dst = static_cast<T*>(p.o) + o_row[r];
#pragma unroll
      for (int j = 0; j < kDTiles; ++j) {
        *reinterpret_cast<std::uint32_t*>(dst + j * 8 + 2 * t) = Elem<T>::pack(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
      }
    }
    if (p.lse != nullptr && t == 0) {
      const float lse = empty ? -INFINITY : (m[r] + log2f(l_row)) * 0.69314718055994531f;
      p.lse[lse_base + row_in_seq[r] * p.lse_stride[2]] = lse;
    }
  }
}

}  // namespace sparge::cuda::attn::sm90
