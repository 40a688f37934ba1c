// The pooled scores S = scale * pq . pk^T: per query head a small fp32 GEMM [NQ x D] x [D x NK]
// (the pooled rows are fp32 and stay fp32, as docs/semantics.md asks of the GPU). A CTA computes
// one TILE x TILE tile with 256 threads (16 x 16, each a (TILE/16)^2 micro-tile), staging 8
// head-dim columns at a time in shared memory. Tiles that no query block of the tile can see
// (causal, or past a varlen sequence's end) are skipped: the selection never reads them.
//
// Every score is one fmaf chain over d = 0 .. D-1 in order, the same instructions for every
// element, so equal pooled K rows give bit-equal scores (exact ties stay exact ties) and the
// result is the same on every run.
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
cudaError_t launch_scores(const Geometry& g, float scale, const Scratch& s, cudaStream_t st) {
  const std::int64_t m = g.nq < g.nk ? g.nq : g.nk;
  if (m >= 512) return launch<128>(g, scale, s, st);
  if (m >= 64) return launch<64>(g, scale, s, st);
  if (m >= 32) return launch<32>(g, scale, s, st);
  return launch<16>(g, scale, s, st);
}

}  // namespace sparge::cuda::block_map
