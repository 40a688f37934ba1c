// The portable block-sparse flash-attention kernel: wires the scheduler (which query block a CTA
// owns), the block iterator (which key blocks it visits), the mainloop (loads and products), the
// online softmax and the epilogue. Included only by the generated instantiation units (inst/).
//
// Pipeline per visited key block i (two shared-memory stages each for K and V; one cp.async group
// per tile, committed in the order Q, K0, V0, K1, V1, ...; a group is committed even when there is
// nothing to load, so the wait counts below hold on every iteration):
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
  // hd 64 with 8 warps fits in 128 registers (Q 16 + O 32 + S 32 live values): ask for two CTAs
  // per SM. Larger tiles keep the compiler's full register budget rather than risk spills.
  static constexpr int value = (Tr::kHeadDim == 64 && Tr::kBlockQ == 128 && Tr::kBlockK == 64) ? 2 : 1;
};

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, MinBlocks<Tr>::value)
    attention_kernel(const __grid_constant__ KernelParams p) {
  using T = typename Tr::T;
  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t q_smem = smem_addr(smem);
  const std::uint32_t k_smem0 = q_smem + Tr::kQBytes;
  const std::uint32_t v_smem0 = k_smem0 + Tr::kStages * Tr::kKVBytes;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;

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

  // ---- block iterator
  const int visible = visible_blocks(q0, rows, sq, sk, Tr::kBlockK, p.is_causal);
  BlockIter it = p.lut == nullptr
                     ? make_dense_iter(visible)
                     : make_lut_iter(p.lut + b * p.lut_stride[0] + h * p.lut_stride[1] + qb * p.lut_stride[2],
                                     p.lut_stride[3], p.counts[b * p.counts_stride[0] + h * p.counts_stride[1] +
                                                               qb * p.counts_stride[2]],
                                     p.nk_lut, visible);

  // Per accumulator row (g, g + 8): its position in the sequence and the last key it sees.
  int row_in_seq[2], key_limit[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_in_seq[r] = q0 + warp * 16 + (lane >> 2) + 8 * r;
    const long long causal_bound = static_cast<long long>(row_in_seq[r]) + sk - sq;
    key_limit[r] = p.is_causal && causal_bound < sk - 1 ? static_cast<int>(causal_bound < -1 ? -1 : causal_bound)
                                                        : sk - 1;
  }
  // The query block's own rows decide pv_threshold; padding rows past sq are not rows of it.
  const bool row_real[2] = {row_in_seq[0] < sq, row_in_seq[1] < sq};
  const float pv_thr = p.pv_threshold_per_head != nullptr ? p.pv_threshold_per_head[h] : p.pv_threshold;
  // A tile needs per-element masks when it crosses sk or (causal) the first row's bound.
  const long long first_row_bound = static_cast<long long>(q0) + sk - sq;

  // ---- prologue: Q, K0, V0
  load_tile<Tr, Tr::kBlockQ>(q_smem, q_g, p.q_stride[1], rows, p.q, tid);
  cp_async_commit();
  int kb = it.next();
  if (kb >= 0) {
    const int k0 = kb * Tr::kBlockK;
    load_tile<Tr, Tr::kBlockK>(k_smem0, k_g + k0 * p.k_stride[1], p.k_stride[1], sk - k0, p.k, tid);
  }
  cp_async_commit();
  if (kb >= 0) {
    const int k0 = kb * Tr::kBlockK;
    load_tile<Tr, Tr::kBlockK>(v_smem0, v_g + k0 * p.v_stride[1], p.v_stride[1], sk - k0, p.v, tid);
  }
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  std::uint32_t qf[Tr::kDSteps][4];
  load_q_fragments<Tr>(qf, q_smem, warp, lane);

  float o[Tr::kDTiles][4];
#pragma unroll
  for (int j = 0; j < Tr::kDTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  OnlineSoftmax<Tr::kKTiles> softmax;
  softmax.init();

  int stage = 0;
  while (kb >= 0) {
    const int kb_next = it.next();
    const int k0 = kb * Tr::kBlockK;
    const std::uint32_t k_cur = k_smem0 + stage * Tr::kKVBytes;
    const std::uint32_t v_cur = v_smem0 + stage * Tr::kKVBytes;
    const std::uint32_t k_nxt = k_smem0 + (stage ^ 1) * Tr::kKVBytes;
    const std::uint32_t v_nxt = v_smem0 + (stage ^ 1) * Tr::kKVBytes;

    cp_async_wait<1>();
    __syncthreads();
    if (kb_next >= 0) {
      const int k0n = kb_next * Tr::kBlockK;
      load_tile<Tr, Tr::kBlockK>(k_nxt, k_g + k0n * p.k_stride[1], p.k_stride[1], sk - k0n, p.k, tid);
    }
    cp_async_commit();

    float s[Tr::kKTiles][4];
    qk_product<Tr>(s, qf, k_cur, lane);
    const bool need_mask = k0 + Tr::kBlockK > sk || (p.is_causal && k0 + Tr::kBlockK - 1 > first_row_bound);
    scale_and_mask<Tr>(s, p.scale_log2, need_mask, key_limit, k0, lane);
    float alpha[2], block_max[2], new_max[2];
    softmax.step(s, alpha, block_max, new_max);

    bool skippable = true;
#pragma unroll
    for (int r = 0; r < 2; ++r) skippable = skippable && (!row_real[r] || pv_skippable(block_max[r], new_max[r], pv_thr));
    cp_async_wait<1>();
    // One barrier makes V_i visible and counts the query block's vote: the PV product is skipped
    // only when every row of the block agrees (a CTA owns exactly one query block).
    const bool skip_pv = __syncthreads_and(p.use_pv_threshold && skippable) != 0;
    if (kb_next >= 0) {
      const int k0n = kb_next * Tr::kBlockK;
      load_tile<Tr, Tr::kBlockK>(v_nxt, v_g + k0n * p.v_stride[1], p.v_stride[1], sk - k0n, p.v, tid);
    }
    cp_async_commit();

#pragma unroll
    for (int j = 0; j < Tr::kDTiles; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }
    if (!skip_pv) pv_product<Tr>(o, s, v_cur, lane);

    kb = kb_next;
    stage ^= 1;
  }

  // ---- epilogue
  std::int64_t o_row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    o_row[r] = b_dim0 * p.o_stride[0] + static_cast<std::int64_t>(q_begin + row_in_seq[r]) * p.o_stride[1] +
               h * p.o_stride[2];
  }
  const std::int64_t lse_base = b * p.lse_stride[0] + h * p.lse_stride[1];
  store_output<T, Tr::kDTiles>(p, o, softmax.m, softmax.l, row_in_seq, sq, o_row, lse_base, lane);
}

template <class T, int HD, int BLKQ, int BLKK>
cudaError_t Kernel<T, HD, BLKQ, BLKK>::attributes(cudaFuncAttributes* attr) {
  return cudaFuncGetAttributes(attr, attention_kernel<Traits<T, HD, BLKQ, BLKK>>);
}

template <class T, int HD, int BLKQ, int BLKK>
cudaError_t Kernel<T, HD, BLKQ, BLKK>::launch(const KernelParams& p, int num_tiles, cudaStream_t stream) {
  using Tr = Traits<T, HD, BLKQ, BLKK>;
  static_assert(Tr::kSmemBytes == smem_bytes(HD, BLKQ, BLKK), "launch.h and traits.cuh disagree");
  auto* kernel = attention_kernel<Tr>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  kernel<<<num_tiles, Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sparge::cuda::attn
