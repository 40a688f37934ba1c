// The pooled scores S = scale * pq . pk^T: per query head a small fp32 GEMM [NQ x D] x [D x NK]
// (the pooled rows are fp32 and stay fp32, as docs/semantics.md asks of the GPU). A CTA computes
// one TILE x TILE tile with 256 threads (16 x 16, each a (TILE/16)^2 micro-tile), staging 8
// head-dim columns at a time in shared memory. Tiles that no query block of the tile can see
// (causal, or past a varlen sequence's end) are skipped: the selection never reads them.
//
// Every score is one fmaf chain over d = 0 .. D-1 in order, the same instructions for every
// element, so equal pooled K rows give bit-equal scores (exact ties stay exact ties) and the
// result is the same on every run.
#include <cstdlib>
#include <cstring>

#include "cuda/block_map/block_map.cuh"

namespace sparge::cuda::block_map {

namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 8;  // head-dim columns staged per step; D is a multiple of 8
constexpr std::int64_t kMaxGrid = std::int64_t{1} << 30;

template <int TILE>
__global__ void __launch_bounds__(kThreads) scores_kernel(Geometry g, float scale, Scratch s) {
  constexpr int kMicro = TILE / 16;
  constexpr int kPitch = TILE + 1;
  __shared__ float as[kChunk * kPitch];
  __shared__ float bs[kChunk * kPitch];
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % 16, ty = tid / 16;
  const std::int64_t tiles_q = (g.nq + TILE - 1) / TILE, tiles_k = (g.nk + TILE - 1) / TILE;
  const std::int64_t total = g.nseq * g.hq * tiles_q * tiles_k;
  const std::int64_t group = g.hq / g.hk;
  for (std::int64_t w = blockIdx.x; w < total; w += gridDim.x) {
    const std::int64_t tk = w % tiles_k, tq = (w / tiles_k) % tiles_q;
    const std::int64_t h = (w / (tiles_k * tiles_q)) % g.hq, si = w / (tiles_k * tiles_q * g.hq);
    const std::int64_t qb0 = tq * TILE, kb0 = tk * TILE;
    const Seq seq = sequence(g, si);
    // Visibility grows with the query block, so the tile's last real query block bounds it.
    const std::int64_t nq_seq = (seq.q_len + g.blkq - 1) / g.blkq;
    const std::int64_t qb_hi = (qb0 + TILE < nq_seq ? qb0 + TILE : nq_seq) - 1;
    if (qb_hi < qb0 || kb0 >= visible_blocks(g, seq, qb_hi)) continue;  // uniform over the CTA

    const float* pq = s.pq + (si * g.hq + h) * g.nq * g.d;
    const float* pk = s.pk + (si * g.hk + h / group) * g.nk * g.d;
    float acc[kMicro][kMicro] = {};
    for (std::int64_t k0 = 0; k0 < g.d; k0 += kChunk) {
      for (int idx = tid; idx < TILE * kChunk; idx += kThreads) {
        const int r = idx / kChunk, c = idx % kChunk;
        const std::int64_t qb = qb0 + r, kb = kb0 + r;
        as[c * kPitch + r] = qb < g.nq ? pq[qb * g.d + k0 + c] : 0.0f;
        bs[c * kPitch + r] = kb < g.nk ? pk[kb * g.d + k0 + c] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int c = 0; c < kChunk; ++c) {
        float a[kMicro], b[kMicro];
#pragma unroll
        for (int i = 0; i < kMicro; ++i) {
          a[i] = as[c * kPitch + ty + 16 * i];
          b[i] = bs[c * kPitch + tx + 16 * i];
        }
#pragma unroll
        for (int i = 0; i < kMicro; ++i) {
#pragma unroll
          for (int j = 0; j < kMicro; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
      }
      __syncthreads();
    }
    float* out = s.scores + (si * g.hq + h) * g.nq * g.nk;
#pragma unroll
    for (int i = 0; i < kMicro; ++i) {
      const std::int64_t qb = qb0 + ty + 16 * i;
#pragma unroll
      for (int j = 0; j < kMicro; ++j) {
        const std::int64_t kb = kb0 + tx + 16 * j;
        if (qb < g.nq && kb < g.nk) out[qb * g.nk + kb] = acc[i][j] * scale;
      }
    }
  }
}

// The large tile: 128 x 128 per CTA, each of the 256 threads (16 x 16) an 8 x 8 micro-tile, rows
// ty*4 + {0..3} and 64 + ty*4 + {0..3} (columns likewise with tx), read from shared memory as
// float4 (conflict free). Head-dim chunks of 8 are double-buffered: the global loads of chunk
// c + 1 are in flight while chunk c is multiplied, one barrier per chunk. Same fmaf chain per
// score as scores_kernel, so the same bits.
constexpr int kBig = 128;
constexpr int kBigPitch = kBig + 4;  // keeps the float4 rows aligned; staging stores are conflict free

__global__ void __launch_bounds__(kThreads, 2) scores_big_kernel(Geometry g, float scale, Scratch s) {
  __shared__ __align__(16) float as[2][kChunk][kBigPitch];
  __shared__ __align__(16) float bs[2][kChunk][kBigPitch];
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % 16, ty = tid / 16;
  const int lr = tid / 2, lc = (tid % 2) * 4;  // staging: one float4 of A and of B per thread and chunk
  const std::int64_t tiles_q = (g.nq + kBig - 1) / kBig, tiles_k = (g.nk + kBig - 1) / kBig;
  const std::int64_t total = g.nseq * g.hq * tiles_q * tiles_k;
  const std::int64_t group = g.hq / g.hk;
  const int chunks = static_cast<int>(g.d / kChunk);
  for (std::int64_t w = blockIdx.x; w < total; w += gridDim.x) {
    const std::int64_t tk = w % tiles_k, tq = (w / tiles_k) % tiles_q;
    const std::int64_t h = (w / (tiles_k * tiles_q)) % g.hq, si = w / (tiles_k * tiles_q * g.hq);
    const std::int64_t qb0 = tq * kBig, kb0 = tk * kBig;
    const Seq seq = sequence(g, si);
    const std::int64_t nq_seq = (seq.q_len + g.blkq - 1) / g.blkq;
    const std::int64_t qb_hi = (qb0 + kBig < nq_seq ? qb0 + kBig : nq_seq) - 1;
    if (qb_hi < qb0 || kb0 >= visible_blocks(g, seq, qb_hi)) continue;  // uniform over the CTA

    // Rows past NQ / NK read as zeros (their scores are never stored).
    const bool a_ok = qb0 + lr < g.nq, b_ok = kb0 + lr < g.nk;
    const float* pa = s.pq + ((si * g.hq + h) * g.nq + (a_ok ? qb0 + lr : 0)) * g.d + lc;
    const float* pb = s.pk + ((si * g.hk + h / group) * g.nk + (b_ok ? kb0 + lr : 0)) * g.d + lc;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 ra = a_ok ? *reinterpret_cast<const float4*>(pa) : zero;
    float4 rb = b_ok ? *reinterpret_cast<const float4*>(pb) : zero;
    const auto stage = [&](int buf) {
      as[buf][lc + 0][lr] = ra.x;
      as[buf][lc + 1][lr] = ra.y;
      as[buf][lc + 2][lr] = ra.z;
      as[buf][lc + 3][lr] = ra.w;
      bs[buf][lc + 0][lr] = rb.x;
      bs[buf][lc + 1][lr] = rb.y;
      bs[buf][lc + 2][lr] = rb.z;
      bs[buf][lc + 3][lr] = rb.w;
    };
    stage(0);
    __syncthreads();
    float acc[8][8] = {};
    for (int c0 = 0; c0 < chunks; ++c0) {
      const int cur = c0 & 1;
      const bool more = c0 + 1 < chunks;
      if (more) {
        ra = a_ok ? *reinterpret_cast<const float4*>(pa + (c0 + 1) * kChunk) : zero;
        rb = b_ok ? *reinterpret_cast<const float4*>(pb + (c0 + 1) * kChunk) : zero;
      }
#pragma unroll
      for (int c = 0; c < kChunk; ++c) {
        const float4 a0 = *reinterpret_cast<const float4*>(&as[cur][c][ty * 4]);
        const float4 a1 = *reinterpret_cast<const float4*>(&as[cur][c][64 + ty * 4]);
        const float4 b0 = *reinterpret_cast<const float4*>(&bs[cur][c][tx * 4]);
        const float4 b1 = *reinterpret_cast<const float4*>(&bs[cur][c][64 + tx * 4]);
        const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
      }
      // The other buffer was last read before the previous barrier.
      if (more) stage(cur ^ 1);
      __syncthreads();
    }
    float* out = s.scores + (si * g.hq + h) * g.nq * g.nk;
    const bool vec = g.nk % 4 == 0;  // rows 16-byte aligned (the region is)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const std::int64_t qb = qb0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
      if (qb >= g.nq) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const std::int64_t kb = kb0 + half * 64 + tx * 4;
        const float* v = &acc[i][half * 4];
        if (vec) {
          if (kb < g.nk) {
            *reinterpret_cast<float4*>(out + qb * g.nk + kb) =
                make_float4(v[0] * scale, v[1] * scale, v[2] * scale, v[3] * scale);
          }
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (kb + j < g.nk) out[qb * g.nk + kb + j] = v[j] * scale;
          }
        }
      }
    }
  }
}

cudaError_t launch_big(const Geometry& g, float scale, const Scratch& s, cudaStream_t st) {
  const std::int64_t tiles = g.nseq * g.hq * ((g.nq + kBig - 1) / kBig) * ((g.nk + kBig - 1) / kBig);
  if (tiles == 0) return cudaSuccess;
  const int grid = static_cast<int>(tiles < kMaxGrid ? tiles : kMaxGrid);
  scores_big_kernel<<<grid, kThreads, 0, st>>>(g, scale, s);
  return cudaGetLastError();
}

// SPARGE_BLOCKMAP_SCORES=small (read per call) keeps the (TILE/16)^2 micro-tiles for every shape,
// for timing comparisons.
bool big_allowed() {
  const char* v = std::getenv("SPARGE_BLOCKMAP_SCORES");
  return !(v != nullptr && std::strcmp(v, "small") == 0);
}

template <int TILE>
cudaError_t launch(const Geometry& g, float scale, const Scratch& s, cudaStream_t st) {
  const std::int64_t tiles = g.nseq * g.hq * ((g.nq + TILE - 1) / TILE) * ((g.nk + TILE - 1) / TILE);
  if (tiles == 0) return cudaSuccess;
  const int grid = static_cast<int>(tiles < kMaxGrid ? tiles : kMaxGrid);
  scores_kernel<TILE><<<grid, kThreads, 0, st>>>(g, scale, s);
  return cudaGetLastError();
}

}  // namespace

// Tile choice changes speed only, never a score: each score is the same fmaf chain in any tile.
const char* scores_variant(const Geometry& g) {
  const std::int64_t m = g.nq < g.nk ? g.nq : g.nk;
  if (m >= 128 && big_allowed()) return "big128";
  if (m >= 512) return "tile128";
  if (m >= 64) return "tile64";
  if (m >= 32) return "tile32";
  return "tile16";
}

cudaError_t launch_scores(const Geometry& g, float scale, const Scratch& s, cudaStream_t st) {
  const std::int64_t m = g.nq < g.nk ? g.nq : g.nk;
  if (m >= 128 && big_allowed()) return launch_big(g, scale, s, st);
  if (m >= 512) return launch<128>(g, scale, s, st);
  if (m >= 64) return launch<64>(g, scale, s, st);
  if (m >= 32) return launch<32>(g, scale, s, st);
  return launch<16>(g, scale, s, st);
}

}  // namespace sparge::cuda::block_map
