// Pure arithmetic of the Hopper kernel's persistent schedules, shared by the launcher, the kernels
// and the CPU tests (no CUDA types here).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPARGE_SCHED_HD __host__ __device__
#else
#define SPARGE_SCHED_HD
#endif

namespace sparge::cuda::attn::sm90 {

// The persistent order of causal dense tiles (session 16; docs/attention_sm90.md, "Causal pairs"): the
// slot of `tile` (make_tile's index: head-major, heavy_first query blocks) when `grid` CTAs walk slots
// x, x + grid, ... in clusters of g (1, or 2 with K/V multicast: tiles 2w, 2w + 1 of one head stay
// neighbouring slots of one round; nq % g == 0). A head's units of g tiles pair up heavy with light,
// (u, U - 1 - u), and lane c (CTAs c g .. c g + g - 1) takes item I = m C + c's heavy unit in round 2m
// and its light unit in round 2m + 1: with rows growing linearly in qb every lane does about the same
// work per round pair, and a round pair spans ~C / (U / 2) heads (their K/V shared in L2). The items
// left after the whole round pairs (heavy units, then light ones) and each head's middle unit (U odd)
// take the last slots: the split tail's round. A permutation of [0, heads * nq) for grid % g == 0.
SPARGE_SCHED_HD inline std::int64_t causal_pair_slot(std::int64_t tile, int nq, std::int64_t heads, int grid,
                                                         int g) {
  const std::int64_t head = tile / nq;
  const int i = static_cast<int>(tile % nq);
  const int units = nq / g, u = i / g, k = i % g;
  const int per_head = units / 2;
  const std::int64_t lanes = grid / g;
  const std::int64_t items = heads * per_head;
  const std::int64_t whole = items / lanes;  // round pairs every lane takes part in
  const std::int64_t left = items - whole * lanes;
  const std::int64_t tail = 2 * whole * lanes * g;
  if (units % 2 == 1 && u == units / 2) return tail + 2 * left * g + head * g + k;
  const bool light = u > units - 1 - u;
  const std::int64_t item = head * per_head + (light ? units - 1 - u : u);
  if (item < whole * lanes) {
    const std::int64_t m = item / lanes, c = item % lanes;
    return (2 * m + (light ? 1 : 0)) * grid + c * g + k;
  }
  return tail + (light ? left * g : 0) + (item - whole * lanes) * g + k;
}
}  // namespace sparge::cuda::attn::sm90
