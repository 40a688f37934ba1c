// The Hopper (sm_90a) block-sparse flash-attention kernel: warp-specialized, TMA + mbarrier
// pipeline, wgmma. Included only by the instantiation units in sm90/inst/.
//
// CTA = one query block (BLKQ rows) = one producer warpgroup + BLKQ / 64 consumer warpgroups
// (64 query rows each, the M of wgmma). The producer's first thread walks the block iterator (LUT
// row or all visible blocks) and issues TMA loads of Q once and of K, V key tiles into a ring of
// stages; sparsity changes only the row coordinates of these loads. A key tile is one LUT block,
// or (paired kernel, 64-key LUT blocks) two consecutive entries of the LUT
// row in the two 64-row halves of a 128-key stage. Each consumer warpgroup walks the same
// iterator (to know the key offsets for masking) and per tile:
//   wait K full; S = Q K^T (wgmma ss, K-major both); release K
//   scale, mask, online softmax (the portable kernel's arithmetic: same accumulator layout per warp)
//   pv_threshold vote per LUT block (own warpgroup's rows; the other warpgroup's vote is read only
//   when this one's rows all say "skip": docs/attention_sm90.md, "pv_threshold")
//   O *= alpha; wait V full; O += P V (wgmma rs: P from registers, V MN-major); release V
// Stages of K and V have separate barriers, so K of the next tile lands while PV runs; the loop
// overlaps the softmax of tile i with PV of tile i - 1 (docs/attention_sm90.md, Pipeline).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/attention/block_iter.cuh"
#include "cuda/attention/params.h"
#include "cuda/attention/primitives.cuh"
#include "cuda/attention/sm90/launch.h"
#include "cuda/attention/sm90/pipeline.cuh"
#include "cuda/attention/sm90/rows.cuh"
#include "cuda/attention/sm90/wgmma.cuh"
#include "cuda/scratch_pool.h"

namespace sparge::cuda::attn::sm90 {

// BLKK_ is the key block of the LUT (and of causal/visibility bookkeeping); a pipeline stage holds
// one key tile of kTileK keys. PAIR_ (BLKK_ 64 only): a tile is two LUT blocks,
// any two entries of the row (consecutive in LUT order, not necessarily adjacent keys), loaded as
// two TMA boxes into the two 64-row halves of one 128-key stage and computed by the 128-key
// wgmmas; an odd count ends with a half tile (second half masked, PV over the first 64 keys).
// FP8_: the fp8 recipe (docs/quantized.md): Q, K (rows of 128 bytes at head dim 128) and V^T in
// e4m3, both GEMMs with k = 32; T_ is then the output dtype only.
template <class T_, int HD_, int BLKQ_, int BLKK_, bool PAIR_ = false, bool FP8_ = false>
struct Traits {
  using T = T_;
  static constexpr bool kFp8 = FP8_;
  using MmaT = std::conditional_t<FP8_, E4M3, T_>;  // the wgmma input type
  static constexpr int kElem = FP8_ ? 1 : 2;         // bytes per Q/K/V element in shared memory
  static_assert(!FP8_ || (HD_ == 128 && BLKQ_ == 128), "the fp8 kernel is head dim 128, BLKQ 128");
  static constexpr int kHeadDim = HD_;
  static constexpr int kBlockQ = BLKQ_;
  static constexpr int kBlockK = BLKK_;              // keys of one LUT block
  static constexpr bool kPair = PAIR_;
  // The dense-only tile (sm90::dense_tile: 176 keys at head dim 128): never given a LUT or
  // pv_threshold, so those paths are not compiled into it.
  static constexpr bool kDenseOnly = BLKK_ % 64 != 0;
  static_assert(!kDenseOnly || (!PAIR_ && !FP8_ && BLKK_ % 16 == 0), "dense-only tiles: whole 16-key PV k-steps");
  // Kernels with the split tail (work_at; the launches that may be persistent, fp16 / bf16 only: the fp8
  // epilogue's scales would have to follow the chunks into the combine).
  static constexpr bool kSplit = !FP8_ && BLKQ_ >= 128;
  static constexpr int kTileK = PAIR_ ? 2 * BLKK_ : BLKK_;  // keys of one stage (the wgmma N of QK^T)
  static_assert(!PAIR_ || BLKK_ == 64, "pairing joins two 64-key LUT blocks into one 128-key tile");
  static constexpr int kConsumers = consumer_warpgroups(BLKQ_);
  static constexpr int kThreads = threads_per_cta(BLKQ_);
  static constexpr int kMinBlocks = ctas_per_sm(BLKQ_);
  static constexpr int kStages = stages(HD_, BLKQ_, kTileK, kElem);
  // A second Q buffer (kVariantQDouble) where it fits beside the same K/V stages.
  static constexpr int kQBufs =
      smem_bytes(HD_, BLKQ_, kTileK, kElem) + q_bytes(HD_, BLKQ_, kElem) <= smem_budget(BLKQ_) ? 2 : 1;
  static constexpr int kSmemBytes = smem_bytes(HD_, BLKQ_, kTileK, kElem) + (kQBufs - 1) * q_bytes(HD_, BLKQ_, kElem);
  static constexpr int kSlabs = HD_ * kElem / 128;   // 128-byte column slabs per row
  static constexpr int kQSlab = BLKQ_ * 128;         // bytes of one slab of the Q tile
  static constexpr int kKVSlab = kTileK * 128;       // bytes of one slab of a K or V stage
  static constexpr int kBlockSlab = BLKK_ * 128;     // bytes of one LUT block within a slab
  static constexpr int kQBytes = q_bytes(HD_, BLKQ_, kElem);
  static constexpr int kKVBytes = kv_bytes(HD_, kTileK, kElem);
  static constexpr int kBlockBytes = kv_bytes(HD_, BLKK_, kElem);  // one LUT block of K (or V), all slabs
  // fp8: a V stage is V^T in sub-tiles of HD rows x 64 keys (64 bytes per row, 64-byte swizzle).
  static constexpr int kVSub = HD_ * 64;
  // Register tiles of one consumer warp (as in the portable kernel's Traits).
  static constexpr int kDTiles = HD_ / 8;
  static constexpr int kKTiles = kTileK / 8;
  static constexpr int kBlockKTiles = PAIR_ ? BLKK_ / 8 : kKTiles;  // score tiles of the first block
  static constexpr int kDSteps = HD_ * kElem / 32;          // k-steps of QK^T (32 bytes of a row each)
  static constexpr int kKSteps = kTileK / (FP8_ ? 32 : 16);  // k-steps of PV (keys)
  // setmaxnreg budgets: the CTA's registers are threads * (65536 / (threads * CTAs per SM)),
  // rounded down to 8; the producer keeps 24 and the consumers share the rest.
  static constexpr int kProducerRegs = 24;
  static constexpr int kLaunchRegs = (65536 / (kThreads * kMinBlocks)) / 8 * 8;
  static constexpr int kConsumerRegs =
      ((kLaunchRegs * kThreads - kProducerRegs * 128) / (128 * kConsumers)) / 8 * 8 > 240
          ? 240
          : ((kLaunchRegs * kThreads - kProducerRegs * 128) / (128 * kConsumers)) / 8 * 8;
  static_assert(kStages >= 1 && kSmemBytes <= smem_budget(BLKQ_), "shared-memory plan does not fit");
  // Kernels the launcher may run in clusters of 2 with K/V multicast (kVariantClusterKV: BLKQ 128,
  // head dim 128, unpaired tiles; dense only); every other kernel drops the run-time multicast checks.
  static constexpr bool kMayMulticast = !PAIR_ && BLKQ_ == 128 && HD_ == 128 && !FP8_;
  // Score tiles of a 64-key half of the stage (fp8: the halves may carry different K scales).
  static constexpr int kHalfTiles = 8;
  // dev/sm90_trace derives a Traits with kTrace = true: per-tile clock stamps (trace_mark).
  static constexpr bool kTrace = false;
  // dev/sm90_trace mode 1: also stamps inside the key-tile loop (16 more registers per consumer thread).
  static constexpr bool kTraceLoop = false;
  // softmax_step (fp16 / bf16, no pv_threshold): the second row's max reduction made to wait for the first
  // row's first exponential, so ptxas places it among the first row's MUFU.EX2 (which issue every 8 cycles)
  // instead of before them. Trace harness (its mode bit 1 flips this), alternating A/B: LUT 128 x 128 at density
  // 0.4 -3.1% (s22r1), 1.2-1.5% in s20r11; the dense-only 176-key tile -0.4% (s22r1, s22r2: five pairs, every one
  // faster), although ptxas gives that consumer a 40-byte stack with it. false restores the former schedule.
  static constexpr bool kRowStagger = true;
  // Q of the tile in registers (ldmatrix once per tile) and QK^T with A from registers, instead of every
  // QK^T reading Q from shared memory; the Q buffer is then released as soon as the fragments are loaded.
  // The H200 runs these kernels at its 700 W cap (SM clock ~1.63 GHz in back-to-back launches), so shared-memory
  // operand bytes cost time: trace harness, back to back, alternating (s23r3), LUT 128 x 128 -1.6% / -1.4% /
  // -1.3% at density 1.0 / 0.4 / 0.1, bitwise the same O. fp16 / bf16 head dim 128, BLKQ 128 and 128-key stages
  // (the 128 x 128 and the paired 128 x 64 LUT kernels: Wgmma<T, 128>::rs_kmajor); not the dense-only tiles.
  static constexpr bool kQRegs = !FP8_ && HD_ == 128 && BLKQ_ == 128 && kTileK == 128;
  // The V-staged epilogue (session 26, Consumer::v_staged): O goes out through the tile's last V stage with TMA
  // stores instead of from registers. The kernels with Q in registers (their one Q buffer is refilled early, so
  // it cannot hold O). dev/sm90_trace measured the register epilogue at ~2000 cycles of a ~42000-cycle query tile
  // at density 0.1, and the tile 4% faster back to back without any O stores (SPARGE_TRACE_NOEPI).
  static constexpr bool kVStaged = kQRegs;
};

// Per-tile event stamps of dev/sm90_trace (Traits::kTrace; no other kernel compiles any of this):
// P.trace[((cta * 3 + role) * kTraceTiles + nt) * kTraceEvents + ev] = clock64() (or `value`), where
// role 0 is the producer, 1 + cw a consumer warpgroup (its first thread), nt the CTA's tile count.
constexpr int kTraceTiles = 96;
constexpr int kTraceLoopFirst = 10;  // events 0..9 per tile, then kTraceLoopEvents inside key tile kTraceKeyTile
constexpr int kTraceLoopEvents = 8;   // of the loop (Traits::kTraceLoop)
constexpr int kTraceEvents = kTraceLoopFirst + kTraceLoopEvents;
constexpr std::uint32_t kTraceKeyTile = 3;
template <class Tr>
__device__ __forceinline__ void trace_mark(const Sm90Params& P, int role, std::uint32_t nt, int ev,
                                           long long value = -1) {
  if constexpr (Tr::kTrace) {
    if (P.trace != nullptr && (threadIdx.x & 127) == 0 && nt < static_cast<std::uint32_t>(kTraceTiles)) {
      P.trace[((static_cast<long long>(blockIdx.x) * 3 + role) * kTraceTiles + nt) * kTraceEvents + ev] =
          value < 0 ? static_cast<long long>(clock64()) : value;
    }
  } else {
    (void)P, (void)role, (void)nt, (void)ev, (void)value;
  }
}

// The consumers' walk of the key blocks a query block visits, one warp together: the sequence of
// the producer's BlockIter (block_iter.cuh: the LUT row in its order without entries outside
// [0, visible), or every visible block when dense). Lane i holds entry base + i of the LUT row (the next chunk of 32 is loaded one refill early), a ballot marks the chunk's entries in
// [0, visible), and each call hands out the lowest one not yet returned (__shfl_sync from its
// lane). Per block a few instructions instead of BlockIter's serial load-and-test per entry; the
// order is the same (chunks ascending, lanes ascending within a chunk), so the producer's
// BlockIter and every consumer warp agree on the tiles. All lanes of the warp must call next().
struct WarpWalk {
  const std::int32_t* row = nullptr;  // nullptr: dense
  std::int64_t stride = 1;
  int n = 0;              // LUT: entries (clamped count); dense: visible blocks
  int base = 0;           // LUT: first entry of the current chunk; dense: the next block
  int mine = -1;          // LUT: entry base + lane, -1 past n
  int mine_next = -1;     // LUT: entry base + 32 + lane, -1 past n
  std::uint32_t pending = 0;  // LUT: lanes whose entries are visible and not yet returned
  std::uint32_t visible = 0;
  int lane = 0;

  __device__ __forceinline__ int load(int i) const { return i < n ? __ldg(row + i * stride) : -1; }
  // The chunk at base is in `mine`: mark its visible entries, prefetch the chunk after it.
  __device__ __forceinline__ void fill() {
    pending = __ballot_sync(0xffffffffu, static_cast<std::uint32_t>(mine) < visible);
    mine_next = load(base + 32 + lane);
  }
  __device__ __forceinline__ int next() {
    if (row == nullptr) return base < n ? base++ : -1;
    while (pending == 0) {
      if (base + 32 >= n) return -1;
      base += 32;
      mine = mine_next;
      fill();
    }
    const int src = __ffs(static_cast<int>(pending)) - 1;
    pending &= pending - 1;
    return __shfl_sync(0xffffffffu, mine, src);
  }
};

// The key blocks of one pipeline tile: kb[0] always >= 0 while tiles remain, kb[1] the second
// block of a paired tile or -1 (unpaired kernel, or the odd last block of a row).
struct KeyTile {
  int kb[2];
};
// Fetches the next tile from a walk of the block sequence (the producer's BlockIter and every
// consumer warp's WarpWalk return the same blocks, so all agree on the pairs). kb[0] < 0: no tile
// left.
template <class Tr, class Walk>
__device__ __forceinline__ KeyTile next_tile(Walk& it) {
  KeyTile kt;
  kt.kb[0] = it.next();
  kt.kb[1] = Tr::kPair && kt.kb[0] >= 0 ? it.next() : -1;
  return kt;
}

// Shared memory: [Q slabs][second Q buffer (kQBufs 2)][K stage 0..S-1][V stage 0..S-1][barriers],
// tiles 1024-byte aligned. Barriers: Q full / empty of buffer 0 at 0 / 1 + 4S, of buffer 1 at
// 2 + 4S / 3 + 4S (initialized when kQBufs is 2), the K/V stages' in between.
template <class Tr>
struct Smem {
  unsigned char* base;
  static constexpr int kQAll = Tr::kQBufs * Tr::kQBytes;
  __device__ __forceinline__ std::uint32_t q(int b = 0) const { return smem_addr(base) + b * Tr::kQBytes; }
  __device__ __forceinline__ std::uint32_t k(int s) const { return q() + kQAll + s * Tr::kKVBytes; }
  __device__ __forceinline__ std::uint32_t v(int s) const { return q() + kQAll + (Tr::kStages + s) * Tr::kKVBytes; }
  __device__ __forceinline__ void* ptr(std::uint32_t addr) const { return base + (addr - q()); }
  __device__ __forceinline__ std::uint64_t* bars() const {
    return reinterpret_cast<std::uint64_t*>(base + kQAll + 2 * Tr::kStages * Tr::kKVBytes);
  }
  __device__ __forceinline__ std::uint64_t* q_full(int b = 0) const { return bars() + (b == 0 ? 0 : 2 + 4 * Tr::kStages); }
  __device__ __forceinline__ std::uint64_t* k_full(int s) const { return bars() + 1 + s; }
  __device__ __forceinline__ std::uint64_t* v_full(int s) const { return bars() + 1 + Tr::kStages + s; }
  __device__ __forceinline__ std::uint64_t* k_empty(int s) const { return bars() + 1 + 2 * Tr::kStages + s; }
  __device__ __forceinline__ std::uint64_t* v_empty(int s) const { return bars() + 1 + 3 * Tr::kStages + s; }
  // Q may be overwritten (the next tile of a persistent CTA): every consumer warp arrives once all
  // QK^T of its tile have completed.
  __device__ __forceinline__ std::uint64_t* q_empty(int b = 0) const {
    return bars() + (b == 0 ? 1 + 4 * Tr::kStages : 3 + 4 * Tr::kStages);
  }
  // Varlen (producer only): the V loads of a block crossing its sequence's end complete here, and the
  // word after it counts those uses (its phase); once they have landed the producer copies zeros over
  // the rows past the end, and those copies complete the stage's "full" barrier (varlen_fix_v).
  __device__ __forceinline__ std::uint64_t* v_fix() const { return bars() + 4 + 4 * Tr::kStages; }
  __device__ __forceinline__ std::uint32_t* v_fix_uses() const {
    return reinterpret_cast<std::uint32_t*>(bars() + 5 + 4 * Tr::kStages);
  }
  // pv_threshold vote ring (BLKQ 128): kVoteRing tagged words per consumer warp (8 warps), after the
  // barriers (within kSmemSlack, asserted below).
  static constexpr int kVoteWarps = Tr::kConsumers == 2 ? 8 : 0;  // BLKQ 64 votes through a barrier
  static constexpr std::uint32_t kVoteRing = 8;  // >= stages + 1 (docs/attention_sm90.md: why it is never overrun)
  // The first word of warp w's ring (w = 4 * consumer warpgroup + warp); slot seq is 4 * (seq % kVoteRing) further.
  __device__ __forceinline__ std::uint32_t vote_row(int w) const {
    return smem_addr(bars() + 6 + 4 * Tr::kStages) + 4u * kVoteRing * static_cast<std::uint32_t>(w);
  }
  static __device__ __forceinline__ std::uint32_t vote_slot(std::uint32_t row, std::uint32_t seq) {
    return row + 4u * (seq % kVoteRing);
  }
  static_assert(kVoteRing >= Tr::kStages + 1, "the vote ring must outlast the K/V stage ring");
  static_assert(1024 + 8 * (6 + 4 * Tr::kStages) + 4 * kVoteRing * kVoteWarps <= kSmemSlack,
                "barriers and vote ring exceed the shared-memory slack");
};

// Position in the ring of K/V stages, carried across the tiles of a persistent CTA: stage use u
// is stage u % S, phase (u / S) & 1 (pipeline.cuh: "full" waits for the phase, "empty" for its
// complement).
template <class Tr>
struct Ring {
  int st = 0;
  std::uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++st == Tr::kStages) {
      st = 0;
      phase ^= 1;
    }
  }
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
  if (p.cu_seqlens_q != nullptr) {  // varlen: sequence t.b owns rows [begin, end) of the packed tensors
    t.q_begin = __ldg(p.cu_seqlens_q + t.b);
    t.k_begin = __ldg(p.cu_seqlens_k + t.b);
    t.sq = max(0, min(__ldg(p.cu_seqlens_q + t.b + 1) - t.q_begin, p.seq_q));
    t.sk = max(0, min(__ldg(p.cu_seqlens_k + t.b + 1) - t.k_begin, p.seq_k));
    t.b_dim0 = 0;
  }
  t.q0 = t.qb * blkq;
  t.hk = t.h / (p.hq / p.hk);
  return t;
}

__device__ __forceinline__ const std::int32_t* lut_count_ptr(const KernelParams& p, const Tile& t) {
  return p.counts + t.b * p.counts_stride[0] + t.h * p.counts_stride[1] + t.qb * p.counts_stride[2];
}
// A LUT row's count as the kernel uses it: clamped into [0, nk_lut].
__device__ __forceinline__ int clamp_count(const KernelParams& p, int count) {
  return count < 0 ? 0 : (count > p.nk_lut ? p.nk_lut : count);
}
__device__ __forceinline__ int lut_count(const KernelParams& p, const Tile& t) {
  return clamp_count(p, *lut_count_ptr(p, t));
}
__device__ __forceinline__ const std::int32_t* lut_row(const KernelParams& p, const Tile& t) {
  return p.lut + t.b * p.lut_stride[0] + t.h * p.lut_stride[1] + t.qb * p.lut_stride[2];
}
__device__ __forceinline__ WarpWalk make_warp_walk(const KernelParams& p, const Tile& t, int visible, int lane) {
  WarpWalk it;
  it.visible = static_cast<std::uint32_t>(visible < 0 ? 0 : visible);
  it.lane = lane;
  if (p.lut == nullptr) {
    it.n = visible;
    return it;
  }
  it.row = lut_row(p, t);
  it.stride = p.lut_stride[3];
  it.n = lut_count(p, t);
  it.mine = it.load(lane);
  it.fill();
  return it;
}
// A consumer's look-ahead of its next tile (kernel loop): the slot it holds (-1: none) and that tile's
// LUT count and first two chunks of entries as loaded (raw, entries read up to nk_lut), issued while
// the current tile's last PV and epilogue run. dev/sm90_trace measured the chain of dependent loads
// at every tile start (order -> LUT count -> entries) at ~2000 cycles per tile before.
struct Ahead {
  int slot = -1, tile = 0, count = 0, e0 = -1, e1 = -1;
};
__device__ __forceinline__ void load_ahead(const KernelParams& p, Ahead& a, int slot, int tile, int blkq, int lane) {
  a.slot = -1;
  if (tile < 0) return;
  const Tile t = make_tile(p, tile, blkq);
  if (t.q0 >= t.sq) return;  // skipped by the loop: its own path
  a.slot = slot;
  a.tile = tile;
  if (p.lut == nullptr) return;
  const std::int32_t* row = lut_row(p, t);
  a.count = *lut_count_ptr(p, t);
  a.e0 = lane < p.nk_lut ? __ldg(row + lane * p.lut_stride[3]) : -1;
  a.e1 = 32 + lane < p.nk_lut ? __ldg(row + (32 + lane) * p.lut_stride[3]) : -1;
}
// make_warp_walk from a look-ahead's values: the same walk (entries past the clamped count read -1).
__device__ __forceinline__ WarpWalk make_warp_walk(const KernelParams& p, const Tile& t, int visible, int lane,
                                                   const Ahead& a) {
  if (p.lut == nullptr) return make_warp_walk(p, t, visible, lane);
  WarpWalk it;
  it.visible = static_cast<std::uint32_t>(visible < 0 ? 0 : visible);
  it.lane = lane;
  it.row = lut_row(p, t);
  it.stride = p.lut_stride[3];
  it.n = clamp_count(p, __shfl_sync(0xffffffffu, a.count, 0));  // uniform (one address), provably so for ptxas
  it.mine = lane < it.n ? a.e0 : -1;
  it.pending = __ballot_sync(0xffffffffu, static_cast<std::uint32_t>(it.mine) < it.visible);
  it.mine_next = 32 + lane < it.n ? a.e1 : -1;
  return it;
}
// The producer's walk: the portable kernel's iterator over the same row and clamped count.
__device__ __forceinline__ BlockIter make_iter(const KernelParams& p, const Tile& t, int visible) {
  if (p.lut == nullptr) return make_dense_iter(visible);
  return make_lut_iter(lut_row(p, t), p.lut_stride[3], lut_count(p, t), p.nk_lut, visible);
}

// One K or V slab box of a tile: into this CTA's stage, or (multicast, kVariantClusterKV) only the
// slab whose index is this CTA's rank in its cluster of 2, written to the same offset of both CTAs'
// shared memory and completing bytes on the same barrier offset in both.
// The flag and the rank are read at each use (kernel parameter, special register): the producer
// has 24 registers, and keeping them live across its loop made ptxas spill.
template <class Tr>
__device__ __forceinline__ void load_kv_slab(const Sm90Params& P, void* dst, const CUtensorMap* map, int s, int row,
                                             const Tile& t, std::uint64_t* full) {
  if (!Tr::kMayMulticast || P.multicast == 0) {
    tma_load_4d(dst, map, s * 64, t.k_begin + row, t.hk, t.b_dim0, full);
  } else if (static_cast<std::uint32_t>(s) == cluster_rank()) {
    tma_load_4d_multicast(dst, map, s * 64, t.k_begin + row, t.hk, t.b_dim0, full, 0x3);
  }
}

// The Q buffer and its phase parity for a CTA's nt-th tile: one buffer whose phase flips every tile,
// or (kVariantQDouble) two used in turn, each flipping every other tile. The producer and the
// consumers must agree: both take it from here.
struct QSlot {
  int buf;
  std::uint32_t phase;
};
__device__ __forceinline__ QSlot q_slot(std::uint32_t nt, bool dbl) {
  return dbl ? QSlot{static_cast<int>(nt & 1u), (nt >> 1) & 1u} : QSlot{0, nt & 1u};
}

// Zeros that the varlen V fix copies over the rows past a sequence's end (the widest key tile, 176
// rows of 128 bytes; zero-initialized device memory of the module, never written).
static __device__ __align__(128) std::uint8_t kVarlenZeros[176 * 128];

// Varlen, after the V loads of stage st went to v_fix (producer()): waits for them (one TMA latency,
// once per query tile and sequence end), then completes the stage's "full" barrier with bulk copies of
// zeros over the rows of each block at or past the sequence's end (t.sk), in every slab (a row is 128
// contiguous bytes of a slab whatever the swizzle). Both writes are async-proxy copies ordered by the
// wait, and the consumers' wait on "full" sees both (the producer acquired v_fix before its arrive).
template <class Tr>
__device__ __forceinline__ void varlen_fix_v(const Smem<Tr>& sm, int st, const Tile& t, const KeyTile& kt) {
  static_assert(Tr::kBlockK * 128 <= static_cast<int>(sizeof(kVarlenZeros)), "the zero rows must cover a block");
  std::uint32_t* uses = sm.v_fix_uses();
  barrier_wait(sm.v_fix(), *uses & 1u);
  ++*uses;
  std::uint32_t bytes = 0;
  for (int h = 0; h < 2; ++h) {
    if (kt.kb[h] < 0) break;
    const int r0 = max(0, t.sk - kt.kb[h] * Tr::kBlockK);  // first row past the end
    if (r0 < Tr::kBlockK) bytes += static_cast<std::uint32_t>(Tr::kSlabs * (Tr::kBlockK - r0) * 128);
  }
  barrier_expect_bytes(sm.v_full(st), bytes);
  for (int h = 0; h < 2; ++h) {
    if (kt.kb[h] < 0) break;
    const int r0 = max(0, t.sk - kt.kb[h] * Tr::kBlockK);
    if (r0 >= Tr::kBlockK) continue;
    for (int s = 0; s < Tr::kSlabs; ++s) {
      ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global,
                         sm.ptr(sm.v(st) + s * Tr::kKVSlab + h * Tr::kBlockSlab + 128 * r0), kVarlenZeros,
                         static_cast<std::uint32_t>((Tr::kBlockK - r0) * 128), sm.v_full(st));
    }
  }
}

// One tile's loads: Q into buffer qb (once the consumers of the tile that used it before released it:
// q_phase is the parity of that buffer's uses), then the K and V tiles in the ring. Multicast: clusters of 2 CTAs (dense, same
// keys for both), each loading one of the two slabs of every K/V tile for both; the "full" barrier
// still expects the whole tile (half from each CTA's TMA), the "empty" barrier counts the consumer
// warps of both CTAs.
template <class Tr>
__device__ __forceinline__ void producer(const Sm90Params& P, const Smem<Tr>& sm, const Tile& t, BlockIter it,
                                         std::uint32_t q_phase, int qb, Ring<Tr>& ring, std::uint32_t trace_nt = 0) {
  const auto load_q = [&]() {
    barrier_wait(sm.q_empty(qb), q_phase ^ 1);
    barrier_expect_bytes(sm.q_full(qb), Tr::kQBytes);
#pragma unroll
    for (int s = 0; s < Tr::kSlabs; ++s) {
      tma_load_4d(sm.ptr(sm.q(qb) + s * Tr::kQSlab), &P.q_map, s * 64, t.q_begin + t.q0, t.h, t.b_dim0, sm.q_full(qb));
    }
    trace_mark<Tr>(P, 0, trace_nt, 1);
  };
  // kVariantEarlyNext: the first K/V stage goes out before the wait for the Q buffer (which the
  // previous tile's consumers release only after their last QK^T). No deadlock: that stage is
  // freed by the previous tile's consumers alone, as the Q buffer is.
  bool q_pending = (P.variant & kVariantEarlyNext) != 0, first = true;
  [[maybe_unused]] bool traced_first = false;
  if (!q_pending) load_q();
  for (;; ring.advance()) {
    if (q_pending && !first) {  // after the first key tile's loads
      load_q();
      q_pending = false;
    }
    first = false;
    const KeyTile kt = next_tile<Tr>(it);
    if (kt.kb[0] < 0) break;
    const int st = ring.st;
    const std::uint32_t parity = ring.phase ^ 1;
    const int blocks = kt.kb[1] >= 0 ? 2 : 1;
    barrier_wait(sm.k_empty(st), parity);
    barrier_expect_bytes(sm.k_full(st), blocks * Tr::kBlockBytes);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (h == 1 && blocks == 1) break;
#pragma unroll
      for (int s = 0; s < Tr::kSlabs; ++s) {
        load_kv_slab<Tr>(P, sm.ptr(sm.k(st) + s * Tr::kKVSlab + h * Tr::kBlockSlab), &P.k_map, s,
                         kt.kb[h] * Tr::kBlockK, t, sm.k_full(st));
      }
    }
    barrier_wait(sm.v_empty(st), parity);
    // Varlen: one tensor map spans the packed sequences, so a block crossing its sequence's end
    // brings the next sequence's first rows. Their scores are masked (P = 0), but 0 * Inf is NaN:
    // such V loads complete on v_fix, and the producer then copies zeros over the rows past the end
    // (the portable kernel's zero fill), completing the stage's "full" barrier (varlen_fix_v).
    std::uint64_t* v_bar = sm.v_full(st);
    if constexpr (!Tr::kFp8) {
      if (P.p.cu_seqlens_q != nullptr &&
          ((kt.kb[0] + 1) * Tr::kBlockK > t.sk || (blocks == 2 && (kt.kb[1] + 1) * Tr::kBlockK > t.sk))) {
        v_bar = sm.v_fix();
      }
    }
    barrier_expect_bytes(v_bar, blocks * Tr::kBlockBytes);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (h == 1 && blocks == 1) break;
      if constexpr (Tr::kFp8) {
        // V^T: the block's keys in 64-key sub-tiles (columns of v8t), sub-tile h * (BLKK / 64) + c.
#pragma unroll
        for (int c = 0; c < Tr::kBlockK / 64; ++c) {
          tma_load_4d(sm.ptr(sm.v(st) + (h * (Tr::kBlockK / 64) + c) * Tr::kVSub), &P.v_map,
                      kt.kb[h] * Tr::kBlockK + 64 * c, 0, t.hk, t.b_dim0, sm.v_full(st));
        }
      } else {
#pragma unroll
        for (int s = 0; s < Tr::kSlabs; ++s) {
          load_kv_slab<Tr>(P, sm.ptr(sm.v(st) + s * Tr::kKVSlab + h * Tr::kBlockSlab), &P.v_map, s,
                           kt.kb[h] * Tr::kBlockK, t, v_bar);
        }
      }
    }
    if constexpr (!Tr::kFp8) {
      if (v_bar != sm.v_full(st)) varlen_fix_v<Tr>(sm, st, t, kt);
    }
    if constexpr (Tr::kTrace) {
      if (!traced_first) trace_mark<Tr>(P, 0, trace_nt, 2);
      traced_first = true;
    }
  }
  if (q_pending) load_q();  // a tile without key tiles: its consumers still take and release Q
  trace_mark<Tr>(P, 0, trace_nt, 3);
}

// Named barrier ids: 0 is __syncthreads, 1 the legacy pv_threshold vote (all consumer threads),
// 2 + w warpgroup w's pingpong turn, 4 the pv_threshold vote of BLKQ 64 (its one consumer warpgroup).
constexpr int kVoteBarrier = 1;
constexpr int kTurnBarrier = 2;
constexpr int kOwnVoteBarrier = 4;
constexpr int kEpilogueBarrier = 8;  // + consumer warpgroup: the staged epilogue's barrier of its 128 threads
// + consumer warpgroup: the V-staged epilogue's "the other warpgroup's last PV has read the stage" (the other
// warpgroup arrives, this one syncs; 256 threads).
constexpr int kVDoneBarrier = 5;

// pv_threshold modes of the mainloop: off; per warp (each consumer warp votes on its own 16 rows
// and publishes a tagged word; a warp reads the other warps' words only when its own rows all say
// "skip"); legacy (kVariantLegacyPv: one bar.red.and of all consumer threads per tile, unpaired).
constexpr int kVoteOff = 0;
constexpr int kVoteWarp = 1;
constexpr int kVoteLegacy = 2;
// A vote word: the tile's sequence number (30 bits, the CTA's count of key tiles so far) above
// the two skip bits (bit 0: the tile's first LUT block, bit 1: its second, paired tiles only).
__device__ __forceinline__ std::uint32_t vote_word(std::uint32_t seq, int bits) {
  return (seq << 2) | static_cast<std::uint32_t>(bits);
}

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
  float pv_thr[2];  // the head's pv_threshold for a row of the sequence, -inf (always passes) for one past it
  int mask_from;  // key blocks kb >= mask_from need the token mask (softmax_step)
  std::uint32_t q_tile;
  int qb;  // the Q buffer of this tile (0 unless kVariantQDouble)
  std::uint32_t my_votes;  // this warp's pv_threshold vote ring (Smem::vote_row)
  std::uint32_t trace_nt = 0;  // the CTA's tile count (trace_mark; Traits::kTrace only)

  float o[Tr::kDTiles][4];
  float s[Tr::kKTiles][4];
  std::uint32_t qa[Tr::kQRegs ? Tr::kDSteps : 1][4];  // Q's A fragments per k-step (Traits::kQRegs)
  std::uint32_t pa[Tr::kKSteps][4];  // P of the previous block, the A operand of its PV
  float m[2];  // running max of the two rows (log2 units), -inf before the first key
  float l[2];  // this thread's partial denominators (the quad's are summed in the epilogue)
  // fp8: scale * log2(e) * the row's Q dequantization scale (the K block's is applied per tile).
  float row_scale[2];

  __device__ __forceinline__ Consumer(const KernelParams& p_, const Smem<Tr>& sm_, const Tile& t_, int cw_, int tid,
                                      const Sm90Params& P_, int qb_)
      : p(p_), sm(sm_), t(t_), cw(cw_), warp(tid / 32), lane(tid % 32),
        pingpong(Tr::kConsumers == 2 && (P_.variant & kVariantNoPingpong) == 0), P(P_) {
    const int wg_row0 = t.q0 + cw * 64;  // first query row of this warpgroup
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_in_seq[r] = wg_row0 + warp * 16 + (lane >> 2) + 8 * r;
      const long long causal_bound = static_cast<long long>(row_in_seq[r]) + t.sk - t.sq;
      key_limit[r] = p.is_causal && causal_bound < t.sk - 1 ? static_cast<int>(causal_bound < -1 ? -1 : causal_bound)
                                                            : t.sk - 1;
    }
    const float thr = p.pv_threshold_per_head != nullptr ? p.pv_threshold_per_head[t.h] : p.pv_threshold;
#pragma unroll
    for (int r = 0; r < 2; ++r) pv_thr[r] = row_in_seq[r] < t.sq ? thr : -INFINITY;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_scale[r] = p.scale_log2;
      if constexpr (Tr::kFp8) {
        if (row_in_seq[r] < t.sq) {
          row_scale[r] *= __ldg(P_.q_scale + (static_cast<std::int64_t>(t.b) * p.hq + t.h) * t.sq + row_in_seq[r]);
        }
      }
    }
    // A LUT block kb (keys kb * n .. kb * n + n - 1, n = kBlockK) crosses sk when kb * n + n > sk,
    // i.e. kb >= sk / n; it crosses the causal diagonal of this warpgroup's first row
    // (bound = wg_row0 + sk - sq) when kb * n + n - 1 > bound, i.e. kb * n > x = bound - n + 1:
    // every kb when x < 0, else kb >= x / n + 1. Both conditions are "kb >= threshold", so one
    // compare per block replaces the per-tile arithmetic (the same blocks are masked as before).
    {
      constexpr int n = Tr::kBlockK;
      long long from = t.sk / n;
      if (p.is_causal) {
        const long long x = static_cast<long long>(wg_row0) + t.sk - t.sq - n + 1;
        const long long from_causal = x < 0 ? 0 : x / n + 1;
        if (from_causal < from) from = from_causal;
      }
      mask_from = static_cast<int>(from);
    }
    qb = qb_;
    q_tile = sm.q(qb) + cw * 64 * 128;  // this warpgroup's 64 rows of each Q slab
    my_votes = sm.vote_row(cw * 4 + warp);
#pragma unroll
    for (int j = 0; j < Tr::kDTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
  }

  // Pingpong between the two consumer warpgroups (BLKQ 128), unless the variant bit turns it off
  // (a kernel parameter: uniform, the same for both warpgroups).
  bool pingpong;
  __device__ __forceinline__ void turn_begin() const {
    if (pingpong) named_barrier_sync(kTurnBarrier + cw, 256);
  }
  __device__ __forceinline__ void turn_end() const {
    if (pingpong) named_barrier_arrive(kTurnBarrier + (cw ^ 1), 256);
  }
  __device__ __forceinline__ void release(std::uint64_t* bar) const {
    __syncwarp();
    if (lane == 0) barrier_arrive(bar);
  }
  // A K or V stage: with multicast both CTAs' producers write it, so both must hear that this warp
  // has finished reading it (its wgmmas completed: waited before this call). The flag and the rank
  // are read where needed (kernel parameter, special register): registers are at their limit.
  const Sm90Params& P;
  __device__ __forceinline__ void release_kv(std::uint64_t* bar, bool arrive = true) const {
    __syncwarp();
    if (lane == 0 && arrive) {
      barrier_arrive(bar);
      if (Tr::kMayMulticast && P.multicast != 0) barrier_arrive_peer(bar, cluster_rank() ^ 1u);
    }
  }

  // Traits::kQRegs: this warp's 16 rows of Q as wgmma A fragments (ldmatrix x4 per 16-column k-step: rows
  // 0-7 / 8-15 by lane bit 3, columns 0-7 / 8-15 by lane bit 4; 128-byte swizzled slabs of 64 columns).
  __device__ __forceinline__ void load_q_regs() {
    if constexpr (Tr::kQRegs) {
      static_assert(!Tr::kFp8 && Tr::kTileK == 128 && Tr::kHeadDim == 128, "Q in registers: the 128 x 128 tile");
      const int row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int ks = 0; ks < Tr::kDSteps; ++ks) {
        const int chunk = 2 * (ks % 4) + (lane >> 4);
        ldmatrix_x4(qa[ks], q_tile + (ks / 4) * Tr::kQSlab + row * 128 + ((chunk ^ (row & 7)) << 4));
      }
    }
  }
  // Descriptors: a base per operand tile, plus each k-step's constant offset (wgmma.cuh, DescBase).
  __device__ __forceinline__ void issue_qk(int st) {
    if constexpr (Tr::kQRegs) {
      const DescBase kd = k_major_base(sm.k(st));
#pragma unroll
      for (int ks = 0; ks < Tr::kDSteps; ++ks) {
        Wgmma<T, Tr::kTileK>::rs_kmajor(s, qa[ks], kd.at(k_major_offset(Tr::kKVSlab, ks)), ks > 0);
      }
      wgmma_commit();
      return;
    }
    const DescBase qd = k_major_base(q_tile);
    const DescBase kd = k_major_base(sm.k(st));
#pragma unroll
    for (int ks = 0; ks < Tr::kDSteps; ++ks) {
      Wgmma<typename Tr::MmaT, Tr::kTileK>::ss(s, qd.at(k_major_offset(Tr::kQSlab, ks)),
                                               kd.at(k_major_offset(Tr::kKVSlab, ks)), ks > 0);
    }
    wgmma_commit();
  }
  // O += P_{i-1} V_{i-1} over the 16-key steps [kFrom, kTo) of the stage, one commit group.
  // fp8: V^T sub-tile kk / 2 (64 keys), its 32-byte k-step kk % 2.
  template <int kFrom, int kTo>
  __device__ __forceinline__ void issue_pv_steps(int st) {
    if constexpr (Tr::kFp8) {
      const DescBase vd = k_major_base_sw64(sm.v(st));
#pragma unroll
      for (int kk = kFrom; kk < kTo; ++kk) {
        Wgmma<E4M3, Tr::kHeadDim>::rs(o, pa[kk], vd.at((kk / 2) * Tr::kVSub + (kk % 2) * 32));
      }
    } else {
      const DescBase vd = mn_major_base(sm.v(st), Tr::kKVSlab);
#pragma unroll
      for (int kk = kFrom; kk < kTo; ++kk) {
        Wgmma<T, Tr::kHeadDim>::rs(o, pa[kk], vd.at(mn_major_offset(kk)));
      }
    }
    wgmma_commit();
  }
  // PV of the previous tile. skip: the query block's pv_threshold decision (bit 0: the tile's
  // first LUT block, bit 1: its second, paired tiles), uniform. A skipped PV commits an empty
  // group, so the wait counts are the same on every path (ptxas serializes every wgmma of the
  // kernel, C7514, when the waits differ between the paths). Paired kernel: a half tile (odd last
  // block) multiplies only the first 64 keys; its second half of V holds another tile's rows (or
  // never-written shared memory), which even P = 0 must not touch (0 * NaN); with pv_threshold a
  // skipped half is left out the same way (k-steps 0..3 are the first block's keys, 4..7 the
  // second's). Each path commits its own group: a commit after the join makes ptxas close the
  // group itself and add an empty group on both paths, so wait<1> would wait for the PV too.
  template <int kVote>
  __device__ __forceinline__ void issue_pv(int st, int skip, bool half) {
    constexpr int kAll = Tr::kKSteps, kHalf = Tr::kKSteps / 2;
    if constexpr (Tr::kPair && kVote == kVoteOff) {
      if (!half) {
        issue_pv_steps<0, kAll>(st);
      } else {
        issue_pv_steps<0, kHalf>(st);
      }
    } else if constexpr (Tr::kPair) {
      // A half tile's missing second block is left out as a skipped one is (bit 1). Tested in this
      // order, the common case (nothing left out) is one uniform compare and branch, no jump table.
      const int out = skip | (half ? 2 : 0);
      if (out == 0) {
        issue_pv_steps<0, kAll>(st);
      } else if (out == 2) {
        issue_pv_steps<0, kHalf>(st);
      } else if (out == 1) {
        issue_pv_steps<kHalf, kAll>(st);
      } else {
        wgmma_commit();
      }
    } else if constexpr (kVote != kVoteOff) {
      if (skip == 0) {
        issue_pv_steps<0, kAll>(st);
      } else {
        wgmma_commit();
      }
    } else {
      issue_pv_steps<0, kAll>(st);
    }
  }
  __device__ __forceinline__ void fence_p() {
#pragma unroll
    for (int kk = 0; kk < Tr::kKSteps; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(pa[kk][e])::"memory");
  }

  // Keys a row does not see (past sk, or in the causal future, or the missing second block of a
  // half tile: k0b = kNoKeys) become -inf; only tiles that need it call this. Score tiles
  // [0, kBlockKTiles) are keys k0a.., the rest (paired kernel) keys k0b...
  static constexpr int kNoKeys = 1 << 30;  // past every key_limit (sequences are < 2^30), no overflow
  __device__ __forceinline__ void mask_scores(int k0a, int k0b) {
    const int c = 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < Tr::kKTiles; ++j) {
      const int col0 = (j < Tr::kBlockKTiles ? k0a + j * 8 : k0b + (j - Tr::kBlockKTiles) * 8) + c;
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (col0 + (e & 1) > key_limit[e >> 1]) s[j][e] = -INFINITY;
    }
  }

  // Max of row r's raw scores over score tiles [j0, j1) of this thread, in two chains (half the
  // dependent FMNMX latency), each started from its first pair (not from -inf: one FMNMX less per
  // chain; the same max for every non-NaN score). kAfter: both chains start from x + dep, dep = +0 (so
  // only a -0 score becomes +0, which no max, P or sum can tell apart), there only to make ptxas wait for
  // whatever computes dep (Traits::kRowStagger).
  template <int j0, int j1, bool kAfter = false>
  __device__ __forceinline__ float raw_max(int r, float dep = 0.0f) const {
    static_assert(j1 - j0 >= 2 && (j1 - j0) % 2 == 0, "two chains of score tiles");
    float a0 = s[j0][2 * r], a1 = s[j0 + 1][2 * r];
    if constexpr (kAfter) {
      a0 += dep;
      a1 += dep;
    } else {
      (void)dep;
    }
    float x0 = fmaxf(a0, s[j0][2 * r + 1]);
    float x1 = fmaxf(a1, s[j0 + 1][2 * r + 1]);
#pragma unroll
    for (int j = j0 + 2; j < j1; j += 2) {
      x0 = fmaxf(x0, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
      x1 = fmaxf(x1, fmaxf(s[j + 1][2 * r], s[j + 1][2 * r + 1]));
    }
    return fmaxf(x0, x1);
  }

  // This warp's pv_threshold vote (kVoteWarp): ok0 / ok1 say whether this thread's rows allow
  // skipping the tile's first / second LUT block; bit b of the result says whether all 16 rows of
  // the warp do (__all_sync). Lane 0 publishes it as a tagged word in the warp's ring slot for seq
  // (one shared-memory atomic, no barrier: no warp waits here).
  // BLKQ 64 (one consumer warpgroup = the query block): the 4 warps' votes meet in one
  // barrier.red.popc on named barrier 4 (lane 0 contributes the first bit, lanes 1..8 the second:
  // popc = n0 + 8 * n1), whose result is the answer (decide() returns it). Reading the other warps'
  // words there instead made ptxas serialize the kernel's wgmmas (C7520): without a pingpong
  // barrier before the PV issue it does not see the spin's result as uniform.
  __device__ __forceinline__ int warp_vote(bool ok0, bool ok1, std::uint32_t seq) const {
    if constexpr (Tr::kConsumers == 1) {
      const bool a0 = __all_sync(0xffffffffu, ok0);
      const bool a1 = Tr::kPair && __all_sync(0xffffffffu, ok1);
      const bool pred = lane == 0 ? a0 : (lane <= 8 ? a1 : false);
      const std::uint32_t n = named_barrier_popc(kOwnVoteBarrier, 128, pred);
      (void)seq;
      return uniform(((n & 7u) == 4u ? 1 : 0) | ((n >> 3) == 4u ? 2 : 0));
    }
    int bits = __all_sync(0xffffffffu, ok0) ? 1 : 0;
    if constexpr (Tr::kPair) bits |= __all_sync(0xffffffffu, ok1) ? 2 : 0;
    bits = uniform(bits);
    if (lane == 0) shared_store_atomic(Smem<Tr>::vote_slot(my_votes, seq), vote_word(seq, bits));
    return bits;
  }
  // The query block's decision for the tile of sequence number seq, given this warp's own bits: a
  // block is skipped only when every row of the query block allows it, i.e. when every consumer
  // warp's bit is set. Own bits 0 (the common case): the answer is 0 without reading anything (a
  // uniform branch). Otherwise lane i < 8 reads the word of consumer warp i (its own included:
  // lane 0 of this warp wrote it; all at once), until every word carries seq's tag (the answer is
  // the AND of all bits) or the bits of the words already there make the AND 0. Every warp of the
  // CTA reaches the same answer (the AND of the same words, or 0 when its own bits already make it
  // 0), so the 4 warps of a warpgroup issue the same PV. Called outside any turn with no wgmma in
  // flight; every other warp publishes seq without anything more from this one
  // (docs/attention_sm90.md). Legacy mode and BLKQ 64: own is already the query block's bits.
  template <int kVote>
  __device__ __forceinline__ int decide(int own, std::uint32_t seq) const {
    if constexpr (kVote != kVoteWarp || Tr::kConsumers == 1) {
      return own;
    } else {
      if (own == 0) return 0;
      // The mutation hook (wrong on purpose): only the warps of this warpgroup (its own rows).
      const bool hook = (P.variant & kVariantTestOwnVote) != 0;
      const int w_first = hook ? cw * 4 : 0;
      const int n = hook ? 4 : Smem<Tr>::kVoteWarps;
      const std::uint32_t tag = seq & 0x3FFFFFFFu;
      const std::uint32_t addr = Smem<Tr>::vote_slot(sm.vote_row(w_first + (lane < n ? lane : 0)), seq);
      unsigned bits;
      for (;;) {
        // Lanes past the CTA's warps hold a word that is ready and allows both blocks.
        const std::uint32_t word = lane < n ? shared_load_atomic(addr) : (tag << 2) | 3u;
        const bool ready = (word >> 2) == tag;
        // Both reductions land in uniform registers (REDUX): a uniform loop exit.
        bits = __reduce_and_sync(0xffffffffu, ready ? (word & 3u) : 3u) & static_cast<unsigned>(own);
        const unsigned waiting = __reduce_or_sync(0xffffffffu, ready ? 0u : 1u);
        if (bits == 0 || waiting == 0) break;
      }
      return uniform(static_cast<int>(bits));
    }
  }

  // The probabilities of this thread's scores against the new running maxima m (m_old: before this
  // tile), P = 2^(s * scale(r, j) - m + kLog2P), their sums into l, and alpha = the factors O must be
  // rescaled by. A row with no visible key yet (m = -inf) uses 0 as its max (all its P are 0).
  // scale(r, j): the scale of row r's score tile j (compile-time j; a register per row or half).
  template <int kLog2P, class Scale>
  __device__ __forceinline__ void exponentiate_row(int r, const float (&m_old)[2], float (&alpha)[2], Scale scale) {
    const float m_use = m[r] == -INFINITY ? 0.0f : m[r];
    alpha[r] = ex2(m_old[r] - m_use);
    const float neg = kLog2P == 0 ? -m_use : static_cast<float>(kLog2P) - m_use;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int j = 0; j < Tr::kKTiles; ++j) {
      const float cj = scale(r, j);
      s[j][2 * r] = ex2(fmaf(s[j][2 * r], cj, neg));
      s[j][2 * r + 1] = ex2(fmaf(s[j][2 * r + 1], cj, neg));
      sum0 += s[j][2 * r];
      sum1 += s[j][2 * r + 1];
    }
    l[r] = l[r] * alpha[r] + (sum0 + sum1);
  }
  template <int kLog2P, class Scale>
  __device__ __forceinline__ void exponentiate(const float (&m_old)[2], float (&alpha)[2], Scale scale) {
#pragma unroll
    for (int r = 0; r < 2; ++r) exponentiate_row<kLog2P>(r, m_old, alpha, scale);
  }

  // Online softmax of the raw scores S_i (keys k0a.. and, paired, k0b..), the portable kernel's
  // arithmetic with the scale folded in: the row max is taken on raw scores and scaled once
  // (scale > 0, and rounding is monotonic, so this is the max of the scaled scores bit for bit),
  // and every probability is ex2(fma(s, scale*log2e, -max)): one FFMA + one MUFU per element.
  // Returns the pv_threshold vote (kVoteWarp: this warp's bits, published right after the row
  // maxima; kVoteLegacy: the query block's bit); alpha receives the factors O must be rescaled by.
  // Paired tiles: the LUT walk's running maxima are m0 = max(m, x0) after block 0 and m1 = max(m0,
  // x1) after block 1 (x0, x1 the halves' row maxima); block 0 is tested against m0, block 1
  // against m1, and the exponentials of both use m1 (= the tile's max). Each thread tests its own
  // partial maxima (its 16 scores of each half, no quad shuffles): the test (x - m) + thr <= 0 is
  // monotonic in x, so the quad agrees on a row exactly when the row's max passes, and the warp's
  // __all_sync covers the quad. Block 1 is tested against m1 = the new running max. Block 0 is
  // tested against the old max m instead of m0: when x0 <= m the two are equal; when x0 > m then
  // m0 = x0 and the row fails both ways (the thread holding x0 gets (x0 - x0) + thr = thr > 0
  // against m0 and (x0 - m) + thr > 0 against m), so the decisions are those of the definition.
  template <int kVote, bool kMask>
  __device__ __forceinline__ int softmax_step(int k0a, int k0b, float (&alpha)[2], std::uint32_t seq,
                                              const float (&ksc)[2]) {
    if constexpr (kMask) mask_scores(k0a, k0b);
    if constexpr (Tr::kFp8) {
      return softmax_step_fp8<kVote>(k0b, alpha, seq, ksc);
    } else {
      const float scale = p.scale_log2;
      const auto same_scale = [scale](int, int) { return scale; };
      constexpr bool kSplit = Tr::kPair && kVote == kVoteWarp;
      if constexpr (Tr::kRowStagger && kVote == kVoteOff) {
        float m_old[2] = {m[0], m[1]};
        m[0] = fmaxf(m[0], quad_max(raw_max<0, Tr::kKTiles>(0)) * scale);
        exponentiate_row<0>(0, m_old, alpha, same_scale);
        // Row 0's first probability is >= 0 or NaN; fminf with 0 gives +0 either way (a NaN row stays its own).
        const float dep = fminf(s[0][0], 0.0f);
        m[1] = fmaxf(m[1], quad_max(raw_max<0, Tr::kKTiles, true>(1, dep)) * scale);
        exponentiate_row<0>(1, m_old, alpha, same_scale);
        return 0;
      }
      float m_old[2];
      bool ok0 = true, ok1 = true;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        m_old[r] = m[r];
        if constexpr (kSplit) {
          const float t0 = raw_max<0, Tr::kBlockKTiles>(r);  // this thread's partial maxima (raw)
          const float t1 = raw_max<Tr::kBlockKTiles, Tr::kKTiles>(r);
          m[r] = fmaxf(m[r], quad_max(fmaxf(t0, t1)) * scale);
          // __fmul_rn: the scaled max, rounded as the old max-then-scale was (not contracted into
          // the test's subtraction), so the decisions are bitwise those of before.
          ok0 &= pv_skippable(__fmul_rn(t0, scale), m_old[r], pv_thr[r]);
          ok1 &= pv_skippable(__fmul_rn(t1, scale), m[r], pv_thr[r]);
        } else {
          const float x = quad_max(raw_max<0, Tr::kKTiles>(r)) * scale;
          m[r] = fmaxf(m[r], x);
          if constexpr (kVote != kVoteOff) ok0 &= pv_skippable(x, m[r], pv_thr[r]);
        }
      }
      int vote = 0;
      if constexpr (kVote == kVoteWarp) {
        if (!Tr::kPair || k0b == kNoKeys) ok1 = false;  // a half tile (or the unpaired kernel) has no second block
        vote = warp_vote(ok0, ok1, seq);
      }
      exponentiate<0>(m_old, alpha, same_scale);
      if constexpr (kVote == kVoteLegacy) {
        vote = uniform(named_barrier_and(kVoteBarrier, Tr::kConsumers * 128, ok0)) != 0 ? 1 : 0;
      }
      return vote;
    }
  }
  // Masked only where the tile needs it (a real branch: with the mask if-converted every block
  // pays two instructions per score). A half tile (kb[1] < 0 in the paired kernel) always does.
  template <int kVote>
  __device__ __forceinline__ int softmax_step(const KeyTile& kt, float (&alpha)[2], std::uint32_t seq,
                                              const float (&ksc)[2]) {
    const int k0a = kt.kb[0] * Tr::kBlockK;
    bool need_mask;
    int k0b = kNoKeys;
    // A LUT block needs the mask when it crosses sk or the causal diagonal of some row of this
    // warpgroup: kb >= mask_from (constructor).
    if constexpr (Tr::kPair) {
      if (kt.kb[1] >= 0) k0b = kt.kb[1] * Tr::kBlockK;
      need_mask = kt.kb[1] < 0 || max(kt.kb[0], kt.kb[1]) >= mask_from;
    } else {
      need_mask = kt.kb[0] >= mask_from;
    }
    if (uniform(need_mask)) return softmax_step<kVote, true>(k0a, k0b, alpha, seq, ksc);
    return softmax_step<kVote, false>(k0a, k0b, alpha, seq, ksc);
  }

  // The fp8 recipe's online softmax (already masked): logit = acc * row_scale * k_scale (log2 units),
  // the two 64-key halves of a 128-key tile scaled by their own LUT block's K scale (paired tiles;
  // one block of 128 keys has the same scale in both). Row maxima per half, scaled, then maxed
  // (each scale > 0, so this is the max of the scaled logits). P = 2^(logit - max + 8): the
  // largest probability is 256, well inside e4m3 (448), and probabilities down to 2^-17 of the max
  // stay normal e4m3 numbers; O and l carry the same factor 256, the LSE subtracts it
  // (store_rows_fp8). pv_threshold as softmax_step: per half against the old / new running max
  // (paired), or the tile's max against the new running max (one block per tile).
  template <int kVote>
  __device__ __forceinline__ int softmax_step_fp8(int k0b, float (&alpha)[2], std::uint32_t seq,
                                                  const float (&ksc)[2]) {
    constexpr bool kHalves = Tr::kKTiles > Tr::kHalfTiles;
    float c[2][2];
    float m_old[2];
    bool ok0 = true, ok1 = true;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      c[r][0] = row_scale[r] * ksc[0];
      c[r][1] = row_scale[r] * ksc[1];
      m_old[r] = m[r];
      if constexpr (kHalves) {
        const float x0 = raw_max<0, Tr::kHalfTiles>(r) * c[r][0];
        const float x1 = raw_max<Tr::kHalfTiles, Tr::kKTiles>(r) * c[r][1];
        m[r] = fmaxf(m[r], quad_max(fmaxf(x0, x1)));
        if constexpr (kVote != kVoteOff) {
          if constexpr (Tr::kPair) {
            ok0 &= pv_skippable(x0, m_old[r], pv_thr[r]);
            ok1 &= pv_skippable(x1, m[r], pv_thr[r]);
          } else {
            ok0 &= pv_skippable(fmaxf(x0, x1), m[r], pv_thr[r]);
          }
        }
      } else {
        const float x = raw_max<0, Tr::kKTiles>(r) * c[r][0];
        m[r] = fmaxf(m[r], quad_max(x));
        if constexpr (kVote != kVoteOff) ok0 &= pv_skippable(x, m[r], pv_thr[r]);
      }
    }
    int vote = 0;
    if constexpr (kVote == kVoteWarp) {
      if (!Tr::kPair || k0b == kNoKeys) ok1 = false;
      vote = warp_vote(ok0, ok1, seq);
    }
    exponentiate<8>(m_old, alpha, [&c](int r, int j) { return j < Tr::kHalfTiles ? c[r][0] : c[r][1]; });
    if constexpr (kVote == kVoteLegacy) {
      vote = uniform(named_barrier_and(kVoteBarrier, Tr::kConsumers * 128, ok0)) != 0 ? 1 : 0;
    }
    return vote;
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
    if constexpr (Tr::kFp8) {
      // 32 keys per k-step: score tiles 4 kk .. 4 kk + 3 (8 keys each). This thread holds keys 2 t,
      // 2 t + 1 of each; packed in tile order, its fragment's k = 4 t + i is key
      // 8 (i / 2) + 2 t + i % 2 (+ 16 for a[2], a[3]): the V^T columns are stored in that order
      // (quant_rule.h, v_key_perm), so no register moves are needed.
#pragma unroll
      for (int kk = 0; kk < Tr::kKSteps; ++kk) {
        pa[kk][0] = pack_e4m3x4(s[4 * kk][0], s[4 * kk][1], s[4 * kk + 1][0], s[4 * kk + 1][1]);
        pa[kk][1] = pack_e4m3x4(s[4 * kk][2], s[4 * kk][3], s[4 * kk + 1][2], s[4 * kk + 1][3]);
        pa[kk][2] = pack_e4m3x4(s[4 * kk + 2][0], s[4 * kk + 2][1], s[4 * kk + 3][0], s[4 * kk + 3][1]);
        pa[kk][3] = pack_e4m3x4(s[4 * kk + 2][2], s[4 * kk + 2][3], s[4 * kk + 3][2], s[4 * kk + 3][3]);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < Tr::kKSteps; ++kk) {
        pa[kk][0] = Elem<T>::pack(s[2 * kk][0], s[2 * kk][1]);
        pa[kk][1] = Elem<T>::pack(s[2 * kk][2], s[2 * kk][3]);
        pa[kk][2] = Elem<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[kk][3] = Elem<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      }
    }
  }

  // Values that are uniform across the warp but that ptxas cannot prove uniform (LUT entries, vote
  // results) are broadcast from lane 0: a wgmma under a branch ptxas considers divergent gets
  // serialized (ptxas C7520: a wait after every wgmma).
  static __device__ __forceinline__ int uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }
  // fp8: the K dequantization scales of the tile's LUT blocks (the second = the first when the tile
  // has one block); loaded when the tile is fetched, used after its QK^T. 1 otherwise (unused).
  __device__ __forceinline__ void k_scales(const KeyTile& kt, float (&ksc)[2]) const {
    if constexpr (Tr::kFp8) {
      const float* row = P.k_scale + (static_cast<std::int64_t>(t.b) * p.hk + t.hk) * P.nkb;
      ksc[0] = __ldg(row + kt.kb[0]);
      ksc[1] = kt.kb[1] >= 0 ? __ldg(row + kt.kb[1]) : ksc[0];
    } else {
      ksc[0] = ksc[1] = 1.0f;
    }
  }
  __device__ __forceinline__ KeyTile next_uniform_tile(WarpWalk& it) const {
    KeyTile kt = next_tile<Tr>(it);
    kt.kb[0] = uniform(kt.kb[0]);
    if constexpr (Tr::kPair) kt.kb[1] = uniform(kt.kb[1]);
    return kt;
  }

  // The staged epilogue (docs/attention_sm90.md, "Session 18"): O of Q's dtype through P.o_map, not
  // fp8 (its Q buffer is half the size), not a split-tail chunk, and under varlen only when the
  // warpgroup's 64 rows lie inside the sequence (the box would write the next sequence's rows; past
  // the end of a padded batch's sequence TMA clips). With one Q buffer only on request: the buffer is
  // released after the stores have read it, which then delays the next tile's Q load.
  __device__ __forceinline__ bool staged(int unit) const {
    if constexpr (Tr::kFp8) {
      (void)unit;
      return false;
    } else {
      if (P.o_tma == 0 || unit >= 0 || !staged_bits(P.variant)) return false;
      const bool dbl = Tr::kQBufs == 2 && (P.variant & kVariantQDouble) != 0;
      if (!dbl && (P.variant & kVariantStagedSingle) == 0) return false;
      return box_in_sequence();
    }
  }
  // The Q-staged epilogue: through this warpgroup's 64 rows of the tile's Q buffer, dead since the last QK^T
  // (q_empty is held back until the stores have read it).
  __device__ __forceinline__ void store_staged(std::int64_t lse_base) const {
    store_through(lse_base, sm.q(qb), Tr::kQSlab, sm.q_empty(qb), false);
  }
  // The V-staged epilogue (Traits::kVStaged; docs/attention_sm90.md, "Session 26"): as store_staged, through
  // this warpgroup's 64 rows of the tile's last V stage (the same 128-byte swizzled slabs of 128 rows), whose
  // "empty" barrier both warpgroups hold back until their stores have read it. The other warpgroup's last PV
  // reads all 128 rows of that stage, so the writes wait on kVDoneBarrier + cw, where it arrives once its PV
  // has completed. The conditions that must agree in both warpgroups (they pair up on the barrier) are the
  // tile's and the launch's: an fp16 / bf16 kernel with kVStaged, pingpong (turns keep a warpgroup from
  // arriving for the next tile before the other has synced for this one), no multicast (a stage written by
  // both CTAs), o_map encoded, not a split-tail chunk, not the Q-staged epilogue, not switched off
  // (kVariantNoVStaged); a warpgroup whose 64 rows reach past a varlen sequence's end takes the register
  // epilogue (box_in_sequence false) but still pairs up.
  __device__ __forceinline__ bool v_staged(int unit, bool stage) const {
    if constexpr (!Tr::kVStaged) {
      (void)unit, (void)stage;
      return false;
    } else {
      return pingpong && P.o_tma != 0 && P.multicast == 0 && unit < 0 && !stage && !staged_bits(P.variant) &&
             (P.variant & kVariantNoVStaged) == 0;
    }
  }
  // Whether this warpgroup's 64-row O box lies inside its sequence (always without varlen); under varlen a box
  // reaching past the end would write the next sequence's rows, so such a warpgroup stores from registers.
  __device__ __forceinline__ bool box_in_sequence() const {
    return p.cu_seqlens_q == nullptr || t.q0 + cw * 64 + 64 <= t.sq;
  }
  // The normalized rows (as store_rows: O = 0 and LSE = -inf for an empty row) go into this warpgroup's 64 rows
  // of `base` (slabs `slab` bytes apart), in the 128-byte swizzled layout of the TMA loads (16-byte chunk c of
  // row r at c ^ (r % 8): the eight rows of a 4-byte store instruction hit eight different chunks, no bank
  // conflict). One thread then stores the slabs with TMA, waits until they have been read and arrives on
  // `release_bar` for the warpgroup's four warps. v_done: first wait for the other warpgroup's kVDoneBarrier
  // arrival (the V stage), after the rows are normalized and packed. The warps leave ~2000 cycles of global
  // stores per tile behind (dev/sm90_trace, session 18).
  __device__ __forceinline__ void store_through(std::int64_t lse_base, std::uint32_t base, int slab,
                                                std::uint64_t* release_bar, bool v_done) const {
    const int g = lane >> 2, tq = lane & 3;
    std::uint32_t packed[2][Tr::kDTiles];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l_row = quad_sum(l[r]);
      const bool empty = !(l_row > 0.0f);
      const float inv = empty ? 0.0f : 1.0f / l_row;
#pragma unroll
      for (int j = 0; j < Tr::kDTiles; ++j) packed[r][j] = Elem<T>::pack(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
      if (p.lse != nullptr && tq == 0 && row_in_seq[r] < t.sq) {
        p.lse[lse_base + row_in_seq[r] * p.lse_stride[2]] = row_lse(m[r], l_row, empty);
      }
    }
    if (v_done) named_barrier_sync(kVDoneBarrier + cw, 256);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const std::uint32_t row = base + static_cast<std::uint32_t>((cw * 64 + warp * 16 + g + 8 * r) * 128 + 4 * tq);
#pragma unroll
      for (int j = 0; j < Tr::kDTiles; ++j) {
        shared_store(row + (j / 8) * slab + (((j % 8) ^ g) * 16), packed[r][j]);
      }
    }
    fence_smem_async();
    named_barrier_sync(kEpilogueBarrier + cw, 128);
    if (warp == 0 && lane == 0) {
#pragma unroll
      for (int s = 0; s < Tr::kSlabs; ++s) {
        tma_store_4d(&P.o_map, sm.ptr(base + s * slab + cw * 64 * 128), s * 64, t.q_begin + t.q0 + cw * 64, t.h,
                     t.b_dim0);
      }
      bulk_commit();
      bulk_wait_read();
      barrier_arrive_n(release_bar, 4);
    }
  }

  // The split tail's epilogue (Traits::kSplit): this warpgroup's rows of O / l in f32 and their LSE
  // in log2 units into the work unit's slices of part_o / part_lse, every row of the tile (rows past
  // sq too: the combine skips them). An empty row (l == 0) gets O = 0 and LSE = -inf, which the
  // combine weighs 0.
  __device__ __forceinline__ void store_part(int unit) const {
    float* po = P.part_o + static_cast<std::int64_t>(unit) * Tr::kBlockQ * Tr::kHeadDim;
    float* pl = P.part_lse + static_cast<std::int64_t>(unit) * Tr::kBlockQ;
    const int c = 2 * (lane & 3);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l_row = quad_sum(l[r]);
      const bool empty = !(l_row > 0.0f);
      const float inv = empty ? 0.0f : 1.0f / l_row;
      const int row = row_in_seq[r] - t.q0;
      float* dst = po + row * Tr::kHeadDim + c;
#pragma unroll
      for (int j = 0; j < Tr::kDTiles; ++j) {
        *reinterpret_cast<float2*>(dst + j * 8) = make_float2(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
      }
      if (c == 0) pl[row] = empty ? -INFINITY : m[r] + log2f(l_row);
    }
  }

  // One tile (query block): the mainloop, then the epilogue. q_phase: parity of this CTA's tile
  // count; ring: the K/V stage position, shared with the producer's walk of the same tiles; seq:
  // this CTA's count of key tiles so far (the same in both consumer warpgroups: the tags of the
  // pv_threshold vote ring).
  // unit >= 0 (split tail, no pv_threshold): the tile's keys are one chunk (the walk's range), stored by
  // store_part.
  // ahead(): the kernel loop's look-ahead of the next tile, called once the last PV is issued (its
  // loads then overlap that PV and the epilogue). What it hands back is broadcast from lane 0 where
  // the kernel loop branches on it: without that ptxas serialized every wgmma of one instantiation
  // (C7520, bf16 128 x 128).
  template <int kVote, class AheadFn>
  __device__ __forceinline__ void run(WarpWalk it, std::uint32_t q_phase, Ring<Tr>& ring, std::uint32_t& seq,
                                      int unit, AheadFn&& ahead) {
    trace_mark<Tr>(P, 1 + cw, trace_nt, 1);
    [[maybe_unused]] const std::uint32_t seq_begin = seq;
    const bool stage = __shfl_sync(0xffffffffu, staged(unit) ? 1 : 0, 0) != 0;  // provably uniform for ptxas
    const bool v_stage = Tr::kVStaged && __shfl_sync(0xffffffffu, v_staged(unit, stage) ? 1 : 0, 0) != 0;
    const bool v_rows = Tr::kVStaged && __shfl_sync(0xffffffffu, box_in_sequence() ? 1 : 0, 0) != 0;
    bool v_held = false;  // v_stage and a tile with key tiles: O goes out through V stage v_st
    int v_st = 0;
    // The first tile and its K scales before the Q wait: their global loads overlap it.
    const KeyTile kt0 = next_uniform_tile(it);
    float ksc[2];
    if (kt0.kb[0] >= 0) k_scales(kt0, ksc);
    barrier_wait(sm.q_full(qb), q_phase);
    trace_mark<Tr>(P, 1 + cw, trace_nt, 2);
    if (kt0.kb[0] < 0) {
      if (!stage) release(sm.q_empty(qb));
      ahead();
    } else {
      if constexpr (Tr::kQRegs) {
        load_q_regs();
        if (!stage) release(sm.q_empty(qb));
      }
      // Tile 0: S_0 alone.
      int st_prev = ring.st;
      std::uint32_t parity_prev = ring.phase;
      ring.advance();
      barrier_wait(sm.k_full(st_prev), parity_prev);
      trace_mark<Tr>(P, 1 + cw, trace_nt, 3);
      turn_begin();
      trace_mark<Tr>(P, 1 + cw, trace_nt, 4);
      wgmma_fence();
      fence_accumulator(s);
      issue_qk(st_prev);
      turn_end();
      wgmma_wait<0>();
      fence_accumulator(s);
      release_kv(sm.k_empty(st_prev));
      float alpha[2];
      std::uint32_t seq_prev = seq++;
      int vote_prev = softmax_step<kVote>(kt0, alpha, seq_prev, ksc);
      bool half_prev = kt0.kb[1] < 0;
      rescale_and_pack(alpha);
      trace_mark<Tr>(P, 1 + cw, trace_nt, 5);
      long long loop_clock[kTraceLoopEvents] = {};  // dev/sm90_trace only (mark below); unused otherwise
      for (;;) {
        const KeyTile kt = next_uniform_tile(it);
        if (kt.kb[0] < 0) break;
        k_scales(kt, ksc);
        const int st = ring.st;
        const std::uint32_t parity = ring.phase;
        const std::uint32_t seq_cur = seq++;
        // dev/sm90_trace only: clocks inside key tile kTraceKeyTile of the loop (events kTraceLoopFirst..), kept
        // in registers by a select (a branch here would make ptxas serialize the wgmmas: C7520) and
        // stored after the loop.
        const auto mark = [&](int ev) {
          if constexpr (Tr::kTrace && Tr::kTraceLoop) {
            const long long t = clock64();
            loop_clock[ev - kTraceLoopFirst] = seq_cur - seq_begin == kTraceKeyTile ? t : loop_clock[ev - kTraceLoopFirst];
          } else {
            (void)ev;
          }
        };
        mark(10);
        ring.advance();
        barrier_wait(sm.k_full(st), parity);
        barrier_wait(sm.v_full(st_prev), parity_prev);
        const int skip_prev = decide<kVote>(vote_prev, seq_prev);
        mark(11);
        turn_begin();
        mark(12);
        wgmma_fence();
        fence_accumulator(s);
        fence_accumulator(o);
        issue_qk(st);
        issue_pv<kVote>(st_prev, skip_prev, half_prev);
        turn_end();
        mark(13);
        wgmma_wait<1>();
        fence_accumulator(s);
        mark(14);
        release_kv(sm.k_empty(st));
        const int vote = softmax_step<kVote>(kt, alpha, seq_cur, ksc);
        mark(15);
        wgmma_wait<0>();
        fence_accumulator(o);
        fence_p();
        mark(16);
        release_kv(sm.v_empty(st_prev));
        rescale_and_pack(alpha);
        mark(17);
        vote_prev = vote;
        seq_prev = seq_cur;
        half_prev = kt.kb[1] < 0;
        st_prev = st;
        parity_prev = parity;
      }
      trace_mark<Tr>(P, 1 + cw, trace_nt, 6);
      if constexpr (Tr::kTrace && Tr::kTraceLoop) {
#pragma unroll
        for (int e = 0; e < kTraceLoopEvents; ++e) trace_mark<Tr>(P, 1 + cw, trace_nt, kTraceLoopFirst + e, loop_clock[e]);
      }
      // Every QK^T of this query block has completed (waited above); the staged epilogue releases later.
      if (!stage && !Tr::kQRegs) release(sm.q_empty(qb));
      // PV of the last tile.
      barrier_wait(sm.v_full(st_prev), parity_prev);
      const int skip_prev = decide<kVote>(vote_prev, seq_prev);
      turn_begin();
      wgmma_fence();
      fence_accumulator(o);
      issue_pv<kVote>(st_prev, skip_prev, half_prev);
      turn_end();
      ahead();
      wgmma_wait<0>();
      fence_accumulator(o);
      fence_p();
      if (v_stage) {
        // This warpgroup's reads of the last V stage are done: the other one may write its rows of O there.
        v_held = true;
        v_st = st_prev;
        named_barrier_arrive(kVDoneBarrier + (cw ^ 1), 256);
      }
      // Held back while O goes out through the stage (store_through releases it); the condition rides on the
      // lane-0 branch inside: a release in a branch of its own made ptxas serialize the wgmmas (C7520).
      release_kv(sm.v_empty(st_prev), !v_stage || !v_rows);
      trace_mark<Tr>(P, 1 + cw, trace_nt, 7);
    }
    trace_mark<Tr>(P, 1 + cw, trace_nt, 9, static_cast<long long>(seq - seq_begin));

    if constexpr (Tr::kSplit) {
      if (unit >= 0) {
        store_part(unit);
        trace_mark<Tr>(P, 1 + cw, trace_nt, 8);
        return;
      }
    }
    if constexpr (Tr::kTrace) {  // dev/sm90_trace's what-if (session 26): the tile without its O / LSE stores
      if (!stage && (P.variant & kVariantTraceNoEpilogue) != 0) {
        if (v_held) {
          named_barrier_sync(kVDoneBarrier + cw, 256);
          if (v_rows) release_kv(sm.v_empty(v_st));
        }
        trace_mark<Tr>(P, 1 + cw, trace_nt, 8);
        return;
      }
    }
    // Epilogue (the portable kernel's: O = 0 / LSE = -inf for empty rows).
    std::int64_t o_row[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      o_row[r] = t.b_dim0 * p.o_stride[0] + static_cast<std::int64_t>(t.q_begin + row_in_seq[r]) * p.o_stride[1] +
                 t.h * p.o_stride[2];
    }
    const std::int64_t lse_base = t.b * p.lse_stride[0] + t.h * p.lse_stride[1];
    if (stage) {
      store_staged(lse_base);
    } else if (v_held && v_rows) {
      store_through(lse_base, sm.v(v_st), Tr::kKVSlab, sm.v_empty(v_st), true);
    } else if constexpr (Tr::kFp8) {
      Fp8Epilogue f8;
      f8.v_scale = P.v_scale + (static_cast<std::int64_t>(t.b) * p.hk + t.hk) * Tr::kHeadDim;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        f8.lse_shift[r] = P.lse_shift != nullptr && row_in_seq[r] < t.sq
                              ? __ldg(P.lse_shift + (static_cast<std::int64_t>(t.b) * p.hq + t.h) * t.sq + row_in_seq[r])
                              : 0.0f;
      }
      store_rows<T, Tr::kDTiles, true>(p, o, m, l, row_in_seq, t.sq, o_row, lse_base, lane, f8);
    } else {
      if (v_held) named_barrier_sync(kVDoneBarrier + cw, 256);  // pairs with the other warpgroup's arrival
      store_rows<T, Tr::kDTiles>(p, o, m, l, row_in_seq, t.sq, o_row, lse_base, lane);
    }
    trace_mark<Tr>(P, 1 + cw, trace_nt, 8);
  }
};

// The tile of order slot `slot` (the sorted order when the launch made one, else the slot itself).
__device__ __forceinline__ int tile_at(const Sm90Params& P, int slot) {
  return P.order != nullptr ? __ldg(P.order + slot) : slot;
}
// A slot's work: a query tile and which chunk of its keys (-1: all). Slots below split_from are whole
// tiles. The split tail (Traits::kSplit, Sm90Params::split_n > 0): unit u = slot - split_from is chunk
// (u % gn) / g of the tile at slot split_from + g (u / gn) + u % g, where g is the cluster size (2 with
// multicast: the two CTAs of a cluster take the same chunk of neighbouring query blocks, so they still
// walk the same keys) and gn = g * split_n. split_combine inverts this.
struct Work {
  int tile, chunk;
};
template <class Tr>
__device__ __forceinline__ Work work_at(const Sm90Params& P, int slot) {
  if constexpr (Tr::kSplit) {
    if (P.split_n > 0 && slot >= P.split_from) {
      const int u = slot - P.split_from, g = P.multicast != 0 ? 2 : 1, gn = g * P.split_n;
      return {tile_at(P, P.split_from + g * (u / gn) + u % g), (u % gn) / g};
    }
  }
  return {tile_at(P, slot), -1};
}
// Positions [first, end) of chunk `chunk` of n among a tile's `count` (visible dense blocks or LUT row
// entries; chunk -1: all of them).
struct KeyRange {
  int first, end;
};
__device__ __forceinline__ KeyRange key_range(int count, int chunk, int n) {
  if (chunk < 0) return {0, count};
  return {chunk * count / n, (chunk + 1) * count / n};
}

template <class Tr>
__device__ __forceinline__ int visible_of(const KernelParams& p, const Tile& t) {
  const int rows = min(Tr::kBlockQ, t.sq - t.q0);
  return visible_blocks(t.q0, rows, t.sq, t.sk, Tr::kBlockK, p.is_causal);
}
// The key blocks a tile walks: its own visible blocks, or with causal masking and K/V multicast the
// larger count of the cluster's two tiles (tile ^ 1 is the partner: query blocks qb and qb - 1 of one
// head), since both CTAs must load and release the same stages. The extra block of the shorter tile
// lies past all of its rows' diagonals: masked whole, P = 0, the result unchanged.
template <class Tr>
__device__ __forceinline__ int walk_blocks(const Sm90Params& P, const Tile& t, int tile) {
  const KernelParams& p = P.p;
  int n = visible_of<Tr>(p, t);
  if constexpr (Tr::kMayMulticast) {
    if (p.is_causal && P.multicast != 0) n = max(n, visible_of<Tr>(p, make_tile(p, tile ^ 1, Tr::kBlockQ)));
  }
  return n;
}

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks) attention_kernel(const __grid_constant__ Sm90Params P) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  const KernelParams& p = P.p;
  Smem<Tr> sm;
  sm.base = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);

  const int tid = threadIdx.x;
  // Multicast (kVariantClusterKV): the launch made clusters of 2 CTAs computing tiles 2c, 2c + 1 (one
  // tile each, the same keys); uniform over the grid.
  // (Read from the parameter where needed, not kept in a register across the consumers' loop.)
  if (tid == 0) {
    const bool mc = P.multicast != 0;
    for (int b = 0; b < Tr::kQBufs; ++b) {
      barrier_init(sm.q_full(b), 1);
      barrier_init(sm.q_empty(b), Tr::kConsumers * 4);
    }
    barrier_init(sm.v_fix(), 1);
    *sm.v_fix_uses() = 0;
    for (int s = 0; s < Tr::kStages; ++s) {
      barrier_init(sm.k_full(s), 1);
      barrier_init(sm.v_full(s), 1);
      barrier_init(sm.k_empty(s), Tr::kConsumers * 4 * (mc ? 2 : 1));
      barrier_init(sm.v_empty(s), Tr::kConsumers * 4 * (mc ? 2 : 1));
    }
    barrier_init_fence();
  }
  // The pv_threshold vote rings: every slot starts with a tag no early sequence number has
  // (0x3FFFFFFF; slot k is first read for seq k < kVoteRing, and written by then).
  if (tid < Smem<Tr>::kVoteWarps * static_cast<int>(Smem<Tr>::kVoteRing)) {
    shared_store_atomic(Smem<Tr>::vote_slot(sm.vote_row(tid / Smem<Tr>::kVoteRing), tid % Smem<Tr>::kVoteRing), ~0u);
  }
  __syncthreads();
  // The peer's TMA and arrivals must not reach barriers it has not initialized yet.
  if (P.multicast != 0) cluster_sync_all();

  // CTA x computes tiles (slots of the order) x, x + grid, ... below num_tiles: one tile when the
  // grid covers them all, several when the launch is persistent. Every role walks the same slots
  // and skips the same (uniformly) empty tiles, so the Q phase and the K/V ring stay in step.
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // provably warp-uniform for ptxas
  if (wg == 0) {
    registers_release<Tr::kProducerRegs>();
    if (tid == 0) {
      Ring<Tr> ring;
      std::uint32_t nt = 0;  // tiles of this CTA so far: the Q buffer and its phase
      const bool dbl = Tr::kQBufs == 2 && (P.variant & kVariantQDouble) != 0;
      for (int slot = blockIdx.x; slot < P.num_tiles; slot += gridDim.x) {
        const Work w = work_at<Tr>(P, slot);
        const Tile t = make_tile(p, w.tile, Tr::kBlockQ);
        if (t.q0 >= t.sq) continue;
        if ((P.variant & kVariantEarlyNext) != 0 && slot + static_cast<int>(gridDim.x) < P.num_tiles) {
          // The next tile's Q into L2 now: its load (after this tile's last QK^T) then hits L2. So do
          // the loads its consumers start with, a chain of dependent global loads at every tile
          // start (LUT count -> LUT entries -> fp8 K scale; fp8 Q scales): the count, the LUT row's
          // first line and the Q scale rows.
          const Tile tn = make_tile(p, work_at<Tr>(P, slot + static_cast<int>(gridDim.x)).tile, Tr::kBlockQ);
          if (tn.q0 < tn.sq) {
#pragma unroll
            for (int s = 0; s < Tr::kSlabs; ++s) tma_prefetch_4d(&P.q_map, s * 64, tn.q_begin + tn.q0, tn.h, tn.b_dim0);
            if (p.lut != nullptr) {
              prefetch_l2(lut_count_ptr(p, tn));
              prefetch_l2(lut_row(p, tn));
            }
            if (Tr::kFp8 && P.q_scale != nullptr) {
              const int rows = min(Tr::kBlockQ, tn.sq - tn.q0);
              const float* qs = P.q_scale + (static_cast<std::int64_t>(tn.b) * p.hq + tn.h) * tn.sq + tn.q0;
              // The bulk prefetch wants 16-byte alignment and size: whole 16-byte words inside the rows.
              const auto a = reinterpret_cast<std::uintptr_t>(qs), e = reinterpret_cast<std::uintptr_t>(qs + rows);
              const std::uintptr_t a16 = (a + 15) & ~std::uintptr_t{15}, e16 = e & ~std::uintptr_t{15};
              if (e16 > a16) prefetch_l2_bulk(reinterpret_cast<const void*>(a16), static_cast<std::uint32_t>(e16 - a16));
            }
          }
        }
        trace_mark<Tr>(P, 0, nt, 0);
        const QSlot qs = q_slot(nt, dbl);
        BlockIter it = make_iter(p, t, walk_blocks<Tr>(P, t, w.tile));
        if (w.chunk >= 0) {  // the iterator walks positions [pos, n) of the LUT row or the dense blocks
          const KeyRange kr = key_range(it.n, w.chunk, P.split_n);
          it.pos = kr.first;
          it.n = kr.end;
          if (it.row != nullptr) it.lookahead = it.pos < it.n ? __ldg(it.row + it.pos * it.stride) : -1;
        }
        producer<Tr>(P, sm, t, it, qs.phase, qs.buf, ring, nt);
        ++nt;
      }
      // Multicast: this CTA must not exit while the peer's consumers may still arrive on its "empty"
      // barriers. The producer waits for every stage's last use to be released by both CTAs (the
      // waits a further refill of each stage would make); the peer's TMA writes into this CTA were
      // all waited for by this CTA's consumers.
      if (P.multicast != 0) {
        for (int i = 0; i < Tr::kStages; ++i, ring.advance()) {
          barrier_wait(sm.k_empty(ring.st), ring.phase ^ 1);
          barrier_wait(sm.v_empty(ring.st), ring.phase ^ 1);
        }
      }
    }
  } else {
    registers_claim<Tr::kConsumerRegs>();
    const int cw = wg - 1;
    // The pingpong turns alternate across all tiles of the CTA (both warpgroups take n + 1 turns
    // per tile, n the same for both): warpgroup 1 opens with an arrive, warpgroup 0 closes with a
    // sync, so the named barriers are balanced at exit.
    const bool pingpong = Tr::kConsumers == 2 && (P.variant & kVariantNoPingpong) == 0;
    if (pingpong && cw == 1) named_barrier_arrive(kTurnBarrier + 0, 256);  // warpgroup 0 goes first
    Ring<Tr> ring;
    std::uint32_t nt = 0;   // tiles of this CTA so far (the producer's count: Q buffer and phase)
    std::uint32_t seq = 0;  // key tiles of this CTA so far: the vote ring's tags (30 bits, see vote_word)
    const bool dbl = Tr::kQBufs == 2 && (P.variant & kVariantQDouble) != 0;
    Ahead ahead;
    for (int slot = blockIdx.x; slot < P.num_tiles; slot += gridDim.x) {
      const bool held = __shfl_sync(0xffffffffu, slot == ahead.slot ? 1 : 0, 0) != 0;  // provably uniform for ptxas
      const Work w = held ? Work{__shfl_sync(0xffffffffu, ahead.tile, 0), -1} : work_at<Tr>(P, slot);
      const Tile t = make_tile(p, w.tile, Tr::kBlockQ);
      if (t.q0 >= t.sq) continue;
      trace_mark<Tr>(P, 1 + cw, nt, 0);
      // The next slot's tile (its order entry loaded now, held over this tile); split units are
      // left to the plain path (their walk's start depends on the count).
      const int next_slot = slot + static_cast<int>(gridDim.x);
      int next_tile = -1;
      if (next_slot < P.num_tiles) {
        const Work wn = work_at<Tr>(P, next_slot);
        if (wn.chunk < 0) next_tile = wn.tile;
      }
      const QSlot qs = q_slot(nt, dbl);
      const std::uint32_t q_phase = qs.phase;
      Consumer<Tr> c(p, sm, t, cw, tid % 128, P, qs.buf);
      c.trace_nt = nt;
      const int visible = walk_blocks<Tr>(P, t, w.tile);
      WarpWalk it = held ? make_warp_walk(p, t, visible, tid % 32, ahead) : make_warp_walk(p, t, visible, tid % 32);
      auto look_ahead = [&] { load_ahead(p, ahead, next_slot, next_tile, Tr::kBlockQ, tid % 32); };
      int unit = -1;
      if (w.chunk >= 0) {  // the walk hands out positions [base, n) of the LUT row or the dense blocks
        const KeyRange kr = key_range(it.n, w.chunk, P.split_n);
        it.base = kr.first;
        it.n = kr.end;
        if (it.row != nullptr) {
          it.mine = it.load(it.base + it.lane);
          it.fill();
        }
        unit = slot - P.split_from;
      }
      // pv_threshold only exists for LUTs (BLKQ 64 / 128: one or two consumer warpgroups; the
      // 192-row and 176-key tiles are dense only). Legacy mode (kVariantLegacyPv): unpaired kernels only (the
      // launcher does not pair with that bit and pv_threshold on).
      if constexpr (Tr::kConsumers <= 2 && !Tr::kDenseOnly) {
        if (p.use_pv_threshold) {
          if constexpr (!Tr::kPair) {
            if ((P.variant & kVariantLegacyPv) != 0) {
              c.template run<kVoteLegacy>(it, q_phase, ring, seq, -1, look_ahead);
            } else {
              c.template run<kVoteWarp>(it, q_phase, ring, seq, -1, look_ahead);
            }
          } else {
            c.template run<kVoteWarp>(it, q_phase, ring, seq, -1, look_ahead);
          }
        } else {
          c.template run<kVoteOff>(it, q_phase, ring, seq, unit, look_ahead);
        }
      } else {
        c.template run<kVoteOff>(it, q_phase, ring, seq, unit, look_ahead);
      }
      ++nt;
    }
    if (pingpong && cw == 0) named_barrier_sync(kTurnBarrier + 0, 256);  // the turn warpgroup 1 passed last
  }
#else
  (void)P;
#endif
}

template <class T, int HD, int BLKQ, int BLKK>
cudaError_t Kernel<T, HD, BLKQ, BLKK>::attributes(cudaFuncAttributes* attr) {
  return cudaFuncGetAttributes(attr, attention_kernel<Traits<T, HD, BLKQ, BLKK>>);
}

// The split tail's combine: one warp per row of the tail's query tiles (tail tiles from split_from),
// merging the row's split_n chunks by their LSE in chunk order (deterministic): with L the largest
// chunk LSE (log2) and w_j = 2^(lse_j - L), O = sum_j w_j O_j / sum_j w_j and LSE = L + log2(sum_j
// w_j); chunks without keys for the row (lse -inf) weigh 0, a row without any gets O = 0, LSE = -inf
// (store_rows' empty row). Lane i holds columns [i HD / 32, (i + 1) HD / 32).
constexpr int kCombineWarps = 8;
template <class Tr>
__global__ void __launch_bounds__(32 * kCombineWarps) split_combine(const __grid_constant__ Sm90Params P, int tail) {
  using T = typename Tr::T;
  constexpr int kPer = Tr::kHeadDim / 32;
  static_assert(kPer == 2 || kPer == 4, "head dim 64 or 128");
  const KernelParams& p = P.p;
  const int lane = threadIdx.x % 32;
  const int row_id = blockIdx.x * kCombineWarps + static_cast<int>(threadIdx.x) / 32;
  if (row_id >= tail * Tr::kBlockQ) return;
  const int k = row_id / Tr::kBlockQ, r = row_id % Tr::kBlockQ;
  const Tile t = make_tile(p, tile_at(P, P.split_from + k), Tr::kBlockQ);
  if (t.q0 + r >= t.sq) return;
  const int g = P.multicast != 0 ? 2 : 1, n = P.split_n;
  const int u0 = g * n * (k / g) + k % g;  // chunk j is unit u0 + g j (work_at)
  float hi = -INFINITY;
  for (int j = 0; j < n; ++j) hi = fmaxf(hi, __ldg(P.part_lse + static_cast<std::int64_t>(u0 + g * j) * Tr::kBlockQ + r));
  float acc[kPer] = {};
  float wsum = 0.0f;
  if (hi != -INFINITY) {
    for (int j = 0; j < n; ++j) {
      const std::int64_t u = u0 + g * j;
      const float lj = __ldg(P.part_lse + u * Tr::kBlockQ + r);
      if (lj == -INFINITY) continue;  // a chunk without keys for this row: weight 0, its O is not read
      const float w = exp2f(lj - hi);
      const float* src = P.part_o + (u * Tr::kBlockQ + r) * Tr::kHeadDim + lane * kPer;
      float x[kPer];
      if constexpr (kPer == 4) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(src));
        x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
      } else {
        const float2 v = __ldg(reinterpret_cast<const float2*>(src));
        x[0] = v.x, x[1] = v.y;
      }
#pragma unroll
      for (int e = 0; e < kPer; ++e) acc[e] = fmaf(w, x[e], acc[e]);
      wsum += w;
    }
  }
  const bool empty = !(wsum > 0.0f);
  const float inv = empty ? 0.0f : 1.0f / wsum;
  const std::int64_t o_off = t.b_dim0 * p.o_stride[0] + static_cast<std::int64_t>(t.q_begin + t.q0 + r) * p.o_stride[1] +
                             t.h * p.o_stride[2] + lane * kPer;
#pragma unroll
  for (int e = 0; e < kPer; e += 2) {
    if (p.o_is_f32) {
      *reinterpret_cast<float2*>(static_cast<float*>(p.o) + o_off + e) = make_float2(acc[e] * inv, acc[e + 1] * inv);
    } else {
      *reinterpret_cast<std::uint32_t*>(static_cast<T*>(p.o) + o_off + e) = Elem<T>::pack(acc[e] * inv, acc[e + 1] * inv);
    }
  }
  if (p.lse != nullptr && lane == 0) {
    p.lse[t.b * p.lse_stride[0] + t.h * p.lse_stride[1] + static_cast<std::int64_t>(t.q0 + r) * p.lse_stride[2]] =
        empty ? -INFINITY : (hi + log2f(wsum)) * 0.69314718055994531f;
  }
}

// The split tail of a persistent launch over `ctas` CTAs (docs/attention_sm90.md, "Session 14"): the
// last round's R = num_tiles mod ctas query tiles would run alone while the other CTAs idle (at b2 h32
// s16384: 8 of 8192 tiles on 132 CTAs, ~1.5% of the kernel when the rows are equally long); instead
// each is cut into n = min(ctas / R, max(2, blocks / 4)) chunks of its key blocks (dense) or LUT
// entries (blocks: the row's blocks, or the LUT's capacity), so the last round is about n times
// shorter, and split_combine merges them. Not with pv_threshold (its decisions are defined against
// the running max of the whole row), nor causal masking unless the launch runs the causal pairs'
// order (causal_pairs; other causal orders are not persistent). Returns the chunks per tile (0: no
// split); the test hook (bit 32768) splits every tile in 3.
template <class Tr>
int split_chunks(const Sm90Params& q, int num_tiles, int ctas, bool causal_pairs, int* split_from) {
  if (q.p.use_pv_threshold) return 0;
  if ((q.variant & kVariantSplitTest) != 0) {
    *split_from = 0;
    return 3;
  }
  // Causal: only on the paired order (causal_pair_slot), whose last round holds the leftover units.
  if ((q.variant & kVariantNoSplit) != 0 || (q.p.is_causal && !causal_pairs) || ctas <= 0 || ctas >= num_tiles) {
    return 0;
  }
  const int tail = num_tiles % ctas;
  const int blocks = q.p.lut != nullptr ? q.p.nk_lut : (q.p.seq_k + Tr::kBlockK - 1) / Tr::kBlockK;
  const int most = blocks / 4 > 2 ? blocks / 4 : 2;
  const int n = tail == 0 ? 0 : (ctas / tail < most ? ctas / tail : most);
  if (n < 2) return 0;
  *split_from = num_tiles - tail;
  return n;
}

template <class Tr>
cudaError_t launch_kernel(const Sm90Params& p, int num_tiles, cudaStream_t stream) {
  auto* kernel = attention_kernel<Tr>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  // Sparse tiles that do not all fit on the GPU at once run longest LUT row first (a stream-ordered
  // scratch of the order): the block scheduler hands the next CTA to the first free slot, so this
  // is greedy longest-first, within a length class of the optimum for skewed LUTs. Without the
  // scratch (allocation failure) the tiles run in index order.
  Sm90Params q = p;
  q.num_tiles = num_tiles;
  ScopedScratch order(stream);
  int dev = 0, sms = 0;
  const bool have_sms = cudaGetDevice(&dev) == cudaSuccess &&
                        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && sms > 0;
  // Persistent: one CTA per slot the GPU holds at once, each walking tiles x, x + grid, ... (the
  // producer loads the next tile's Q and K while the consumers finish the last PV and store O).
  // Otherwise one CTA per tile. Default rule (round-3 H200 data, docs/attention_sm90.md): persistent
  // for non-causal problems with BLKQ >= 128 and unpaired tiles, sparse or head dim 64 (causal lost
  // 11% with static striding, dense hd128 was even). The paired 128 x 64 LUT at head dim 128 too since
  // the session-3 rounds of 2026-11-30 (with the leaner consumer): 1.68 vs 1.74 ms at density 0.1 in
  // three interleaved repeats, 6.04 vs 6.17 ms at 0.4 (noisy), where round 3 had measured -8% at 0.4.
  // The dense-only 176-key tile (non-causal) too, with the multicast below: session 13, H200, b2 h32
  // s16384 d128, two interleaved repeats: 597.0 / 595.6 TFLOPS plain, 600.5 / 600.8 persistent,
  // 606.6 / 612.6 multicast, 611.5 / 611.9 both (docs/attention_sm90.md, "Session 13").
  // Causal (session 16; dense on the 128 x 176 tile, hd64's 192 x 128, 128 x 128 with bit 4096; LUTs on
  // the unpaired and the hd128 paired kernels, fp16 / bf16): persistent on the paired order of
  // causal_pair_slot (heavy and light query blocks of one head in consecutive rounds), not on the plain
  // striding that lost 11%; bit 131072 returns to one CTA per tile (LUTs: longest row first). A causal
  // LUT's rows are paired by query block, not by their counts: balanced when the counts grow with the
  // visible keys (the block map's topk / cdf rows), not for arbitrary skew. Not with varlen (its tiles
  // past a sequence's end are holes in the balance).
  const bool causal_pairs = !Tr::kFp8 && Tr::kBlockQ >= 128 && (!Tr::kPair || Tr::kHeadDim == 128) &&
                            p.p.is_causal && p.p.cu_seqlens_q == nullptr && (p.variant & kVariantNoCausalPairs) == 0;
  bool persistent = ((!p.p.is_causal && Tr::kBlockQ >= 128 && (!Tr::kPair || Tr::kHeadDim == 128) &&
                      (p.p.lut != nullptr || Tr::kHeadDim == 64 || Tr::kDenseOnly)) || causal_pairs);
  if ((p.variant & kVariantPersistent) != 0) persistent = true;
  if ((p.variant & kVariantNoPersistent) != 0) persistent = false;
  int grid = num_tiles;
  if (persistent && have_sms && num_tiles > sms * Tr::kMinBlocks) grid = sms * Tr::kMinBlocks;
  if ((p.variant & kVariantPersistentTest) != 0 && num_tiles > 3) grid = 3;  // every CTA walks many tiles
  if (p.p.lut != nullptr && have_sms && num_tiles > sms * Tr::kMinBlocks && !(causal_pairs && persistent) &&
      order.alloc(sizeof(std::int32_t) * num_tiles) == cudaSuccess &&
      order_tiles_by_count(p.p, num_tiles, order.as<std::int32_t>(), stream) == cudaSuccess) {
    q.order = order.as<std::int32_t>();
  }
  cudaGetLastError();  // a failed optional step above must not be reported as the launch's error
  // Multicast (kVariantClusterKV, dense hd128 non-causal only): clusters of 2 CTAs on tiles 2c, 2c + 1,
  // which are query blocks of one (batch, head) when nq is even, so they walk the same keys; each
  // loads one 64-column slab of every K/V tile for both. Persistent too when the rule above (or bit
  // 16) says so: an even grid of as many clusters as fit at once, so the two CTAs of a cluster walk
  // slots 2c + k * grid and 2c + 1 + k * grid, again neighbouring query blocks of one head.
  // The default for the dense-only 176-key tile (bit 8192 turns it off), on request (bit 128) for 128 x 128.
  const bool mc_wanted = Tr::kDenseOnly ? (p.variant & kVariantNoClusterKV) == 0 : (p.variant & kVariantClusterKV) != 0;
  // Not with varlen: a cluster's second query block may lie past its sequence's end (that CTA would
  // skip the tile and never load its slab), and the varlen V fix completes barriers of one CTA only.
  // Causal (session 15, bit 65536 turns it off): both CTAs walk the longer row of the pair (walk_blocks).
  const bool mc = mc_wanted && p.p.lut == nullptr && (!p.p.is_causal || (p.variant & kVariantNoCausalMulticast) == 0) &&
                  Tr::kMayMulticast && p.p.nq % 2 == 0 && num_tiles % 2 == 0 && p.p.cu_seqlens_q == nullptr;
  // The split tail (Traits::kSplit): the chunks' partial results in one stream-ordered scratch.
  ScopedScratch part(stream);
  // The causal pairs' order for a persistent grid of `ctas` CTAs in clusters of g; without it (no
  // scratch, or the grid covers every tile) the tiles keep index order, whose striding is correct
  // but unbalanced.
  bool paired = false;
  const auto plan_order = [&](int ctas, int g) {
    if (!causal_pairs || !persistent || ctas >= num_tiles || p.p.nq % g != 0 || ctas % g != 0) return;
    if (order.alloc(sizeof(std::int32_t) * num_tiles) == cudaSuccess &&
        order_tiles_causal_pairs(num_tiles, p.p.nq, ctas, g, order.as<std::int32_t>(), stream) == cudaSuccess) {
      q.order = order.as<std::int32_t>();
      paired = true;
    }
    cudaGetLastError();
  };
  const auto plan_split = [&](int ctas) {
    if constexpr (Tr::kSplit) {
      int from = 0;
      const int n = split_chunks<Tr>(q, num_tiles, ctas, paired, &from);
      if (n == 0) return;
      const std::int64_t units = static_cast<std::int64_t>(num_tiles - from) * n;
      const std::int64_t floats = units * Tr::kBlockQ * (Tr::kHeadDim + 1);
      if (part.alloc(sizeof(float) * floats) != cudaSuccess) {
        cudaGetLastError();
        return;  // no scratch: the unsplit launch
      }
      q.split_from = from;
      q.split_n = n;
      q.part_o = part.as<float>();
      q.part_lse = q.part_o + units * Tr::kBlockQ * Tr::kHeadDim;
      q.num_tiles = static_cast<int>(from + units);
    } else {
      (void)ctas;
    }
  };
  if (mc) {
    q.multicast = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(num_tiles));
    cfg.blockDim = dim3(Tr::kThreads);
    cfg.dynamicSmemBytes = Tr::kSmemBytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if ((p.variant & kVariantPersistentTest) != 0 && num_tiles > 3) {
      cfg.gridDim = dim3(2u);  // the test hook: one cluster walks every tile
    } else if (grid < num_tiles && cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess &&
               clusters > 0 && 2 * clusters < num_tiles) {
      cfg.gridDim = dim3(static_cast<unsigned>(2 * clusters));
    }
    cudaGetLastError();
    plan_order(static_cast<int>(cfg.gridDim.x), 2);
    plan_split(static_cast<int>(cfg.gridDim.x));
    if (cudaLaunchKernelEx(&cfg, kernel, q) != cudaSuccess) {
      cudaGetLastError();  // clusters refused: the plain launch below (the same slots, one CTA each)
      q.multicast = 0;
      // The order and the split tail planned for the cluster grid stay correct on this one (every
      // slot is walked once; work_at and split_combine read the cluster size from q.multicast),
      // only their balance is the cluster grid's.
      kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(q);
    }
  } else {
    plan_order(grid, 1);
    plan_split(grid);
    kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(q);
  }
  err = cudaGetLastError();
  if constexpr (Tr::kSplit) {
    if (q.split_n > 0) {
      if (err == cudaSuccess) {
        const int tail = num_tiles - q.split_from;
        const int rows = tail * Tr::kBlockQ;
        split_combine<Tr><<<(rows + kCombineWarps - 1) / kCombineWarps, 32 * kCombineWarps, 0, stream>>>(q, tail);
        err = cudaGetLastError();
      }
    }
  }
  return err;  // order and part are freed after the launches (stream ordered)
}

template <class T, int HD, int BLKQ, int BLKK>
cudaError_t Kernel<T, HD, BLKQ, BLKK>::launch(const Sm90Params& p, int num_tiles, cudaStream_t stream) {
  Sm90Params q = p;
  // Two Q buffers (bit 2048, where kQBufs allows) and with them the staged epilogue stay opt-in: the
  // kernels that matter most (hd128, 128-key tiles: three stages) have room for one Q buffer only, where
  // the staged epilogue measured within noise (session 18, docs/attention_sm90.md).
  q.variant = variant_bits();
  // 64-key LUT blocks are computed two per 128-key tile (with pv_threshold too: its per-block
  // decisions are taken per half) unless the variant bits say otherwise (bit 256 with
  // pv_threshold: the legacy unpaired path). BLKQ 64 at head dim 128 pairs only on request: its
  // 113 KiB leave one 128-key stage (two 64-key stages unpaired).
  if constexpr (BLKK == 64) {
    const bool legacy_pv = p.p.use_pv_threshold && (q.variant & kVariantLegacyPv) != 0;
    const bool pair = !legacy_pv && (q.variant & kVariantNoPair) == 0 &&
                      (BLKQ == 128 || HD == 64 || (q.variant & kVariantPairQ64) != 0);
    if (pair) {
      const cudaError_t err = launch_kernel<Traits<T, HD, BLKQ, BLKK, true>>(q, num_tiles, stream);
      if (err != cudaErrorInvalidValue) return err;
      cudaGetLastError();  // its shared memory was refused: run unpaired
    }
  }
  return launch_kernel<Traits<T, HD, BLKQ, BLKK>>(q, num_tiles, stream);
}

// The fp8 recipe: head dim 128, 64-key LUT blocks always paired (V^T sub-tiles are 64 keys; an
// unpaired 64-key tile would need its own instantiation). Variant bits that select other kernels
// (multicast, legacy pv_threshold, no pairing) do not apply. Default (SPARGE_SM90_VARIANT unset):
// two Q buffers and the next tile's prefetches (bits 2048 | 1024; H200, session 6 round 4, b2 h32
// s16384 d128 topk 0.1, two repeats: 128 x 128 2.301 / 2.301 -> 2.288 / 2.248 ms, 128 x 64 2.468 /
// 2.449 -> 2.414 / 2.393, tool timings with the prepass; no effect on fp16 kernels, so not theirs).
template <class T, int BLKQ, int BLKK>
using Fp8Traits = Traits<T, 128, BLKQ, BLKK, BLKK == 64, true>;

template <class T, int BLKQ, int BLKK>
cudaError_t KernelFp8<T, BLKQ, BLKK>::attributes(cudaFuncAttributes* attr) {
  return cudaFuncGetAttributes(attr, attention_kernel<Fp8Traits<T, BLKQ, BLKK>>);
}

template <class T, int BLKQ, int BLKK>
cudaError_t KernelFp8<T, BLKQ, BLKK>::launch(const Sm90Params& p, int num_tiles, cudaStream_t stream) {
  Sm90Params q = p;
  q.variant = fp8_variant_bits();
  return launch_kernel<Fp8Traits<T, BLKQ, BLKK>>(q, num_tiles, stream);
}

}  // namespace sparge::cuda::attn::sm90
