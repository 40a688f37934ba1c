// The previous topk_select kernel (four reads of the row: three histogram passes on 11 + 11 + 10 key
// bits, then one emit pass), kept for one device round as SPARGE_TOPK_VARIANT=2 so the new
// two-read kernel (two_pass.cuh) can be compared with it and, if it misbehaves, bypassed. To be
// removed once the new kernel has passed on the GPU.
#pragma once

#include "cuda/topk/common.cuh"

namespace sparge::cuda::topk {

// Loads the kVec consecutive elements at column `c` (c + kVec <= n: one vector load when kVec > 1)
// or, at the row's tail, the elements that exist; valid[e] says which.
template <class T, int kVec>
__device__ __forceinline__ void load_bits(const T* row, std::int64_t s1, std::int64_t c, std::int64_t n,
                                          std::uint32_t (&bits)[kVec], bool (&valid)[kVec]) {
  if constexpr (kVec == 1) {
    valid[0] = c < n;
    bits[0] = valid[0] ? float_bits(row[c * s1]) : 0u;
  } else {
    if (c + kVec <= n) {
      // 16-byte vector load; the host guarantees alignment (select_topk).
      const uint4 raw = *reinterpret_cast<const uint4*>(row + c);
      const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        bits[e] = float_bits(v[e]);
        valid[e] = true;
      }
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        valid[e] = c + e < n;
        bits[e] = valid[e] ? float_bits(row[c + e]) : 0u;
      }
    }
  }
}

template <class T, int kThreads, int kVec>
__global__ void __launch_bounds__(kThreads) legacy_kernel(const TopkArgs a) {
  constexpr int kBins = 2048;
  constexpr std::int64_t kChunk = static_cast<std::int64_t>(kThreads) * kVec;
  static_assert(kChunk < 65536, "the emit scan packs two 16-bit counts per thread");
  __shared__ std::uint32_t hist[kBins];
  __shared__ scan::BlockScanStorage<kThreads> scan_storage;
  __shared__ std::uint32_t sel_bin, sel_above;

  const std::int64_t r = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const T* row = static_cast<const T*>(a.scores) + r * a.s0;
  const std::int64_t n = a.n;

  // ---- 1. radix select: digits of 11, 11 and 10 bits, most significant first.
  std::uint32_t prefix = 0, prefix_mask = 0;
  std::uint32_t k_rem = static_cast<std::uint32_t>(a.k);  // rank of T among keys matching prefix
  std::uint32_t n_above = 0;
  std::uint32_t selectable = 0;  // this thread's keys above the key of -inf (pass 0)
#pragma unroll 1
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const int bins = pass == 2 ? 1024 : 2048;
    for (int b = tid; b < kBins; b += kThreads) hist[b] = 0;
    if (tid == 0) sel_bin = sel_above = 0;
    __syncthreads();
#pragma unroll 1
    for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
      const std::int64_t c = c0 + static_cast<std::int64_t>(tid) * kVec;
      std::uint32_t bits[kVec];
      bool valid[kVec];
      load_bits<T, kVec>(row, a.s1, c, n, bits, valid);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if (!valid[e]) continue;
        const std::uint32_t key = token::order_key(bits[e]);
        if (pass == 0) {
          if (token::is_nan_bits(bits[e])) flags::record(a.nan_flag, r, static_cast<std::uint32_t>(c + e));
          selectable += key > token::kNegInfKey;
        }
        if ((key & prefix_mask) == prefix) atomicAdd(&hist[(key >> shift) & (bins - 1)], 1u);
      }
    }
    __syncthreads();
    // The digit of T: the bin where the count of keys in higher bins first reaches k_rem. Each
    // thread owns a contiguous range of bins; a scan gives the count above each range.
    const int per = bins / kThreads;
    std::uint32_t local = 0;
    for (int b = tid * per; b < (tid + 1) * per; ++b) local += hist[b];
    std::uint32_t total = 0;
    const std::uint32_t below = scan::block_exclusive_sum<kThreads>(local, scan_storage, total);
    std::uint32_t acc = total - below - local;  // keys in bins above this thread's range
    for (int b = (tid + 1) * per - 1; b >= tid * per; --b) {
      const std::uint32_t h = hist[b];
      if (acc < k_rem && acc + h >= k_rem) {  // exactly one bin of the row satisfies this
        sel_bin = static_cast<std::uint32_t>(b);
        sel_above = acc;
      }
      acc += h;
    }
    __syncthreads();
    prefix |= sel_bin << shift;
    prefix_mask |= static_cast<std::uint32_t>(bins - 1) << shift;
    n_above += sel_above;
    k_rem -= sel_above;
    __syncthreads();  // everyone has read sel_* before the next pass resets them
  }
  // With fewer than k selectable scores the whole selectable set is the answer, in ascending column
  // order (no k-th value exists, so no "ties after"); treating T as the key of -inf makes every
  // selectable score "above" and takes no tie. With exactly k the k-th value exists and its ties go
  // last, as with more (docs/semantics.md, Stage 3).
  std::uint32_t n_selectable = 0;
  scan::block_exclusive_sum<kThreads>(selectable, scan_storage, n_selectable);
  std::uint32_t threshold = prefix;
  if (n_selectable < static_cast<std::uint32_t>(a.k)) {
    threshold = token::kNegInfKey;
    n_above = n_selectable;
  }
  const std::uint32_t take_ties = threshold == token::kNegInfKey ? 0u : k_rem;
  const std::uint32_t valid_count = n_above + take_ties;

  // ---- 2. one emit pass: above -> [0, n_above), ties -> [n_above, valid_count), ascending.
  std::int32_t* out = a.indices + r * a.i0;
  std::uint32_t base_above = 0, base_tie = 0;
#pragma unroll 1
  for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
    if (base_above >= n_above && base_tie >= take_ties) break;  // block-uniform: both from scans
    const std::int64_t c = c0 + static_cast<std::int64_t>(tid) * kVec;
    std::uint32_t bits[kVec];
    bool valid[kVec];
    load_bits<T, kVec>(row, a.s1, c, n, bits, valid);
    std::uint32_t is_above = 0, is_tie = 0, na = 0, nt = 0;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const std::uint32_t key = token::order_key(bits[e]);
      const bool ab = valid[e] && key > threshold;
      const bool ti = valid[e] && take_ties != 0 && key == threshold;
      is_above |= static_cast<std::uint32_t>(ab) << e;
      is_tie |= static_cast<std::uint32_t>(ti) << e;
      na += ab;
      nt += ti;
    }
    std::uint32_t total = 0;
    const std::uint32_t excl = scan::block_exclusive_sum<kThreads>((na << 16) | nt, scan_storage, total);
    std::uint32_t slot_above = base_above + (excl >> 16);
    std::uint32_t rank_tie = base_tie + (excl & 0xffffu);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      if ((is_above >> e) & 1u) out[static_cast<std::int64_t>(slot_above++) * a.i1] = static_cast<std::int32_t>(c + e);
      if ((is_tie >> e) & 1u) {
        if (rank_tie < take_ties) out[static_cast<std::int64_t>(n_above + rank_tie) * a.i1] = static_cast<std::int32_t>(c + e);
        ++rank_tie;
      }
    }
    base_above += total >> 16;
    base_tie += total & 0xffffu;
  }
  for (std::int64_t s = valid_count + tid; s < a.k; s += kThreads) out[s * a.i1] = -1;
  if (tid == 0 && a.counts != nullptr) a.counts[r * a.c0] = static_cast<std::int32_t>(valid_count);
}

}  // namespace sparge::cuda::topk
