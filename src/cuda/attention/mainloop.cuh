// The mainloop's building blocks: predicated cp.async tile loads into swizzled shared memory, the
// QK^T and PV products of one warp (16 or 32 query rows) with ldmatrix + mma.sync, and score masking.
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
  // A pass moves the thread kRowsPerPass rows down, a multiple of 8: row % 8, hence the swizzled
  // chunk, stays the same, and the destination advances by a constant.
  static_assert(kRowsPerPass % 8 == 0, "the swizzle repeats every 8 rows");
  const int r0 = tid / Tr::kChunks;
  const int chunk = tid % Tr::kChunks;
  const std::uint32_t dst0 = dst + swizzle(r0, chunk, Tr::kChunks);
  // One running pointer rather than kRows / kRowsPerPass loop-invariant row offsets, which the
  // compiler would otherwise hoist out of the mainloop into live registers.
  const typename Tr::T* src = g + r0 * row_stride + chunk * 8;
  std::int64_t step = kRowsPerPass * row_stride;
  // Opaque to the optimizer: keeps it from hoisting the per-pass offsets out of the loop.
  asm volatile("" : "+l"(step));
#pragma unroll
  for (int i = 0; i < kRows / kRowsPerPass; ++i) {
    const bool ok = r0 + i * kRowsPerPass < valid;
    cp_async_16(dst0 + i * kRowsPerPass * Tr::kChunks * 16, ok ? static_cast<const void*>(src) : mapped, ok);
    src += step;
  }
}

// Q fragments (A operand) of a warp with one M tile (kQInRegs): all k-steps, loaded once and kept in
// registers for the whole loop. Warps with two M tiles have no register room for them and re-read
// each k-step's fragments from shared memory in qk_product (then `r` is a placeholder).
template <class Tr>
struct QFragments {
  std::uint32_t r[Tr::kQInRegs ? Tr::kDSteps : 1][4];
};

// ldmatrix x4 of an A fragment (16 rows x 16 columns): rows 0-7 / 8-15 (lane bit 3) x columns 0-7 /
// 8-15 (lane bit 4) = a0..a3. The same lane layout serves V's transposed B fragments.
template <class Tr>
__device__ __forceinline__ std::uint32_t a_lane_base(int lane) {
  return swizzle((lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4, Tr::kChunks);
}

template <class Tr>
__device__ __forceinline__ void load_q_fragments(QFragments<Tr>& qf, std::uint32_t q_smem, int row_group, int lane) {
  if constexpr (Tr::kQInRegs) {
    const std::uint32_t lane_base = a_lane_base<Tr>(lane);
#pragma unroll
    for (int ks = 0; ks < Tr::kDSteps; ++ks) {
      ldmatrix_x4(qf.r[ks], q_smem + swizzle_at(lane_base, row_group * Tr::kWarpRows, ks, Tr::kChunks));
    }
  }
}

// s = Q K^T for this warp's kWarpRows rows (row group `row_group`) and the kTileK keys at k_smem.
template <class Tr>
__device__ __forceinline__ void qk_product(float (&s)[Tr::kMTiles][Tr::kKTiles][4], const QFragments<Tr>& qf,
                                           std::uint32_t q_smem, std::uint32_t k_smem, int row_group, int lane) {
#pragma unroll
  for (int mt = 0; mt < Tr::kMTiles; ++mt) {
#pragma unroll
    for (int j = 0; j < Tr::kKTiles; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
  }
  // B = K^T: a non-transposed 8x8 load of K rows (keys) gives each lane keys n = lane/4 and head
  // dims k = 2*(lane%4), +1, the col-major B fragment. Matrices: (keys 0-7, d 0-7), (keys 0-7,
  // d 8-15), (keys 8-15, d 0-7), (keys 8-15, d 8-15) = b0, b1 of n-tile 2np, b0, b1 of 2np+1.
  // Each B fragment feeds kMTiles M tiles: with two, one ldmatrix serves four mma instead of two.
  const std::uint32_t k_lane = swizzle((lane & 7) + (lane >> 4) * 8, (lane >> 3) & 1, Tr::kChunks);
  const std::uint32_t q_lane = a_lane_base<Tr>(lane);
#pragma unroll
  for (int ks = 0; ks < Tr::kDSteps; ++ks) {
    std::uint32_t a[Tr::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Tr::kMTiles; ++mt) {
      if constexpr (Tr::kQInRegs) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[mt][i] = qf.r[ks][i];
      } else {
        ldmatrix_x4(a[mt], q_smem + swizzle_at(q_lane, row_group * Tr::kWarpRows + mt * 16, ks, Tr::kChunks));
      }
    }
#pragma unroll
    for (int np = 0; np < Tr::kKTiles / 2; ++np) {
      std::uint32_t b[4];
      ldmatrix_x4(b, k_smem + swizzle_at(k_lane, np * 16, ks, Tr::kChunks));
#pragma unroll
      for (int mt = 0; mt < Tr::kMTiles; ++mt) {
        mma_16816<typename Tr::T>(s[mt][2 * np], a[mt], b[0], b[1]);
        mma_16816<typename Tr::T>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// o += P V with P = the probabilities in s (fp32), rounded to the input dtype; v_smem = the tile's
// first V row. The accumulator
// layout of two adjacent S n-tiles is exactly the A fragment of one k-step of PV, so P never
// leaves registers.
template <class Tr>
__device__ __forceinline__ void pv_product(float (&o)[Tr::kMTiles][Tr::kDTiles][4],
                                           const float (&s)[Tr::kMTiles][Tr::kKTiles][4], std::uint32_t v_smem,
                                           int lane) {
  using E = Elem<typename Tr::T>;
  // B = V (k = keys, n = head dims): a transposed 8x8 load gives each lane keys 2*(lane%4), +1 at
  // head dim lane/4. Matrices: (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15),
  // (keys 8-15, d 8-15) = b0, b1 of d-tile 2dp, b0, b1 of 2dp+1.
  const std::uint32_t lane_base = a_lane_base<Tr>(lane);
#pragma unroll
  for (int kk = 0; kk < Tr::kKSteps; ++kk) {
    std::uint32_t a[Tr::kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < Tr::kMTiles; ++mt) {
      a[mt][0] = E::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
      a[mt][1] = E::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
      a[mt][2] = E::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
      a[mt][3] = E::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < Tr::kDTiles / 2; ++dp) {
      std::uint32_t b[4];
      ldmatrix_x4_trans(b, v_smem + swizzle_at(lane_base, kk * 16, dp, Tr::kChunks));
#pragma unroll
      for (int mt = 0; mt < Tr::kMTiles; ++mt) {
        mma_16816<typename Tr::T>(o[mt][2 * dp], a[mt], b[0], b[1]);
        mma_16816<typename Tr::T>(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// Sets the raw scores of keys a row does not see to -inf: keys >= sk, and with causal masking keys
// j > i + sk - sq (bottom-right aligned). row0 = the sequence position of the thread's first
// accumulator row (row r = 2 * M tile + half sits at row0 + 16 * M tile + 8 * half), k0 = the first
// key of the tile. The per-row limits are recomputed here, in the rare masked
// tiles, rather than held in registers across the loop. Scaling is folded into the softmax's exponent.
template <class Tr>
__device__ __forceinline__ void mask_scores(float (&s)[Tr::kMTiles][Tr::kKTiles][4], int row0, int sq, int sk,
                                            bool causal, int k0, int lane) {
  const int col0 = k0 + 2 * (lane & 3);
#pragma unroll
  for (int mt = 0; mt < Tr::kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // The last key the row sees; the causal bound is computed in 64 bits (sk - sq may be large).
      const long long bound = static_cast<long long>(row0 + 16 * mt + 8 * half) + sk - sq;
      const int limit = causal && bound < sk - 1 ? static_cast<int>(bound < -1 ? -1 : bound) : sk - 1;
#pragma unroll
      for (int j = 0; j < Tr::kKTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (col0 + j * 8 + e > limit) s[mt][j][2 * half + e] = -INFINITY;
        }
      }
    }
  }
}

}  // namespace sparge::cuda::attn
