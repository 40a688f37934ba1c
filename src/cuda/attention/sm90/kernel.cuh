// The Hopper (sm_90a) block-sparse flash-attention kernel: warp-specialized, TMA + mbarrier
// pipeline, wgmma. Included only by the instantiation units in sm90/inst/.
//
// CTA = one query block (BLKQ rows) = one producer warpgroup + BLKQ / 64 consumer warpgroups
// (64 query rows each, the M of wgmma). The producer's first thread walks the block iterator (LUT
// row or all visible blocks) and issues TMA loads of Q once and of K_i, V_i into a ring of stages;
// sparsity changes only the row coordinate of these loads. Each consumer warpgroup walks the same
// iterator (to know k0 for masking) and per visited block:
//   wait K_i full; S = Q K_i^T (wgmma ss, K-major both); wait; release K_i
//   scale, mask, online softmax (the portable kernel's code: same accumulator layout per warp)
//   pv_threshold vote over the query block (named barrier AND of all consumer threads)
//   O *= alpha; wait V_i full; O += P V_i (wgmma rs: P from registers, V MN-major); wait; release V_i
// Stages of K and V have separate barriers, so K_{i+1} lands while PV_i runs.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/attention/block_iter.cuh"
#include "cuda/attention/params.h"
#include "cuda/attention/primitives.cuh"
#include "cuda/attention/sm90/launch.h"
#include "cuda/attention/sm90/pipeline.cuh"
#include "cuda/attention/sm90/rows.cuh"
#include "cuda/attention/sm90/wgmma.cuh"

namespace sparge::cuda::attn::sm90 {

template <class T_, int HD_, int BLKQ_, int BLKK_>
struct Traits {
  using T = T_;
  static constexpr int kHeadDim = HD_;
  static constexpr int kBlockQ = BLKQ_;
  static constexpr int kBlockK = BLKK_;
  static constexpr int kConsumers = consumer_warpgroups(BLKQ_);
  static constexpr int kThreads = threads_per_cta(BLKQ_);
  static constexpr int kMinBlocks = ctas_per_sm(BLKQ_);
  static constexpr int kStages = stages(HD_, BLKQ_, BLKK_);
  static constexpr int kSmemBytes = smem_bytes(HD_, BLKQ_, BLKK_);
  static constexpr int kSlabs = HD_ / 64;            // 64-column (128-byte) slabs per row
  static constexpr int kQSlab = BLKQ_ * 128;         // bytes of one slab of the Q tile
  static constexpr int kKVSlab = BLKK_ * 128;        // bytes of one slab of a K or V tile
  static constexpr int kQBytes = q_bytes(HD_, BLKQ_);
  static constexpr int kKVBytes = kv_bytes(HD_, BLKK_);
  // Register tiles of one consumer warp (as in the portable kernel's Traits).
  static constexpr int kDTiles = HD_ / 8;
  static constexpr int kKTiles = BLKK_ / 8;
  static constexpr int kDSteps = HD_ / 16;
  static constexpr int kKSteps = BLKK_ / 16;
  // setmaxnreg budgets: the CTA's registers are threads * (65536 / (threads * CTAs per SM)),
  // rounded down to 8; the producer keeps 24 and the consumers share the rest.
  static constexpr int kProducerRegs = 24;
  static constexpr int kLaunchRegs = (65536 / (kThreads * kMinBlocks)) / 8 * 8;
  static constexpr int kConsumerRegs =
      ((kLaunchRegs * kThreads - kProducerRegs * 128) / (128 * kConsumers)) / 8 * 8 > 240
          ? 240
          : ((kLaunchRegs * kThreads - kProducerRegs * 128) / (128 * kConsumers)) / 8 * 8;
  static_assert(kStages >= 1 && kSmemBytes <= smem_budget(BLKQ_), "shared-memory plan does not fit");
};

// Shared memory: [Q slabs][K stage 0..S-1][V stage 0..S-1][barriers], tiles 1024-byte aligned.
template <class Tr>
struct Smem {
  unsigned char* base;
  __device__ __forceinline__ std::uint32_t q() const { return smem_addr(base); }
  __device__ __forceinline__ std::uint32_t k(int s) const { return q() + Tr::kQBytes + s * Tr::kKVBytes; }
  __device__ __forceinline__ std::uint32_t v(int s) const {
    return q() + Tr::kQBytes + (Tr::kStages + s) * Tr::kKVBytes;
  }
  __device__ __forceinline__ void* ptr(std::uint32_t addr) const { return base + (addr - q()); }
  __device__ __forceinline__ std::uint64_t* bars() const {
    return reinterpret_cast<std::uint64_t*>(base + Tr::kQBytes + 2 * Tr::kStages * Tr::kKVBytes);
  }
  __device__ __forceinline__ std::uint64_t* q_full() const { return bars(); }
  __device__ __forceinline__ std::uint64_t* k_full(int s) const { return bars() + 1 + s; }
  __device__ __forceinline__ std::uint64_t* v_full(int s) const { return bars() + 1 + Tr::kStages + s; }
  __device__ __forceinline__ std::uint64_t* k_empty(int s) const { return bars() + 1 + 2 * Tr::kStages + s; }
  __device__ __forceinline__ std::uint64_t* v_empty(int s) const { return bars() + 1 + 3 * Tr::kStages + s; }
};

// Which query block a CTA owns and where its sequence lives (the portable kernel's schedule).
struct Tile {
  int b, h, hk, qb, q0, q_begin, k_begin, sq, sk, b_dim0;
};

__device__ __forceinline__ Tile make_tile(const KernelParams& p, int tile_index, int blkq) {
  Tile t;
  const int qb_idx = tile_index % p.nq;
  const int bh = tile_index / p.nq;
  t.h = bh % p.hq;
  t.b = bh / p.hq;
  t.qb = p.heavy_first ? p.nq - 1 - qb_idx : qb_idx;
  t.q_begin = 0;
  t.k_begin = 0;
  t.sq = p.seq_q;
  t.sk = p.seq_k;
  t.b_dim0 = t.b;
  t.q0 = t.qb * blkq;
  t.hk = t.h / (p.hq / p.hk);
  return t;
}

__device__ __forceinline__ BlockIter make_iter(const KernelParams& p, const Tile& t, int visible) {
  if (p.lut == nullptr) return make_dense_iter(visible);
  return make_lut_iter(p.lut + t.b * p.lut_stride[0] + t.h * p.lut_stride[1] + t.qb * p.lut_stride[2], p.lut_stride[3],
                       p.counts[t.b * p.counts_stride[0] + t.h * p.counts_stride[1] + t.qb * p.counts_stride[2]],
                       p.nk_lut, visible);
}

template <class Tr>
__device__ __forceinline__ void producer(const Sm90Params& P, const Smem<Tr>& sm, const Tile& t, BlockIter it) {
  barrier_expect_bytes(sm.q_full(), Tr::kQBytes);
#pragma unroll
  for (int s = 0; s < Tr::kSlabs; ++s) {
    tma_load_4d(sm.ptr(sm.q() + s * Tr::kQSlab), &P.q_map, s * 64, t.q0, t.h, t.b_dim0, sm.q_full());
  }
  int use = 0;
  for (int kb = it.next(); kb >= 0; kb = it.next(), ++use) {
    const int st = use % Tr::kStages;
    const std::uint32_t parity = ((use / Tr::kStages) & 1) ^ 1;
    const int row = kb * Tr::kBlockK;
    barrier_wait(sm.k_empty(st), parity);
    barrier_expect_bytes(sm.k_full(st), Tr::kKVBytes);
#pragma unroll
    for (int s = 0; s < Tr::kSlabs; ++s) {
      tma_load_4d(sm.ptr(sm.k(st) + s * Tr::kKVSlab), &P.k_map, s * 64, row, t.hk, t.b_dim0, sm.k_full(st));
    }
    barrier_wait(sm.v_empty(st), parity);
    barrier_expect_bytes(sm.v_full(st), Tr::kKVBytes);
#pragma unroll
    for (int s = 0; s < Tr::kSlabs; ++s) {
      tma_load_4d(sm.ptr(sm.v(st) + s * Tr::kKVSlab), &P.v_map, s * 64, row, t.hk, t.b_dim0, sm.v_full(st));
    }
  }
}

// Named barrier ids: 0 is __syncthreads, 1 the pv_threshold vote, 2 + w warpgroup w's pingpong turn.
constexpr int kVoteBarrier = 1;
constexpr int kTurnBarrier = 2;

// One consumer warpgroup's state and steps. Per visited block i the loop issues, in one "turn"
// (pingpong with the other consumer warpgroup: its softmax runs while this one's GEMMs run),
//   S_i = Q K_i^T        and        O += P_{i-1} V_{i-1}
// then waits for S_i only, runs softmax_i while PV_{i-1} is still on the tensor cores, waits for
// PV_{i-1}, rescales O by alpha_i and packs P_i. A last turn issues PV of the last block.
template <class Tr>
struct Consumer {
  using T = typename Tr::T;
  const KernelParams& p;
  const Smem<Tr>& sm;
  const Tile& t;
  int cw, warp, lane;
  int row_in_seq[2], key_limit[2];
  bool row_real[2];
  float pv_thr;
  long long first_row_bound;
  std::uint32_t q_tile;

  float o[Tr::kDTiles][4];
  float s[Tr::kKTiles][4];
  std::uint32_t pa[Tr::kKSteps][4];  // P of the previous block, the A operand of its PV
  float m[2];  // running max of the two rows (log2 units), -inf before the first key
  float l[2];  // this thread's partial denominators (the quad's are summed in the epilogue)

  __device__ __forceinline__ Consumer(const KernelParams& p_, const Smem<Tr>& sm_, const Tile& t_, int cw_, int tid)
      : p(p_), sm(sm_), t(t_), cw(cw_), warp(tid / 32), lane(tid % 32) {
    const int wg_row0 = t.q0 + cw * 64;  // first query row of this warpgroup
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_in_seq[r] = wg_row0 + warp * 16 + (lane >> 2) + 8 * r;
      const long long causal_bound = static_cast<long long>(row_in_seq[r]) + t.sk - t.sq;
      key_limit[r] = p.is_causal && causal_bound < t.sk - 1 ? static_cast<int>(causal_bound < -1 ? -1 : causal_bound)
                                                            : t.sk - 1;
      row_real[r] = row_in_seq[r] < t.sq;
    }
    pv_thr = p.pv_threshold_per_head != nullptr ? p.pv_threshold_per_head[t.h] : p.pv_threshold;
    first_row_bound = static_cast<long long>(wg_row0) + t.sk - t.sq;
    q_tile = sm.q() + cw * 64 * 128;  // this warpgroup's 64 rows of each Q slab
#pragma unroll
    for (int j = 0; j < Tr::kDTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
  }

  static constexpr bool kPingpong = Tr::kConsumers == 2;
  __device__ __forceinline__ void turn_begin() const {
    if (kPingpong) named_barrier_sync(kTurnBarrier + cw, 256);
  }
  __device__ __forceinline__ void turn_end() const {
    if (kPingpong) named_barrier_arrive(kTurnBarrier + (cw ^ 1), 256);
  }
  __device__ __forceinline__ void release(std::uint64_t* bar) const {
    __syncwarp();
    if (lane == 0) barrier_arrive(bar);
  }

  __device__ __forceinline__ void issue_qk(int st) {
#pragma unroll
    for (int ks = 0; ks < Tr::kDSteps; ++ks) {
      Wgmma<T, Tr::kBlockK>::ss(s, k_major_desc(q_tile, Tr::kQSlab, ks), k_major_desc(sm.k(st), Tr::kKVSlab, ks), ks > 0);
    }
    wgmma_commit();
  }
  // O += P_{i-1} V_{i-1}, one commit group.
  __device__ __forceinline__ void issue_pv(int st) {
#pragma unroll
    for (int kk = 0; kk < Tr::kKSteps; ++kk) {
      Wgmma<T, Tr::kHeadDim>::rs(o, pa[kk], mn_major_desc(sm.v(st), Tr::kKVSlab, kk));
    }
    wgmma_commit();
  }
  // The same when the query block may have voted to skip it: a skipped PV commits an empty group,
  // so the wait counts are the same on both paths (ptxas serializes every wgmma of the kernel,
  // C7514, when the waits differ between the paths). Each path commits its own group: a commit
  // after the join makes ptxas close the PV group itself and add an empty group on both paths, so
  // wait<1> would wait for the PV too.
  __device__ __forceinline__ void issue_pv(int st, bool skip) {
    if (!skip) {
      issue_pv(st);
    } else {
      wgmma_commit();
    }
  }
  __device__ __forceinline__ void fence_p() {
#pragma unroll
    for (int kk = 0; kk < Tr::kKSteps; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(pa[kk][e])::"memory");
  }

  // Keys a row does not see (past sk, or in the causal future) become -inf; only blocks that
  // cross sk or the diagonal of some row of this warpgroup call this.
  __device__ __forceinline__ void mask_scores(int k0) {
    const int col0 = k0 + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < Tr::kKTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (col0 + j * 8 + (e & 1) > key_limit[e >> 1]) s[j][e] = -INFINITY;
  }

  // Online softmax of the raw scores S_i (block starting at key k0), the portable kernel's
  // arithmetic with the scale folded in: the row max is taken on raw scores and scaled once
  // (scale > 0, and rounding is monotonic, so this is the max of the scaled scores bit for bit),
  // and every probability is ex2(fma(s, scale*log2e, -max)): one FFMA + one MUFU per element.
  // Returns the query block's pv_threshold decision when kVote; alpha receives the factors O must
  // be rescaled by.
  template <bool kVote, bool kMask>
  __device__ __forceinline__ bool softmax_step(int k0, float (&alpha)[2]) {
    if constexpr (kMask) mask_scores(k0);
    const float scale = p.scale_log2;
    float block_max[2], new_max[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float x0 = -INFINITY, x1 = -INFINITY;  // two chains: half the dependent FMNMX latency
#pragma unroll
      for (int j = 0; j < Tr::kKTiles; j += 2) {
        x0 = fmaxf(x0, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
        x1 = fmaxf(x1, fmaxf(s[j + 1][2 * r], s[j + 1][2 * r + 1]));
      }
      const float x = quad_max(fmaxf(x0, x1)) * scale;
      const float m_new = fmaxf(m[r], x);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      alpha[r] = ex2(m[r] - m_use);
      block_max[r] = x;
      new_max[r] = m_new;
      m[r] = m_new;
      const float neg = -m_use;
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int j = 0; j < Tr::kKTiles; ++j) {
        s[j][2 * r] = ex2(fmaf(s[j][2 * r], scale, neg));
        s[j][2 * r + 1] = ex2(fmaf(s[j][2 * r + 1], scale, neg));
        sum0 += s[j][2 * r];
        sum1 += s[j][2 * r + 1];
      }
      l[r] = l[r] * alpha[r] + (sum0 + sum1);
    }
    if constexpr (!kVote) {
      return false;
    } else {
      bool skippable = true;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        skippable = skippable && (!row_real[r] || pv_skippable(block_max[r], new_max[r], pv_thr));
      }
      return uniform(named_barrier_and(kVoteBarrier, Tr::kConsumers * 128, skippable)) != 0;
    }
  }
  // Masked only where the block crosses sk or the causal diagonal of this warpgroup's rows (a
  // real branch: with the mask if-converted every block pays two instructions per score).
  template <bool kVote>
  __device__ __forceinline__ bool softmax_step(int k0, float (&alpha)[2]) {
    const bool need_mask = k0 + Tr::kBlockK > t.sk || (p.is_causal && k0 + Tr::kBlockK - 1 > first_row_bound);
    if (uniform(need_mask)) return softmax_step<kVote, true>(k0, alpha);
    return softmax_step<kVote, false>(k0, alpha);
  }

  // O *= alpha, skipped when no row of the warp changed its max (alpha == 1 exactly: ex2(0)),
  // which after the first blocks is most of them; then P packed to the input dtype.
  __device__ __forceinline__ void rescale_and_pack(const float (&alpha)[2]) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int j = 0; j < Tr::kDTiles; ++j) {
        o[j][0] *= alpha[0];
        o[j][1] *= alpha[0];
        o[j][2] *= alpha[1];
        o[j][3] *= alpha[1];
      }
    }
#pragma unroll
    for (int kk = 0; kk < Tr::kKSteps; ++kk) {
      pa[kk][0] = Elem<T>::pack(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = Elem<T>::pack(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = Elem<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = Elem<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
  }

  // Values that are uniform across the warp but that ptxas cannot prove uniform (LUT entries, vote
  // results) are broadcast from lane 0: a wgmma under a branch ptxas considers divergent gets
  // serialized (ptxas C7520: a wait after every wgmma).
  static __device__ __forceinline__ int uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }

  template <bool kVote>
  __device__ __forceinline__ void run(BlockIter it) {
    if (kPingpong && cw == 1) named_barrier_arrive(kTurnBarrier + 0, 256);  // warpgroup 0 goes first
    barrier_wait(sm.q_full(), 0);
    const int kb = uniform(it.next());
    if (kb >= 0) {
      // Block 0: S_0 alone.
      barrier_wait(sm.k_full(0), 0);
      turn_begin();
      wgmma_fence();
      fence_accumulator(s);
      issue_qk(0);
      turn_end();
      wgmma_wait<0>();
      fence_accumulator(s);
      release(sm.k_empty(0));
      float alpha[2];
      bool skip_prev = softmax_step<kVote>(kb * Tr::kBlockK, alpha);
      rescale_and_pack(alpha);
      int st_prev = 0;
      std::uint32_t parity_prev = 0;
      for (int use = 1;; ++use) {
        const int kb_next = uniform(it.next());
        if (kb_next < 0) break;
        const int st = use % Tr::kStages;
        const std::uint32_t parity = (use / Tr::kStages) & 1;
        barrier_wait(sm.k_full(st), parity);
        barrier_wait(sm.v_full(st_prev), parity_prev);
        turn_begin();
        wgmma_fence();
        fence_accumulator(s);
        fence_accumulator(o);
        issue_qk(st);
        if constexpr (kVote) {
          issue_pv(st_prev, skip_prev);
        } else {
          issue_pv(st_prev);
        }
        turn_end();
        wgmma_wait<1>();
        fence_accumulator(s);
        release(sm.k_empty(st));
        const bool skip = softmax_step<kVote>(kb_next * Tr::kBlockK, alpha);
        wgmma_wait<0>();
        fence_accumulator(o);
        fence_p();
        release(sm.v_empty(st_prev));
        rescale_and_pack(alpha);
        skip_prev = skip;
        st_prev = st;
        parity_prev = parity;
      }
      // PV of the last block.
      barrier_wait(sm.v_full(st_prev), parity_prev);
      turn_begin();
      wgmma_fence();
      fence_accumulator(o);
      if constexpr (kVote) {
          issue_pv(st_prev, skip_prev);
        } else {
          issue_pv(st_prev);
        }
      turn_end();
      wgmma_wait<0>();
      fence_accumulator(o);
      fence_p();
      release(sm.v_empty(st_prev));
    }
    if (kPingpong && cw == 0) named_barrier_sync(kTurnBarrier + 0, 256);  // the turn warpgroup 1 passed last

    // Epilogue (the portable kernel's: O = 0 / LSE = -inf for empty rows).
    std::int64_t o_row[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      o_row[r] = t.b_dim0 * p.o_stride[0] + static_cast<std::int64_t>(t.q_begin + row_in_seq[r]) * p.o_stride[1] +
                 t.h * p.o_stride[2];
    }
    const std::int64_t lse_base = t.b * p.lse_stride[0] + t.h * p.lse_stride[1];
    store_rows<T, Tr::kDTiles>(p, o, m, l, row_in_seq, t.sq, o_row, lse_base, lane);
  }
};

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks) attention_kernel(const __grid_constant__ Sm90Params P) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  const KernelParams& p = P.p;
  Smem<Tr> sm;
  sm.base = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);

  const int tile_index = P.order != nullptr ? __ldg(P.order + blockIdx.x) : static_cast<int>(blockIdx.x);
  const Tile t = make_tile(p, tile_index, Tr::kBlockQ);
  if (t.q0 >= t.sq) return;  // uniform: the whole CTA leaves before any barrier exists
  const int rows = min(Tr::kBlockQ, t.sq - t.q0);
  const int visible = visible_blocks(t.q0, rows, t.sq, t.sk, Tr::kBlockK, p.is_causal);

  const int tid = threadIdx.x;
  if (tid == 0) {
    barrier_init(sm.q_full(), 1);
    for (int s = 0; s < Tr::kStages; ++s) {
      barrier_init(sm.k_full(s), 1);
      barrier_init(sm.v_full(s), 1);
      barrier_init(sm.k_empty(s), Tr::kConsumers * 4);
      barrier_init(sm.v_empty(s), Tr::kConsumers * 4);
    }
    barrier_init_fence();
  }
  __syncthreads();

  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // provably warp-uniform for ptxas
  if (wg == 0) {
    registers_release<Tr::kProducerRegs>();
    if (tid == 0) producer<Tr>(P, sm, t, make_iter(p, t, visible));
  } else {
    registers_claim<Tr::kConsumerRegs>();
    Consumer<Tr> c(p, sm, t, wg - 1, tid % 128);
    if (p.use_pv_threshold) {
      c.template run<true>(make_iter(p, t, visible));
    } else {
      c.template run<false>(make_iter(p, t, visible));
    }
  }
#else
  (void)P;
#endif
}

template <class T, int HD, int BLKQ, int BLKK>
cudaError_t Kernel<T, HD, BLKQ, BLKK>::attributes(cudaFuncAttributes* attr) {
  return cudaFuncGetAttributes(attr, attention_kernel<Traits<T, HD, BLKQ, BLKK>>);
}

template <class T, int HD, int BLKQ, int BLKK>
cudaError_t Kernel<T, HD, BLKQ, BLKK>::launch(const Sm90Params& p, int num_tiles, cudaStream_t stream) {
  using Tr = Traits<T, HD, BLKQ, BLKK>;
  auto* kernel = attention_kernel<Tr>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  // Sparse tiles that do not all fit on the GPU at once run longest LUT row first (a stream-ordered
  // scratch of the order): the block scheduler hands the next CTA to the first free slot, so this
  // is greedy longest-first, within a length class of the optimum for skewed LUTs. Without the
  // scratch (allocation failure) the tiles run in index order.
  Sm90Params q = p;
  std::int32_t* order = nullptr;
  int dev = 0, sms = 0;
  if (p.p.lut != nullptr && cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
      num_tiles > sms * Tr::kMinBlocks) {
    if (cudaMallocAsync(reinterpret_cast<void**>(&order), sizeof(std::int32_t) * num_tiles, stream) == cudaSuccess) {
      if (order_tiles_by_count(p.p, num_tiles, order, stream) == cudaSuccess) q.order = order;
    } else {
      order = nullptr;
    }
  }
  cudaGetLastError();  // a failed optional step above must not be reported as the launch's error
  kernel<<<num_tiles, Tr::kThreads, Tr::kSmemBytes, stream>>>(q);
  err = cudaGetLastError();
  if (order != nullptr) cudaFreeAsync(order, stream);
  return err;
}

}  // namespace sparge::cuda::attn::sm90
