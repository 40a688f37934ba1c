// The portable block-sparse flash-attention kernel: wires the scheduler (which query block a CTA
// owns), the block iterator (which key blocks it visits), the mainloop (loads and products), the
// online softmax and the epilogue. Included only by the generated instantiation units (inst/).
//
// Pipeline per visited key tile i (a LUT block, or one of its 64-key sub-tiles when pv_threshold is
// off; two shared-memory stages each for K and V; one cp.async group per tile, committed in the
// order Q, K0, V0, K1, V1, ...; a group is committed even when there is nothing to load, so the wait
// counts below hold on every iteration):
//   wait_group 1 (K_i landed, V_i may fly), barrier        -> K_i visible to all warps
//   issue K_{i+1} into the other K stage                    (its last reader, S_{i-1}, finished
//                                                           before the vote barrier of i-1)
//   S = Q K_i^T, mask, online softmax
//   wait_group 1 (V_i landed, K_{i+1} may fly), barrier+vote -> V_i visible; pv_threshold decided
//   issue V_{i+1} into the other V stage                    (its last reader, PV_{i-1}, finished
//                                                           before this iteration's first barrier)
//   O = alpha O (+ P V_i unless the whole query block voted to skip)
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/attention/block_iter.cuh"
#include "cuda/attention/epilogue.cuh"
#include "cuda/attention/launch.h"
#include "cuda/attention/mainloop.cuh"
#include "cuda/attention/params.h"
#include "cuda/attention/softmax.cuh"
#include "cuda/attention/traits.cuh"

namespace sparge::cuda::attn {

template <class Tr>
struct MinBlocks {
  // Two CTAs per SM: free for 4-warp CTAs (two of them fit in the register file at ptxas's 255-register
  // cap) and for hd 64 with 8 warps and 64-key tiles (fits in 128 registers: Q 16 + O 32 + S 32 live
  // values). Other 8-warp tiles keep the compiler's full register budget rather than risk spills.
  static constexpr int value =
      Tr::kMinCtas > 0 ? Tr::kMinCtas : (Tr::kThreads <= 128 || (Tr::kHeadDim == 64 && Tr::kTileK == 64)) ? 2 : 1;
};

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, MinBlocks<Tr>::value)
    attention_kernel(const __grid_constant__ KernelParams p) {
  using T = typename Tr::T;
  constexpr int kRows = Tr::kRows;
  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t q_smem = smem_addr(smem);
  const std::uint32_t k_smem0 = q_smem + Tr::kQBytes;
  const std::uint32_t v_smem0 = k_smem0 + Tr::kStages * Tr::kKVBytes;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int rg = warp;  // the warp's query rows (row group)

  // ---- scheduler: tile -> (b, h, qb); query blocks of one head are adjacent (they share K/V in
  // L2), and with heavy_first the longest causal rows start first.
  const int tile = blockIdx.x;
  const int qb_idx = tile % p.nq;
  const int bh = tile / p.nq;
  const int h = bh % p.hq;
  const int b = bh / p.hq;
  const int qb = p.heavy_first ? p.nq - 1 - qb_idx : qb_idx;

  int q_begin = 0, k_begin = 0, sq = p.seq_q, sk = p.seq_k, b_dim0 = b;
  if (p.cu_seqlens_q != nullptr) {
    q_begin = p.cu_seqlens_q[b];
    k_begin = p.cu_seqlens_k[b];
    sq = min(p.cu_seqlens_q[b + 1] - q_begin, p.seq_q);
    sk = min(p.cu_seqlens_k[b + 1] - k_begin, p.seq_k);
    sq = max(sq, 0);
    sk = max(sk, 0);
    b_dim0 = 0;
  }
  const int q0 = qb * Tr::kBlockQ;
  if (q0 >= sq) return;  // a query block past this sequence's end: no rows, nothing to write
  const int rows = min(Tr::kBlockQ, sq - q0);
  const int hk = h / (p.hq / p.hk);

  const T* q_g = static_cast<const T*>(p.q) + b_dim0 * p.q_stride[0] + (q_begin + q0) * p.q_stride[1] +
                 h * p.q_stride[2];
  const T* k_g = static_cast<const T*>(p.k) + b_dim0 * p.k_stride[0] + static_cast<std::int64_t>(k_begin) * p.k_stride[1] +
                 hk * p.k_stride[2];
  const T* v_g = static_cast<const T*>(p.v) + b_dim0 * p.v_stride[0] + static_cast<std::int64_t>(k_begin) * p.v_stride[1] +
                 hk * p.v_stride[2];

  // Q's copy goes out first: it does not depend on the LUT, whose count and first entry are two
  // dependent global loads ahead of K0's address.
  load_tile<Tr, Tr::kBlockQ>(q_smem, q_g, p.q_stride[1], rows, p.q, tid);
  cp_async_commit();

  // ---- block and tile iterators
  const int visible = visible_blocks(q0, rows, sq, sk, Tr::kBlockK, p.is_causal);
  TileIter<Tr::kSubTiles> it;
  it.blocks = p.lut == nullptr
                  ? make_dense_iter(visible)
                  : make_lut_iter(p.lut + b * p.lut_stride[0] + h * p.lut_stride[1] + qb * p.lut_stride[2],
                                  p.lut_stride[3], p.counts[b * p.counts_stride[0] + h * p.counts_stride[1] +
                                                            qb * p.counts_stride[2]],
                                  p.nk_lut, visible);
  it.visible_tiles = visible_blocks(q0, rows, sq, sk, Tr::kTileK, p.is_causal);

  // The sequence position of the thread's first accumulator row; row r (M tile r / 2, g or g + 8)
  // sits at row0 + row_offset(r).
  const int row0 = q0 + rg * Tr::kWarpRows + (lane >> 2);
  auto row_offset = [](int r) { return (r / 2) * 16 + 8 * (r % 2); };
  // pv_threshold is decided per LUT block, so only whole-block tiles can skip (the launcher never
  // runs a sub-tiled shape with pv_threshold on). The query block's own rows decide; padding rows
  // past sq are not rows of it.
  const bool use_pv = Tr::kSubTiles == 1 && p.use_pv_threshold;
  const float pv_thr = !use_pv ? 0.0f : p.pv_threshold_per_head != nullptr ? p.pv_threshold_per_head[h] : p.pv_threshold;
  // A tile needs per-element masks when it crosses sk or (causal) the first row's bound
  // q0 + sk - sq; both hold from some tile index on, so one index decides (tiles come in LUT order).
  // |q0 + sk - sq| < 2^30 (the entry caps lengths at 2^30), so int arithmetic is exact.
  int first_masked_tile = sk / Tr::kTileK;  // the first tile that reaches past sk - 1
  if (p.is_causal) {
    const int bound = q0 + sk - sq;  // the last key the first row sees
    // the first tile whose last key k0 + kTileK - 1 exceeds bound
    const int t = bound < 0 ? 0 : (bound + 1) / Tr::kTileK;
    first_masked_tile = min(first_masked_tile, t);
  }

  // ---- prologue: Q (issued above), K0, V0
  int kt = it.next();
  if (kt >= 0) {
    const int k0 = kt * Tr::kTileK;
    load_tile<Tr, Tr::kTileK>(k_smem0, k_g + k0 * p.k_stride[1], p.k_stride[1], sk - k0, p.k, tid);
  }
  cp_async_commit();
  if (kt >= 0) {
    const int k0 = kt * Tr::kTileK;
    load_tile<Tr, Tr::kTileK>(v_smem0, v_g + k0 * p.v_stride[1], p.v_stride[1], sk - k0, p.v, tid);
  }
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  QFragments<Tr> qf;
  load_q_fragments<Tr>(qf, q_smem, rg, lane);

  float o[Tr::kMTiles][Tr::kDTiles][4];
#pragma unroll
  for (int mt = 0; mt < Tr::kMTiles; ++mt) {
#pragma unroll
    for (int j = 0; j < Tr::kDTiles; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.0f;
  }
  OnlineSoftmax<Tr::kMTiles, Tr::kKTiles> softmax;
  softmax.init();

  int stage = 0;
  while (kt >= 0) {
    const int kt_next = it.next();
    const int k0 = kt * Tr::kTileK;
    const std::uint32_t k_cur = k_smem0 + stage * Tr::kKVBytes;
    const std::uint32_t v_cur = v_smem0 + stage * Tr::kKVBytes;
    const std::uint32_t k_nxt = k_smem0 + (stage ^ 1) * Tr::kKVBytes;
    const std::uint32_t v_nxt = v_smem0 + (stage ^ 1) * Tr::kKVBytes;

    cp_async_wait<1>();
    __syncthreads();
    if (kt_next >= 0) {
      const int k0n = kt_next * Tr::kTileK;
      load_tile<Tr, Tr::kTileK>(k_nxt, k_g + k0n * p.k_stride[1], p.k_stride[1], sk - k0n, p.k, tid);
    }
    cp_async_commit();

    float s[Tr::kMTiles][Tr::kKTiles][4];
    qk_product<Tr>(s, qf, q_smem, k_cur, rg, lane);
    if (kt >= first_masked_tile) {
      mask_scores<Tr>(s, row0, sq, sk, p.is_causal, k0, lane);
    }
    float alpha[kRows], block_max[kRows], new_max[kRows];
    softmax.step(s, p.scale_log2, alpha, block_max, new_max);

    cp_async_wait<1>();
    // One barrier makes V_i visible and, with pv_threshold, counts the query block's vote: the PV
    // product is skipped only when every row of the block agrees (a CTA owns exactly one query block).
    bool skip_pv = false;
    if (use_pv) {
      bool skippable = true;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        skippable = skippable && (row0 + row_offset(r) >= sq || pv_skippable(block_max[r], new_max[r], pv_thr));
      }
      skip_pv = __syncthreads_and(skippable) != 0;
    } else {
      __syncthreads();
    }
    if (kt_next >= 0) {
      const int k0n = kt_next * Tr::kTileK;
      load_tile<Tr, Tr::kTileK>(v_nxt, v_g + k0n * p.v_stride[1], p.v_stride[1], sk - k0n, p.v, tid);
    }
    cp_async_commit();

    // With lazy_rescale a warp whose rows all kept their maxima (alpha == 1 exactly, the common case
    // once the maxima settle) skips the multiply by one: bitwise the same O.
    bool rescale = true;
    if (p.lazy_rescale) {
      bool moved = false;
#pragma unroll
      for (int r = 0; r < kRows; ++r) moved = moved || alpha[r] != 1.0f;
      rescale = __any_sync(0xffffffffu, moved);
    }
    if (rescale) {
#pragma unroll
      for (int mt = 0; mt < Tr::kMTiles; ++mt) {
#pragma unroll
        for (int j = 0; j < Tr::kDTiles; ++j) {
          o[mt][j][0] *= alpha[2 * mt];
          o[mt][j][1] *= alpha[2 * mt];
          o[mt][j][2] *= alpha[2 * mt + 1];
          o[mt][j][3] *= alpha[2 * mt + 1];
        }
      }
    }
    if (!skip_pv) pv_product<Tr>(o, s, v_cur, lane);

    kt = kt_next;
    stage ^= 1;
  }

  // ---- epilogue
  int row_in_seq[kRows];
  std::int64_t o_row[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    row_in_seq[r] = row0 + row_offset(r);
    o_row[r] = b_dim0 * p.o_stride[0] + static_cast<std::int64_t>(q_begin + row_in_seq[r]) * p.o_stride[1] +
               h * p.o_stride[2];
  }
  const std::int64_t lse_base = b * p.lse_stride[0] + h * p.lse_stride[1];
  store_output<T, Tr::kMTiles, Tr::kDTiles>(p, o, softmax.m, softmax.l, row_in_seq, sq, o_row, lse_base, lane);
}

template <class Tr>
cudaError_t launch_shape(const KernelParams& p, int num_tiles, cudaStream_t stream) {
  static_assert(Tr::kSmemBytes <= smem_bytes(Tr::kHeadDim, Tr::kBlockQ, Tr::kBlockK),
                "launch.h's bound (checked against the device by entry.cu) must cover every shape launched");
  auto* kernel = attention_kernel<Tr>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  kernel<<<num_tiles, Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <class T, int HD, int BLKQ, int BLKK>
cudaError_t Kernel<T, HD, BLKQ, BLKK>::attributes(cudaFuncAttributes* attr) {
  return cudaFuncGetAttributes(attr, attention_kernel<StreamTraits<T, HD, BLKQ, BLKK>>);
}

// Shape per call (traits.cuh): pv_threshold with BLKK 128 needs whole-block tiles.
template <class T, int HD, int BLKQ, int BLKK>
cudaError_t Kernel<T, HD, BLKQ, BLKK>::launch(const KernelParams& p, int num_tiles, cudaStream_t stream) {
  if constexpr (StreamTraits<T, HD, BLKQ, BLKK>::kSubTiles > 1) {
    if (p.use_pv_threshold) return launch_shape<WholeBlockTraits<T, HD, BLKQ, BLKK>>(p, num_tiles, stream);
  }
  return launch_shape<StreamTraits<T, HD, BLKQ, BLKK>>(p, num_tiles, stream);
}

}  // namespace sparge::cuda::attn
