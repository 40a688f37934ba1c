// topk_select in (usually) two reads of the row: radix select on 11 + 11 + 10 key bits where only
// the first digit is counted over the whole row; the rest is resolved on a small candidate set in
// shared memory. One CTA (kThreads) per row.
//
//   1. Histogram pass: every key's top digit (11 bits) -> hist; the digit d1 holding the k-th largest
//      key, n_strong = #(digit > d1) (all surely selected) and the candidate count C = hist[d1].
//      (The number of selectable scores falls out of the same histogram: see kNegInfKey below.)
//   2. Only while C > kCap (a huge bucket: heavy ties, narrow value ranges), one more histogram pass
//      over the row on the next digit, restricted to the bucket, narrows the range [lo, hi].
//   3. Emit pass: keys > hi ("strong") go straight to out[0, n_strong) in ascending column order;
//      keys in [lo, hi] ("candidates") are compacted into shared memory, also in ascending column
//      order, (column, key) pairs. Slots come from a block-wide exclusive scan per chunk, never from
//      atomics, so nothing depends on scheduling. When the range is a single key (all three digits
//      were resolved on the row, or fewer than k scores are selectable), the candidates are the
//      ties themselves and the first take_ties go straight to their slots instead.
//   4. The remaining digits are counted over the candidates only: T = the k-th largest key,
//      m = #(candidates > T). The output is merge(strong, candidates above T) by column, then the
//      ties (key == T) by column. Both lists are ascending, so the merge is positional: a strong
//      entry moves up by the number of candidates-above with a smaller column (binary search in
//      shared memory), a candidate-above lands at its rank plus the number of strong entries with a
//      smaller column (binary search in the strong list before it moves). The strong list is moved
//      in place from its top chunk down: a move only goes up, and every entry of a chunk is read
//      before any of them is written.
// With kFilter, step 1 is preceded by a sample of the row (kSampleElems scores per thread, spread
// over the row) that picks a lowest top digit `lb` still worth counting: the pass then does a
// shared-memory atomic only for keys with digit >= lb (a few percent of a random row instead of
// every key, whose top digits cluster in a handful of bins and so serialise the atomics) and counts
// the selectable keys in a register. The bins >= lb are exact, so when they hold at least k keys
// the digit of the k-th is found among them exactly as without the filter; when they do not (the
// sample misjudged the row), the pass is repeated counting every key. Results never depend on lb.
// Reads of the row: 2 when the top bucket holds at most kCap keys (random scores at k = 2048 of
// 131072: ~2200), 3 or 4 otherwise (as many as the old kernel did).
//
// Exact semantics (docs/semantics.md, Stage 3; src/cpu/token.cpp is the spec): keys strictly above
// T in ascending column order, then keys equal to T in ascending column order up to k; a row with
// fewer than k selectable scores lists all of them (T is taken as the key of -inf: everything
// selectable is above, no tie) and pads with -1.
#pragma once

#include "cuda/topk/common.cuh"

namespace sparge::cuda::topk {

constexpr int kThreads = 256;     // one CTA per row
constexpr int kBins = 2048;       // 11-bit digits (the last one has 10 bits)
constexpr int kCap = 4096;        // candidates kept in shared memory: 2 x 16 KB
constexpr int kMinBlocksPerSm = 4;  // 512 rows on 132 SMs run in one wave
constexpr int kSampleElems = 4;     // kFilter: scores sampled per thread (1024 per row)
constexpr std::int64_t kFilterMinN = 16384;  // kFilter: shorter rows count every key

// Every key below the key of -inf belongs to a negative NaN and every key above it is selectable
// (or a positive NaN), so #selectable = the sum of the top-digit bins from 4 up: bin 3 ends exactly
// at the key of -inf.
static_assert(token::kNegInfKey == (4u << 21) - 1u, "the key of -inf must close top-digit bin 3");

// A key that is not an ordinary selectable score: NaN (either sign) or -inf, i.e. key <= kNegInfKey
// (-inf, negative NaN) or key > the key of +inf (positive NaN); one subtraction and one compare, so
// the histogram pass tests it on every key and looks closer only when it is set.
constexpr std::uint32_t kPosInfKey = 0xff800000u;  // token::order_key(bits of +inf)
__device__ __forceinline__ bool is_special_key(std::uint32_t key) {
  return key - (token::kNegInfKey + 1u) > kPosInfKey - (token::kNegInfKey + 1u);
}

// token::order_key of every non-NaN score, in three ALU operations: x + 0.0f (round to nearest,
// no flush to zero: inline PTX so that no compiler flag changes it) turns -0.0 into +0.0 and leaves
// every other non-NaN value as it is; then the sign decides between ~b and b | sign. A NaN comes
// out as the canonical positive NaN (its key is > kPosInfKey whatever its sign): only rows that
// are rejected anyway see the difference. The kernel uses this key in all passes.
__device__ __forceinline__ std::uint32_t fast_key(std::uint32_t bits) {
  float x;
  asm("add.rn.f32 %0, %1, 0f00000000;" : "=f"(x) : "f"(__uint_as_float(bits)));
  const std::uint32_t b = __float_as_uint(x);
  return b ^ (static_cast<std::uint32_t>(static_cast<std::int32_t>(b) >> 31) | 0x80000000u);
}

// ++hist[bin] in shared memory when p, as a predicated reduction (no branch around it).
__device__ __forceinline__ void add_one_if(std::uint32_t* hist, std::uint32_t bin, bool p) {
  const auto addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(hist + bin));
  asm volatile(
      "{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %1, 0;\n\t@q red.shared.add.u32 [%0], %2;\n\t}"
      ::"r"(addr), "r"(static_cast<std::uint32_t>(p)), "r"(1u) : "memory");
}

// One thread's columns of a chunk: kVec * kLoads consecutive columns from `col`, of which the
// first `valid` exist (the others hold -inf, so that they need no test in the
// histogram pass: see there). Consecutive threads own consecutive column ranges, so a block scan over the
// threads in order lists the chunk's columns in ascending order. The scores are kept as loaded
// (two f16 per register) to spare registers; bits(e) widens on use.
template <class T, int kVec, int kLoads>
struct Slice {
  static constexpr int kElems = kVec * kLoads;
  static constexpr bool kHalf = sizeof(T) == 2;
  static constexpr int kWords = kHalf ? (kElems + 1) / 2 : kElems;
  std::uint32_t raw[kWords];
  std::int64_t col;
  int valid;

  __device__ __forceinline__ std::uint32_t bits(int e) const {
    if constexpr (kHalf) {
      const auto h = static_cast<unsigned short>(raw[e / 2] >> (16 * (e % 2)));
      return float_bits(__ushort_as_half(h));
    } else {
      return raw[e];
    }
  }
  __device__ __forceinline__ std::uint32_t key(int e) const { return fast_key(bits(e)); }

  // kVec > 1: rows are contiguous (s1 == 1) and 16-byte aligned (the host checks), so a full slice
  // is kLoads 16-byte loads; the row's tail and the strided path load one element at a time.
  __device__ __forceinline__ void load(const T* row, std::int64_t s1, std::int64_t c, std::int64_t n) {
    col = c;
    const std::int64_t left = n - c;
    valid = left <= 0 ? 0 : (left >= kElems ? kElems : static_cast<int>(left));
    if constexpr (kVec > 1) {
      if (valid == kElems) {
        const uint4* p = reinterpret_cast<const uint4*>(row + c);
#pragma unroll
        for (int l = 0; l < kLoads; ++l) {
          const uint4 v = __ldg(p + l);
          raw[4 * l] = v.x;
          raw[4 * l + 1] = v.y;
          raw[4 * l + 2] = v.z;
          raw[4 * l + 3] = v.w;
        }
        return;
      }
    }
#pragma unroll
    for (int w = 0; w < kWords; ++w) raw[w] = kHalf ? 0xfc00fc00u : 0xff800000u;  // -inf
#pragma unroll
    for (int e = 0; e < kElems; ++e) {
      if (e < valid) {
        if constexpr (kHalf) {
          const auto h = reinterpret_cast<const unsigned short*>(row)[(c + e) * s1];
          const int sh = 16 * (e % 2);
          raw[e / 2] = (raw[e / 2] & ~(0xffffu << sh)) | (static_cast<std::uint32_t>(h) << sh);
        } else {
          raw[e] = __float_as_uint(row[(c + e) * s1]);
        }
      }
    }
  }
};

// Calls f(slice) on this thread's slice of every chunk of the row, in order; stops after the first
// f that returns false. f's answer must be block-uniform (f may synchronise the block). With
// kPrefetch the next chunk's loads are issued before f runs on the current one; with kAhead > 0
// (contiguous rows only) also an L2 prefetch of this thread's slice kAhead chunks further on,
// which puts more bytes in flight without holding registers for them.
template <bool kPrefetch, class S, int kAhead = 0, class T, class F>
__device__ __forceinline__ void walk_row(const T* row, std::int64_t s1, std::int64_t n, F&& f) {
  constexpr std::int64_t kChunk = static_cast<std::int64_t>(kThreads) * S::kElems;
  const std::int64_t first = static_cast<std::int64_t>(threadIdx.x) * S::kElems;
  if constexpr (kPrefetch) {
    S cur;
    cur.load(row, s1, first, n);
#pragma unroll 1
    for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
      if constexpr (kAhead > 0) {
        const std::int64_t c = c0 + (kAhead + 1) * kChunk + first;
        if (c < n) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + c));  // inside the row only
      }
      S next;
      next.load(row, s1, c0 + kChunk + first, n);  // past the row: valid = 0, nothing is read
      if (!f(cur)) break;
      cur = next;
    }
  } else {
#pragma unroll 1
    for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
      S cur;
      cur.load(row, s1, c0 + first, n);
      if (!f(cur)) break;
    }
  }
}

struct Digit {
  std::uint32_t bin;    // the digit of the k_rem-th largest key of the range
  std::uint32_t above;  // keys of the range in higher bins
  std::uint32_t count;  // keys in that bin
};

// The bin of hist[0, bins) where the count of keys in higher bins first reaches k_rem (1 <= k_rem
// <= the sum of hist). Every thread calls it and gets the answer; `total` gets the sum of hist.
// Each thread owns a contiguous range of bins and a scan gives the count above each range. On
// return every thread has finished reading hist and `sel` (a barrier follows the last read of
// hist, and `sel` is only written again after the barriers of the next call).
__device__ __forceinline__ Digit select_digit(const std::uint32_t* hist, int bins, std::uint32_t k_rem,
                                              scan::BlockScanStorage<kThreads>& scan_storage, Digit& sel,
                                              std::uint32_t& total) {
  const int tid = static_cast<int>(threadIdx.x);
  const int per = bins / kThreads;
  std::uint32_t local = 0;
  for (int b = tid * per; b < (tid + 1) * per; ++b) local += hist[b];
  const std::uint32_t below = scan::block_exclusive_sum<kThreads>(local, scan_storage, total);
  std::uint32_t acc = total - below - local;  // keys in bins above this thread's range
  for (int b = (tid + 1) * per - 1; b >= tid * per; --b) {
    const std::uint32_t h = hist[b];
    if (acc < k_rem && acc + h >= k_rem) sel = Digit{static_cast<std::uint32_t>(b), acc, h};  // one bin only
    acc += h;
  }
  __syncthreads();
  return sel;
}

// #(entries of the ascending list v[0, len) below x), v in shared or global memory with stride.
template <class V>
__device__ __forceinline__ std::uint32_t count_below(const V* v, std::int64_t stride, std::uint32_t len,
                                                     std::uint32_t x) {
  std::uint32_t lo = 0, hi = len;
  while (lo < hi) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (static_cast<std::uint32_t>(v[static_cast<std::int64_t>(mid) * stride]) < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// kFilter: the lowest top digit worth counting in the histogram pass, from a sample of the row
// (kSampleElems consecutive scores at kThreads evenly spaced columns), or 0 (count every key).
// The sample's count of keys in bins >= lb must reach its expected count of the k largest plus a
// margin of 4 standard deviations + 8, so that the k-th key of the row falls below lb only for rows
// whose sampled columns are unlike the rest (then the caller repeats the pass with lb = 0).
// Every thread calls it (it synchronises); hist must be zero on entry and is zero again on return.
template <class T>
__device__ __forceinline__ std::uint32_t sample_lowest_digit(const T* row, std::int64_t s1, std::int64_t n,
                                                             std::uint32_t k, std::uint32_t* hist,
                                                             scan::BlockScanStorage<kThreads>& scan_storage,
                                                             Digit& sel) {
  constexpr int kSamples = kThreads * kSampleElems;
  if (n < kFilterMinN) return 0u;  // block-uniform; n >= kSamples, so the sampled columns are distinct
  const float expected = static_cast<float>(kSamples) * static_cast<float>(k) / static_cast<float>(n);
  const float target_f = expected + 4.0f * sqrtf(expected) + 8.0f;
  if (target_f >= static_cast<float>(kSamples) / 2) return 0u;  // a filter would save little
  const auto target = static_cast<std::uint32_t>(target_f) + 1u;
  const std::int64_t c = static_cast<std::int64_t>(threadIdx.x) * n / kThreads;  // c + e < n
#pragma unroll
  for (int e = 0; e < kSampleElems; ++e) {
    const std::uint32_t b = float_bits<T>(row[(c + e) * s1]);
    if (!token::is_nan_bits(b)) atomicAdd(&hist[token::order_key(b) >> 21], 1u);
  }
  __syncthreads();
  std::uint32_t total = 0;
  const Digit d = select_digit(hist, kBins, target, scan_storage, sel, total);  // reads done on return
  for (int b = static_cast<int>(threadIdx.x); b < kBins; b += kThreads) hist[b] = 0;
  __syncthreads();
  return total >= target ? d.bin : 0u;  // too few samples (NaN): no filter
}

// The two-pass kernel's shared memory as one block (one_pass.cuh's fallback reuses its own bytes
// this way; two_pass_kernel keeps separate static arrays, which ptxas allocates better).
struct RowSmem {
  std::uint32_t hist[kBins];
  std::uint32_t cand_col[kCap];
  std::uint32_t cand_key[kCap];
  scan::BlockScanStorage<kThreads> scan_storage;
  Digit sel;
};

// One row (blockIdx.x) of the two-pass algorithm above in the given shared memory (hist: kBins
// words, cand_col / cand_key: kCap each); every thread of the CTA calls it.
template <class T, int kVec, int kLoads, bool kPrefetch, bool kFilter, int kAhead = 0>
__device__ __forceinline__ void two_pass_row(const TopkArgs& a, std::uint32_t* const hist, std::uint32_t* const cand_col,
                                             std::uint32_t* const cand_key, scan::BlockScanStorage<kThreads>& scan_storage,
                                             Digit& sel) {
  using S = Slice<T, kVec, kLoads>;
  constexpr int kElems = S::kElems;
  static_assert(kAhead == 0 || (kVec > 1 && kPrefetch), "L2 prefetch only on the contiguous prefetching path");
  static_assert(kElems <= 32, "per-thread class masks are 32-bit");
  static_assert(static_cast<std::int64_t>(kThreads) * kElems < 65536 && kCap < 65536,
                "the scans pack two 16-bit counts per thread");
  static_assert(kCap % kThreads == 0 && kBins % kThreads == 0, "bins and candidates split evenly over threads");

  const std::int64_t r = blockIdx.x;
  const int tid = static_cast<int>(threadIdx.x);
  const T* row = static_cast<const T*>(a.scores) + r * a.s0;
  const std::int64_t n = a.n;
  const std::uint32_t k = static_cast<std::uint32_t>(a.k);
  std::int32_t* out = a.indices + r * a.i0;
  const std::int64_t i1 = a.i1;

  // ---- 1. top-digit histogram over the row (bins >= lb only), the selectable keys and the lowest
  // NaN column of this thread.
  for (int b = tid; b < kBins; b += kThreads) hist[b] = 0;
  __syncthreads();
  std::uint32_t lb = 0;
  if constexpr (kFilter) lb = sample_lowest_digit<T>(row, a.s1, n, k, hist, scan_storage, sel);
  std::uint32_t nan_col = ~0u;
  std::uint32_t total = 0, n_selectable = 0;
  Digit d{};
#pragma unroll 1
  for (;;) {
    const std::uint32_t lb_key = lb << 21;  // count keys >= lb_key, i.e. top digit >= lb
    std::uint32_t my_unselectable = 0;      // keys <= kNegInfKey (-inf, negative NaN)
    // Per key: its bin if counted, and a flag for the rare NaN / -inf keys, handled afterwards.
    // Columns past the row's end hold -inf: counted in bin 3 (only when lb <= 3, and then every
    // selectable key is counted too, so `total` still decides right below and bin 3 is never the
    // digit of T) and as unselectable, which is undone per slice.
    walk_row<kPrefetch, S, kAhead>(row, a.s1, n, [&](const S& s) {
      std::uint32_t special = 0;
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        const std::uint32_t key = s.key(e);
        special |= static_cast<std::uint32_t>(is_special_key(key)) << e;
        add_one_if(hist, key >> 21, key >= lb_key);
      }
      if (special != 0) {
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
          if ((special >> e) & 1u) {
            const std::uint32_t b = s.bits(e);
            if (token::is_nan_bits(b)) nan_col = min(nan_col, static_cast<std::uint32_t>(s.col + e));
            my_unselectable += token::order_key(b) <= token::kNegInfKey;
          }
        }
        my_unselectable -= static_cast<std::uint32_t>(kElems - s.valid);  // the padding was -inf
      }
      return true;
    });
    __syncthreads();
    std::uint32_t n_unselectable = 0;
    (void)scan::block_exclusive_sum<kThreads>(my_unselectable, scan_storage, n_unselectable);
    n_selectable = static_cast<std::uint32_t>(n) - n_unselectable;
    d = select_digit(hist, kBins, k, scan_storage, sel, total);  // total = keys counted in hist
    // Block-uniform. With lb = 0 every key is counted, so total >= n_selectable.
    if (lb == 0 || n_selectable < k || total >= k) break;
    lb = 0;  // the sample misjudged the row: count every key (hist is no longer read: see select_digit)
    for (int b = tid; b < kBins; b += kThreads) hist[b] = 0;
    __syncthreads();
  }
  if (nan_col != ~0u) flags::record(a.nan_flag, r, nan_col);

  // The current range of keys [lo, hi] holding T; n_above = #(keys > hi); k_rem = T's rank in it.
  std::uint32_t prefix = 0, n_above = 0, k_rem = k, count = 0;
  int level = 0;  // digits resolved: prefix holds the top 11, 22 or 32 bits
  bool single = true;
  std::uint32_t lo = token::kNegInfKey, hi = token::kNegInfKey, take_ties = 0;
  if (n_selectable >= k) {
    prefix = d.bin << 21;
    n_above = d.above;
    k_rem = k - d.above;
    count = d.count;
    level = 1;
    // ---- 2. a bucket too large for shared memory: narrow it with more passes over the row.
#pragma unroll 1
    while (level < 3 && count > static_cast<std::uint32_t>(kCap)) {  // block-uniform
      const int shift = level == 1 ? 10 : 0;
      const int bins = level == 1 ? 2048 : 1024;
      const std::uint32_t pmask = level == 1 ? 0xffe00000u : 0xfffffc00u;
      __syncthreads();  // every thread has read hist (n_selectable, the previous digit)
      for (int b = tid; b < kBins; b += kThreads) hist[b] = 0;
      __syncthreads();
      walk_row<kPrefetch, S, kAhead>(row, a.s1, n, [&](const S& s) {
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
          const std::uint32_t key = s.key(e);
          if (e < s.valid && (key & pmask) == prefix) atomicAdd(&hist[(key >> shift) & (bins - 1)], 1u);
        }
        return true;
      });
      __syncthreads();
      d = select_digit(hist, bins, k_rem, scan_storage, sel, total);
      prefix |= d.bin << shift;
      n_above += d.above;
      k_rem -= d.above;
      count = d.count;
      ++level;
    }
    lo = prefix;
    hi = prefix | (level == 1 ? 0x1fffffu : (level == 2 ? 0x3ffu : 0u));
    single = level == 3;
    take_ties = k_rem;
  } else {
    n_above = n_selectable;  // every selectable key is above the key of -inf; no tie is taken
  }
  const std::uint32_t n_strong = n_above;
  const std::uint32_t want_cand = single ? take_ties : count;

  // ---- 3. emit pass: strong keys to their slots, candidates (or ties) compacted, all ascending.
  std::uint32_t base_s = 0, base_c = 0;
  walk_row<kPrefetch, S, kAhead>(row, a.s1, n, [&](const S& s) {
    if (base_s >= n_strong && base_c >= want_cand) return false;  // block-uniform: from the scans
    std::uint32_t is_strong = 0, is_cand = 0;
#pragma unroll
    for (int e = 0; e < kElems; ++e) {
      const std::uint32_t key = s.key(e);
      is_strong |= static_cast<std::uint32_t>(key > hi) << e;
      is_cand |= static_cast<std::uint32_t>(key - lo <= hi - lo) << e;  // lo <= key <= hi (lo <= hi)
    }
    if (s.valid != kElems) {  // the columns past the row's end (only in its last chunk)
      const std::uint32_t live = s.valid <= 0 ? 0u : (s.valid >= 32 ? ~0u : (1u << s.valid) - 1u);
      is_strong &= live;
      is_cand &= live;
    }
    const std::uint32_t ns = __popc(is_strong), nc = __popc(is_cand);
    std::uint32_t chunk_total = 0;
    const std::uint32_t excl = scan::block_exclusive_sum<kThreads>((ns << 16) | nc, scan_storage, chunk_total);
    std::uint32_t slot = base_s + (excl >> 16);
    std::uint32_t rank = base_c + (excl & 0xffffu);
    for (std::uint32_t m = is_strong; m != 0; m &= m - 1) {  // set bits, lowest (column) first
      const auto col = static_cast<std::int32_t>(s.col + (__ffs(static_cast<int>(m)) - 1));
      if (slot < k) out[static_cast<std::int64_t>(slot) * i1] = col;
      ++slot;
    }
#pragma unroll
    for (int e = 0; e < kElems; ++e) {
      const auto col = static_cast<std::int32_t>(s.col + e);
      if ((is_cand >> e) & 1u) {
        if (single) {
          if (rank < take_ties) out[static_cast<std::int64_t>(n_strong + rank) * i1] = col;
        } else if (rank < static_cast<std::uint32_t>(kCap)) {
          cand_col[rank] = static_cast<std::uint32_t>(col);
          cand_key[rank] = s.key(e);
        }
        ++rank;
      }
    }
    base_s += chunk_total >> 16;
    base_c += chunk_total & 0xffffu;
    return true;
  });

  std::uint32_t valid_count = single ? n_strong + take_ties : k;
  if (!single) {
    // ---- 4a. the remaining digits of T, counted over the candidates only.
    const std::uint32_t n_cand = min(count, static_cast<std::uint32_t>(kCap));
#pragma unroll 1
    while (level < 3) {
      const int shift = level == 1 ? 10 : 0;
      const int bins = level == 1 ? 2048 : 1024;
      const std::uint32_t pmask = level == 1 ? 0xffe00000u : 0xfffffc00u;
      __syncthreads();  // the previous hist readers (and the emit pass's candidate writers) are done
      for (int b = tid; b < kBins; b += kThreads) hist[b] = 0;
      __syncthreads();
      for (std::uint32_t i = tid; i < n_cand; i += kThreads) {
        const std::uint32_t key = cand_key[i];
        if ((key & pmask) == prefix) atomicAdd(&hist[(key >> shift) & (bins - 1)], 1u);
      }
      __syncthreads();
      d = select_digit(hist, bins, k_rem, scan_storage, sel, total);
      prefix |= d.bin << shift;
      k_rem -= d.above;
      ++level;
    }
    const std::uint32_t t_key = prefix;

    // ---- 4b. classify this thread's candidates: above T -> A (ascending columns), ties -> slots.
    constexpr int kPer = kCap / kThreads;
    const std::uint32_t i0 = static_cast<std::uint32_t>(tid) * kPer;
    std::uint32_t is_above = 0, is_tie = 0, na = 0, nt = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const std::uint32_t i = i0 + j;
      const std::uint32_t key = i < n_cand ? cand_key[i] : 0u;
      const bool ab = i < n_cand && key > t_key;
      const bool ti = i < n_cand && key == t_key;
      is_above |= static_cast<std::uint32_t>(ab) << j;
      is_tie |= static_cast<std::uint32_t>(ti) << j;
      na += ab;
      nt += ti;
    }
    std::uint32_t cand_total = 0;
    // The scan synchronises: every thread has read its candidates' keys before A overwrites them.
    const std::uint32_t excl = scan::block_exclusive_sum<kThreads>((na << 16) | nt, scan_storage, cand_total);
    const std::uint32_t m = cand_total >> 16;          // candidates above T
    const std::uint32_t tie_base = n_strong + m;       // first tie slot
    const std::uint32_t take = tie_base < k ? k - tie_base : 0u;  // ties that fit (>= 1 in fact)
    std::uint32_t ja = excl >> 16, jt = excl & 0xffffu;
    std::uint32_t* above_cols = cand_key;  // A[j], j < m: columns of the candidates above T, ascending
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const std::uint32_t i = i0 + j;
      if ((is_above >> j) & 1u) above_cols[ja++] = cand_col[i];
      if ((is_tie >> j) & 1u) {
        if (jt < take) out[static_cast<std::int64_t>(tie_base + jt) * i1] = static_cast<std::int32_t>(cand_col[i]);
        ++jt;
      }
    }
    __syncthreads();

    if (m > 0) {  // block-uniform
      // ---- 4c. final slot of A[j]: j + #(strong columns below it), from the strong list before
      // it moves (written by the emit pass, visible after the barrier above).
      std::uint32_t* above_slot = cand_col;
      for (std::uint32_t j = tid; j < m; j += kThreads) {
        above_slot[j] = j + count_below(out, i1, n_strong, above_cols[j]);
      }
      __syncthreads();
      // ---- 4d. move the strong list up in place, top chunk first: each entry moves up by the
      // number of A entries below its column. All reads of a chunk precede its writes (barrier);
      // a chunk's writes land at or above its own first slot, so lower chunks are still intact,
      // and the final slots of all entries are distinct.
#pragma unroll 1
      for (std::int64_t s0 = (static_cast<std::int64_t>(n_strong) + kThreads - 1) / kThreads * kThreads - kThreads;
           s0 >= 0; s0 -= kThreads) {
        const std::int64_t s = s0 + tid;
        std::int32_t v = 0;
        std::uint32_t up = 0;
        if (s < n_strong) {
          v = out[s * i1];
          up = count_below(above_cols, 1, m, static_cast<std::uint32_t>(v));
        }
        __syncthreads();
        if (up != 0 && s + up < k) out[(s + up) * i1] = v;
      }
      __syncthreads();
      for (std::uint32_t j = tid; j < m; j += kThreads) {
        if (above_slot[j] < k) out[static_cast<std::int64_t>(above_slot[j]) * i1] = static_cast<std::int32_t>(above_cols[j]);
      }
    }
  }
  for (std::int64_t s = static_cast<std::int64_t>(valid_count) + tid; s < k; s += kThreads) out[s * i1] = -1;
  if (tid == 0 && a.counts != nullptr) a.counts[r * a.c0] = static_cast<std::int32_t>(valid_count);
}

template <class T, int kVec, int kLoads, bool kPrefetch, bool kFilter, int kAhead = 0>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) two_pass_kernel(const TopkArgs a) {
  __shared__ std::uint32_t hist[kBins];
  __shared__ std::uint32_t cand_col[kCap];
  __shared__ std::uint32_t cand_key[kCap];
  __shared__ scan::BlockScanStorage<kThreads> scan_storage;
  __shared__ Digit sel;
  two_pass_row<T, kVec, kLoads, kPrefetch, kFilter, kAhead>(a, hist, cand_col, cand_key, scan_storage, sel);
}

}  // namespace sparge::cuda::topk
