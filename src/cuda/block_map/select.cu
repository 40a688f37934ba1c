// The selection of docs/semantics.md (Stage 1, steps 4-7): one CTA per query block row.
//   1. Items in blocked arrangement (thread t holds key blocks t*IPT .. t*IPT+IPT-1): the score
//      of every visible block, -inf for a forced column (K block not self-similar); the keep
//      flags of forced rows, forced columns and the sink.
//   2. The rankable blocks (visible, finite score) become 64-bit keys
//        (~order_bits(S) << IDX_BITS) | kb,
//      so an ascending block-wide radix sort (CUB BlockRadixSort) orders them by S descending and
//      ties toward the lower block index, exactly the CPU's strict total order.
//   3. top-k keeps the first n = min(R, max(1, floor((double)topk * NV))) ranks; cdf scans
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

#include "cuda/block_map/block_map.cuh"

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
    unsigned char keep[kCap];
  };

  __device__ static std::uint64_t key(float s, int kb) {
    return (static_cast<std::uint64_t>(~order_bits(s)) << kIdxBits) | static_cast<std::uint64_t>(kb);
  }
  __device__ static float score(std::uint64_t key) {
    return from_order_bits(~static_cast<std::uint32_t>(key >> kIdxBits));
  }
};

template <int NT, int IPT>
__global__ void __launch_bounds__(NT) select_kernel(const __grid_constant__ SelectArgs a) {
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

    // ---- 2./3. ranking and selection (uniform branch: r and forced_row are the CTA's) -------
    if (!forced_row && r > 0) {
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
  select_kernel<NT, IPT><<<grid, NT, bytes, st>>>(a);
  return cudaGetLastError();
}

}  // namespace

// Tiers by row length. The capacity changes speed only: keys are unique and the sort is total.
std::size_t select_smem_bytes(std::int64_t nk) {
  if (nk <= 256) return smem_bytes<128, 2>();
  if (nk <= 1024) return smem_bytes<256, 4>();
  if (nk <= 4096) return smem_bytes<512, 8>();
  if (nk <= kMaxKeyBlocks) return smem_bytes<1024, 16>();
  return 0;
}

cudaError_t launch_select(const Geometry& g, const SelectRule& rule, const Scratch& s, const Out<std::int32_t>& lut,
                          const Out<std::int32_t>& counts, const Out<float>& maybe_scores, cudaStream_t st) {
  const SelectArgs a{g, rule, s, lut, counts, maybe_scores};
  if (g.nk <= 256) return launch<128, 2>(a, st);
  if (g.nk <= 1024) return launch<256, 4>(a, st);
  if (g.nk <= 4096) return launch<512, 8>(a, st);
  return launch<1024, 16>(a, st);
}

}  // namespace sparge::cuda::block_map
