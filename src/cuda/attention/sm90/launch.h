// The host's handle on the Hopper (sm_90a) attention kernel: its parameters (the portable
// KernelParams plus TMA tensor maps of q, k, v), its shared-memory plan and one instantiation per
// (dtype, head dim, BLKQ, BLKK) in sm90/inst/. See docs/attention_sm90.md.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/params.h"
#include "cuda/attention/sm90/schedule.h"

namespace sparge::cuda::attn::sm90 {

struct Sm90Params {
  CUtensorMap q_map, k_map, v_map;  // 4-D (column, row, head, batch), 64 x rows boxes, 128B swizzle
  // O with Q's dtype, 64 x 64 boxes (one consumer warpgroup's rows of a slab), 128B swizzle: the staged
  // epilogue's TMA stores (Consumer::staged). Valid when o_tma is 1 (set by the launcher when the map
  // could be encoded).
  CUtensorMap o_map;
  int o_tma = 0;
  KernelParams p;
  // CTA i computes tile order[i] (sparse, when the tiles do not all fit on the GPU at once: the
  // launch orders them by LUT row length, longest first, so the block scheduler's greedy dispatch
  // balances skewed LUTs); nullptr: CTA i computes tile i. Set by Kernel::launch.
  const std::int32_t* order = nullptr;
  int variant = 0;    // SPARGE_SM90_VARIANT bits (kVariant*), set by Kernel::launch
  int multicast = 0;  // 1: launched in clusters of 2 CTAs that load one K/V slab each for both (kVariantClusterKV)
  int num_tiles = 0;  // slots: CTA x computes slots x, x + grid, ... (query tiles, then the split tail's chunks)
  // The split tail (kernels with Traits::kSplit, persistent launches; docs/attention_sm90.md, "Session
  // 14"): slots >= split_from are chunks of the key blocks (dense) or LUT entries of the last round's
  // query tiles, split_n per tile, each written as (O / l in f32, its LSE in log2 units) to part_o
  // [unit][BLKQ][HD] / part_lse [unit][BLKQ] and combined by LSE afterwards (split_combine).
  // split_n == 0: no split.
  int split_from = 0;
  int split_n = 0;
  float* part_o = nullptr;
  float* part_lse = nullptr;
  // fp8 recipe (KernelFp8; docs/quantized.md): q_map / k_map / v_map describe the prepass's q8, k8
  // and v8t (cuda/quant/quant.h), and these are its dequantization scales. p.q / p.k / p.v stay the
  // caller's tensors (unused by the kernel).
  const float* q_scale = nullptr;    // [B, Hq, Sq], per row
  const float* k_scale = nullptr;    // [B, Hk, nkb], per LUT key block
  const float* v_scale = nullptr;    // [B, Hk, D], per channel
  const float* lse_shift = nullptr;  // [B, Hq, Sq] added to the LSE (K smoothing), or nullptr
  int nkb = 0;
  // Event stamps of dev/sm90_trace (kernels with Traits::kTrace only; see trace_mark in kernel.cuh).
  long long* trace = nullptr;
};

// SPARGE_SM90_VARIANT: bits that switch uncertain performance choices, read on every launch (so one
// process can compare them); unset or unparsable = 0 = the defaults. Results are the same up to
// summation order (pairing changes the order of the online softmax, deterministically).
constexpr int kVariantNoPair = 1;      // 64-key LUT blocks as 64-key tiles (no pairing)
constexpr int kVariantPairQ64 = 2;     // pair also at BLKQ 64, head dim 128 (one 128-key stage)
constexpr int kVariantNoPingpong = 4;  // the two consumer warpgroups issue without taking turns
constexpr int kVariantDenseQ128 = 8;   // dense head dim 64: 128 x 128 tiles (default: 192 x 128, 3 consumer WGs)
constexpr int kVariantPersistent = 16;      // persistent CTAs always (grid = CTAs the GPU holds at once)
constexpr int kVariantPersistentTest = 32;  // test hook: persistent with a grid of 3 CTAs (many tiles each)
constexpr int kVariantNoPersistent = 64;    // never persistent (overrides the default rule and bit 16)
constexpr int kVariantClusterKV = 128;      // dense hd128 non-causal 128 x 128: CTA pairs share K/V loads (TMA
                                            // multicast; the 128 x 176 tile's default, see bit 8192)
constexpr int kVariantLegacyPv = 256;       // pv_threshold: the pre-round-5 path (unpaired 64-key tiles, one
                                            // bar.red.and of all consumer threads per tile, lockstep)
constexpr int kVariantTestOwnVote = 512;    // test hook, WRONG ON PURPOSE: BLKQ 128 decides pv_threshold on each
                                            // warpgroup's own rows (no peer vote); the pattern tests must fail
constexpr int kVariantEarlyNext = 1024;     // persistent CTAs: the producer prefetches the next tile's Q into
                                            // L2 (TMA prefetch) when it starts a tile, and issues a tile's first
                                            // K/V stage before waiting for the Q buffer (session 6, opt-in)
constexpr int kVariantQDouble = 2048;       // persistent CTAs: two Q buffers (kernels whose shared memory
                                            // has room, Traits::kQBufs), so the next tile's Q and K/V loads
                                            // never wait for this tile's last QK^T (session 6, opt-in)
constexpr int kVariantDenseK128 = 4096;     // dense head dim 128: 128 x 128 tiles (default: 128 x 176, FA3's
                                            // non-causal tile; since session 13, causal too since session 14)
constexpr int kVariantNoClusterKV = 8192;   // the dense 128 x 176 tile without its default K/V multicast
constexpr int kVariantNoSplit = 16384;      // persistent launches without the split tail (session 14)
constexpr int kVariantSplitTest = 32768;    // test hook: every query tile's key blocks or LUT entries in 3 chunks
                                            // (combined by LSE), whatever the launch shape (not with pv_threshold)
constexpr int kVariantNoCausalMulticast = 65536;  // causal dense 176 tile: no K/V multicast (the default before session 15)
constexpr int kVariantNoCausalPairs = 131072;     // causal dense (BLKQ >= 128 tiles): one CTA per tile (the default
                                                  // before session 16) instead of persistent CTAs on the paired
                                                  // order of causal_pair_slot (schedule.h)
constexpr int kVariantStagedSingle = 262144;  // the staged epilogue also with one Q buffer (its release, after the
                                              // TMA stores have read it, then delays the next tile's Q load)
constexpr int kVariantNoStaged = 524288;      // no staged epilogue: O from registers (the default before session 18)
constexpr int kVariantNoVStaged = 1048576;     // no V-staged epilogue (Traits::kVStaged, session 26): O from registers
constexpr int kVariantTraceNoEpilogue = 1 << 30;  // dev/sm90_trace only (Traits::kTrace), a what-if, WRONG
                                                 // ON PURPOSE: the register epilogue's O / LSE stores skipped
// Whether these bits can turn the staged epilogue on (Consumer::staged adds the per-kernel and per-tile
// conditions): the launcher encodes o_map only then, off the default path's host time.
constexpr bool staged_bits(int variant) {
  return (variant & kVariantNoStaged) == 0 && (variant & (kVariantQDouble | kVariantStagedSingle)) != 0;
}
// Default persistence (no bit 16 / 64): non-causal, BLKQ >= 128, unpaired tiles or paired ones at head
// dim 128, and a LUT, head dim 64 or the dense 176-key tile (docs/attention_sm90.md: round 4, the
// paired LUT since session 3, the 176 tile since session 13).
// SPARGE_SM90_VARIANT's bits; `unset` when the variable is not set (the fp8 kernels' defaults differ).
int variant_bits(int unset = 0);
// The fp8 kernels' bits (KernelFp8::launch): two Q buffers and the next tile's prefetches when the variable is unset
// (bits 2048 | 1024), less the bits that select other kernels (multicast, legacy pv_threshold, no pairing, BLKQ-64
// pairing), which do not apply to them.
inline int fp8_variant_bits() {
  return variant_bits(kVariantQDouble | kVariantEarlyNext) &
         ~(kVariantClusterKV | kVariantLegacyPv | kVariantNoPair | kVariantPairQ64);
}

// The dense tile of the Hopper kernel for this call (the variant bits above, read now): 128 x 176 at
// head dim 128 unless bit 4096 asks for 128 x 128 (a 176-key tile pays the per-tile costs of the
// consumers' loop over 176 keys; its one partial tile per row, and the tiles crossing the causal
// diagonal, are masked like any tile crossing sk); 192 x 128 at head dim 64 unless bit 8 asks for
// 128 x 128.
struct DenseTile {
  int blkq, blkk;
};
DenseTile dense_tile(int head_dim);

// Writes into order[0, num_tiles) the tiles (index as CTAs see them) sorted by the length of their
// LUT row, longest first, stably within a power-of-two length class (neighbouring tiles of one
// head stay together, for L2 reuse of its K and V). One CTA; p.lut must be set.
cudaError_t order_tiles_by_count(const KernelParams& p, int num_tiles, std::int32_t* order, cudaStream_t stream);

// Writes order[causal_pair_slot(t)] = t for every tile t of heads * nq.
cudaError_t order_tiles_causal_pairs(int num_tiles, int nq, int grid, int g, std::int32_t* order, cudaStream_t stream);

// One consumer warpgroup per 64 query rows plus one producer warpgroup.
constexpr int consumer_warpgroups(int blkq) { return blkq / 64; }
constexpr int threads_per_cta(int blkq) { return 128 * (1 + consumer_warpgroups(blkq)); }
// BLKQ 128 (and 192, dense head dim 64 only): one CTA per SM with the whole 227 KiB; BLKQ 64: two
// CTAs per SM (113 KiB each).
constexpr int ctas_per_sm(int blkq) { return blkq >= 128 ? 1 : 2; }
constexpr int smem_budget(int blkq) { return blkq >= 128 ? 232448 : 115712; }
constexpr int kSmemSlack = 1024 + 512;  // 1024-byte alignment of the tiles + the barriers + the vote rings
// eb: bytes per element of Q, K and V in shared memory (2; 1 for the fp8 recipe).
constexpr int q_bytes(int hd, int blkq, int eb = 2) { return blkq * hd * eb; }
constexpr int kv_bytes(int hd, int blkk, int eb = 2) { return blkk * hd * eb; }
// K/V stages: as many as fit (at most 4), at least one.
constexpr int stages(int hd, int blkq, int blkk, int eb = 2) {
  const int s = (smem_budget(blkq) - kSmemSlack - q_bytes(hd, blkq, eb)) / (2 * kv_bytes(hd, blkk, eb));
  return s > 4 ? 4 : (s < 1 ? 1 : s);
}
constexpr int smem_bytes(int hd, int blkq, int blkk, int eb = 2) {
  return kSmemSlack + q_bytes(hd, blkq, eb) + 2 * stages(hd, blkq, blkk, eb) * kv_bytes(hd, blkk, eb);
}

template <class T, int HD, int BLKQ, int BLKK>
struct Kernel {
  static cudaError_t attributes(cudaFuncAttributes* attr);
  static cudaError_t launch(const Sm90Params& p, int num_tiles, cudaStream_t stream);
};

// The fp8 recipe's kernel (head dim 128; T is the output dtype): Q, K, V in e4m3 from the prepass.
// 64-key LUT blocks are always paired into 128-key tiles.
template <class T, int BLKQ, int BLKK>
struct KernelFp8 {
  static cudaError_t attributes(cudaFuncAttributes* attr);
  static cudaError_t launch(const Sm90Params& p, int num_tiles, cudaStream_t stream);
};

// TMA maps of the fp8 prepass's buffers (quant.h layouts, contiguous): q8 / k8 [B, H, S, 128] bytes
// in 128-row-byte boxes of `box_rows` rows, 128-byte swizzle; v8t [B, Hk, 128, sk_pad] in boxes of
// 64 keys x 128 rows, 64-byte swizzle.
bool encode_fp8_rows_map(CUtensorMap* out, const void* base, std::int64_t b, std::int64_t h, std::int64_t s,
                         int box_rows);
bool encode_fp8_vt_map(CUtensorMap* out, const void* base, std::int64_t b, std::int64_t hk, std::int64_t sk_pad);

// 1 when this build holds an sm_90a image of the kernels and the current device runs it (a tiny
// probe kernel, launched once per device and cached); 0 otherwise.
bool image_available(int device);

}  // namespace sparge::cuda::attn::sm90
