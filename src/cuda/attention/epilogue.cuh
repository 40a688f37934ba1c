// Epilogue: normalize the accumulator rows by their denominators and store O (input dtype or f32)
// and the optional LSE straight from registers. Every row of the query block that exists in the
// sequence is written, including empty rows (O = 0, LSE = -inf), so poisoned outputs never survive.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/attention/params.h"
#include "cuda/attention/primitives.cuh"

namespace sparge::cuda::attn {

// row_in_seq[r]: the sequence position of accumulator row r (2 * M tile + half: g, g + 8 of each M
// tile), o_row[r] its element offset in o; rows at or past sq are not written.
template <class T, int kMTiles, int kDTiles>
__device__ __forceinline__ void store_output(const KernelParams& p, float (&o)[kMTiles][kDTiles][4],
                                             const float (&m)[2 * kMTiles], const float (&l)[2 * kMTiles],
                                             const int (&row_in_seq)[2 * kMTiles], int sq,
                                             const std::int64_t (&o_row)[2 * kMTiles], std::int64_t lse_base,
                                             int lane) {
  const int t = lane & 3;
#pragma unroll
  for (int r = 0; r < 2 * kMTiles; ++r) {
    const int mt = r / 2, e0 = 2 * (r % 2);
    const float l_row = quad_sum(l[r]);
    // l is a sum of non-negative terms; l <= 0 also catches -0.0 (a float compare, not bits).
    const bool empty = !(l_row > 0.0f);
    const float inv = empty ? 0.0f : 1.0f / l_row;
    if (row_in_seq[r] >= sq) continue;
    if (p.o_is_f32) {
      float* dst = static_cast<float*>(p.o) + o_row[r];
#pragma unroll
      for (int j = 0; j < kDTiles; ++j) {
        *reinterpret_cast<float2*>(dst + j * 8 + 2 * t) = make_float2(o[mt][j][e0] * inv, o[mt][j][e0 + 1] * inv);
      }
    } else {
      T* dst = static_cast<T*>(p.o) + o_row[r];
#pragma unroll
      for (int j = 0; j < kDTiles; ++j) {
        *reinterpret_cast<std::uint32_t*>(dst + j * 8 + 2 * t) = Elem<T>::pack(o[mt][j][e0] * inv, o[mt][j][e0 + 1] * inv);
      }
    }
    if (p.lse != nullptr && t == 0) {
      // m and l are in log2 units: LSE = ln 2 * (m + log2 l).
      const float lse = empty ? -INFINITY : (m[r] + log2f(l_row)) * 0.69314718055994531f;
      p.lse[lse_base + row_in_seq[r] * p.lse_stride[2]] = lse;
    }
  }
}

}  // namespace sparge::cuda::attn
