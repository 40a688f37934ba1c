// gather_attention, step 1: per group, the sorted union of its rows' key lists and each row's
// membership mask over that union (layout in gather_common.cuh).
//
// A group runs on `ctas` CTAs (UnionArgs::ctas): 1, or on sm_90 a thread block cluster of up to 8,
// each CTA owning a contiguous slice of the group's rows. The index lists are the bulk of the
// traffic of the whole op (hd128, 2048 keys per row: 4 bytes of index per 128 FLOPs), so they are
// read with 16-byte loads, four per lane in flight.
// Default (variant kRowBitmaps, where Sk <= 65536 and it fits in shared memory): each CTA reads its
// slice ONCE. Phase A sets every visible entry's bit in its list's own bitmap over the Sk keys (one
// shared atomic per entry, whose old value tells a repeated key); the CTA's union bitmap is the OR
// of those; cluster OR, ranks and the sorted union as below (every CTA also keeps the union as u16
// keys); phase B needs no list: mask word m of list r is two warp ballots of "key ukeys[64 m + b]
// is in r's bitmap", stored coalesced. Per entry that is one shared atomic in all; the path below
// costs per entry a bitmap test (+ atomic), a second (L2) read and a position lookup + atomic.
// The two-read path (variant bits 1 and 2 without 4, or where the bitmaps do not fit):
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
  // SPARGE_GATHER_UNION_VARIANT bits (same bits out under every value):
  //   kStream    vec4 lists through stream_entries (next batch in flight while one is processed);
  //   kPosMap    phase B looks union positions up in a 16-bit key -> position map in shared memory
  //              (pos_off; only when Sk <= kPosMapMaxKeys and it fits) instead of rank + popcount.
  //   kRowBitmaps each CTA reads its lists once: phase A sets each list's keys in the list's own
  //              bitmap over the Sk keys in shared memory (rowbm_off; the union bitmap is their OR,
  //              a repeated key is a bit already set), phase B builds the masks from those bitmaps
  //              with warp ballots over the union positions (ukeys_off: the union as u16 keys), no
  //              second read of the lists and no per-entry atomics or position lookups in phase B.
  //              Taken when Sk <= kRowBitmapMaxKeys and it fits (host); kPosMap is then unused.
  int variant;
  int pos_off;       // byte offset of the position map; < 0: no map
  int rowbm_off;     // byte offset of the per-list bitmaps [rows_per_cta][words_k]; < 0: not used
  int ukeys_off;     // byte offset of the union keys as u16 [ucap] (with rowbm_off)
};

enum UnionVariant : int { kStream = 1, kPosMap = 2, kRowBitmaps = 4 };
constexpr int kRowBitmapMaxKeys = 65536;  // union keys stored as u16
constexpr int kPosMapMaxKeys = 32768;  // 64 KB of u16 positions

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

// The vec4 iterator of variant kStream: a warp's lists as one stream of batches (4 x 16-byte loads
// per lane = 512 entries per warp), the next batch's loads issued before the current batch is
// processed, so each warp has a batch in flight while it works, instead of one round trip per batch
// plus one for each list's count. A list's first batch is read before its count is known (chunks
// below n_max / 4: inside the row), then entries past the count are ignored. Per entry the checks
// are branch-free: fn(unit, j, ok) sees j = 0 when !ok (so its shared-memory reads stay in bounds)
// and returns nonzero when the entry repeats a key of its list; repeats are flagged once per batch
// (the host re-reads the flagged list, so which entry repeated does not matter here).
template <class Fn>
__device__ __forceinline__ void stream_entries(const UnionArgs& a, const GroupPos& gp, int r_begin, int r_end, bool record, Fn&& fn) {
  const Geometry& geo = a.geo;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  constexpr int kWarps = kUnionThreads / 32;
  constexpr int kBatch = 4 * 32;  // 16-byte chunks per warp batch
  const int n4max = a.n_max >> 2;
  const int sk = static_cast<int>(geo.sk);
  struct List {
    const int4* l4;
    const std::int32_t* cnt;
    std::uint64_t row_id;
    std::int32_t bound;  // key j is visible iff j <= bound (clamped to [-1, Sk - 1])
  };
  auto locate = [&](int gr) {
    const bool per_row = a.list_rep == 1;
    const std::int64_t i = gp.i0 + (per_row ? gr / geo.g : gr);
    const std::int64_t h = per_row ? gp.hk * geo.g + gr % geo.g : gp.hk;
    List l;
    l.row_id = static_cast<std::uint64_t>((gp.b * a.list_heads + h) * geo.sq + i);
    l.cnt = a.counts + gp.b * a.n0 + h * a.n1 + i * a.n2;
    l.l4 = reinterpret_cast<const int4*>(a.indices + gp.b * a.x0 + h * a.x1 + i * a.x2);
    std::int64_t bound = geo.causal ? i + geo.sk - geo.sq : geo.sk - 1;
    bound = bound < -1 ? -1 : (bound > geo.sk - 1 ? geo.sk - 1 : bound);
    l.bound = static_cast<std::int32_t>(bound);
    return l;
  };
  auto load = [&](int4 (&v)[4], const int4* l4, int base, int lim) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int c4 = base + k * 32 + lane;
      v[k] = c4 < lim ? __ldg(l4 + c4) : make_int4(0, 0, 0, 0);
    }
  };
  auto checked_count = [&](int c, const List& l) {
    if (c < 0 || c > a.n_max) {
      if (record && lane == 0) flags::record(&a.flags[kBadCount], l.row_id, static_cast<std::uint32_t>(c));
      c = c < 0 ? 0 : a.n_max;
    }
    return c;
  };

  int gr = r_begin + warp;
  if (gr >= r_end) return;
  List cur = locate(gr);
  int4 v[4];
  const int raw0 = __ldg(cur.cnt);
  load(v, cur.l4, 0, n4max);
  int cnt = checked_count(raw0, cur);
  int base = 0;
  while (true) {
    // The next batch: the rest of this list, else the warp's next list (its count with it).
    const int n4 = (cnt + 3) >> 2;
    int ngr = gr, nbase = base + kBatch;
    if (nbase >= n4) {
      ngr = gr + kWarps;
      nbase = 0;
    }
    const bool more = ngr < r_end;
    int4 w[4];
    List nxt = cur;
    int nraw = 0;
    if (more) {
      if (ngr != gr) {
        nxt = locate(ngr);
        nraw = __ldg(nxt.cnt);
        load(w, nxt.l4, 0, n4max);
      } else {
        load(w, cur.l4, nbase, n4);
      }
    }
    // Bad indices and repeats are flagged once per batch and lane (the host re-reads a flagged list
    // to name the entry, so the column recorded does not matter: 0). A batch whose 512 entries are
    // all listed, without the causal bound (warp-uniform), tests only the index range per entry.
    std::uint32_t dup = 0;
    bool bad = false;
    if ((base + kBatch) * 4 <= cnt && !geo.causal) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const std::int32_t js[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const std::int32_t j = js[c];
          const bool ok = static_cast<std::uint32_t>(j) < static_cast<std::uint32_t>(sk);
          bad |= !ok;
          dup |= fn(gr, ok ? j : 0, ok);
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int t0 = (base + k * 32 + lane) * 4;
        const std::int32_t js[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const std::int32_t j = js[c];
          const bool listed = t0 + c < cnt;
          const bool in_range = static_cast<std::uint32_t>(j) < static_cast<std::uint32_t>(sk);
          bad |= listed && !in_range;
          const bool ok = listed && in_range && j <= cur.bound;
          dup |= fn(gr, ok ? j : 0, ok);
        }
      }
    }
    if (record && bad) flags::record(&a.flags[kBadIndex], cur.row_id, 0u);
    if (dup != 0) flags::record(&a.flags[kDuplicate], cur.row_id, 0u);
    if (!more) break;
    if (ngr != gr) {
      gr = ngr;
      cur = nxt;
      cnt = checked_count(nraw, cur);
    }
    base = nbase;
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = w[k];
  }
}

// kRowBm: the kRowBitmaps path (a.rowbm_off >= 0), a separate instantiation so that each path gets
// its own register allocation (one kernel holding both spilled at the 64-register cap).
template <bool kRowBm>
__global__ void __launch_bounds__(kUnionThreads, 2) union_kernel(const UnionArgs a) {
  pdl_launch_dependents();  // SPARGE_GATHER_PDL: the attention grid may start once all union CTAs run
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
  const bool stream = a.vec4 && (a.variant & kStream) != 0;
  // kRowBitmaps: unit r's keys in its own bitmap rowbm[(r - r_begin) * words_k ...].
  std::uint32_t* rowbm = kRowBm ? reinterpret_cast<std::uint32_t*>(union_smem + a.rowbm_off) : nullptr;
  const int nu = r_end - r_begin;
  if constexpr (kRowBm) {
    // Zero this CTA's list bitmaps (16-byte stores; the host pads the area to 16 bytes).
    const int n4 = (nu * a.words_k + 3) >> 2;
    for (int i = tid; i < n4; i += kUnionThreads) reinterpret_cast<uint4*>(rowbm)[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  __syncthreads();
  if constexpr (kRowBm) {
    // Every visible entry sets its bit in its list's bitmap; the bit already set (the old value
    // of the atomic) is a key listed twice by that list, whichever lane came first.
    if (stream) {
      // Branch-free: an entry that is not set (!ok; j = 0 then) ORs 0 into its list's first word,
      // which changes nothing and reports no repeat (old & 0).
      stream_entries(a, gp, r_begin, r_end, true, [&](int gr, std::int32_t j, bool ok) -> std::uint32_t {
        const std::uint32_t bit = ok ? 1u << (j & 31) : 0u;
        const std::uint32_t old = atomicOr(&rowbm[(gr - r_begin) * a.words_k + (j >> 5)], bit);
        return old & bit;
      });
    } else {
      for_each_entry(a, gp, r_begin, r_end, true, [&](int gr, std::uint64_t row_id, std::int32_t j) {
        const std::uint32_t bit = 1u << (j & 31);
        const std::uint32_t old = atomicOr(&rowbm[(gr - r_begin) * a.words_k + (j >> 5)], bit);
        if (old & bit) flags::record(&a.flags[kDuplicate], row_id, static_cast<std::uint32_t>(j));
      });
    }
    __syncthreads();
    // This CTA's part of the union: the OR of its lists' bitmaps (consecutive words per thread:
    // conflict-free).
    for (int i = tid; i < a.words_k; i += kUnionThreads) {
      std::uint32_t x = 0;
      for (int r = 0; r < nu; ++r) x |= rowbm[r * a.words_k + i];
      bitmap[i] = x;
    }
  } else if (stream) {
    // A bit already set needs no atomic: rows of a group share most keys, and atomics on one word
    // serialise. (A stale read only costs a redundant atomicOr.)
    stream_entries(a, gp, r_begin, r_end, true, [&](int, std::int32_t j, bool ok) -> std::uint32_t {
      const std::uint32_t bit = 1u << (j & 31);
      if (ok && (bitmap[j >> 5] & bit) == 0) atomicOr(&bitmap[j >> 5], bit);
      return 0u;
    });
  } else {
    for_each_entry(a, gp, r_begin, r_end, true, [&](int, std::uint64_t, std::int32_t j) {
      const std::uint32_t bit = 1u << (j & 31);
      if ((bitmap[j >> 5] & bit) == 0) atomicOr(&bitmap[j >> 5], bit);
    });
  }
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
  // Position map (kPosMap): pos_map[j] = union position of key j, for the keys of the union only
  // (other entries are never read with ok set: phase B visits the keys phase A put in the union).
  std::uint16_t* pos_map = a.pos_off >= 0 ? reinterpret_cast<std::uint16_t*>(union_smem + a.pos_off) : nullptr;
  // kRowBitmaps: ukeys[u] = key of union position u (every CTA of the cluster holds the union).
  std::uint16_t* ukeys = kRowBm ? reinterpret_cast<std::uint16_t*>(union_smem + a.ukeys_off) : nullptr;
  for (int i = w_lo; i < w_hi; ++i) {
    rank[i] = pos;
    if (crank == 0 || pos_map != nullptr || ukeys != nullptr) {
      std::uint32_t bits = bitmap[i];
      std::uint32_t p = pos;
      while (bits != 0) {
        const int bit = __ffs(static_cast<int>(bits)) - 1;
        if (crank == 0) keys[p] = i * 32 + bit;
        if (pos_map != nullptr) pos_map[i * 32 + bit] = static_cast<std::uint16_t>(p);
        if (ukeys != nullptr) ukeys[p] = static_cast<std::uint16_t>(i * 32 + bit);
        ++p;
        bits &= bits - 1;
      }
    }
    pos += __popc(bitmap[i]);
  }
  if (tid == 0 && crank == 0) s.union_size[w] = static_cast<std::int32_t>(total);
  const int words_u = static_cast<int>((total + 63) / 64);
  unsigned long long* gmask = s.masks + w * s.words_cap * a.geo.rows;
  auto union_pos = [&](std::int32_t j) {
    return rank[j >> 5] + __popc(bitmap[j >> 5] & ((1u << (j & 31)) - 1u));
  };

  // Phase B: masks of this CTA's units; unit r's mask is the mask of rows r * rep .. r * rep + rep - 1.
  if constexpr (kRowBm) {
    // Mask word m of unit r: bit b = key ukeys[64 m + b] is in r's bitmap. A warp takes one word m
    // and up to 32 units: per unit two ballots (positions 64 m + lane, 64 m + 32 + lane), whose
    // word lane 0 puts in the warp's staging row, so that lane r - c0 reads unit r's word after the
    // loop (a per-row select in every lane cost three instructions per unit); then the 32 units'
    // rows (rep each, adjacent in the mask layout) are stored as consecutive words, coalesced, each
    // lane fetching its unit's word by shuffle. A position past the union tests bit mask 0 of the
    // row's word 0 (no predication in the loop).
    __shared__ unsigned long long stage[kUnionThreads / 32][32];
    __syncthreads();  // ukeys complete
    const int lane = tid & 31, warp = tid >> 5;
    constexpr int kWarps = kUnionThreads / 32;
    const int chunks = (nu + 31) >> 5;
    for (int item = warp; item < words_u * chunks; item += kWarps) {  // warp-uniform
      const int m = item / chunks;
      const int c0 = (item - m * chunks) * 32;
      const int c1 = min(nu, c0 + 32);
      const int p0 = m * 64 + lane, p1 = p0 + 32;
      const bool v0 = p0 < static_cast<int>(total), v1 = p1 < static_cast<int>(total);
      const int k0 = v0 ? ukeys[p0] : 0, k1 = v1 ? ukeys[p1] : 0;
      const int w0 = k0 >> 5, w1 = k1 >> 5;
      const std::uint32_t b0 = v0 ? 1u << (k0 & 31) : 0u, b1 = v1 ? 1u << (k1 & 31) : 0u;
      const std::uint32_t* row = rowbm + c0 * a.words_k;
      for (int r = 0; r < c1 - c0; ++r, row += a.words_k) {
        const unsigned lo = __ballot_sync(0xffffffffu, (row[w0] & b0) != 0u);
        const unsigned hi = __ballot_sync(0xffffffffu, (row[w1] & b1) != 0u);
        if (lane == 0) stage[warp][r] = static_cast<unsigned long long>(lo) | (static_cast<unsigned long long>(hi) << 32);
      }
      __syncwarp();
      const unsigned long long mine = lane < c1 - c0 ? stage[warp][lane] : 0ull;
      __syncwarp();  // the next item's stores to the staging row come after every lane's read
      const int n = (c1 - c0) * rep;
      unsigned long long* dst = gmask + static_cast<std::int64_t>(m) * a.geo.rows + static_cast<std::int64_t>(r_begin + c0) * rep;
      for (int base = 0; base < n; base += 32) {  // warp-uniform
        const int idx = base + lane;
        const int src = idx < n ? (rep == 1 ? idx : idx / rep) : 0;
        const unsigned long long v = __shfl_sync(0xffffffffu, mine, src);
        if (idx < n) dst[idx] = v;
      }
    }
  } else if (a.mask_rows > 0) {
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
      if (stream) {
        stream_entries(a, gp, rb, re, false, [&](int gr, std::int32_t j, bool ok) -> std::uint32_t {
          const std::uint32_t u = pos_map != nullptr ? static_cast<std::uint32_t>(pos_map[j]) : union_pos(j);
          const std::uint32_t bit = 1u << (u & 31);
          std::uint32_t old = 0;
          if (ok) old = atomicOr(&smask32[(gr - rb) * 2 * ms + static_cast<int>(u >> 5)], bit);
          return old & bit;
        });
      } else {
        for_each_entry(a, gp, rb, re, false, [&](int gr, std::uint64_t row_id, std::int32_t j) {
          const std::uint32_t u = pos_map != nullptr ? static_cast<std::uint32_t>(pos_map[j]) : union_pos(j);
          const std::uint32_t bit = 1u << (u & 31);
          const std::uint32_t old = atomicOr(&smask32[(gr - rb) * 2 * ms + static_cast<int>(u >> 5)], bit);
          // Which of two equal entries comes second depends on scheduling, so record the key, not t.
          if (old & bit) flags::record(&a.flags[kDuplicate], row_id, static_cast<std::uint32_t>(j));
        });
      }
      __syncthreads();
      // Row rb * rep + lr of the group gets unit rb + lr / rep's mask (coalesced over rows).
      // Element i = word * nrows + lr for i = tid, tid + kUnionThreads, ...: (word, lr) stepped
      // without a division per store; lr / rep by a multiply-high with ceil(2^32 / rep), exact
      // while lr * rep < 2^32 (else a division).
      const int nrows = nr * rep;
      const int step_w = kUnionThreads / nrows, step_l = kUnionThreads - step_w * nrows;
      const bool magic = rep > 1 && static_cast<std::uint64_t>(nrows) * static_cast<std::uint64_t>(rep) < (1ull << 32);
      const std::uint32_t inv_rep = magic ? static_cast<std::uint32_t>(((1ull << 32) + static_cast<std::uint64_t>(rep) - 1) / static_cast<std::uint64_t>(rep)) : 0u;
      int word = tid / nrows, lr = tid - word * nrows;
      while (word < words_u) {
        const int unit = rep == 1 ? lr : (magic ? static_cast<int>(__umulhi(static_cast<std::uint32_t>(lr), inv_rep)) : lr / rep);
        gmask[static_cast<std::int64_t>(word) * a.geo.rows + rb * rep + lr] = smask[unit * ms + word];
        word += step_w;
        lr += step_l;
        if (lr >= nrows) {
          lr -= nrows;
          ++word;
        }
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
