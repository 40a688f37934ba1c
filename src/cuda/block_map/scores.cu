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
  wait_prior_grid();  // SPARGE_BLOCKMAP_PDL: nothing is read before the pooling has finished
  allow_dependents();
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

// The large tiles: TQ x TK (TQ, TK in {64, 128}) per CTA, each of the 256 threads (16 x 16) a
// (TQ / 16) x (TK / 16) micro-tile: rows ty*4 + {0..3} (and 64 + ty*4 + {0..3} when TQ = 128),
// columns likewise with tx, read from shared memory as float4 (conflict free). Head-dim chunks of 8
// are double-buffered: the global loads of chunk c + 1 are in flight while chunk c is multiplied,
// one barrier per chunk. Same fmaf chain per score as scores_kernel, so the same bits for every
// tile shape. 128 x 128 is the default; the smaller tiles (SPARGE_BLOCKMAP_SCORES=big64x128 /
// big64x64) give 2x / 4x the CTAs with shorter chains per thread (b2 h32 NQ 128 NK 256: 128 CTAs
// of 128 x 128 on 132 SMs, under one wave).

template <int TQ, int TK>
__global__ void __launch_bounds__(kThreads, TQ * TK <= 64 * 64 ? 4 : 2) scores_big_kernel(Geometry g, float scale,
                                                                                          Scratch s) {
  static_assert((TQ == 64 || TQ == 128) && (TK == 64 || TK == 128), "tiles of 64 or 128");
  constexpr int kMi = TQ / 16, kMj = TK / 16;  // micro-tile rows / columns (4 or 8)
  // Pitches keep the float4 rows aligned; the staging stores are conflict free (a warp's two
  // column groups lc = 0 / 4 land 4 * pitch = 16 mod 32 banks apart).
  __shared__ __align__(16) float as[2][kChunk][TQ + 4];
  __shared__ __align__(16) float bs[2][kChunk][TK + 4];
  wait_prior_grid();  // SPARGE_BLOCKMAP_PDL: nothing is read before the pooling has finished
  allow_dependents();
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % 16, ty = tid / 16;
  // Staging: thread tid holds row lr, columns lc .. lc + 3 of the chunk, of A when lr < TQ and of B
  // when lr < TK (256 threads: 128 rows x 2 float4).
  const int lr = tid / 2, lc = (tid % 2) * 4;
  const bool a_row = TQ == 128 || lr < TQ, b_row = TK == 128 || lr < TK;  // 128: every thread (lr < 128)
  const std::int64_t tiles_q = (g.nq + TQ - 1) / TQ, tiles_k = (g.nk + TK - 1) / TK;
  const std::int64_t total = g.nseq * g.hq * tiles_q * tiles_k;
  const std::int64_t group = g.hq / g.hk;
  const int chunks = static_cast<int>(g.d / kChunk);
  for (std::int64_t w = blockIdx.x; w < total; w += gridDim.x) {
    const std::int64_t tk = w % tiles_k, tq = (w / tiles_k) % tiles_q;
    const std::int64_t h = (w / (tiles_k * tiles_q)) % g.hq, si = w / (tiles_k * tiles_q * g.hq);
    const std::int64_t qb0 = tq * TQ, kb0 = tk * TK;
    const Seq seq = sequence(g, si);
    const std::int64_t nq_seq = (seq.q_len + g.blkq - 1) / g.blkq;
    const std::int64_t qb_hi = (qb0 + TQ < nq_seq ? qb0 + TQ : nq_seq) - 1;
    if (qb_hi < qb0 || kb0 >= visible_blocks(g, seq, qb_hi)) continue;  // uniform over the CTA

    // Rows past NQ / NK read as zeros (their scores are never stored).
    const bool a_ok = a_row && qb0 + lr < g.nq, b_ok = b_row && kb0 + lr < g.nk;
    const float* pa = s.pq + ((si * g.hq + h) * g.nq + (a_ok ? qb0 + lr : 0)) * g.d + lc;
    const float* pb = s.pk + ((si * g.hk + h / group) * g.nk + (b_ok ? kb0 + lr : 0)) * g.d + lc;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 ra = a_ok ? *reinterpret_cast<const float4*>(pa) : zero;
    float4 rb = b_ok ? *reinterpret_cast<const float4*>(pb) : zero;
    const auto stage = [&](int buf) {
      if (a_row) {
        as[buf][lc + 0][lr] = ra.x;
        as[buf][lc + 1][lr] = ra.y;
        as[buf][lc + 2][lr] = ra.z;
        as[buf][lc + 3][lr] = ra.w;
      }
      if (b_row) {
        bs[buf][lc + 0][lr] = rb.x;
        bs[buf][lc + 1][lr] = rb.y;
        bs[buf][lc + 2][lr] = rb.z;
        bs[buf][lc + 3][lr] = rb.w;
      }
    };
    stage(0);
    __syncthreads();
    float acc[kMi][kMj] = {};
    for (int c0 = 0; c0 < chunks; ++c0) {
      const int cur = c0 & 1;
      const bool more = c0 + 1 < chunks;
      if (more) {
        ra = a_ok ? *reinterpret_cast<const float4*>(pa + (c0 + 1) * kChunk) : zero;
        rb = b_ok ? *reinterpret_cast<const float4*>(pb + (c0 + 1) * kChunk) : zero;
      }
#pragma unroll
      for (int c = 0; c < kChunk; ++c) {
        float a[kMi], b[kMj];
#pragma unroll
        for (int half = 0; half < kMi / 4; ++half) {
          const float4 v = *reinterpret_cast<const float4*>(&as[cur][c][half * 64 + ty * 4]);
          a[half * 4 + 0] = v.x, a[half * 4 + 1] = v.y, a[half * 4 + 2] = v.z, a[half * 4 + 3] = v.w;
        }
#pragma unroll
        for (int half = 0; half < kMj / 4; ++half) {
          const float4 v = *reinterpret_cast<const float4*>(&bs[cur][c][half * 64 + tx * 4]);
          b[half * 4 + 0] = v.x, b[half * 4 + 1] = v.y, b[half * 4 + 2] = v.z, b[half * 4 + 3] = v.w;
        }
#pragma unroll
        for (int i = 0; i < kMi; ++i) {
#pragma unroll
          for (int j = 0; j < kMj; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
      }
      // The other buffer was last read before the previous barrier.
      if (more) stage(cur ^ 1);
      __syncthreads();
    }
    float* out = s.scores + (si * g.hq + h) * g.nq * g.nk;
    const bool vec = g.nk % 4 == 0;  // rows 16-byte aligned (the region is)
#pragma unroll
    for (int i = 0; i < kMi; ++i) {
      const std::int64_t qb = qb0 + (i / 4) * 64 + ty * 4 + i % 4;
      if (qb >= g.nq) continue;
#pragma unroll
      for (int half = 0; half < kMj / 4; ++half) {
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

template <int TQ, int TK>
cudaError_t launch_big(const Geometry& g, float scale, const Scratch& s, cudaStream_t st) {
  const std::int64_t tiles = g.nseq * g.hq * ((g.nq + TQ - 1) / TQ) * ((g.nk + TK - 1) / TK);
  if (tiles == 0) return cudaSuccess;
  const int grid = static_cast<int>(tiles < kMaxGrid ? tiles : kMaxGrid);
  return launch_kernel(scores_big_kernel<TQ, TK>, dim3(grid), dim3(kThreads), 0, st, pdl_mode() >= 1, g, scale, s);
}

// SPARGE_BLOCKMAP_SCORES (read per call) where NQ and NK are both at least 128: `big` (default)
// 128 x 128 tiles; `big64x128` / `big64x64` the smaller double-buffered tiles; `small` the
// (TILE/16)^2 micro-tiles of scores_kernel, for timing comparisons. Same bits every way.
enum class BigTile { kNone, k128, k64x128, k64x64 };
BigTile big_tile() {
  const char* v = std::getenv("SPARGE_BLOCKMAP_SCORES");
  if (v != nullptr && std::strcmp(v, "small") == 0) return BigTile::kNone;
  if (v != nullptr && std::strcmp(v, "big64x128") == 0) return BigTile::k64x128;
  if (v != nullptr && std::strcmp(v, "big64x64") == 0) return BigTile::k64x64;
  return BigTile::k128;
}

template <int TILE>
cudaError_t launch(const Geometry& g, float scale, const Scratch& s, cudaStream_t st) {
  const std::int64_t tiles = g.nseq * g.hq * ((g.nq + TILE - 1) / TILE) * ((g.nk + TILE - 1) / TILE);
  if (tiles == 0) return cudaSuccess;
  const int grid = static_cast<int>(tiles < kMaxGrid ? tiles : kMaxGrid);
  return launch_kernel(scores_kernel<TILE>, dim3(grid), dim3(kThreads), 0, st, pdl_mode() >= 1, g, scale, s);
}

}  // namespace

// Tile choice changes speed only, never a score: each score is the same fmaf chain in any tile.
const char* scores_variant(const Geometry& g) {
  const std::int64_t m = g.nq < g.nk ? g.nq : g.nk;
  const BigTile big = m >= 128 ? big_tile() : BigTile::kNone;
  if (big == BigTile::k128) return "big128";
  if (big == BigTile::k64x128) return "big64x128";
  if (big == BigTile::k64x64) return "big64x64";
  if (m >= 512) return "tile128";
  if (m >= 64) return "tile64";
  if (m >= 32) return "tile32";
  return "tile16";
}

cudaError_t launch_scores(const Geometry& g, float scale, const Scratch& s, cudaStream_t st) {
  const std::int64_t m = g.nq < g.nk ? g.nq : g.nk;
  const BigTile big = m >= 128 ? big_tile() : BigTile::kNone;
  if (big == BigTile::k128) return launch_big<128, 128>(g, scale, s, st);
  if (big == BigTile::k64x128) return launch_big<64, 128>(g, scale, s, st);
  if (big == BigTile::k64x64) return launch_big<64, 64>(g, scale, s, st);
  if (m >= 512) return launch<128>(g, scale, s, st);
  if (m >= 64) return launch<64>(g, scale, s, st);
  if (m >= 32) return launch<32>(g, scale, s, st);
  return launch<16>(g, scale, s, st);
}

}  // namespace sparge::cuda::block_map
