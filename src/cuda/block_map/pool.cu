// The memory-bound part of the block map: the K mean (smooth_k) and the pooling / self-similarity
// of every Q and K block, in two passes over the inputs (docs/block_map_gpu.md):
//   pass 1: Q pooling, and K sums of kKSumRows-row chunks (smooth_k) or K pooling (no smoothing);
//   k_mean: the chunk sums of each (sequence, kv head) in chunk order, / k_len;
//   pass 2 (smooth_k): K pooling of the rows shifted by the mean, in reverse item order, so that
//           it starts on the K rows pass 1 read last (still in L2).
// So Q is read once and K twice (the smoothed rows' similarity needs the mean first).
//
// One warp per work item (a Q / K block or a K chunk): no shared memory and no block barriers, so
// a warp's loads overlap the other warps' arithmetic. A row of D values is read by LANES =
// next_pow2(D / 8) consecutive lanes, 8 values (one 16-byte load) each; the warp reads
// 32 / LANES rows per step and issues kBatch steps of loads before it adds any. Items are
// numbered with the head fastest, so the warps in flight read whole token rows of the tensor
// (all heads of a block of tokens): contiguous memory for the usual [B, S, H, D] layout.
//
// Determinism: every sum has a fixed order. A lane adds its rows in row order, the row groups of
// the warp meet in a fixed shuffle tree, the K chunks are added in chunk order, and the row norms
// and |sum of unit rows|^2 reduce with fixed shuffle trees. Nothing depends on scheduling.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/block_map/block_map.cuh"
#include "cuda/block_map/load.cuh"

namespace sparge::cuda::block_map {

namespace {

constexpr int kWarps = kPoolThreads / 32;
constexpr int kBatch = 8;  // steps of 16-byte loads in flight per lane
constexpr std::int64_t kMaxGrid = std::int64_t{1} << 30;

int grid_for(std::int64_t warps) {
  const std::int64_t ctas = (warps + kWarps - 1) / kWarps;
  return static_cast<int>(ctas < kMaxGrid ? ctas : kMaxGrid);
}

// One kind of work item over one tensor: item i = ((seq * nblk) + block) * heads + head.
struct Segment {
  Rows x;
  bool is_k = false;              // rows of k (k_begin / k_len) or of q
  bool pool = false;              // pooled mean + similarity; false: plain row sums (K mean chunks)
  bool reverse = false;           // walk the items last to first
  std::int64_t heads = 0, nblk = 0, count = 0;
  int blk = 0;                    // rows per item
  const float* shift = nullptr;   // [nseq, heads, D] subtracted from every row (smooth_k), or null
  float* out = nullptr;           // [nseq, heads, nblk, D]: pooled rows or chunk sums
  float* sim = nullptr;           // [nseq, heads, nblk] (pool)
  Out<float> maybe_sim;           // optional diagnostic [B, heads, nblk]
};

struct PassArgs {
  Geometry g;
  Segment seg[2];  // items [0, seg[0].count), then [.., + seg[1].count)
};

template <class T, int LANES>
__global__ void __launch_bounds__(kPoolThreads, 3) pass_kernel(const __grid_constant__ PassArgs a) {
  constexpr int kRowsPerStep = 32 / LANES;
  const Geometry& g = a.g;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int sub = lane % LANES, grp = lane / LANES;
  const bool col_ok = sub < g.d / 8;
  const std::int64_t total = a.seg[0].count + a.seg[1].count;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kWarps;
  for (std::int64_t w = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; w < total; w += stride) {
    const bool first = w < a.seg[0].count;
    const Segment& sg = first ? a.seg[0] : a.seg[1];
    std::int64_t i = first ? w : w - a.seg[0].count;
    if (sg.reverse) i = sg.count - 1 - i;
    const std::int64_t h = i % sg.heads, b = (i / sg.heads) % sg.nblk, si = i / (sg.heads * sg.nblk);
    const std::int64_t o = (si * sg.heads + h) * sg.nblk + b;  // output row
    const Seq seq = sequence(g, si);
    const std::int64_t len = sg.is_k ? seq.k_len : seq.q_len;
    const std::int64_t begin = (sg.is_k ? seq.k_begin : seq.q_begin) + b * sg.blk;
    const int n = static_cast<int>(clamp64(len - b * sg.blk, 0, sg.blk));

    float shift[8] = {};
    if (sg.shift != nullptr && col_ok) {
#pragma unroll
      for (int j = 0; j < 8; ++j) shift[j] = sg.shift[(si * sg.heads + h) * g.d + sub * 8 + j];
    }
    float sum[8] = {}, unit[8] = {};
    // Warp-uniform loop: row r = s0 + u * kRowsPerStep + grp.
    for (int s0 = 0; s0 < n; s0 += kBatch * kRowsPerStep) {
      uint4 raw[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int r = s0 + u * kRowsPerStep + grp;
        raw[u] = (col_ok && r < n) ? load8(sg.x, seq.batch, begin + r, h, sub) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const bool valid = col_ok && s0 + u * kRowsPerStep + grp < n;
        float v[8];
        unpack8<T>(raw[u], v);
        if (!sg.pool) {
#pragma unroll
          for (int j = 0; j < 8; ++j) sum[j] += valid ? v[j] : 0.0f;
          continue;
        }
        float n2 = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          v[j] = valid ? v[j] - shift[j] : 0.0f;
          n2 = fmaf(v[j], v[j], n2);
        }
        // |row|^2 over the LANES lanes of the row (every lane of the warp takes part).
#pragma unroll
        for (int x = LANES / 2; x > 0; x >>= 1) n2 += __shfl_xor_sync(0xffffffffu, n2, x);
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
    }
    // The row groups of the warp, in a fixed tree; lanes of group 0 end with the totals.
#pragma unroll
    for (int x = LANES; x < 32; x <<= 1) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        sum[j] += __shfl_xor_sync(0xffffffffu, sum[j], x);
        unit[j] += __shfl_xor_sync(0xffffffffu, unit[j], x);
      }
    }
    const bool writer = grp == 0 && col_ok;
    float* out = sg.out + o * g.d + sub * 8;  // 32-byte aligned: D % 8 == 0, regions 256-byte aligned
    if (!sg.pool) {
      if (writer) {
        reinterpret_cast<float4*>(out)[0] = make_float4(sum[0], sum[1], sum[2], sum[3]);
        reinterpret_cast<float4*>(out)[1] = make_float4(sum[4], sum[5], sum[6], sum[7]);
      }
      continue;
    }
    float u2 = 0.0f;
    if (writer) {
      float p[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        p[j] = n > 0 ? sum[j] / static_cast<float>(n) : 0.0f;
        u2 = fmaf(unit[j], unit[j], u2);
      }
      reinterpret_cast<float4*>(out)[0] = make_float4(p[0], p[1], p[2], p[3]);
      reinterpret_cast<float4*>(out)[1] = make_float4(p[4], p[5], p[6], p[7]);
    }
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) u2 += __shfl_xor_sync(0xffffffffu, u2, x);
    if (lane == 0) {
      const float fn = static_cast<float>(n);
      const float sim = n > 0 ? u2 / (fn * fn) : 0.0f;
      sg.sim[o] = sim;
      if (sg.maybe_sim.data != nullptr) {
        const Out<float>& m = sg.maybe_sim;
        m.data[si * m.stride[0] + h * m.stride[1] + b * m.stride[2]] = sim;
      }
    }
  }
}

// ---- K mean: the chunk sums of one (sequence, kv head) in chunk order, / k_len ----------------
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
#pragma unroll 8
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

// The 16-bit element type and the lanes per row, as template arguments.
cudaError_t launch_pass(bool bf16, const PassArgs& a, cudaStream_t st) {
  const std::int64_t items = a.seg[0].count + a.seg[1].count;
  if (items == 0) return cudaSuccess;
  const std::int64_t cols = a.g.d / 8;
  const auto go = [&](auto lanes) {
    constexpr int L = decltype(lanes)::value;
    if (bf16) {
      pass_kernel<__nv_bfloat16, L><<<grid_for(items), kPoolThreads, 0, st>>>(a);
    } else {
      pass_kernel<__half, L><<<grid_for(items), kPoolThreads, 0, st>>>(a);
    }
    return cudaGetLastError();
  };
  if (cols <= 1) return go(std::integral_constant<int, 1>{});
  if (cols <= 2) return go(std::integral_constant<int, 2>{});
  if (cols <= 4) return go(std::integral_constant<int, 4>{});
  if (cols <= 8) return go(std::integral_constant<int, 8>{});
  if (cols <= 16) return go(std::integral_constant<int, 16>{});
  return go(std::integral_constant<int, 32>{});
}

Segment pool_segment(const Geometry& g, const Rows& x, bool is_k, const float* shift, const Scratch& s,
                     const Out<float>& maybe_sim) {
  Segment sg;
  sg.x = x;
  sg.is_k = is_k;
  sg.pool = true;
  sg.heads = is_k ? g.hk : g.hq;
  sg.nblk = is_k ? g.nk : g.nq;
  sg.count = g.nseq * sg.heads * sg.nblk;
  sg.blk = is_k ? g.blkk : g.blkq;
  sg.shift = shift;
  sg.out = is_k ? s.pk : s.pq;
  sg.sim = is_k ? s.k_sim : s.q_sim;
  sg.maybe_sim = maybe_sim;
  return sg;
}

// The K sums of kKSumRows-row chunks (the first step of the K mean).
Segment k_sums_segment(const Geometry& g, const Rows& k, const Scratch& s) {
  Segment sums;
  sums.x = k;
  sums.is_k = true;
  sums.pool = false;
  sums.heads = g.hk;
  sums.nblk = s.nchunks;
  sums.count = g.nseq * g.hk * s.nchunks;
  sums.blk = kKSumRows;
  sums.out = s.k_part;
  return sums;
}

}  // namespace

cudaError_t launch_k_mean(const Geometry& g, const Scratch& s, cudaStream_t st) {
  const std::int64_t work = g.nseq * g.hk;
  if (work == 0) return cudaSuccess;
  k_mean_kernel<<<static_cast<int>(work < kMaxGrid ? work : kMaxGrid), kPoolThreads, 0, st>>>(g, s);
  return cudaGetLastError();
}

cudaError_t launch_k_chunk_sums(const Geometry& g, const Rows& k, bool bf16, const Scratch& s, cudaStream_t st) {
  PassArgs a;
  a.g = g;
  a.seg[0] = k_sums_segment(g, k, s);
  return launch_pass(bf16, a, st);
}

cudaError_t launch_pool_one(const Geometry& g, const Rows& x, bool bf16, bool is_k, const float* shift, const Scratch& s,
                            cudaStream_t st) {
  PassArgs a;
  a.g = g;
  a.seg[0] = pool_segment(g, x, is_k, shift, s, Out<float>{});
  return launch_pass(bf16, a, st);
}

cudaError_t launch_pooling(const Geometry& g, const Rows& q, const Rows& k, bool bf16, bool smooth, const Scratch& s,
                           const Out<float>& maybe_q_sim, const Out<float>& maybe_k_sim, cudaStream_t st) {
  PassArgs p1;
  p1.g = g;
  p1.seg[0] = pool_segment(g, q, false, nullptr, s, maybe_q_sim);
  if (!smooth) {
    p1.seg[1] = pool_segment(g, k, true, nullptr, s, maybe_k_sim);
    return launch_pass(bf16, p1, st);
  }
  p1.seg[1] = k_sums_segment(g, k, s);
  cudaError_t e = launch_pass(bf16, p1, st);
  if (e != cudaSuccess) return e;
  if ((e = launch_k_mean(g, s, st)) != cudaSuccess) return e;

  PassArgs p2;
  p2.g = g;
  p2.seg[0] = pool_segment(g, k, true, s.k_mean, s, maybe_k_sim);
  p2.seg[0].reverse = true;  // start on the K rows pass 1 read last
  return launch_pass(bf16, p2, st);
}

}  // namespace sparge::cuda::block_map
