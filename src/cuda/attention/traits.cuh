// Tile shapes of the portable kernel and the shared-memory layout that follows from them.
//
// One CTA owns one query block (BLKQ rows) so that decisions defined per query block (pv_threshold)
// are one CTA-wide vote. Each warp owns kWarpRows query rows: 16 (one m16n8k16 M tile, Q kept in
// registers) or 32 (two M tiles that share every K/V fragment an ldmatrix brings from shared memory;
// Q is then re-read from shared memory per k-step, there is no register room for it). The key tile
// kTileK is either the whole LUT block (BLKK; needed by pv_threshold, which is decided on the whole
// key block's row maxima) or a 64-key sub-tile of it when pv_threshold is off.
#pragma once

#include <cstdint>

namespace sparge::cuda::attn {

template <class T_, int HD_, int BLKQ_, int BLKK_, int WARP_ROWS_, int TILE_K_, int MIN_CTAS_ = 0>
struct Traits {
  using T = T_;
  static constexpr int kHeadDim = HD_;
  static constexpr int kBlockQ = BLKQ_;
  static constexpr int kBlockK = BLKK_;  // the LUT's key block
  static constexpr int kWarpRows = WARP_ROWS_;
  static constexpr int kTileK = TILE_K_;  // keys per pipeline step
  static_assert(kWarpRows == 16 || kWarpRows == 32, "a warp owns one or two m16 tiles");
  static_assert(kBlockQ % kWarpRows == 0 && kBlockK % kTileK == 0 && kTileK % 16 == 0, "tiles must nest");
  static constexpr int kMTiles = kWarpRows / 16;
  static constexpr int kRows = 2 * kMTiles;  // accumulator rows per thread (g, g + 8 of each M tile)
  static constexpr int kRowGroups = kBlockQ / kWarpRows;
  static constexpr int kWarps = kRowGroups;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kSubTiles = kBlockK / kTileK;  // > 1 only when pv_threshold is off
  static constexpr bool kQInRegs = kMTiles == 1;
  static constexpr int kMinCtas = MIN_CTAS_;  // CTAs per SM asked of ptxas; 0 = kernel.cuh's rule

  // Shared memory rows hold kHeadDim elements = kChunks 16-byte chunks.
  static constexpr int kChunks = kHeadDim * 2 / 16;
  static_assert(kChunks >= 8, "the xor swizzle needs at least 8 chunks (128 bytes) per row");
  static constexpr int kQBytes = kBlockQ * kHeadDim * 2;
  static constexpr int kKVBytes = kTileK * kHeadDim * 2;
  // Two stages each for K and V: K of tile i+1 loads while tile i computes, V of tile i+1 while
  // tile i's PV runs (docs/attention_portable.md, "pipeline").
  static constexpr int kStages = 2;
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVBytes;

  // Register tiles per warp.
  static constexpr int kDTiles = kHeadDim / 8;  // n-tiles of O
  static constexpr int kKTiles = kTileK / 8;  // n-tiles of S
  static constexpr int kDSteps = kHeadDim / 16;  // k-steps of QK^T
  static constexpr int kKSteps = kTileK / 16;  // k-steps of PV
};

// The two shapes a (dtype, head dim, BLKQ, BLKK) instantiation launches (a tuning choice: it changes
// speed, never results beyond summation order):
// - Streaming (pv_threshold off, or BLKK = 64): 64-key tiles; 32 rows per warp for BLKQ 128 (4 warps,
//   FA2's forward shape, two CTAs per SM), 16 for BLKQ 64 (4 warps).
// - Whole block (pv_threshold on with BLKK = 128): one 128-key tile, 16 rows per warp (the 128-key
//   scores of 32 rows do not fit next to the O accumulator).
constexpr int kStreamTileK = 64;
// hd 64 with 32 rows per warp and BLKK 64 asks for three CTAs per SM (168 registers, a few spilled):
// H200 dense hd64 298 TFLOPS against 277 at two CTAs (docs/attention_portable.md).
template <class T, int HD, int BLKQ, int BLKK>
using StreamTraits = Traits<T, HD, BLKQ, BLKK, (BLKQ >= 128 ? 32 : 16), (BLKK < kStreamTileK ? BLKK : kStreamTileK),
                            (HD == 64 && BLKQ >= 128 && BLKK == 64 ? 3 : 0)>;
template <class T, int HD, int BLKQ, int BLKK>
using WholeBlockTraits = Traits<T, HD, BLKQ, BLKK, 16, BLKK>;

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of `chunks` chunks per row. The chunk
// index is xor-ed with row % 8: the 8 rows an ldmatrix phase reads (same logical chunk) land in 8
// different 16-byte bank groups, and so do the 8 chunks one cp.async phase writes.
__device__ __forceinline__ std::uint32_t swizzle(int row, int chunk, int chunks) {
  return static_cast<std::uint32_t>((row * chunks + (chunk ^ (row & 7))) * 16);
}

// The fragment loads read rows r0 + (lane's row) with r0 a multiple of 8 and chunks 2c + (lane's
// chunk bit), so row % 8 is the lane's and the swizzled offset splits into
//   swizzle(r0 + row, 2c + bit) = r0 * row_bytes + (swizzle(row, bit) ^ (c * 32)),
// a per-lane base computed once, an immediate xor and an add, instead of one live register per
// (row, chunk) pair.
__device__ __forceinline__ std::uint32_t swizzle_at(std::uint32_t lane_base, int r0, int c, int chunks) {
  return static_cast<std::uint32_t>(r0 * chunks * 16) + (lane_base ^ static_cast<std::uint32_t>(c * 32));
}

}  // namespace sparge::cuda::attn
