// Online softmax in fp32 and log2 units, for the two accumulator rows a thread holds (g and g+8 of
// its warp's 16 rows). Scores arrive already multiplied by scale * log2(e) (folded on the host), so
// every exponential is one ex2.approx.
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

template <int kKTiles>
struct OnlineSoftmax {
  float m[2];  // running max (log2 units), -inf before the first key
  float l[2];  // this thread's partial denominator; the quad's partials are summed at the end

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[r] = -INFINITY;
      l[r] = 0.0f;
    }
  }

  // Folds one key block's scores s (log2 units, masked entries -inf) into the state: updates the
  // running max, replaces s by the probabilities exp2(s - max), adds them to the denominator and
  // returns the factors alpha by which O has to be rescaled. block_max receives the block's row
  // maxima and new_max the running maxima including this block (pv_threshold's two inputs).
  __device__ __forceinline__ void step(float (&s)[kKTiles][4], float (&alpha)[2], float (&block_max)[2],
                                       float (&new_max)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float x = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKTiles; ++j) x = fmaxf(x, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
      x = quad_max(x);
      const float m_new = fmaxf(m[r], x);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      alpha[r] = ex2(m[r] - m_use);
      block_max[r] = x;
      new_max[r] = m_new;
      m[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kKTiles; ++j) {
        s[j][2 * r] = ex2(s[j][2 * r] - m_use);
        s[j][2 * r + 1] = ex2(s[j][2 * r + 1] - m_use);
        sum += s[j][2 * r] + s[j][2 * r + 1];
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
