// A small parallel-for over an index range for the CPU backend. Work is split into contiguous
// chunks handed out dynamically; each index runs exactly once, so results never depend on the
// thread count (every index writes its own outputs; no cross-index reductions happen here).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace sparge::cpu {

inline int resolve_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

// Calls fn(i) for every i in [0, n). `grain` indices are claimed at a time.
template <class Fn>
void parallel_for(std::int64_t n, int threads, Fn&& fn, std::int64_t grain = 1) {
  if (n <= 0) return;
  const int t = static_cast<int>(std::min<std::int64_t>(resolve_threads(threads), (n + grain - 1) / grain));
  if (t <= 1) {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<std::int64_t> next{0};
  auto worker = [&] {
    for (;;) {
      const std::int64_t start = next.fetch_add(grain);
      if (start >= n) return;
      const std::int64_t end = std::min(n, start + grain);
      for (std::int64_t i = start; i < end; ++i) fn(i);
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(t - 1));
  for (int i = 1; i < t; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
}

}  // namespace sparge::cpu
