// gather_attention, step 1: per group, the sorted union of its rows' key lists and each row's
// membership mask over that union (layout in gather_common.cuh). One CTA per group.
//
// Everything here is order-independent, so the result is deterministic without any ordering of
// threads: the union is a bitmap over the Sk keys in shared memory (atomicOr is idempotent), its
// positions come from a block-wide scan of the words' popcounts, and each row's mask bits are set
// with atomicOr too. Entries that fail validation (count outside [0, n_max], key outside [0, Sk),
// a key listed twice by one row) are recorded in the flag words and skipped, so nothing is written
// out of bounds; the host turns the flags into an error Status.
#pragma once

#include <cstdint>

#include "cuda/gather/gather_common.cuh"
#include "cuda/topk/block_scan.cuh"
#include "cuda/topk/error_flags.cuh"

namespace sparge::cuda::gather {

constexpr int kUnionThreads = 512;

struct UnionArgs {
  Geometry geo;
  const std::int32_t* indices;  // [B, Hq, Sq, n_max]
  std::int64_t x0, x1, x2, x3;
  const std::int32_t* counts;   // [B, Hq, Sq]
  std::int64_t n0, n1, n2;
  int n_max;
  std::int64_t first_group;
  int words_k;  // ceil(Sk / 32): bitmap words
  Scratch scratch;
  unsigned long long* flags;  // FlagWord
};

// Calls fn(gr, t, j) for every valid, causally visible entry t of every row gr of the group.
template <class Fn>
__device__ __forceinline__ void for_each_entry(const UnionArgs& a, const GroupPos& gp, bool record, Fn&& fn) {
  const Geometry& geo = a.geo;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  constexpr int kWarps = kUnionThreads / 32;
  for (int gr = warp; gr < gp.rows; gr += kWarps) {
    const std::int64_t i = gp.i0 + gr / geo.g;
    const std::int64_t h = gp.hk * geo.g + gr % geo.g;
    const std::uint64_t row_id = static_cast<std::uint64_t>((gp.b * geo.hq + h) * geo.sq + i);
    int cnt = a.counts[gp.b * a.n0 + h * a.n1 + i * a.n2];
    if (cnt < 0 || cnt > a.n_max) {
      if (record && lane == 0) flags::record(&a.flags[kBadCount], row_id, static_cast<std::uint32_t>(cnt));
      cnt = cnt < 0 ? 0 : a.n_max;
    }
    const std::int32_t* list = a.indices + gp.b * a.x0 + h * a.x1 + i * a.x2;
    const std::int64_t bound = i + geo.sk - geo.sq;  // causal: key j visible iff j <= bound
    for (int t = lane; t < cnt; t += 32) {
      const std::int32_t j = list[t * a.x3];
      if (j < 0 || j >= geo.sk) {
        if (record) flags::record(&a.flags[kBadIndex], row_id, static_cast<std::uint32_t>(t));
        continue;
      }
      if (geo.causal && j > bound) continue;
      fn(gr, row_id, j);
    }
  }
}

__global__ void __launch_bounds__(kUnionThreads) union_kernel(const UnionArgs a) {
  extern __shared__ std::uint32_t smem[];
  std::uint32_t* bitmap = smem;              // [words_k]
  std::uint32_t* rank = smem + a.words_k;    // [words_k]: union position of the word's first key
  __shared__ scan::BlockScanStorage<kUnionThreads> scan_storage;
  const int tid = static_cast<int>(threadIdx.x);
  const std::int64_t w = blockIdx.x;
  const GroupPos gp = group_pos(a.geo, a.first_group + w);
  const Scratch& s = a.scratch;

  for (int i = tid; i < a.words_k; i += kUnionThreads) bitmap[i] = 0;
  __syncthreads();
  for_each_entry(a, gp, true, [&](int, std::uint64_t, std::int32_t j) { atomicOr(&bitmap[j >> 5], 1u << (j & 31)); });
  __syncthreads();

  // Union positions: each thread owns a contiguous run of bitmap words.
  const int per = (a.words_k + kUnionThreads - 1) / kUnionThreads;
  const int w_lo = min(tid * per, a.words_k), w_hi = min(w_lo + per, a.words_k);
  std::uint32_t local = 0;
  for (int i = w_lo; i < w_hi; ++i) local += __popc(bitmap[i]);
  std::uint32_t total = 0;
  std::uint32_t pos = scan::block_exclusive_sum<kUnionThreads>(local, scan_storage, total);
  std::int32_t* keys = s.union_keys + w * s.ucap;
  for (int i = w_lo; i < w_hi; ++i) {
    rank[i] = pos;
    std::uint32_t bits = bitmap[i];
    while (bits != 0) {
      const int bit = __ffs(static_cast<int>(bits)) - 1;
      keys[pos++] = i * 32 + bit;
      bits &= bits - 1;
    }
  }
  if (tid == 0) s.union_size[w] = static_cast<std::int32_t>(total);
  unsigned long long* masks = s.masks + w * s.words_cap * a.geo.rows;
  const std::int64_t words_u = (static_cast<std::int64_t>(total) + 63) / 64;
  for (std::int64_t i = tid; i < words_u * a.geo.rows; i += kUnionThreads) masks[i] = 0;
  __syncthreads();  // ranks in shared memory and zeroed masks in global memory, visible to the block

  for_each_entry(a, gp, false, [&](int gr, std::uint64_t row_id, std::int32_t j) {
    const std::uint32_t word = bitmap[j >> 5];
    const std::uint32_t u = rank[j >> 5] + __popc(word & ((1u << (j & 31)) - 1u));
    const unsigned long long bit = 1ull << (u & 63);
    const unsigned long long old = atomicOr(&masks[(u >> 6) * a.geo.rows + gr], bit);
    // Which of two equal entries comes second depends on scheduling, so record the key, not t.
    if (old & bit) flags::record(&a.flags[kDuplicate], row_id, static_cast<std::uint32_t>(j));
  });
}

}  // namespace sparge::cuda::gather
