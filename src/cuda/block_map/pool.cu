// The memory-bound part of the block map: the K mean (smooth_k) and the pooling / self-similarity
// of every Q and K block. Together they read Q once and K twice (once for its mean, once for the
// pooling of the smoothed rows, which needs the mean first), in 16-byte loads: a row of D values
// is read by LANES = next_pow2(D / 8) consecutive threads, 8 values each.
//
// Determinism: every sum has a fixed order. A thread accumulates its rows in row order, the
// partial sums of the CTA's row groups are added in group order through shared memory, the K
// chunks in chunk order, and the row norms / |sum of unit rows|^2 reduce with fixed shuffle
// trees. Nothing depends on scheduling, so the pooled values are the same bits on every run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/block_map/block_map.cuh"
#include "cuda/block_map/load.cuh"

namespace sparge::cuda::block_map {

namespace {

constexpr int kWarps = kPoolThreads / 32;
constexpr std::int64_t kMaxGrid = std::int64_t{1} << 30;

int grid_for(std::int64_t work) { return static_cast<int>(work < kMaxGrid ? work : kMaxGrid); }

// Adds the per-thread partial sums red[tid*8 + j] (thread tid = group * LANES + lane, lane owning
// columns lane*8 .. lane*8+7) over the groups, in group order, for column d.
template <int LANES>
__device__ __forceinline__ float sum_groups(const float* red, int d) {
  constexpr int kGroups = kPoolThreads / LANES;
  const int lane = d / 8, j = d % 8;
  float t = 0.0f;
#pragma unroll 8
  for (int grp = 0; grp < kGroups; ++grp) t += red[(grp * LANES + lane) * 8 + j];
  return t;
}

// ---- K mean, pass 1: sums of kKSumRows-row chunks --------------------------------------------
template <class T, int LANES>
__global__ void __launch_bounds__(kPoolThreads) k_sum_kernel(Geometry g, Rows k, Scratch s) {
  constexpr int kGroups = kPoolThreads / LANES;
  constexpr int kInFlight = 8;  // rows loaded before they are added: 8 x 16 bytes per thread
  __shared__ float red[kPoolThreads * 8];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % LANES, grp = tid / LANES;
  const bool col_ok = lane < g.d / 8;
  const std::int64_t total = g.nseq * g.hk * s.nchunks;
  for (std::int64_t w = blockIdx.x; w < total; w += gridDim.x) {
    const std::int64_t chunk = w % s.nchunks, h = (w / s.nchunks) % g.hk, si = w / (s.nchunks * g.hk);
    const Seq seq = sequence(g, si);
    const std::int64_t r0 = chunk * kKSumRows;
    const int n = static_cast<int>(clamp64(seq.k_len - r0, 0, kKSumRows));
    float sum[8] = {};
    for (int base = grp; base < n; base += kInFlight * kGroups) {
      uint4 raw[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int r = base + u * kGroups;
        raw[u] = (col_ok && r < n) ? load8(k, seq.batch, seq.k_begin + r0 + r, h, lane) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (!(col_ok && base + u * kGroups < n)) continue;
        float x[8];
        unpack8<T>(raw[u], x);
#pragma unroll
        for (int j = 0; j < 8; ++j) sum[j] += x[j];
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) red[tid * 8 + j] = sum[j];
    __syncthreads();
    for (int d = tid; d < g.d; d += kPoolThreads) s.k_part[w * g.d + d] = sum_groups<LANES>(red, d);
    __syncthreads();  // red is rewritten by the next work item
  }
}

// ---- K mean, pass 2: chunks in order, / k_len ---------------------------------------------------
__global__ void __launch_bounds__(kPoolThreads) k_mean_kernel(Geometry g, Scratch s) {
  __shared__ float red[kPoolThreads];
  const int tid = static_cast<int>(threadIdx.x);
  const int d_count = static_cast<int>(g.d);
  const int groups = kPoolThreads / d_count;  // D <= 256, so at least 1
  const int grp = tid / d_count, d = tid % d_count;
  for (std::int64_t w = blockIdx.x; w < g.nseq * g.hk; w += gridDim.x) {
    const Seq seq = sequence(g, w / g.hk);
    float acc = 0.0f;
    if (grp < groups) {
      for (std::int64_t c = grp; c < s.nchunks; c += groups) acc += s.k_part[(w * s.nchunks + c) * g.d + d];
    }
    red[tid] = acc;
    __syncthreads();
    if (tid < d_count) {
      float t = 0.0f;
      for (int i = 0; i < groups; ++i) t += red[i * d_count + tid];
      s.k_mean[w * g.d + tid] = seq.k_len > 0 ? t / static_cast<float>(seq.k_len) : 0.0f;
    }
    __syncthreads();
  }
}

// ---- pooling and self-similarity of Q or K blocks ----------------------------------------------
struct PoolArgs {
  Geometry g;
  Rows x;
  bool is_k;
  const float* shift;  // k_mean [nseq, hk, D] (smooth_k), else nullptr
  float* pooled;       // [nseq, heads, nblk, D]
  float* sim;          // [nseq, heads, nblk]
  Out<float> maybe_sim;
};

template <class T, int LANES>
__global__ void __launch_bounds__(kPoolThreads) pool_kernel(PoolArgs a) {
  constexpr int kGroups = kPoolThreads / LANES;
  constexpr int kIters = (128 + kGroups - 1) / kGroups;  // enough for the largest block (128 rows)
  __shared__ float red_sum[kPoolThreads * 8];
  __shared__ float red_unit[kPoolThreads * 8];
  __shared__ float warp_part[kWarps];
  const Geometry& g = a.g;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % LANES, grp = tid / LANES;
  const bool col_ok = lane < g.d / 8;
  const std::int64_t heads = a.is_k ? g.hk : g.hq;
  const std::int64_t nblk = a.is_k ? g.nk : g.nq;
  const int blk = a.is_k ? g.blkk : g.blkq;
  const std::int64_t total = g.nseq * heads * nblk;
  for (std::int64_t w = blockIdx.x; w < total; w += gridDim.x) {
    const std::int64_t b = w % nblk, h = (w / nblk) % heads, si = w / (nblk * heads);
    const Seq seq = sequence(g, si);
    const std::int64_t len = a.is_k ? seq.k_len : seq.q_len;
    const std::int64_t begin = a.is_k ? seq.k_begin : seq.q_begin;
    const std::int64_t r0 = b * blk;
    const int n = static_cast<int>(clamp64(len - r0, 0, blk));

    float shift[8] = {};
    if (a.shift != nullptr && col_ok) {
#pragma unroll
      for (int j = 0; j < 8; ++j) shift[j] = a.shift[(si * heads + h) * g.d + lane * 8 + j];
    }
    // All loads first (up to kIters x 16 bytes in flight per thread), then the arithmetic.
    uint4 raw[kIters];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int r = grp + it * kGroups;
      raw[it] = (col_ok && r < n) ? load8(a.x, seq.batch, begin + r0 + r, h, lane) : make_uint4(0, 0, 0, 0);
    }
    float sum[8] = {}, unit[8] = {};
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const bool valid = col_ok && grp + it * kGroups < n;
      float v[8];
      unpack8<T>(raw[it], v);
      float n2 = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        v[j] = valid ? v[j] - shift[j] : 0.0f;
        n2 = fmaf(v[j], v[j], n2);
      }
      // |row|^2 over the LANES threads of the row; every thread of the warp takes part.
#pragma unroll
      for (int o = LANES / 2; o > 0; o >>= 1) n2 += __shfl_xor_sync(0xffffffffu, n2, o);
      if (valid) {
#pragma unroll
        for (int j = 0; j < 8; ++j) sum[j] += v[j];
        // A zero row adds nothing to the sum of unit rows (but counts in n).
        if (n2 > 0.0f) {
          const float inv = 1.0f / sqrtf(n2);
#pragma unroll
          for (int j = 0; j < 8; ++j) unit[j] = fmaf(v[j], inv, unit[j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      red_sum[tid * 8 + j] = sum[j];
      red_unit[tid * 8 + j] = unit[j];
    }
    __syncthreads();
    float u2 = 0.0f;
    if (tid < g.d) {  // D <= kPoolThreads: one column per thread
      const float total_sum = sum_groups<LANES>(red_sum, tid);
      const float total_unit = sum_groups<LANES>(red_unit, tid);
      a.pooled[w * g.d + tid] = n > 0 ? total_sum / static_cast<float>(n) : 0.0f;
      u2 = total_unit * total_unit;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) u2 += __shfl_xor_sync(0xffffffffu, u2, o);
    if (tid % 32 == 0) warp_part[tid / 32] = u2;
    __syncthreads();
    if (tid == 0) {
      float t = 0.0f;
#pragma unroll
      for (int i = 0; i < kWarps; ++i) t += warp_part[i];
      const float fn = static_cast<float>(n);
      const float sim = n > 0 ? t / (fn * fn) : 0.0f;
      a.sim[w] = sim;
      if (a.maybe_sim.data != nullptr) {
        a.maybe_sim.data[si * a.maybe_sim.stride[0] + h * a.maybe_sim.stride[1] + b * a.maybe_sim.stride[2]] = sim;
      }
    }
    __syncthreads();  // red_* and warp_part are rewritten by the next work item
  }
}

// The 16-bit element type and the lanes per row, as template arguments.
template <template <class, int> class Launch, class... Args>
cudaError_t dispatch(bool bf16, std::int64_t d, Args&&... args) {
  const std::int64_t cols = d / 8;
  const auto go = [&](auto lanes) {
    constexpr int L = decltype(lanes)::value;
    return bf16 ? Launch<__nv_bfloat16, L>::run(args...) : Launch<__half, L>::run(args...);
  };
  if (cols <= 1) return go(std::integral_constant<int, 1>{});
  if (cols <= 2) return go(std::integral_constant<int, 2>{});
  if (cols <= 4) return go(std::integral_constant<int, 4>{});
  if (cols <= 8) return go(std::integral_constant<int, 8>{});
  if (cols <= 16) return go(std::integral_constant<int, 16>{});
  return go(std::integral_constant<int, 32>{});
}

template <class T, int L>
struct KSumLaunch {
  static cudaError_t run(const Geometry& g, const Rows& k, const Scratch& s, cudaStream_t st) {
    const std::int64_t work = g.nseq * g.hk * s.nchunks;
    k_sum_kernel<T, L><<<grid_for(work), kPoolThreads, 0, st>>>(g, k, s);
    return cudaGetLastError();
  }
};

template <class T, int L>
struct PoolLaunch {
  static cudaError_t run(const PoolArgs& a, std::int64_t work, cudaStream_t st) {
    pool_kernel<T, L><<<grid_for(work), kPoolThreads, 0, st>>>(a);
    return cudaGetLastError();
  }
};

}  // namespace

cudaError_t launch_k_sum(const Geometry& g, const Rows& k, bool bf16, const Scratch& s, cudaStream_t st) {
  if (g.nseq * g.hk * s.nchunks == 0) return cudaSuccess;
  return dispatch<KSumLaunch>(bf16, g.d, g, k, s, st);
}

cudaError_t launch_k_mean(const Geometry& g, const Scratch& s, cudaStream_t st) {
  const std::int64_t work = g.nseq * g.hk;
  if (work == 0) return cudaSuccess;
  k_mean_kernel<<<grid_for(work), kPoolThreads, 0, st>>>(g, s);
  return cudaGetLastError();
}

cudaError_t launch_pool(const Geometry& g, const Rows& x, bool bf16, bool is_k, bool smooth, const Scratch& s,
                        const Out<float>& maybe_sim, cudaStream_t st) {
  PoolArgs a{g, x, is_k, is_k && smooth ? s.k_mean : nullptr, is_k ? s.pk : s.pq, is_k ? s.k_sim : s.q_sim,
             maybe_sim};
  const std::int64_t work = g.nseq * (is_k ? g.hk * g.nk : g.hq * g.nq);
  if (work == 0) return cudaSuccess;
  return dispatch<PoolLaunch>(bf16, g.d, a, work, st);
}

}  // namespace sparge::cuda::block_map
