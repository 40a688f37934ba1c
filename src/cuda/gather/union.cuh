// gather_attention, step 1: per group, the sorted union of its rows' key lists and each row's
// membership mask over that union (layout in gather_common.cuh).
//
// A group runs on `ctas` CTAs (UnionArgs::ctas): 1, or on sm_90 a thread block cluster of up to 8,
// each CTA owning a contiguous slice of the group's rows. The index lists are the bulk of the
// traffic of the whole op (hd128, 2048 keys per row: 4 bytes of index per 128 FLOPs), so they are
// read with 16-byte loads, four per lane in flight, and each slice is read twice by its own CTA
// (phase A: union bitmap; phase B: masks) so the second read is an L2 hit.
//   phase A  each CTA sets the bits of its rows' keys in a shared bitmap over the Sk keys; with a
//            cluster, every CTA then ORs the cluster's bitmaps (distributed shared memory), so all
//            CTAs hold the group's union;
//   ranks    a block-wide scan of the words' popcounts gives each word's first union position;
//            CTA 0 writes the sorted union;
//   phase B  each row's membership mask is built in shared memory (64-bit atomicOr, batches of
//            rows that fit) and stored with coalesced plain stores; when not even one row's mask
//            fits, atomicOr goes straight to global memory (zeroed first).
// Everything is order-independent (atomicOr is idempotent, positions come from a scan), so the
// result is deterministic without any ordering of threads. Entries that fail validation (count
// outside [0, n_max], key outside [0, Sk), a key listed twice by one row) are recorded in the flag
// words and skipped, so nothing is written out of bounds; the host turns the flags into a Status.
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include <cooperative_groups.h>
#endif

#include "cuda/gather/gather_common.cuh"
#include "cuda/topk/block_scan.cuh"
#include "cuda/topk/error_flags.cuh"

namespace sparge::cuda::gather {

constexpr int kUnionThreads = 512;
constexpr int kUnionMaxCtas = 8;  // portable cluster size limit

struct UnionArgs {
  Geometry geo;
  const std::int32_t* indices;  // [B, L, Sq, n_max], L = list_heads
  std::int64_t x0, x1, x2, x3;
  const std::int32_t* counts;   // [B, L, Sq]
  std::int64_t list_heads;      // L: Hq (one list per query head) or Hk (one per kv head)
  // Group rows sharing one list: 1 with per-query-head lists; G = Hq / Hk with per-kv-head lists,
  // where the G rows gr = pos * G + head of a position read the same list. The kernel works on
  // "units" (one list each: units = rows / list_rep), reads each list once and writes its mask to
  // the unit's list_rep rows.
  int list_rep;
  std::int64_t n0, n1, n2;
  int n_max;
  std::int64_t first_group;
  int words_k;  // ceil(Sk / 32): bitmap words
  Scratch scratch;
  unsigned long long* flags;  // FlagWord
  bool vec4;         // x3 == 1, every row 16-byte aligned and n_max % 4 == 0: int4 loads
  int ctas;          // CTAs per group; > 1 only in a cluster launch of that size (sm_90)
  int rows_per_cta;  // units per CTA: ceil(geo.rows / list_rep / ctas)
  int mask_rows;     // units whose masks fit in shared memory at once; 0: global atomics
  int mask_off;      // byte offset of the shared mask area (after bitmap and ranks)
};

// Calls fn(unit, row_id, j) for every valid, causally visible entry of every unit (list) in
// [r_begin, r_end) of the group, one warp per list; row_id = (b * L + l) * Sq + i names the list.
template <class Fn>
__device__ __forceinline__ void for_each_entry(const UnionArgs& a, const GroupPos& gp, int r_begin, int r_end,
                                               bool record, Fn&& fn) {
  const Geometry& geo = a.geo;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  constexpr int kWarps = kUnionThreads / 32;
  for (int gr = r_begin + warp; gr < r_end; gr += kWarps) {
    // Per-query-head lists: unit gr is row gr (position gr / G, head gr % G). Per-kv-head lists:
    // unit gr is position gr, list head = the kv head. (G == 1: both agree.)
    const bool per_row = a.list_rep == 1;
    const std::int64_t i = gp.i0 + (per_row ? gr / geo.g : gr);
    const std::int64_t h = per_row ? gp.hk * geo.g + gr % geo.g : gp.hk;
    const std::uint64_t row_id = static_cast<std::uint64_t>((gp.b * a.list_heads + h) * geo.sq + i);
    int cnt = a.counts[gp.b * a.n0 + h * a.n1 + i * a.n2];
    if (cnt < 0 || cnt > a.n_max) {
      if (record && lane == 0) flags::record(&a.flags[kBadCount], row_id, static_cast<std::uint32_t>(cnt));
      cnt = cnt < 0 ? 0 : a.n_max;
    }
    const std::int32_t* list = a.indices + gp.b * a.x0 + h * a.x1 + i * a.x2;
    const std::int64_t bound = i + geo.sk - geo.sq;  // causal: key j visible iff j <= bound
    auto entry = [&](int t, std::int32_t j) {
      if (j < 0 || j >= geo.sk) {
        if (record) flags::record(&a.flags[kBadIndex], row_id, static_cast<std::uint32_t>(t));
        return;
      }
      if (geo.causal && j > bound) return;
      fn(gr, row_id, j);
    };
    if (a.vec4) {
      // Four 16-byte loads per lane issued before any is used: enough bytes in flight to stream
      // the lists near DRAM bandwidth. Chunks past ceil(cnt / 4) are not read (n_max % 4 == 0
      // keeps every chunk read inside the row).
      const int4* l4 = reinterpret_cast<const int4*>(list);
      const int n4 = (cnt + 3) >> 2;
      for (int base = 0; base < n4; base += 4 * 32) {
        int4 v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int c4 = base + k * 32 + lane;
          v[k] = c4 < n4 ? __ldg(l4 + c4) : make_int4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int t0 = (base + k * 32 + lane) * 4;
          if (t0 + 0 < cnt) entry(t0 + 0, v[k].x);
          if (t0 + 1 < cnt) entry(t0 + 1, v[k].y);
          if (t0 + 2 < cnt) entry(t0 + 2, v[k].z);
          if (t0 + 3 < cnt) entry(t0 + 3, v[k].w);
        }
      }
    } else {
      for (int t = lane; t < cnt; t += 32) entry(t, list[t * a.x3]);
    }
  }
}

__global__ void __launch_bounds__(kUnionThreads) union_kernel(const UnionArgs a) {
  extern __shared__ __align__(16) unsigned char union_smem[];
  std::uint32_t* bitmap = reinterpret_cast<std::uint32_t*>(union_smem);  // [words_k]
  std::uint32_t* rank = bitmap + a.words_k;  // [words_k]: union position of the word's first key
  unsigned long long* smask = reinterpret_cast<unsigned long long*>(union_smem + a.mask_off);
  __shared__ scan::BlockScanStorage<kUnionThreads> scan_storage;
  const int tid = static_cast<int>(threadIdx.x);
  const std::int64_t w = blockIdx.x / a.ctas;
  const int crank = static_cast<int>(blockIdx.x % a.ctas);  // the cluster rank: clusters are (ctas, 1, 1)
  const GroupPos gp = group_pos(a.geo, a.first_group + w);
  const Scratch& s = a.scratch;
  const int rep = a.list_rep;
  const int units = gp.rows / rep;  // gp.rows = positions * G, and rep is 1 or G
  const int r_begin = min(units, crank * a.rows_per_cta);  // this CTA's units
  const int r_end = min(units, r_begin + a.rows_per_cta);

  // Phase A: this CTA's rows' keys.
  for (int i = tid; i < a.words_k; i += kUnionThreads) bitmap[i] = 0;
  __syncthreads();
  // A bit already set needs no atomic: rows of a group share most keys, and atomics on one word
  // serialise. (A stale read only costs a redundant atomicOr.)
  for_each_entry(a, gp, r_begin, r_end, true, [&](int, std::uint64_t, std::int32_t j) {
    const std::uint32_t bit = 1u << (j & 31);
    if ((bitmap[j >> 5] & bit) == 0) atomicOr(&bitmap[j >> 5], bit);
  });
  if (a.ctas > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // The group's union = OR of the cluster's bitmaps. The first cluster barrier publishes every
    // CTA's bitmap (release/acquire at cluster scope); the OR goes to `rank` (free until the scan)
    // because other CTAs may still be reading this CTA's bitmap; the second barrier says that all
    // remote reads are done, so each CTA may overwrite (and later leave with) its own bitmap.
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    cluster.sync();
    for (int i = tid; i < a.words_k; i += kUnionThreads) {
      std::uint32_t x = 0;
      for (int c = 0; c < a.ctas; ++c) x |= cluster.map_shared_rank(bitmap, static_cast<unsigned>(c))[i];
      rank[i] = x;
    }
    cluster.sync();
    for (int i = tid; i < a.words_k; i += kUnionThreads) bitmap[i] = rank[i];
#else
    __trap();  // the host launches clusters on sm_90 only
#endif
  }
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
    if (crank == 0) {
      std::uint32_t bits = bitmap[i];
      while (bits != 0) {
        const int bit = __ffs(static_cast<int>(bits)) - 1;
        keys[pos++] = i * 32 + bit;
        bits &= bits - 1;
      }
    }
  }
  if (tid == 0 && crank == 0) s.union_size[w] = static_cast<std::int32_t>(total);
  const int words_u = static_cast<int>((total + 63) / 64);
  unsigned long long* gmask = s.masks + w * s.words_cap * a.geo.rows;
  auto union_pos = [&](std::int32_t j) {
    return rank[j >> 5] + __popc(bitmap[j >> 5] & ((1u << (j & 31)) - 1u));
  };

  // Phase B: masks of this CTA's units; unit r's mask is the mask of rows r * rep .. r * rep + rep - 1.
  if (a.mask_rows > 0) {
    const int ms = words_u | 1;  // odd stride in 8-byte words: the store loop's reads hit distinct banks
    for (int rb = r_begin; rb < r_end; rb += a.mask_rows) {
      const int re = min(r_end, rb + a.mask_rows);
      const int nr = re - rb;
      __syncthreads();  // ranks ready (first batch); the previous batch's stores have read smask
      for (int i = tid; i < nr * ms; i += kUnionThreads) smask[i] = 0;
      __syncthreads();
      // 32-bit shared atomics on the halves of the 64-bit words (little-endian: bit u % 64 of word
      // u / 64 is bit u % 32 of half u / 32).
      std::uint32_t* smask32 = reinterpret_cast<std::uint32_t*>(smask);
      for_each_entry(a, gp, rb, re, false, [&](int gr, std::uint64_t row_id, std::int32_t j) {
        const std::uint32_t u = union_pos(j);
        const std::uint32_t bit = 1u << (u & 31);
        const std::uint32_t old = atomicOr(&smask32[(gr - rb) * 2 * ms + static_cast<int>(u >> 5)], bit);
        // Which of two equal entries comes second depends on scheduling, so record the key, not t.
        if (old & bit) flags::record(&a.flags[kDuplicate], row_id, static_cast<std::uint32_t>(j));
      });
      __syncthreads();
      // Row rb * rep + lr of the group gets unit rb + lr / rep's mask (coalesced over rows).
      const int nrows = nr * rep;
      for (int i = tid; i < words_u * nrows; i += kUnionThreads) {
        const int word = i / nrows, lr = i - word * nrows;
        gmask[static_cast<std::int64_t>(word) * a.geo.rows + rb * rep + lr] = smask[(lr / rep) * ms + word];
      }
    }
  } else {
    const int nrows = (r_end - r_begin) * rep;
    for (int i = tid; i < words_u * nrows; i += kUnionThreads) {
      const int word = i / nrows, lr = i - word * nrows;
      gmask[static_cast<std::int64_t>(word) * a.geo.rows + r_begin * rep + lr] = 0;
    }
    __syncthreads();  // ranks ready, zeroed masks visible to the block
    for_each_entry(a, gp, r_begin, r_end, false, [&](int unit, std::uint64_t row_id, std::int32_t j) {
      const std::uint32_t u = union_pos(j);
      const unsigned long long bit = 1ull << (u & 63);
      unsigned long long* word = gmask + static_cast<std::int64_t>(u >> 6) * a.geo.rows + unit * rep;
      // Every row of the unit receives the same ORs, so the first row's old value tells a repeat.
      const unsigned long long old = atomicOr(word, bit);
      for (int r = 1; r < rep; ++r) atomicOr(word + r, bit);
      if (old & bit) flags::record(&a.flags[kDuplicate], row_id, static_cast<std::uint32_t>(j));
    });
  }
}

}  // namespace sparge::cuda::gather
