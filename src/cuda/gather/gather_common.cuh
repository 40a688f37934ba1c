// What the two gather_attention kernels (union.cuh builds each group's key set, attention.cuh
// attends over it) agree on: the group geometry and the scratch layout.
//
// A group is the G = Hq / Hk query heads of one kv head at `ur` consecutive query positions
// (ur = union_rows with group_union, 1 without). Its rows are numbered gr = pos * G + head, so the
// heads of one position are adjacent. The group's key set is the sorted union of its rows' lists
// (after causal pruning); each row keeps a bitmask over the union positions saying which of them
// are its own keys. A tile of the attention kernel is BM rows of one group and walks the whole
// union of that group, 64 union positions (one mask word) at a time.
#pragma once

#include <cstdint>

#include "cuda/pdl.cuh"

namespace sparge::cuda::gather {

struct Geometry {
  std::int64_t batch, sq, sk, hq, hk;
  int g;            // Hq / Hk
  int ur;           // query positions per group
  int rows;         // rows per group = g * ur (the last group of a sequence may have fewer)
  std::int64_t chunks;  // groups per (b, kv head) = ceil(sq / ur)
  bool causal;
};

struct GroupPos {
  std::int64_t b, hk, i0;
  int rows;  // rows of this group (<= Geometry::rows)
};

__host__ __device__ inline GroupPos group_pos(const Geometry& geo, std::int64_t g) {
  GroupPos p;
  const std::int64_t chunk = g % geo.chunks;
  const std::int64_t t = g / geo.chunks;
  p.hk = t % geo.hk;
  p.b = t / geo.hk;
  p.i0 = chunk * geo.ur;
  const std::int64_t npos = geo.sq - p.i0 < geo.ur ? geo.sq - p.i0 : geo.ur;
  p.rows = static_cast<int>(npos * geo.g);
  return p;
}

// Scratch of one wave of groups, slot w = group - first group of the wave:
//   union_size[w]                              number of keys in the union, U
//   union_keys[w * ucap + u], u < U            the union, ascending key positions
//   masks[(w * words_cap + u / 64) * rows + gr] bit u % 64: union position u is in row gr's list
struct Scratch {
  std::int32_t* union_size;
  std::int32_t* union_keys;
  unsigned long long* masks;
  std::int64_t ucap;       // >= any group's U: min(Sk, rows * n_max)
  std::int64_t words_cap;  // ceil(ucap / 64)
};

// Programmatic dependent launch (SPARGE_GATHER_PDL=1, gather.cu; pdl_wait / pdl_launch_dependents from
// cuda/pdl.cuh): the attention kernel may be launched while the union kernel before it is still
// running; it calls pdl_wait() before it reads anything the union kernel writes. The union kernel
// lets the dependent launch start as soon as all its CTAs are running (pdl_launch_dependents at its
// top), so attention CTAs fill SMs as union CTAs leave.

// Flag words (error_flags.cuh) of gather_attention.
enum FlagWord : int { kBadCount = 0, kBadIndex = 1, kDuplicate = 2, kNumFlags = 3 };

}  // namespace sparge::cuda::gather
