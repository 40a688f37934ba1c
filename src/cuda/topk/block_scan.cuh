// Deterministic block-wide scans for the token kernels (topk emit, compact_mask): a warp scan with
// shuffles, then a scan of the per-warp totals by warp 0. Output slots come from these scans, never
// from atomics, so where an element lands depends only on the data (seed 003: atomic slot
// assignment made the list order, and so the softmax summation order, change from run to run).
#pragma once

#include <cstdint>

namespace sparge::cuda::scan {

__device__ __forceinline__ std::uint32_t warp_inclusive_sum(std::uint32_t v) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const std::uint32_t u = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += u;
  }
  return v;
}

// Shared storage of block_exclusive_sum: one word per warp plus the total.
template <int kThreads>
struct BlockScanStorage {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "kThreads must be a multiple of 32, at most 1024");
  std::uint32_t warp[kThreads / 32 + 1];
};

// Exclusive prefix sum of v over the threads of the block in threadIdx.x order; `total` gets the sum
// of all v. Every thread of the block must call it (it synchronises). Safe to call back to back:
// the first barrier keeps a new call from overwriting totals that a previous call still reads.
template <int kThreads>
__device__ __forceinline__ std::uint32_t block_exclusive_sum(std::uint32_t v, BlockScanStorage<kThreads>& s,
                                                             std::uint32_t& total) {
  constexpr int kWarps = kThreads / 32;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const std::uint32_t incl = warp_inclusive_sum(v);
  __syncthreads();
  if (lane == 31) s.warp[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const std::uint32_t x = lane < kWarps ? s.warp[lane] : 0u;
    const std::uint32_t xi = warp_inclusive_sum(x);
    if (lane < kWarps) s.warp[lane] = xi - x;
    if (lane == kWarps - 1) s.warp[kWarps] = xi;
  }
  __syncthreads();
  total = s.warp[kWarps];
  return s.warp[warp] + incl - v;
}

}  // namespace sparge::cuda::scan
