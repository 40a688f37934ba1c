// topk_select on CUDA: radix select of the k largest scores of each row (docs/semantics.md,
// "Stage 3"), bit-identical to the CPU backend.
//
// Scores map to order-preserving uint32 keys (cpu/token_order.h, shared with the CPU backend, so
// -0.0 == +0.0 and the two agree on every tie). One CTA per row:
//   1. three histogram passes over the row on 11 + 11 + 10 key bits find the k-th largest key T
//      and n_above = #(key > T) (seed 003: three passes instead of four for 8-bit digits);
//   2. ONE emit pass writes the keys above T into slots [0, n_above) and the ties (key == T) into
//      [n_above, k), each class in ascending column order. Slots come from a block-wide exclusive
//      scan, never from atomics, so the output never depends on scheduling.
// The two classes cannot be merged into one ">= T" pass: the ties must come after every larger
// value (the documented order, which gather_attention sums in).
// A row with fewer than k selectable (not -inf) scores selects all of them in ascending column order,
// as the CPU backend does: T is then taken as the key of -inf, every selectable score is "above"
// and no tie is taken, so -inf is never selected and the rest of the row is -1.
// A row of 512 KB does not fit in shared memory, so each pass reads the row from global memory
// (L2 catches part of it); the histogram passes are ~4 reads of the row in all, memory-bound.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cpu/token_order.h"
#include "cuda/cuda_backend.h"
#include "cuda/topk/block_scan.cuh"
#include "cuda/topk/error_flags.cuh"
#include "validate/validate.h"

namespace sparge::cuda {

namespace {

constexpr const char* kOp = "topk_select";

struct TopkArgs {
  const void* scores;
  std::int64_t s0, s1;  // element strides of scores
  std::int64_t n;
  int k;
  std::int32_t* indices;
  std::int64_t i0, i1;
  std::int32_t* counts;  // nullptr when absent
  std::int64_t c0;
  unsigned long long* nan_flag;  // lowest (row, column) holding a NaN
};

template <class T>
__device__ __forceinline__ std::uint32_t float_bits(T v);
template <>
__device__ __forceinline__ std::uint32_t float_bits<float>(float v) { return __float_as_uint(v); }
template <>
__device__ __forceinline__ std::uint32_t float_bits<__half>(__half v) { return __float_as_uint(__half2float(v)); }

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
__global__ void __launch_bounds__(kThreads) topk_kernel(const TopkArgs a) {
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

using KernelFn = void (*)(const TopkArgs);

// The one selection function: run and supported() both use it, so they never disagree.
struct TopkPlan {
  Status status;
  KernelFn kernel = nullptr;
  int threads = 0;
};

template <class T, int kVec>
void pick_threads(TopkPlan& plan, std::int64_t n) {
  // Tuning only (changes speed, never results): a wide block for long rows, a narrow one for short.
  if (n >= 8192) {
    plan.kernel = topk_kernel<T, 512, kVec>;
    plan.threads = 512;
  } else {
    plan.kernel = topk_kernel<T, 128, kVec>;
    plan.threads = 128;
  }
}

TopkPlan select_topk(const TopkSelectParams& p) {
  TopkPlan plan;
  const Tensor& s = p.scores;
  if (s.ndim != 2 || p.indices.ndim != 2) {
    return TopkPlan{detail::bad(kOp, "scores and indices must be 2-d (scores.ndim = ", s.ndim, ", indices.ndim = ", p.indices.ndim, ")")};
  }
  if (s.dtype != DType::f32 && s.dtype != DType::f16) {
    return TopkPlan{unsupported(detail::cat(kOp, ": scores.dtype = ", to_string(s.dtype), " is not supported on cuda (expected f32 or f16)"))};
  }
  if (s.shape[1] > INT32_MAX || p.k < 1 || p.k > s.shape[1]) {
    return TopkPlan{detail::bad(kOp, "k = ", p.k, " with N = ", s.shape[1], " (expected 1 <= k <= N <= 2^31 - 1)")};
  }
  // The vector path needs contiguous rows starting on 16-byte boundaries; anything else takes the
  // strided path (one element per load), which is slower but exact.
  const std::int64_t esize = static_cast<std::int64_t>(dtype_size(s.dtype));
  const std::int64_t per16 = 16 / esize;
  const bool vec = s.stride[1] == 1 && (reinterpret_cast<std::uintptr_t>(s.data) % 16 == 0) &&
                   (s.stride[0] % per16 == 0);
  const std::int64_t n = s.shape[1];
  if (s.dtype == DType::f32) {
    vec ? pick_threads<float, 4>(plan, n) : pick_threads<float, 1>(plan, n);
  } else {
    vec ? pick_threads<__half, 8>(plan, n) : pick_threads<__half, 1>(plan, n);
  }
  return plan;
}

}  // namespace

Status supported(const TopkSelectParams& p) { return select_topk(p).status; }

Status topk_select(const TopkSelectParams& p) {
  const TopkPlan plan = select_topk(p);
  SPARGE_RETURN_IF_ERROR(plan.status);
  const std::int64_t rows = p.scores.shape[0];
  if (rows == 0) return {};
  if (rows > INT32_MAX) return detail::bad(kOp, "scores.shape[0] = ", rows, " exceeds the grid limit");
  auto stream = static_cast<cudaStream_t>(p.exec.stream);
  flags::DeviceFlags<1> fl(stream);
  cudaError_t e = fl.init();
  if (e != cudaSuccess) return runtime_error(detail::cat(kOp, ": ", cudaGetErrorString(e)));
  TopkArgs a{};
  a.scores = p.scores.data;
  a.s0 = p.scores.stride[0];
  a.s1 = p.scores.stride[1];
  a.n = p.scores.shape[1];
  a.k = p.k;
  a.indices = p.indices.ptr<std::int32_t>();
  a.i0 = p.indices.stride[0];
  a.i1 = p.indices.stride[1];
  a.counts = p.maybe_counts.present() ? p.maybe_counts.ptr<std::int32_t>() : nullptr;
  a.c0 = p.maybe_counts.present() ? p.maybe_counts.stride[0] : 0;
  a.nan_flag = fl.device();
  plan.kernel<<<static_cast<unsigned>(rows), plan.threads, 0, stream>>>(a);
  e = cudaGetLastError();
  if (e != cudaSuccess) return runtime_error(detail::cat(kOp, ": kernel launch failed: ", cudaGetErrorString(e)));
  e = fl.fetch();
  if (e != cudaSuccess) return runtime_error(detail::cat(kOp, ": ", cudaGetErrorString(e)));
  if (fl[0] != flags::kNone) {
    const auto row = flags::row_of(fl[0]);
    const auto col = flags::col_of(fl[0]);
    return detail::bad(kOp, "scores[", row, ", ", col, "] is NaN (row ", row, ", column ", col,
                       "); scores must not contain NaN");
  }
  return {};
}

}  // namespace sparge::cuda
