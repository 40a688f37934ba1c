// The selection of docs/semantics.md (Stage 1, steps 4-7).
//
// Rows of at most 256 key blocks (the common case: Sk <= 32k at blkk = 128, 16k at blkk = 64) take
// one warp per row (select_row_kernel): lane l holds key blocks l, l + 32, ...; top-k and cdf find
// their crossing point by search over the order of the scores (select_by_search: no sort), and the
// LUT row comes from ballots. No block barriers, 4 rows per 128-thread CTA.
//
// Longer rows take one CTA per row (select_kernel):
//   1. Items in blocked arrangement (thread t holds key blocks t*IPT .. t*IPT+IPT-1): the score
//      of every visible block, -inf for a forced column (K block not self-similar); the keep
//      flags of forced rows, forced columns and the sink.
//   2. The rankable blocks (visible, finite score) become 64-bit keys
//        (~order_bits(S) << IDX_BITS) | kb,
//      ordered by S descending and ties toward the lower block index, exactly the CPU's strict
//      total order.
//   3. top-k keeps the first n = min(R, max(1, floor((double)topk * NV))) blocks of that order,
//      found by a block-wide bit search; cdf sorts the keys (CUB BlockRadixSort), scans
//      exp(S - S_max) in rank order (CUB BlockScan, fixed order) and keeps the ranks up to the
//      first whose cumulative probability reaches cdfthreshd (the crossing block included; all
//      of them when rounding keeps the sum below).
//   4. An exclusive scan of the keep flags in block order writes the ascending LUT row, -1 after.
// Nothing uses float atomics; the one atomic (atomicMin on an int rank) has an order-independent
// result, so a row's output is the same on every run.
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "cuda/block_map/block_map.cuh"
#include "cuda/block_map/pdl.cuh"
#include "cuda/fast_div.h"

namespace sparge::cuda::block_map {

namespace {

constexpr std::int64_t kMaxGrid = std::int64_t{1} << 30;
constexpr std::size_t kDefaultSmem = 48 * 1024;

struct SelectArgs {
  Geometry g;
  SelectRule rule;
  Scratch s;
  Out<std::int32_t> lut, counts;
  Out<float> maybe_scores;
  // The warp kernel's row decoding when every row index and head fits in 31 bits (small): NQ, HQ
  // and HQ / HK as fast divisors (cuda/fast_div.h).
  bool small = false;
  FastDiv by_nq, by_hq, by_group;
  // LUT rows that the warp kernel may write as 16-byte vectors: unit inner stride, NK a multiple of
  // 4, every row start 16-byte aligned.
  bool lut_vec = false;
};

constexpr int log2_exact(int v) { return v <= 1 ? 0 : 1 + log2_exact(v / 2); }

// Order-preserving map of a float to uint32 (a < b iff bits(a) < bits(b)); -0 is read as +0, so
// that equal scores compare equal as they do on the CPU.
__device__ __forceinline__ std::uint32_t order_bits(float v) {
  const std::uint32_t u = v == 0.0f ? 0u : __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float from_order_bits(std::uint32_t o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

template <int NT, int IPT>
struct Tier {
  static constexpr int kCap = NT * IPT;
  static constexpr int kIdxBits = log2_exact(kCap);
  static_assert((1 << kIdxBits) == kCap, "capacity must be a power of two");
  static constexpr std::uint64_t kIdxMask = (std::uint64_t{1} << kIdxBits) - 1;
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};  // sorts after every rankable key

  using Sort = cub::BlockRadixSort<std::uint64_t, NT, IPT>;
  using ScanF = cub::BlockScan<float, NT>;
  using ScanI = cub::BlockScan<int, NT>;
  using ReduceI = cub::BlockReduce<int, NT>;

  struct Shared {
    union {
      typename Sort::TempStorage sort;
      typename ScanF::TempStorage scan_f;
      typename ScanI::TempStorage scan_i;
      typename ReduceI::TempStorage reduce;
    } cub;
    int rankable;
    int first_cross;
    float top_score;
    int part[2][NT / 32];  // per-warp partial counts of the top-k bit search (double-buffered)
    unsigned char keep[kCap];
  };

  __device__ static std::uint64_t key(float s, int kb) {
    return (static_cast<std::uint64_t>(~order_bits(s)) << kIdxBits) | static_cast<std::uint64_t>(kb);
  }
  __device__ static float score(std::uint64_t key) {
    return from_order_bits(~static_cast<std::uint32_t>(key >> kIdxBits));
  }
};

// Top-k rows take the bit search, cdf rows the sort.
template <int NT, int IPT>
__global__ void __launch_bounds__(NT) select_kernel(const __grid_constant__ SelectArgs a) {
  pdl_wait();  // the scores and sims of the launches before (a no-op without PDL)
  using T = Tier<NT, IPT>;
  extern __shared__ __align__(16) unsigned char smem[];
  typename T::Shared& sh = *reinterpret_cast<typename T::Shared*>(smem);
  const Geometry& g = a.g;
  const int tid = static_cast<int>(threadIdx.x);
  const std::int64_t total = g.nseq * g.hq * g.nq;
  const std::int64_t group = g.hq / g.hk;
  const bool has_threshold = a.rule.has_threshold;

  for (std::int64_t row = blockIdx.x; row < total; row += gridDim.x) {
    const std::int64_t qb = row % g.nq, h = (row / g.nq) % g.hq, si = row / (g.nq * g.hq);
    const Seq seq = sequence(g, si);
    const int nv = static_cast<int>(visible_blocks(g, seq, qb));
    const float threshold = has_threshold ? a.rule.threshold[h] : 0.0f;
    // A Q block that is not self-similar keeps its whole visible row.
    const bool forced_row = has_threshold && nv > 0 && !(a.s.q_sim[row] > threshold);
    const float* scores = a.s.scores + row * g.nk;
    const float* k_sim = a.s.k_sim + (si * g.hk + h / group) * g.nk;

    // ---- 1. items ------------------------------------------------------------------------------
    std::uint64_t keys[IPT];
    int rankable = 0;
#pragma unroll
    for (int i = 0; i < IPT; ++i) {
      const int kb = tid * IPT + i;
      float s = -INFINITY;
      bool forced_col = false;
      if (kb < nv) {
        // A visible K block that is not self-similar takes no part in the ranking and is kept.
        forced_col = has_threshold && !(k_sim[kb] > threshold);
        s = forced_col ? -INFINITY : scores[kb];
      }
      const bool rank_me = kb < nv && isfinite(s);
      keys[i] = rank_me ? T::key(s, kb) : T::kNone;
      rankable += rank_me ? 1 : 0;
      sh.keep[kb] = kb < nv && (forced_row || forced_col || (a.rule.sink && kb == 0)) ? 1 : 0;
      if (a.maybe_scores.data != nullptr && kb < g.nk) {
        const Out<float>& o = a.maybe_scores;
        o.data[si * o.stride[0] + h * o.stride[1] + qb * o.stride[2] + kb * o.stride[3]] = s;
      }
    }
    const int r_sum = typename T::ReduceI(sh.cub.reduce).Sum(rankable);
    if (tid == 0) {
      sh.rankable = r_sum;
      sh.first_cross = INT_MAX;
    }
    __syncthreads();
    const int r = sh.rankable;

    // ---- 2./3. top-k by bit search (uniform branch), as select_by_search on one warp: the
    // n-th smallest w = key >> kIdxBits (~0u for the unrankable) bit by bit from block-wide
    // counts, then the ties at it in block order (blocked items: a block scan is in kb order).
    if (!forced_row && r > 0 && a.rule.use_topk) {
      const auto want = static_cast<std::int64_t>(floor(static_cast<double>(a.rule.value[h]) * static_cast<double>(nv)));
      const int n = static_cast<int>(want < 1 ? 1 : (want < r ? want : r));
      std::uint32_t w[IPT];
#pragma unroll
      for (int i = 0; i < IPT; ++i) w[i] = static_cast<std::uint32_t>(keys[i] >> T::kIdxBits);
      const int lane = tid % 32, warp = tid / 32;
      int parity = 0;
      // Block-wide sum of one count per thread; one barrier (the buffers alternate, and a buffer
      // is rewritten only after the next barrier, which every reader of it has passed).
      const auto block_count = [&](unsigned c) {
        c = __reduce_add_sync(0xffffffffu, c);
        if (lane == 0) sh.part[parity][warp] = static_cast<int>(c);
        __syncthreads();
        int total = 0;
#pragma unroll 4
        for (int j = 0; j < NT / 32; ++j) total += sh.part[parity][j];
        parity ^= 1;
        return total;
      };
      std::uint32_t cross_w = ~0u;  // n == r: every rankable block (w <= ~0u - 1)
      int need = 0;
      if (n < r) {
        std::uint32_t prefix = 0;
#pragma unroll 1
        for (int b = 31; b >= 0; --b) {
          const std::uint32_t x = prefix | ((1u << b) - 1u);
          unsigned c = 0;
#pragma unroll
          for (int i = 0; i < IPT; ++i) c += w[i] <= x ? 1u : 0u;
          if (block_count(c) < n) prefix |= 1u << b;
        }
        cross_w = prefix;
        unsigned below = 0;
#pragma unroll
        for (int i = 0; i < IPT; ++i) below += w[i] < cross_w ? 1u : 0u;
        need = n - block_count(below);  // >= 1 blocks with w == cross_w are kept
      }
      int tie[IPT], pos[IPT], ties_total;
#pragma unroll
      for (int i = 0; i < IPT; ++i) tie[i] = n < r && w[i] == cross_w ? 1 : 0;
      typename T::ScanI(sh.cub.scan_i).ExclusiveSum(tie, pos, ties_total);
#pragma unroll
      for (int i = 0; i < IPT; ++i) {
        const bool ranked = w[i] != ~0u;
        const bool kept = n < r ? (w[i] < cross_w || (tie[i] && pos[i] < need)) : ranked;
        if (ranked && kept) sh.keep[tid * IPT + i] = 1;
      }
      (void)ties_total;
    } else if (!forced_row && r > 0) {
      // ---- 2./3. ranking and selection by a sort (uniform branch) ----------------------------
      typename T::Sort(sh.cub.sort).Sort(keys, 0, 32 + T::kIdxBits);
      __syncthreads();  // the sort's storage is reused below
      int n;
      const float value = a.rule.value[h];
      if (a.rule.use_topk) {
        const auto want = static_cast<std::int64_t>(floor(static_cast<double>(value) * static_cast<double>(nv)));
        n = static_cast<int>(want < 1 ? 1 : (want < r ? want : r));
      } else {
        if (tid == 0) sh.top_score = T::score(keys[0]);  // rank 0: the largest score
        __syncthreads();
        const float top = sh.top_score;
        float e[IPT], cum[IPT], z;
#pragma unroll
        for (int i = 0; i < IPT; ++i) {
          const int rank = tid * IPT + i;
          e[i] = rank < r ? expf(T::score(keys[i]) - top) : 0.0f;
        }
        typename T::ScanF(sh.cub.scan_f).InclusiveSum(e, cum, z);
#pragma unroll
        for (int i = 0; i < IPT; ++i) {
          const int rank = tid * IPT + i;
          if (rank < r && cum[i] / z >= value) {
            atomicMin(&sh.first_cross, rank);  // integer minimum: the same whatever the order
            break;
          }
        }
        __syncthreads();
        n = sh.first_cross == INT_MAX ? r : sh.first_cross + 1;
      }
#pragma unroll
      for (int i = 0; i < IPT; ++i) {
        if (tid * IPT + i < n) sh.keep[keys[i] & T::kIdxMask] = 1;
      }
    }
    __syncthreads();

    // ---- 4. the LUT row: kept blocks ascending, then -1 ----------------------------------------
    int flag[IPT], pos[IPT], count;
#pragma unroll
    for (int i = 0; i < IPT; ++i) flag[i] = sh.keep[tid * IPT + i];
    typename T::ScanI(sh.cub.scan_i).ExclusiveSum(flag, pos, count);
    const Out<std::int32_t>& lut = a.lut;
    std::int32_t* lut_row = lut.data + si * lut.stride[0] + h * lut.stride[1] + qb * lut.stride[2];
#pragma unroll
    for (int i = 0; i < IPT; ++i) {
      if (flag[i]) lut_row[pos[i] * lut.stride[3]] = tid * IPT + i;
    }
    for (std::int64_t slot = count + tid; slot < g.nk; slot += NT) lut_row[slot * lut.stride[3]] = -1;
    if (tid == 0) {
      a.counts.data[si * a.counts.stride[0] + h * a.counts.stride[1] + qb * a.counts.stride[2]] = count;
    }
    __syncthreads();  // shared memory is rewritten by the next row
  }
}

// ---- one warp per row, for rows of at most 32 * IPT key blocks --------------------------------
constexpr int kRowWarps = 4;  // rows per CTA

// The warp's sum of one float per lane in a fixed xor tree: every lane ends with the same bits.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int x = 16; x > 0; x >>= 1) v += __shfl_xor_sync(0xffffffffu, v, x);
  return v;
}

// How the warp finds the n-th smallest w of a top-k row (SPARGE_BLOCKMAP_SELECT, read per call):
// the pivot search (default) or the narrowed bit search. Both find the same value, so the same
// blocks are kept.
enum class TopK { kBits, kPivot };

// The n-th smallest w of the warp's blocks (kBits; SPARGE_BLOCKMAP_SELECT=bits, the default until
// session 5): the search starts below the leading bits that
// the smallest and the largest rankable w share (lo, hi: REDUX min / max), and it stops as soon as
// the interval of w still possible holds a single block, whose w is then read directly. Invariant
// before the step of bit b: the answer v lies in I = [prefix, prefix | (2^(b+1) - 1)],
// below = count(w < prefix), upto = count(w <= max I) (all blocks of the warp, the unrankable ones
// with w = ~0u included). The step halves I by the count at its middle; when upto - below == 1,
// the one block in I is v. Exact ties never leave a single block in I, so rows with repeated
// scores take all the bits below the first difference.
template <int IPT>
__device__ __forceinline__ std::uint32_t nth_by_bits(const std::uint32_t (&w)[IPT], int n, int r, std::uint32_t lo,
                                                     std::uint32_t hi) {
  if (lo == hi) return lo;  // every rankable block has this w
  const int top = 31 - __clz(lo ^ hi);                            // the highest bit where they differ
  const std::uint32_t span = top == 31 ? ~0u : (2u << top) - 1u;  // I = [prefix, prefix | span]
  std::uint32_t prefix = lo & ~span;
  int below = 0;                                     // no block has w < lo, so none is below prefix
  int upto = (prefix | span) == ~0u ? 32 * IPT : r;  // blocks with w <= max I
#pragma unroll 1
  for (int b = top; b >= 0; --b) {
    const std::uint32_t half = (1u << b) - 1u;
    const std::uint32_t x = prefix | half;
    unsigned c = 0;
#pragma unroll
    for (int i = 0; i < IPT; ++i) c += w[i] <= x ? 1u : 0u;
    const int cnt = static_cast<int>(__reduce_add_sync(0xffffffffu, c));
    if (cnt < n) {
      prefix |= 1u << b;
      below = cnt;
    } else {
      upto = cnt;
    }
    if (upto - below == 1 && b > 0) {  // one block left in [prefix, prefix | half]: it is v
      std::uint32_t only = ~0u;
#pragma unroll
      for (int i = 0; i < IPT; ++i) only = w[i] >= prefix && w[i] <= (prefix | half) ? w[i] : only;
      return __reduce_min_sync(0xffffffffu, only);
    }
  }
  return prefix;
}

// The n-th smallest w by pivots taken from the data (kPivot; the default since session 5: H200
// round 2, select 0.0243 ms against 0.0301 for the bit search in the profile, 13.2M instructions
// against 20.6M (ncu), bits equal on all 292 block-map cases). Invariant: v lies in [A, B] and
// cA = count(w < A) < n <= cB = count(w <= B); at the start A = lo, B = hi, cA = 0, cB = r. A step
// picks a pivot p, the w of some block in [A, B], and counts the blocks with w < p and with w <= p
// in one REDUX (two 16-bit fields: at most 32 * IPT <= 256 blocks each): if c_lt < n <= c_le, p is
// v; if c_le < n, A = p + 1; else B = p - 1 (p > A then, as c_lt >= n > cA). Every step that does
// not end removes p's value from [A, B], so the loop ends.
// The pivot is the smallest w at or above a guess g in [A, B] (the largest w in [A, g) if there is
// none): g interpolates the rank n between cA and cB linearly in the score (the scores of A and B),
// so a row of distinct scores ends in a few steps and a row of repeated scores as soon as a pivot
// hits the value (the bit search has to take every bit below the first difference there); after
// two steps in a row that did not halve the blocks in [A, B], g bisects [A, B] instead (which
// bounds the steps of skewed rows). Every w in [lo, hi] decodes to a finite score.
// Host emulation (2026-11-30, 184k random rows of up to 256 blocks, ties, +-0, skewed scales):
// the same v and count(w < v) as a sort; mean 4.0 steps (max 18) against 16.9 for the bit search;
// at the bench's rows (256 blocks, n = 102) 4.9 vs 14.4 (distinct scores), 3.2 vs 32 (each score
// 8 times, as the bench's repeated input pattern gives).
template <int IPT>
__device__ __forceinline__ std::uint32_t nth_by_pivot(const std::uint32_t (&w)[IPT], int n, int r, std::uint32_t lo,
                                                      std::uint32_t hi, int& below) {
  static_assert(32 * IPT < (1 << 16), "two 16-bit counts per REDUX");
  std::uint32_t A = lo, B = hi;
  int cA = 0, cB = r;
  int slow = 0;  // steps in a row that did not halve cB - cA
#pragma unroll 1
  while (true) {
    std::uint32_t g = A + (B - A) / 2u;
    if (slow < 2) {
      // Any g in [A, B] is correct, so the fast division and the rounding do no harm; a guess
      // outside [A, B] (rounding, or an overflowing difference of scores) becomes B.
      const float frac = __fdividef(static_cast<float>(n - cA) - 0.5f, static_cast<float>(cB - cA));  // in (0, 1)
      const float sa = from_order_bits(~A), sb = from_order_bits(~B);  // sa >= sb
      const float gs = sa - frac * (sa - sb);
      g = isfinite(gs) ? ~order_bits(gs) : B;
      g = g < A || g > B ? B : g;
    } else {
      slow = 0;
    }
    // The smallest w >= g as g + min(w - g) (unsigned: a w below g wraps above every w >= g); it
    // is the smallest w in [g, B] unless it lies outside [g, B] (then nothing is in there).
    std::uint32_t off = ~0u;
#pragma unroll
    for (int i = 0; i < IPT; ++i) off = min(off, w[i] - g);
    std::uint32_t p = g + __reduce_min_sync(0xffffffffu, off);
    if (p < g || p > B) {  // nothing in [g, B]: the largest w in [A, g) (one exists, as cA < n <= cB)
      std::uint32_t under = 0;
#pragma unroll
      for (int i = 0; i < IPT; ++i) under = w[i] >= A && w[i] < g && w[i] > under ? w[i] : under;
      p = __reduce_max_sync(0xffffffffu, under);
    }
    unsigned packed = 0;  // (count(w <= p) << 16) | count(w < p) over the lane's blocks
#pragma unroll
    for (int i = 0; i < IPT; ++i) packed += (w[i] <= p ? 0x10000u : 0u) + (w[i] < p ? 1u : 0u);
    packed = __reduce_add_sync(0xffffffffu, packed);
    const int c_le = static_cast<int>(packed >> 16), c_lt = static_cast<int>(packed & 0xffffu);
    if (c_lt < n && n <= c_le) {
      below = c_lt;
      return p;
    }
    const int before = cB - cA;
    if (c_le < n) {
      A = p + 1u;
      cA = c_le;
    } else {
      B = p - 1u;
      cB = c_lt;
    }
    slow = 2 * (cB - cA) > before ? slow + 1 : 0;
  }
}

// The rule of one row by search instead of ranks. Rankable key blocks carry w = ~order_bits(S)
// (ascending w = descending S, finite scores never reach ~0u), the rest w = ~0u. The strict total
// order of the CPU is (w, kb) ascending; every quantity below is a function of a prefix of that
// order, so it is monotone in the prefix and its crossing point is found by search (over w, then,
// only when several blocks share the crossing w, over kb), with no sort:
//   top-k: the n-th smallest w (nth_by_bits or nth_by_pivot), the blocks with smaller w, and the
//          first n - count(w < w_n) blocks with w = w_n in block order (ballots);
//   cdf:   G(prefix) = sum of exp(S - S_max) over the prefix, always added in the same fixed tree
//          (each lane its IPT values in order, then warp_sum) with the blocks outside the prefix
//          as zeros, bit by bit over w, then over kb. Rounding to nearest is monotone, so G is
//          monotone in the prefix and G(all) = z; the crossing block is the first whose prefix
//          has G / z >= cdfthreshd.
// Returns, in keep, the selected blocks (or-ed into the forced ones).
template <int IPT, TopK KIND>
__device__ __forceinline__ void select_by_search(const std::uint32_t (&w)[IPT], const float (&sc)[IPT], int lane,
                                                 int r, int nv, bool use_topk, float value, bool (&keep)[IPT]) {
  constexpr int kIdxBits = log2_exact(32 * IPT);
  std::uint32_t cross_w = 0;  // the w of the last kept block
  int cross_kb = 0;           // among blocks with w == cross_w, the kept ones have kb <= cross_kb
  if (use_topk) {
    const auto want = static_cast<std::int64_t>(floor(static_cast<double>(value) * static_cast<double>(nv)));
    const int n = static_cast<int>(want < 1 ? 1 : (want < r ? want : r));
    if (n == r) {
#pragma unroll
      for (int i = 0; i < IPT; ++i) keep[i] = keep[i] || w[i] != ~0u;
      return;
    }
    std::uint32_t lo = ~0u, hi = 0;
#pragma unroll
    for (int i = 0; i < IPT; ++i) {
      lo = w[i] < lo ? w[i] : lo;
      const std::uint32_t v = w[i] != ~0u ? w[i] : 0u;
      hi = v > hi ? v : hi;
    }
    lo = __reduce_min_sync(0xffffffffu, lo);  // the smallest rankable w (r > 0)
    hi = __reduce_max_sync(0xffffffffu, hi);  // the largest rankable w (< ~0u)
    int below = -1;
    if constexpr (KIND == TopK::kPivot) {
      cross_w = nth_by_pivot<IPT>(w, n, r, lo, hi, below);
    } else {
      cross_w = nth_by_bits<IPT>(w, n, r, lo, hi);
    }
    if (below < 0) {
      unsigned c = 0;
#pragma unroll
      for (int i = 0; i < IPT; ++i) c += w[i] < cross_w ? 1u : 0u;
      below = static_cast<int>(__reduce_add_sync(0xffffffffu, c));
    }
    const int need = n - below;  // >= 1 blocks at cross_w
    // The need-th block with w == cross_w in block order (kb = lane + 32 i ascends with (i, lane)).
    int taken = 0;
    cross_kb = -1;
#pragma unroll
    for (int i = 0; i < IPT; ++i) {
      const unsigned bal = __ballot_sync(0xffffffffu, w[i] == cross_w);
      const int c = __popc(bal);
      if (cross_kb < 0 && taken + c >= need) {
        // The (need - taken)-th set bit of bal, found by all lanes alike.
        unsigned m = bal;
        for (int j = 1; j < need - taken; ++j) m &= m - 1u;
        cross_kb = (__ffs(m) - 1) + 32 * i;
      }
      taken += c;
    }
  } else {
    std::uint32_t w_min = ~0u;
#pragma unroll
    for (int i = 0; i < IPT; ++i) w_min = w[i] < w_min ? w[i] : w_min;
    w_min = __reduce_min_sync(0xffffffffu, w_min);
    // S_max, decoded from the smallest w (exact; a -0 maximum reads as +0, which gives the same
    // exp(S - S_max) values).
    const float top = from_order_bits(~w_min);
    float e[IPT];
#pragma unroll
    for (int i = 0; i < IPT; ++i) e[i] = w[i] != ~0u ? expf(sc[i] - top) : 0.0f;
    const auto mass = [&](auto in_prefix) {
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < IPT; ++i) acc += in_prefix(i) ? e[i] : 0.0f;
      return warp_sum(acc);
    };
    const float z = mass([&](int i) { return w[i] != ~0u; });
    // The smallest w whose prefix (every block with w' <= w) reaches the mass.
    std::uint32_t prefix = 0;
#pragma unroll 1
    for (int b = 31; b >= 0; --b) {
      const std::uint32_t x = prefix | ((1u << b) - 1u);
      if (!(mass([&](int i) { return w[i] <= x; }) / z >= value)) prefix |= 1u << b;
    }
    cross_w = prefix;
    if (cross_w == ~0u) {
      cross_kb = 32 * IPT;  // never reached (value > 1): keep every rankable block
    } else {
      int ties = 0;
#pragma unroll
      for (int i = 0; i < IPT; ++i) ties += __popc(__ballot_sync(0xffffffffu, w[i] == cross_w));
      cross_kb = 32 * IPT - 1;
      if (ties > 1) {
        // Several blocks share the crossing w: the first of them (in block order) whose prefix
        // reaches the mass.
        int pre = 0;
#pragma unroll 1
        for (int b = kIdxBits - 1; b >= 0; --b) {
          const int x = pre | ((1 << b) - 1);
          const float g = mass([&](int i) { return w[i] < cross_w || (w[i] == cross_w && lane + 32 * i <= x); });
          if (!(g / z >= value)) pre |= 1 << b;
        }
        cross_kb = pre;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < IPT; ++i) {
    const int kb = lane + 32 * i;
    if (w[i] != ~0u && (w[i] < cross_w || (w[i] == cross_w && kb <= cross_kb))) keep[i] = true;
  }
}

// One warp per row (rows of at most 32 * IPT key blocks; the default since 2026-11-30, session 5:
// 0.0300 ms against 0.0314 for the kernel it replaced, which interleaved the row's loads with its
// work, bits equal on all 290 block-map cases). Lane l holds key blocks l, l + 32, ...; the row's
// global loads (scores, k_sim, q_sim) are all issued before anything else (an optional
// maybe_scores store between k_sim loads would make each load wait for the one before, as the two
// may alias), then select_by_search, then the LUT row (16-byte stores through shared memory where
// the LUT layout allows, else ballots). No block barriers, 4 rows per 128-thread CTA, 64 registers
// (8 CTAs per SM). The row index is decoded by multiply-shift divisions (FastDiv) when the row count
// allows.
template <int IPT, TopK KIND>
__global__ void __launch_bounds__(32 * kRowWarps, 8) select_row_kernel(const __grid_constant__ SelectArgs a) {
  pdl_wait();  // the scores and sims of the launches before (a no-op without PDL)
  const Geometry& g = a.g;
  const int lane = static_cast<int>(threadIdx.x % 32), wid = static_cast<int>(threadIdx.x / 32);
  const std::int64_t total = g.nseq * g.hq * g.nq;
  const bool has_threshold = a.rule.has_threshold;
  // The LUT row of the warp in shared memory before its 16-byte stores (lut_vec).
  __shared__ __align__(16) std::int32_t staged[kRowWarps][32 * IPT + 32];  // + a slot per lane for dropped items
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowWarps + wid; row < total;
       row += static_cast<std::int64_t>(gridDim.x) * kRowWarps) {
    std::int64_t qb, h, si, hk;
    if (a.small) {  // every row index fits in 31 bits: multiplies instead of divisions
      const auto ur = static_cast<std::uint32_t>(row);
      const std::uint32_t q = a.by_nq.div(ur), s = a.by_hq.div(q), uh = q - s * a.by_hq.d;
      qb = ur - q * a.by_nq.d, h = uh, si = s, hk = a.by_group.div(uh);
    } else {
      qb = row % g.nq, h = (row / g.nq) % g.hq, si = row / (g.nq * g.hq), hk = h / (g.hq / g.hk);
    }
    const Seq seq = sequence(g, si);
    const int nv = static_cast<int>(visible_blocks(g, seq, qb));
    // ---- every load of the row, before any store ----------------------------------------------
    const float* scores = a.s.scores + row * g.nk;
    const float* k_sim = a.s.k_sim + (si * g.hk + hk) * g.nk;
    float raw[IPT], ks[IPT];
#pragma unroll
    for (int i = 0; i < IPT; ++i) {
      const int kb = lane + 32 * i;
      raw[i] = kb < nv ? scores[kb] : 0.0f;
      ks[i] = has_threshold && kb < nv ? k_sim[kb] : 0.0f;
    }
    const float q_sim = has_threshold && nv > 0 ? a.s.q_sim[row] : 0.0f;
    const float threshold = has_threshold ? a.rule.threshold[h] : 0.0f;
    const float value = a.rule.value[h];

    // ---- items --------------------------------------------------------------------------------
    // A Q block that is not self-similar keeps its whole visible row.
    const bool forced_row = has_threshold && nv > 0 && !(q_sim > threshold);
    float sc[IPT];
    std::uint32_t wk[IPT];
    bool keep[IPT];
    int rankable = 0;
#pragma unroll
    for (int i = 0; i < IPT; ++i) {
      const int kb = lane + 32 * i;
      // A visible K block that is not self-similar takes no part in the ranking and is kept.
      const bool forced_col = kb < nv && has_threshold && !(ks[i] > threshold);
      const float s = kb < nv && !forced_col ? raw[i] : -INFINITY;
      const bool rank_me = kb < nv && isfinite(s);
      sc[i] = s;
      wk[i] = rank_me ? ~order_bits(s) : ~0u;
      keep[i] = kb < nv && (forced_row || forced_col || (a.rule.sink && kb == 0));
      rankable += rank_me ? 1 : 0;
    }
    rankable = static_cast<int>(__reduce_add_sync(0xffffffffu, static_cast<unsigned>(rankable)));
    if (!forced_row && rankable > 0) {  // uniform over the warp
      select_by_search<IPT, KIND>(wk, sc, lane, rankable, nv, a.rule.use_topk, value, keep);
    }
    // ---- stores: the diagnostic scores, the LUT row (kept blocks ascending, then -1), the count --
    if (a.maybe_scores.data != nullptr) {
      const Out<float>& o = a.maybe_scores;
      float* orow = o.data + si * o.stride[0] + h * o.stride[1] + qb * o.stride[2];
#pragma unroll
      for (int i = 0; i < IPT; ++i) {
        const int kb = lane + 32 * i;
        if (kb < g.nk) orow[kb * o.stride[3]] = sc[i];
      }
    }
    const Out<std::int32_t>& lut = a.lut;
    std::int32_t* lut_row = lut.data + si * lut.stride[0] + h * lut.stride[1] + qb * lut.stride[2];
    int count = 0;
    if (a.lut_vec) {
      // The kept blocks into the warp's staging row, then lane l stores slots [IPT l, IPT l + IPT)
      // as IPT / 4 16-byte vectors (-1 past the count), the row's only global stores.
      // Positions without a ballot per item: field i (8 bits) of x counts the lane's keep[i]; an
      // inclusive warp scan of x gives each lane, per field, the kept items of the lanes up to it
      // (at most 32: no carry between fields), the last lane's scan the field totals, and the
      // byte-wise prefix of the totals (at most 7 x 32 < 256) where field i starts in the row.
      using Fields = std::conditional_t<(IPT > 4), std::uint64_t, std::uint32_t>;
      Fields x = 0;
#pragma unroll
      for (int i = 0; i < IPT; ++i) x |= static_cast<Fields>(keep[i] ? 1 : 0) << (8 * i);
      Fields incl = x;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const Fields y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      const Fields totals = __shfl_sync(0xffffffffu, incl, 31);
      const Fields starts = totals * (static_cast<Fields>(0x0101010101010101ull) << 8);  // field i: totals of fields < i
      const Fields before = starts + incl - x;  // field i: the position of the lane's item i
      // Every lane stores every item (no branch per item): a dropped one into the lane's own slot
      // past the row.
      std::int32_t* st = staged[wid];
#pragma unroll
      for (int i = 0; i < IPT; ++i) {
        st[keep[i] ? static_cast<int>((before >> (8 * i)) & 0xff) : 32 * IPT + lane] = lane + 32 * i;
      }
      count = static_cast<int>((starts >> (8 * (IPT - 1))) & 0xff) + static_cast<int>((totals >> (8 * (IPT - 1))) & 0xff);
      __syncwarp();
#pragma unroll
      for (int j = 0; j < IPT / 4; ++j) {
        const int slot = IPT * lane + 4 * j;
        if (slot < g.nk) {
          int4 v = *reinterpret_cast<const int4*>(st + slot);
          v.x = slot < count ? v.x : -1;
          v.y = slot + 1 < count ? v.y : -1;
          v.z = slot + 2 < count ? v.z : -1;
          v.w = slot + 3 < count ? v.w : -1;
          *reinterpret_cast<int4*>(lut_row + slot) = v;
        }
      }
      __syncwarp();  // the staging row is rewritten by the warp's next row
    } else {
      const unsigned lanes_below = (1u << lane) - 1u;
#pragma unroll
      for (int i = 0; i < IPT; ++i) {
        const unsigned bal = __ballot_sync(0xffffffffu, keep[i]);
        if (keep[i]) lut_row[(count + __popc(bal & lanes_below)) * lut.stride[3]] = lane + 32 * i;
        count += __popc(bal);
      }
      for (std::int64_t slot = count + lane; slot < g.nk; slot += 32) lut_row[slot * lut.stride[3]] = -1;
    }
    if (lane == 0) a.counts.data[si * a.counts.stride[0] + h * a.counts.stride[1] + qb * a.counts.stride[2]] = count;
  }
}

// SPARGE_BLOCKMAP_SELECT (read per call; every value gives the same bits): unset or `pivot`,
// nth_by_pivot; `bits`, the narrowed bit search of nth_by_bits (the H200-verified kernel before it).
// Rows longer than 256 key blocks take the CTA kernel either way.
TopK topk_kind() {
  const char* v = std::getenv("SPARGE_BLOCKMAP_SELECT");
  return v != nullptr && std::strcmp(v, "bits") == 0 ? TopK::kBits : TopK::kPivot;
}

template <int IPT>
cudaError_t launch_warp(SelectArgs a, cudaStream_t st) {
  const std::int64_t rows = a.g.nseq * a.g.hq * a.g.nq;
  if (rows == 0) return cudaSuccess;
  const std::int64_t ctas = (rows + kRowWarps - 1) / kRowWarps;
  const int grid = static_cast<int>(ctas < kMaxGrid ? ctas : kMaxGrid);
  a.small = rows < (std::int64_t{1} << 31);  // every row index (and head) the kernel decodes
  if (a.small) {
    a.by_nq = FastDiv(static_cast<std::uint32_t>(a.g.nq));
    a.by_hq = FastDiv(static_cast<std::uint32_t>(a.g.hq));
    a.by_group = FastDiv(static_cast<std::uint32_t>(a.g.hq / a.g.hk));
  }
  const Out<std::int32_t>& lut = a.lut;
  a.lut_vec = lut.stride[3] == 1 && a.g.nk % 4 == 0 && reinterpret_cast<std::uintptr_t>(lut.data) % 16 == 0 &&
              lut.stride[0] % 4 == 0 && lut.stride[1] % 4 == 0 && lut.stride[2] % 4 == 0;
  const bool pdl = pdl_enabled();
  if (topk_kind() == TopK::kPivot) {
    return launch_maybe_pdl(select_row_kernel<IPT, TopK::kPivot>, grid, 32 * kRowWarps, 0, st, pdl, a);
  }
  return launch_maybe_pdl(select_row_kernel<IPT, TopK::kBits>, grid, 32 * kRowWarps, 0, st, pdl, a);
}

template <int NT, int IPT>
std::size_t smem_bytes() {
  return sizeof(typename Tier<NT, IPT>::Shared);
}

template <int NT, int IPT>
cudaError_t launch(const SelectArgs& a, cudaStream_t st) {
  const std::int64_t rows = a.g.nseq * a.g.hq * a.g.nq;
  if (rows == 0) return cudaSuccess;
  const std::size_t bytes = smem_bytes<NT, IPT>();
  if (bytes > kDefaultSmem) {
    const cudaError_t e =
        cudaFuncSetAttribute(select_kernel<NT, IPT>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (e != cudaSuccess) return e;
  }
  const int grid = static_cast<int>(rows < kMaxGrid ? rows : kMaxGrid);
  return launch_maybe_pdl(select_kernel<NT, IPT>, grid, NT, bytes, st, pdl_enabled(), a);
}

}  // namespace

// Tiers by row length. The capacity changes speed only: keys are unique and the order is total.
std::size_t select_smem_bytes(std::int64_t nk) {
  if (nk <= 256) return 0;  // the warp kernel uses no shared memory
  if (nk <= 1024) return smem_bytes<256, 4>();
  if (nk <= 2048) return smem_bytes<256, 8>();
  if (nk <= 4096) return smem_bytes<512, 8>();
  if (nk <= 8192) return smem_bytes<1024, 8>();
  if (nk <= kMaxKeyBlocks) return smem_bytes<1024, 16>();
  return 0;
}

const char* select_variant(std::int64_t nk) {
  if (nk <= 256) return topk_kind() == TopK::kPivot ? "warp-pivot" : "warp-bits";
  return "cta-search (top-k; cdf sorts)";
}

cudaError_t launch_select(const Geometry& g, const SelectRule& rule, const Scratch& s, const Out<std::int32_t>& lut,
                          const Out<std::int32_t>& counts, const Out<float>& maybe_scores, cudaStream_t st) {
  const SelectArgs a{g, rule, s, lut, counts, maybe_scores};
  if (g.nk <= 128) return launch_warp<4>(a, st);
  if (g.nk <= 256) return launch_warp<8>(a, st);
  if (g.nk <= 1024) return launch<256, 4>(a, st);
  if (g.nk <= 2048) return launch<256, 8>(a, st);
  if (g.nk <= 4096) return launch<512, 8>(a, st);
  if (g.nk <= 8192) return launch<1024, 8>(a, st);
  return launch<1024, 16>(a, st);
}

}  // namespace sparge::cuda::block_map
