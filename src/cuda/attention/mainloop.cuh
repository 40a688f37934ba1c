// The mainloop's building blocks: predicated cp.async tile loads into swizzled shared memory, the
// QK^T and PV products of one warp (16 query rows) with ldmatrix + mma.sync, and score masking.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/attention/primitives.cuh"
#include "cuda/attention/traits.cuh"

namespace sparge::cuda::attn {

// Loads kRows rows of kHeadDim elements (row r at g + r * row_stride) into the swizzled tile at
// `dst`. Rows >= valid are zero-filled without reading global memory (src-size 0), so tails and
// padding rows hold exact zeros (a zero V row times a zero probability never makes a NaN); their
// source operand is `mapped`, an address inside the tensor, so no instruction ever names an
// address past an allocation.
template <class Tr, int kRows>
__device__ __forceinline__ void load_tile(std::uint32_t dst, const typename Tr::T* g, std::int64_t row_stride,
                                          int valid, const void* mapped, int tid) {
  constexpr int kRowsPerPass = Tr::kThreads / Tr::kChunks;
  static_assert(kRows % kRowsPerPass == 0, "every thread issues the same number of copies");
  const int chunk = tid % Tr::kChunks;
#pragma unroll
  for (int r = tid / Tr::kChunks; r < kRows; r += kRowsPerPass) {
    const bool ok = r < valid;
    const void* src = ok ? static_cast<const void*>(g + r * row_stride + chunk * 8) : mapped;
    cp_async_16(dst + swizzle(r, chunk, Tr::kChunks), src, ok);
  }
}

// Q fragments (A operand, 16 rows x kHeadDim) of warp `warp`, kept in registers for the whole loop.
template <class Tr>
__device__ __forceinline__ void load_q_fragments(std::uint32_t (&qf)[Tr::kDSteps][4], std::uint32_t q_smem,
                                                 int warp, int lane) {
  // ldmatrix x4 matrices: rows 0-7 / 8-15 (lane bit 3) x columns 0-7 / 8-15 (lane bit 4) = a0..a3.
  const std::uint32_t lane_base = swizzle((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4, Tr::kChunks);
#pragma unroll
  for (int ks = 0; ks < Tr::kDSteps; ++ks) {
    ldmatrix_x4(qf[ks], q_smem + swizzle_at(lane_base, warp * 16, ks, Tr::kChunks));
  }
}

// s = Q K^T for this warp's 16 rows and the kBlockK keys of the tile at k_smem.
template <class Tr>
__device__ __forceinline__ void qk_product(float (&s)[Tr::kKTiles][4], const std::uint32_t (&qf)[Tr::kDSteps][4],
                                           std::uint32_t k_smem, int lane) {
#pragma unroll
  for (int j = 0; j < Tr::kKTiles; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
  // B = K^T: a non-transposed 8x8 load of K rows (keys) gives each lane keys n = lane/4 and head
  // dims k = 2*(lane%4), +1, the col-major B fragment. Matrices: (keys 0-7, d 0-7), (keys 0-7,
  // d 8-15), (keys 8-15, d 0-7), (keys 8-15, d 8-15) = b0, b1 of n-tile 2np, b0, b1 of 2np+1.
  const std::uint32_t lane_base = swizzle((lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1, Tr::kChunks);
#pragma unroll
  for (int ks = 0; ks < Tr::kDSteps; ++ks) {
#pragma unroll
    for (int np = 0; np < Tr::kKTiles / 2; ++np) {
      std::uint32_t b[4];
      ldmatrix_x4(b, k_smem + swizzle_at(lane_base, np * 16, ks, Tr::kChunks));
      mma_16816<typename Tr::T>(s[2 * np], qf[ks], b[0], b[1]);
      mma_16816<typename Tr::T>(s[2 * np + 1], qf[ks], b[2], b[3]);
    }
  }
}

// o += P V with P = the probabilities in s (fp32), rounded to the input dtype. The accumulator
// layout of two adjacent S n-tiles is exactly the A fragment of one k-step of PV, so P never
// leaves registers.
template <class Tr>
__device__ __forceinline__ void pv_product(float (&o)[Tr::kDTiles][4], const float (&s)[Tr::kKTiles][4],
                                           std::uint32_t v_smem, int lane) {
  using E = Elem<typename Tr::T>;
  // B = V (k = keys, n = head dims): a transposed 8x8 load gives each lane keys 2*(lane%4), +1 at
  // head dim lane/4. Matrices: (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15),
  // (keys 8-15, d 8-15) = b0, b1 of d-tile 2dp, b0, b1 of 2dp+1.
  const std::uint32_t lane_base = swizzle((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4, Tr::kChunks);
#pragma unroll
  for (int kk = 0; kk < Tr::kKSteps; ++kk) {
    const std::uint32_t a[4] = {E::pack(s[2 * kk][0], s[2 * kk][1]), E::pack(s[2 * kk][2], s[2 * kk][3]),
                                E::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                E::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < Tr::kDTiles / 2; ++dp) {
      std::uint32_t b[4];
      ldmatrix_x4_trans(b, v_smem + swizzle_at(lane_base, kk * 16, dp, Tr::kChunks));
      mma_16816<typename Tr::T>(o[2 * dp], a, b[0], b[1]);
      mma_16816<typename Tr::T>(o[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// Multiplies the scores by scale * log2(e) and, when the tile needs it, sets keys that a row does
// not see to -inf: keys >= sk, and with causal masking keys j > i + sk - sq (bottom-right aligned).
// key_limit[r] = the last key row r sees (precomputed per row), k0 = the tile's first key.
template <class Tr>
__device__ __forceinline__ void scale_and_mask(float (&s)[Tr::kKTiles][4], float scale_log2, bool need_mask,
                                               const int (&key_limit)[2], int k0, int lane) {
  const int col0 = k0 + 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < Tr::kKTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[j][e] *= scale_log2;
      if (need_mask && col0 + j * 8 + (e & 1) > key_limit[e >> 1]) s[j][e] = -INFINITY;
    }
  }
}

}  // namespace sparge::cuda::attn
