// The Hopper kernel's persistent schedule for causal dense tiles (src/cuda/attention/sm90/schedule.h,
// docs/attention_sm90.md "Causal pairs"), on the CPU:
//   SCHED_CAUSAL_PAIRS   - causal_pair_slot is a permutation of the tiles for any query-block count,
//                          head count, grid and cluster size; with clusters of 2 the tiles 2w, 2w + 1
//                          of a head sit in slots 2x, 2x + 1 of one round (the multicast partners).
//   SCHED_CAUSAL_BALANCE - at the benchmark shape (b2 h32 s16384, 128 x 176 tiles, 132 CTAs) every
//                          CTA's work over the whole rounds is within 1% of the others' (the pairs
//                          walking the longer row of the two with multicast, as the kernel does);
//                          the plain striding of the same tiles is not (the 11% of session 13).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/attention/sm90/schedule.h"
#include "harness/harness.h"

namespace sparge::test {
namespace {

using cuda::attn::sm90::causal_pair_slot;

std::vector<std::int64_t> order_of(int nq, int heads, int grid, int g) {
  const std::int64_t n = static_cast<std::int64_t>(nq) * heads;
  std::vector<std::int64_t> order(static_cast<std::size_t>(n), -1);
  for (std::int64_t t = 0; t < n; ++t) {
    const std::int64_t s = causal_pair_slot(t, nq, heads, grid, g);
    EXPECT_TRUE(s >= 0 && s < n) << "tile " << t << " -> slot " << s;
    if (s < 0 || s >= n) continue;
    EXPECT_EQ(order[static_cast<std::size_t>(s)], -1) << "slot " << s << " taken twice (tile " << t << ")";
    order[static_cast<std::size_t>(s)] = t;
  }
  return order;
}

SPARGE_CASES(SCHED_CAUSAL_PAIRS) {
  for (int g : {1, 2})
    for (int nq : {1, 2, 3, 4, 5, 6, 7, 8, 63, 64, 127, 128})
      for (int heads : {1, 2, 3, 64})
        for (int grid : {1, 2, 6, 10, 131, 132, 264}) {
          if (nq % g != 0 || grid % g != 0) continue;
          cases.push_back({Name("SCHED_CAUSAL_PAIRS")("g", g)("nq", nq)("heads", heads)("grid", grid), [=] {
                             const auto order = order_of(nq, heads, grid, g);
                             for (std::size_t s = 0; s < order.size(); ++s) {
                               ASSERT_GE(order[s], 0) << "slot " << s << " empty";
                               if (g == 2) {
                                 // Partners: the slot's neighbour in its pair holds tile ^ 1.
                                 ASSERT_EQ(order[s ^ 1], order[s] ^ 1) << "slot " << s;
                               }
                             }
                           }});
        }
}

// Per CTA the 176-key tiles walked over the whole rounds (slots below the last partial round).
std::vector<std::int64_t> cta_work(const std::vector<std::int64_t>& order, int nq, int grid, bool mc) {
  const auto blocks = [nq](std::int64_t t) {
    const std::int64_t qb = nq - 1 - t % nq;  // heavy_first, as make_tile
    return ((qb + 1) * 128 + 175) / 176;
  };
  const std::size_t whole = order.size() / static_cast<std::size_t>(grid) * static_cast<std::size_t>(grid);
  std::vector<std::int64_t> work(static_cast<std::size_t>(grid), 0);
  for (std::size_t s = 0; s < whole; ++s) {
    const std::int64_t t = order[s];
    work[s % static_cast<std::size_t>(grid)] += mc ? std::max(blocks(t), blocks(t ^ 1)) : blocks(t);
  }
  return work;
}

double spread(const std::vector<std::int64_t>& w) {
  const auto [lo, hi] = std::minmax_element(w.begin(), w.end());
  return static_cast<double>(*hi) / static_cast<double>(*lo);
}

SPARGE_CASES(SCHED_CAUSAL_BALANCE) {
  for (int g : {1, 2}) {
    cases.push_back({Name("SCHED_CAUSAL_BALANCE")("g", g)("nq", 128)("heads", 64)("grid", 132), [=] {
                       const int nq = 128, heads = 64, grid = 132;
                       const auto paired = order_of(nq, heads, grid, g);
                       std::vector<std::int64_t> plain(paired.size());
                       for (std::size_t i = 0; i < plain.size(); ++i) plain[i] = static_cast<std::int64_t>(i);
                       const double sp = spread(cta_work(paired, nq, grid, g == 2));
                       const double pl = spread(cta_work(plain, nq, grid, g == 2));
                       EXPECT_LT(sp, 1.01) << "paired order: slowest / fastest CTA";
                       EXPECT_GT(pl, 1.05) << "plain striding (the check's control)";
                     }});
  }
}

}  // namespace
}  // namespace sparge::test
