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

// Four fp32 values -> four e4m3 bytes (round to nearest even, saturating), a in the lowest byte.
// (cvt...e4m3x2 puts its first source in the upper byte.)
__device__ __forceinline__ std::uint32_t pack_e4m3x4(float a, float b, float c, float d) {
  std::uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;\n" : "=h"(lo) : "f"(a), "f"(b));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;\n" : "=h"(hi) : "f"(c), "f"(d));
  return static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
}

// The fp8 recipe's epilogue inputs: V's per-channel dequantization scales of this (batch, kv head)
// (column c of O is multiplied by v_scale[c]), and per row the LSE shift of K smoothing (natural
// log); O and l carry the factor 2^8 of P (softmax_step_fp8), so the LSE subtracts 8 in log2 units.
struct Fp8Epilogue {
  const float* v_scale = nullptr;
  float lse_shift[2] = {0.0f, 0.0f};
};

// Quad transpose of packed 16-bit pairs: lane t (= lane & 3) of a quad holds w[i], its two columns
// (2t, 2t + 1) of 8-column tile i of one row, for four consecutive tiles; afterwards it holds all
// eight columns of tile t, in column order (the words of lanes 0..3). Two butterfly stages (partner
// t ^ 2, then t ^ 1), two shuffles each; every lane of the warp must call it.
__device__ __forceinline__ uint4 quad_transpose(const std::uint32_t (&w)[4], int t) {
  const bool hi = (t & 2) != 0, lo = (t & 1) != 0;
  // Stage 1: keep the tiles whose bit 1 is hi's (a: tile 2 hi, b: tile 2 hi + 1), send the other two.
  const std::uint32_t a_me = hi ? w[2] : w[0], b_me = hi ? w[3] : w[1];
  const std::uint32_t a_p = __shfl_xor_sync(0xffffffffu, hi ? w[0] : w[2], 2);  // lane t ^ 2's word of tile a
  const std::uint32_t b_p = __shfl_xor_sync(0xffffffffu, hi ? w[1] : w[3], 2);
  // Stage 2: keep tile 2 hi + lo = t, send the other one (both words) to lane t ^ 1.
  const std::uint32_t k_me = lo ? b_me : a_me, k_p = lo ? b_p : a_p;
  const std::uint32_t r_me = __shfl_xor_sync(0xffffffffu, lo ? a_me : b_me, 1);  // from lane t ^ 1
  const std::uint32_t r_p = __shfl_xor_sync(0xffffffffu, lo ? a_p : b_p, 1);    // from lane t ^ 3
  // Words of tile t by source lane: t -> k_me, t ^ 1 -> r_me, t ^ 2 -> k_p, t ^ 3 -> r_p.
  const std::uint32_t x0 = lo ? r_me : k_me, x1 = lo ? k_me : r_me;  // lanes 2 hi, 2 hi + 1
  const std::uint32_t y0 = lo ? r_p : k_p, y1 = lo ? k_p : r_p;      // lanes 2 !hi, 2 !hi + 1
  return hi ? make_uint4(y0, y1, x0, x1) : make_uint4(x0, x1, y0, y1);
}

// A row's LSE (natural log) from its running max m (log2 units) and denominator; -inf for an empty row.
__device__ __forceinline__ float row_lse(float m, float l_row, bool empty) {
  return empty ? -INFINITY : (m + log2f(l_row)) * 0.69314718055994531f;
}

// Normalizes the two rows by their denominators (l: this thread's partial sums, summed over the
// quad here) and stores O (input dtype or f32) and the optional LSE from registers. Every row that
// exists in the sequence is written; an empty row (l == 0, or -0.0) gets O = 0 and LSE = -inf.
// m is the running max in log2 units.
template <class T, int kDTiles, bool kFp8 = false>
__device__ __forceinline__ void store_rows(const KernelParams& p, const float (&o)[kDTiles][4], const float (&m)[2],
                                           const float (&l)[2], const int (&row_in_seq)[2], int sq,
                                           const std::int64_t (&o_row)[2], std::int64_t lse_base, int lane,
                                           const Fp8Epilogue& f8 = Fp8Epilogue{}) {
  const int t = lane & 3;
  float2 vs[kDTiles];
  if constexpr (kFp8) {
#pragma unroll
    for (int j = 0; j < kDTiles; ++j) vs[j] = __ldg(reinterpret_cast<const float2*>(f8.v_scale + j * 8 + 2 * t));
  } else {
#pragma unroll
    for (int j = 0; j < kDTiles; ++j) vs[j] = make_float2(1.0f, 1.0f);
  }
  float inv[2], l_sum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_sum[r] = quad_sum(l[r]);
    inv[r] = l_sum[r] > 0.0f ? 1.0f / l_sum[r] : 0.0f;
  }
  // 16-byte stores (16-bit output, every row of the warp 16-byte aligned: a warp-uniform choice, so
  // the quads' shuffles see every lane): each row's words transposed within its quad, then a quad
  // writes 64 contiguous bytes of its row per store (16 per lane) instead of four 16-byte pieces of
  // 4-byte stores: a quarter of the store instructions, whole sectors.
  static_assert(kDTiles % 4 == 0, "hd is a multiple of 32");
  bool vec16 = false;
  if (!p.o_is_f32) {
    bool aligned = true;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      aligned &= (reinterpret_cast<std::uintptr_t>(static_cast<T*>(p.o) + o_row[r]) & 15) == 0;
    }
    vec16 = __all_sync(0xffffffffu, aligned);
    if (vec16) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        T* dst = static_cast<T*>(p.o) + o_row[r];
#pragma unroll
        for (int g = 0; g < kDTiles / 4; ++g) {
          std::uint32_t w[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int j = 4 * g + i;
            w[i] = Elem<T>::pack(o[j][2 * r] * inv[r] * vs[j].x, o[j][2 * r + 1] * inv[r] * vs[j].y);
          }
          const uint4 v = quad_transpose(w, t);
          if (row_in_seq[r] < sq) *reinterpret_cast<uint4*>(dst + (4 * g + t) * 8) = v;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l_row = l_sum[r];
    const bool empty = !(l_row > 0.0f);
    if (row_in_seq[r] >= sq) continue;
    if (p.o_is_f32) {
      float* dst = static_cast<float*>(p.o) + o_row[r];
#pragma unroll
      for (int j = 0; j < kDTiles; ++j) {
        if constexpr (kFp8) {
          *reinterpret_cast<float2*>(dst + j * 8 + 2 * t) =
              make_float2(o[j][2 * r] * inv[r] * vs[j].x, o[j][2 * r + 1] * inv[r] * vs[j].y);
        } else {
          *reinterpret_cast<float2*>(dst + j * 8 + 2 * t) = make_float2(o[j][2 * r] * inv[r], o[j][2 * r + 1] * inv[r]);
        }
      }
    } else if (!vec16) {
      T* dst = static_cast<T*>(p.o) + o_row[r];
#pragma unroll
      for (int j = 0; j < kDTiles; ++j) {
        if constexpr (kFp8) {
          *reinterpret_cast<std::uint32_t*>(dst + j * 8 + 2 * t) =
              Elem<T>::pack(o[j][2 * r] * inv[r] * vs[j].x, o[j][2 * r + 1] * inv[r] * vs[j].y);
        } else {
          *reinterpret_cast<std::uint32_t*>(dst + j * 8 + 2 * t) =
              Elem<T>::pack(o[j][2 * r] * inv[r], o[j][2 * r + 1] * inv[r]);
        }
      }
    }
    if (p.lse != nullptr && t == 0) {
      float lse = row_lse(m[r], l_row, empty);
      if constexpr (kFp8) {
        if (!empty) lse = (m[r] + log2f(l_row) - 8.0f) * 0.69314718055994531f + f8.lse_shift[r];
      }
      p.lse[lse_base + row_in_seq[r] * p.lse_stride[2]] = lse;
    }
  }
}

}  // namespace sparge::cuda::attn::sm90
