// topk_select in one read of the row (the common case): the keys that can matter are kept in shared
// memory on the way, so the row is never read a second time. One CTA (kThreads) per row.
//
//   0. Threshold: a sample of the row (kSampleGroups runs of kSampleRun consecutive scores, evenly
//      spaced) gives `thr`, the top 22 bits of the sample's target-th largest key, target = its
//      expected count of the k largest + 4 standard deviations + 8: the row's k-th largest key is
//      very likely >= thr, and the keys >= thr few (k = 2048 of 131072 random scores: ~2.5% of the
//      row, ~3300 keys). Rows of at most kSaveCap scores keep every selectable key (thr = the key
//      above -inf's); rows where the expected keep would not fit leave the fast path at once.
//   1. The read: warp w owns the w-th eighth of the row (in whole warp steps of 32 x kElems columns),
//      its lanes consecutive columns; a key >= thr is appended, as (column, key), to the warp's own
//      list, slots from a warp scan (no block barrier in the loop, no atomics on the data's order).
//      The lists grow by segments of kSeg slots taken from a shared counter; which physical segment a
//      warp gets depends on timing, its place in the warp's list does not: warp w's j-th segment is
//      recorded in seg[w][j], and every later step reads the lists through that table, so the
//      result depends only on the row. NaN columns are found on the way (the lowest is reported).
//   2. If no segment was refused and either the lists hold >= k keys (then all keys >= T are in
//      them: T >= thr) or every selectable key was kept: T = the k-th largest kept key by three
//      digits (11, 11, 10 bits) counted over the kept keys only (in shared memory); otherwise the
//      row takes the two-pass path (two_pass.cuh) from the start, reading the row again: a sample
//      that misjudged the row, a row whose keep overflowed, k too large for the lists.
//   3. Output: the lists in warp order are the kept keys in ascending column order; each thread takes
//      a contiguous run of that order, counts its keys above T and its ties, and a block scan gives
//      every key its slot: keys above T first, then the ties, up to k (docs/semantics.md: the same
//      order as the CPU backend). Fewer than k selectable keys: all of them, then -1.
// Shared memory: the kept lists (kSegs x kSeg slots of column + key) and a histogram, ~53 KB
// (dynamic; four CTAs per SM as the two-pass kernel). The fallback reuses the same bytes.
#pragma once

#include "cuda/topk/two_pass.cuh"

namespace sparge::cuda::topk {

constexpr int kWarps = kThreads / 32;
constexpr int kSeg = 64;                           // slots per segment of a warp's list
constexpr int kSaveCap = 5120;                     // keys kept per row by design (the sample's budget)
constexpr int kSegs = kSaveCap / kSeg + kWarps;    // + each warp's partly filled last segment
constexpr int kSlots = kSegs * kSeg;               // 5632 = 22 x kThreads
constexpr int kSampleGroups = 2 * kThreads;        // sampled runs per row
constexpr int kSampleRun = 8;                      // consecutive scores per run (one 32-byte sector of f32)
constexpr int kSamples = kSampleGroups * kSampleRun;
constexpr std::uint32_t kKeepAll = token::kNegInfKey + 1u;  // the lowest selectable key
constexpr std::uint32_t kNoKeep = 0u;                       // thr: take the two-pass path
static_assert(kSlots % kThreads == 0 && kSlots / kThreads <= 32, "the output pass keeps one bit per slot per thread");
static_assert(kSegs <= 255, "segment numbers are bytes");
static_assert(kSlots < 65536, "the output scan packs two 16-bit counts per thread");

struct KeepSmem {
  std::uint32_t hist[kBins];
  std::uint32_t col[kSlots];
  std::uint32_t key[kSlots];
  std::uint8_t seg[kWarps][kSegs];  // physical segment of warp w's j-th segment
  std::uint32_t warp_n[kWarps];     // keys warp w kept (all of them stored unless `refused`)
  std::uint32_t next_seg;           // segments handed out
  std::uint32_t refused;            // a warp needed a segment beyond kSegs: the fast path is off
  scan::BlockScanStorage<kThreads> scan_storage;
  Digit sel;
};

union OnePassSmem {
  KeepSmem keep;
  RowSmem two;  // the fallback's
};
constexpr int kOnePassSmemBytes = static_cast<int>(sizeof(OnePassSmem));

// Step 0: thr (>= kKeepAll), or kNoKeep. Every thread calls it (it synchronises); hist must be zero
// on entry and is zero again on return.
template <class T>
__device__ __forceinline__ std::uint32_t keep_threshold(const T* row, std::int64_t s1, std::int64_t n, std::uint32_t k,
                                                        KeepSmem& sm) {
  if (n <= kSaveCap) return kKeepAll;  // block-uniform
  if (n < kFilterMinN) return kNoKeep;
  const float expected = static_cast<float>(kSamples) * static_cast<float>(k) / static_cast<float>(n);
  const float target_f = expected + 4.0f * sqrtf(expected) + 8.0f;
  // The keys the row would keep, by the sample's fraction, must leave a quarter of the budget free.
  if (target_f >= static_cast<float>(kSamples) / 2 ||
      target_f * static_cast<float>(n) > 0.75f * static_cast<float>(kSaveCap) * static_cast<float>(kSamples)) {
    return kNoKeep;
  }
  const auto target = static_cast<std::uint32_t>(target_f) + 1u;
  const int tid = static_cast<int>(threadIdx.x);
  std::uint32_t keys[2 * kSampleRun];
#pragma unroll
  for (int g = 0; g < 2; ++g) {
    // Run starts are multiples of kSampleRun (n >= kFilterMinN: the last run ends inside the row).
    const std::int64_t c = (static_cast<std::int64_t>(tid + g * kThreads) * n / kSampleGroups) & ~std::int64_t{kSampleRun - 1};
#pragma unroll
    for (int e = 0; e < kSampleRun; ++e) {
      const std::uint32_t b = float_bits<T>(row[(c + e) * s1]);
      keys[g * kSampleRun + e] = token::is_nan_bits(b) ? 0u : fast_key(b);  // NaN: below every selectable key
    }
  }
#pragma unroll
  for (int i = 0; i < 2 * kSampleRun; ++i) atomicAdd(&sm.hist[keys[i] >> 21], 1u);
  __syncthreads();
  std::uint32_t total = 0;
  const Digit d1 = select_digit(sm.hist, kBins, target, sm.scan_storage, sm.sel, total);  // total = kSamples
  for (int b = tid; b < kBins; b += kThreads) sm.hist[b] = 0;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 2 * kSampleRun; ++i) {
    if ((keys[i] >> 21) == d1.bin) atomicAdd(&sm.hist[(keys[i] >> 10) & (kBins - 1)], 1u);
  }
  __syncthreads();
  const Digit d2 = select_digit(sm.hist, kBins, target - d1.above, sm.scan_storage, sm.sel, total);
  for (int b = tid; b < kBins; b += kThreads) sm.hist[b] = 0;
  __syncthreads();
  const std::uint32_t thr = (d1.bin << 21) | (d2.bin << 10);  // <= the sample's target-th key
  return thr < kKeepAll ? kKeepAll : thr;
}

// Slot of the p-th key of warp w's list.
__device__ __forceinline__ std::uint32_t kept_slot(const KeepSmem& sm, int w, std::uint32_t p) {
  return static_cast<std::uint32_t>(sm.seg[w][p / kSeg]) * kSeg + p % kSeg;
}

template <class T, int kVec, int kLoads>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) one_pass_kernel(const TopkArgs a) {
  using S = Slice<T, kVec, kLoads>;
  constexpr int kElems = S::kElems;
  static_assert(kElems <= 32, "per-thread keep masks are 32-bit");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  OnePassSmem& smu = *reinterpret_cast<OnePassSmem*>(smem_raw);
  KeepSmem& sm = smu.keep;

  const std::int64_t r = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31;
  const T* row = static_cast<const T*>(a.scores) + r * a.s0;
  const std::int64_t n = a.n;
  const std::uint32_t k = static_cast<std::uint32_t>(a.k);
  std::int32_t* out = a.indices + r * a.i0;
  const std::int64_t i1 = a.i1;

  for (int b = tid; b < kBins; b += kThreads) sm.hist[b] = 0;
  if (tid == 0) {
    sm.next_seg = 0;
    sm.refused = 0;
  }
  __syncthreads();
  const std::uint32_t thr = keep_threshold<T>(row, a.s1, n, k, sm);
  if (thr != kNoKeep) {  // block-uniform
    // ---- 1. the read: warp w's columns [c0, c1), keys >= thr appended to its list.
    constexpr std::int64_t kStep = 32 * kElems;
    const std::int64_t steps = (n + kStep - 1) / kStep;
    const std::int64_t per_warp = (steps + kWarps - 1) / kWarps;
    const std::int64_t c0 = warp * per_warp * kStep;
    const std::int64_t c1 = min(n, c0 + per_warp * kStep);
    std::uint32_t kept = 0;    // keys this warp kept so far (warp-uniform)
    std::uint32_t my_segs = 0;  // segments this warp holds (warp-uniform)
    bool refused = false;       // warp-uniform
    std::uint32_t nan_col = ~0u;
    const std::int64_t first = c0 + lane * kElems;
    S cur;
    cur.load(row, a.s1, first, c1);  // columns at or past c1 come back as -inf (never kept)
#pragma unroll 1
    for (std::int64_t o = 0; c0 + o < c1; o += kStep) {
      S next;
      next.load(row, a.s1, first + o + kStep, c1);
      std::uint32_t keep = 0, special = 0;
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        const std::uint32_t key = cur.key(e);
        keep |= static_cast<std::uint32_t>(key >= thr) << e;
        special |= static_cast<std::uint32_t>(is_special_key(key)) << e;
      }
      if (special != 0) {
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
          if ((special >> e) & 1u) {
            if (token::is_nan_bits(cur.bits(e))) nan_col = min(nan_col, static_cast<std::uint32_t>(cur.col + e));
          }
        }
      }
      const std::uint32_t cnt = __popc(keep);
      const std::uint32_t incl = scan::warp_inclusive_sum(cnt);
      const std::uint32_t step_total = __shfl_sync(0xffffffffu, incl, 31);
      if (step_total != 0) {  // warp-uniform
        // Segments for list positions [kept, kept + step_total): lane 0 takes them, in order.
        while (!refused && my_segs * kSeg < kept + step_total) {
          std::uint32_t s = 0;
          if (lane == 0) s = atomicAdd(&sm.next_seg, 1u);
          s = __shfl_sync(0xffffffffu, s, 0);
          if (s >= static_cast<std::uint32_t>(kSegs)) {
            refused = true;
            if (lane == 0) sm.refused = 1;
          } else {
            if (lane == 0) sm.seg[warp][my_segs] = static_cast<std::uint8_t>(s);
            ++my_segs;
          }
        }
        __syncwarp();
        if (!refused) {
          std::uint32_t p = kept + incl - cnt;
#pragma unroll
          for (int e = 0; e < kElems; ++e) {
            if ((keep >> e) & 1u) {
              const std::uint32_t slot = kept_slot(sm, warp, p);
              sm.col[slot] = static_cast<std::uint32_t>(cur.col + e);
              sm.key[slot] = cur.key(e);
              ++p;
            }
          }
        }
        kept += step_total;
      }
      cur = next;
    }
    if (nan_col != ~0u) flags::record(a.nan_flag, r, nan_col);
    if (!refused) {
      // The rest of the warp's last segment holds key 0: below every kept key, so the digit counts
      // over whole segments (step 2) never see it.
      for (std::uint32_t p = kept + lane; p < my_segs * kSeg; p += 32) sm.key[kept_slot(sm, warp, p)] = 0u;
    }
    if (lane == 0) sm.warp_n[warp] = kept;
    __syncthreads();

    std::uint32_t n_kept = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) n_kept += sm.warp_n[w];
    const bool fast = sm.refused == 0 && (n_kept >= k || thr == kKeepAll);  // block-uniform
    if (fast) {
      // ---- 2. T: the k-th largest kept key (all of them when fewer than k are selectable).
      std::uint32_t t_key = token::kNegInfKey;  // fewer than k: everything kept is above, no tie
      if (n_kept >= k) {
        const std::uint32_t slots = sm.next_seg * kSeg;
        std::uint32_t prefix = 0, k_rem = k, total = 0;
#pragma unroll 1
        for (int level = 0; level < 3; ++level) {
          const int shift = level == 0 ? 21 : (level == 1 ? 10 : 0);
          const int bins = level == 2 ? 1024 : 2048;
          const std::uint32_t pmask = level == 0 ? 0u : (level == 1 ? 0xffe00000u : 0xfffffc00u);
          for (std::uint32_t i = tid; i < slots; i += kThreads) {
            const std::uint32_t key = sm.key[i];
            if ((key & pmask) == prefix && key != 0u) atomicAdd(&sm.hist[(key >> shift) & (bins - 1)], 1u);
          }
          __syncthreads();
          const Digit d = select_digit(sm.hist, bins, k_rem, sm.scan_storage, sm.sel, total);
          prefix |= d.bin << shift;
          k_rem -= d.above;
          for (int b = tid; b < kBins; b += kThreads) sm.hist[b] = 0;
          __syncthreads();
        }
        t_key = prefix;
      }
      // ---- 3. slots in column order: thread tid takes list positions [tid * per, ...) of the
      // concatenated lists (warp order = column order).
      const std::uint32_t per = (n_kept + kThreads - 1) / kThreads;  // <= kSlots / kThreads
      const std::uint32_t l0 = min(n_kept, static_cast<std::uint32_t>(tid) * per);
      const std::uint32_t l1 = min(n_kept, l0 + per);
      int w0 = 0;
      std::uint32_t p0 = l0;
      while (w0 < kWarps - 1 && p0 >= sm.warp_n[w0]) p0 -= sm.warp_n[w0++];
      std::uint32_t is_above = 0, is_tie = 0;
      {
        int w = w0;
        std::uint32_t p = p0;
        for (std::uint32_t l = l0; l < l1; ++l, ++p) {
          while (p >= sm.warp_n[w]) {
            p = 0;
            ++w;
          }
          const std::uint32_t key = sm.key[kept_slot(sm, w, p)];
          is_above |= static_cast<std::uint32_t>(key > t_key) << (l - l0);
          is_tie |= static_cast<std::uint32_t>(key == t_key) << (l - l0);
        }
      }
      std::uint32_t both = 0;
      const std::uint32_t excl =
          scan::block_exclusive_sum<kThreads>((__popc(is_above) << 16) | __popc(is_tie), sm.scan_storage, both);
      const std::uint32_t m = both >> 16;  // keys above T
      std::uint32_t ja = excl >> 16, jt = m + (excl & 0xffffu);
      {
        int w = w0;
        std::uint32_t p = p0;
        for (std::uint32_t l = l0; l < l1; ++l, ++p) {
          while (p >= sm.warp_n[w]) {
            p = 0;
            ++w;
          }
          const std::uint32_t bit = 1u << (l - l0);
          if ((is_above | is_tie) & bit) {
            const auto col = static_cast<std::int32_t>(sm.col[kept_slot(sm, w, p)]);
            if (is_above & bit) {
              if (ja < k) out[static_cast<std::int64_t>(ja) * i1] = col;  // m <= k always; kept for safety
              ++ja;
            } else {
              if (jt < k) out[static_cast<std::int64_t>(jt) * i1] = col;
              ++jt;
            }
          }
        }
      }
      const std::uint32_t valid_count = n_kept >= k ? k : n_kept;
      for (std::int64_t s = static_cast<std::int64_t>(valid_count) + tid; s < k; s += kThreads) out[s * i1] = -1;
      if (tid == 0 && a.counts != nullptr) a.counts[r * a.c0] = static_cast<std::int32_t>(valid_count);
      return;
    }
    __syncthreads();  // every read of the lists is done before the fallback reuses the bytes
  }
  // The two-pass default in the same bytes: prefetching on contiguous rows, every key counted.
  RowSmem& two = smu.two;
  two_pass_row<T, kVec, kLoads, (kVec > 1), false>(a, two.hist, two.cand_col, two.cand_key, two.scan_storage, two.sel);
}

}  // namespace sparge::cuda::topk
