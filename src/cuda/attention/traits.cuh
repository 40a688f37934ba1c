// Tile shapes of the portable kernel and the shared-memory layout that follows from them.
//
// One CTA owns one query block (BLKQ rows) so that decisions defined per query block (pv_threshold)
// are one CTA-wide vote. Each warp owns 16 query rows (the M of one m16n8k16), so the CTA has
// BLKQ / 16 warps. The key tile is one LUT block (BLKK keys): pv_threshold is decided on the whole
// key block's row maxima, so the block's scores live in registers at once.
#pragma once

#include <cstdint>

namespace sparge::cuda::attn {

template <class T_, int HD_, int BLKQ_, int BLKK_>
struct Traits {
  using T = T_;
  static constexpr int kHeadDim = HD_;
  static constexpr int kBlockQ = BLKQ_;
  static constexpr int kBlockK = BLKK_;
  static constexpr int kWarps = kBlockQ / 16;
  static constexpr int kThreads = kWarps * 32;

  // Shared memory rows hold kHeadDim elements = kChunks 16-byte chunks.
  static constexpr int kChunks = kHeadDim * 2 / 16;
  static_assert(kChunks >= 8, "the xor swizzle needs at least 8 chunks (128 bytes) per row");
  static constexpr int kQBytes = kBlockQ * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockK * kHeadDim * 2;
  // Two stages each for K and V: K of block i+1 loads while block i computes, V of block i+1
  // while block i's PV runs (docs/attention_portable.md, "pipeline").
  static constexpr int kStages = 2;
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVBytes;

  // Register tiles per warp.
  static constexpr int kDTiles = kHeadDim / 8;   // n-tiles of O
  static constexpr int kKTiles = kBlockK / 8;    // n-tiles of S
  static constexpr int kDSteps = kHeadDim / 16;  // k-steps of QK^T
  static constexpr int kKSteps = kBlockK / 16;   // k-steps of PV
};

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
