// Online softmax in fp32 and log2 units, for the accumulator rows a thread holds (g and g+8 of each
// of its warp's M tiles). Scores arrive raw; scale * log2(e) (computed once on the host) is
// folded into the exponent, so every probability is one FFMA and one ex2.approx.
//
// The running max of a row that has seen no key yet is -inf; exponentials are taken against a
// finite stand-in (0) so that a fully masked row never evaluates exp2(-inf - -inf) = NaN: all its
// probabilities are exp2(-inf) = 0, its denominator stays 0, and the epilogue turns l == 0 into
// O = 0, LSE = -inf.
#pragma once

#include <cmath>

#include "cuda/attention/primitives.cuh"

namespace sparge::cuda::attn {

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <int kMTiles, int kKTiles>
struct OnlineSoftmax {
  static constexpr int kRows = 2 * kMTiles;  // row r = 2 * M tile + half (g, g + 8)
  float m[kRows];  // running max (log2 units), -inf before the first key
  float l[kRows];  // this thread's partial denominator; the quad's partials are summed at the end

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      m[r] = -INFINITY;
      l[r] = 0.0f;
    }
  }

  // Folds one key tile's raw scores s (masked entries -inf) into the state: updates the running max,
  // replaces s by the probabilities exp2(s * scale_log2 - max), adds them to the denominator and
  // returns the factors alpha by which O has to be rescaled. The maximum is taken on raw scores and
  // scaled once per row (scale > 0, and rounding is monotone, so max(fl(s * c)) = fl(max(s) * c));
  // each probability is then one FFMA and one ex2. block_max receives the tile's row maxima and
  // new_max the running maxima including this tile (pv_threshold's two inputs), both in log2 units.
  __device__ __forceinline__ void step(float (&s)[kMTiles][kKTiles][4], float scale_log2, float (&alpha)[kRows],
                                       float (&block_max)[kRows], float (&new_max)[kRows]) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int mt = r / 2, e0 = 2 * (r % 2);
      float x = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKTiles; ++j) x = fmaxf(x, fmaxf(s[mt][j][e0], s[mt][j][e0 + 1]));
      x = quad_max(x) * scale_log2;
      const float m_new = fmaxf(m[r], x);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      alpha[r] = ex2(m[r] - m_use);
      block_max[r] = x;
      new_max[r] = m_new;
      m[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kKTiles; ++j) {
        s[mt][j][e0] = ex2(fmaf(s[mt][j][e0], scale_log2, -m_use));
        s[mt][j][e0 + 1] = ex2(fmaf(s[mt][j][e0 + 1], scale_log2, -m_use));
        sum += s[mt][j][e0] + s[mt][j][e0 + 1];
      }
      l[r] = l[r] * alpha[r] + sum;
    }
  }
};

// pv_threshold's per-row test (docs/semantics.md Stage 2): the block's PV product may be skipped
// for this row when (x - m) + thr <= 0 in log2 units, x the block's row max and m the running max
// including this block. A row without a visible key in the block (x = -inf) always passes.
__device__ __forceinline__ bool pv_skippable(float block_max, float running_max, float thr) {
  return block_max == -INFINITY || (block_max - running_max) + thr <= 0.0f;
}

}  // namespace sparge::cuda::attn
