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
#include "cuda/block_map/load.cuh"

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

// The 128 x 128 tile with the pooled rows staged through cp.async (SPARGE_BLOCKMAP_SCORES unset or
// `stage`; `big128` keeps scores_big_kernel). scores_big_kernel waits on an L2 round trip per 8
// head-dim columns (16 in a row at D = 128, one CTA per SM at the issue's shape); here the rows of
// A (pq) and B (pk) come in head-dim chunks of kStageCols columns, kStages chunks in flight (all of
// them at D <= 64; at D = 128 the next two while one is multiplied), each thread issuing 16-byte cp.async copies into
// [row][column] arrays whose pitch (kStageCols + 4 floats) keeps both the copies and the float4
// reads below conflict free. Thread (ty, tx) owns rows ty + 16 i and columns tx + 16 j (i, j < 8)
// and takes the head dim 4 columns at a time: per row of A one float4, per column of B one float4,
// then the 4 fmaf steps in column order. Every score is the same fmaf chain over d = 0 .. D-1 as in
// the other kernels, so the same bits.
constexpr int kStageCols = 32;
constexpr int kStagePitch = kStageCols + 4;
constexpr int kStages = 2;
constexpr std::size_t kStageSmem = sizeof(float) * kStages * 2 * kBig * kStagePitch;  // 73,728 bytes

__global__ void __launch_bounds__(kThreads) scores_stage_kernel(Geometry g, float scale, Scratch s) {
  extern __shared__ __align__(16) float stage_smem[];
  // Buffer b: A at [b][0][row][col], B at [b][1][row][col].
  const auto tile = [&](int buf, int op) { return stage_smem + (buf * 2 + op) * kBig * kStagePitch; };
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % 16, ty = tid / 16;
  const std::int64_t tiles_q = (g.nq + kBig - 1) / kBig, tiles_k = (g.nk + kBig - 1) / kBig;
  const std::int64_t total = g.nseq * g.hq * tiles_q * tiles_k;
  const std::int64_t group = g.hq / g.hk;
  const int d = static_cast<int>(g.d);
  const int chunks = (d + kStageCols - 1) / kStageCols;
  for (std::int64_t w = blockIdx.x; w < total; w += gridDim.x) {
    const std::int64_t tk = w % tiles_k, tq = (w / tiles_k) % tiles_q;
    const std::int64_t h = (w / (tiles_k * tiles_q)) % g.hq, si = w / (tiles_k * tiles_q * g.hq);
    const std::int64_t qb0 = tq * kBig, kb0 = tk * kBig;
    const Seq seq = sequence(g, si);
    const std::int64_t nq_seq = (seq.q_len + g.blkq - 1) / g.blkq;
    const std::int64_t qb_hi = (qb0 + kBig < nq_seq ? qb0 + kBig : nq_seq) - 1;
    if (qb_hi < qb0 || kb0 >= visible_blocks(g, seq, qb_hi)) continue;  // uniform over the CTA

    const float* pa = s.pq + ((si * g.hq + h) * g.nq + qb0) * g.d;
    const float* pb = s.pk + ((si * g.hk + h / group) * g.nk + kb0) * g.d;
    // Chunk c into buffer c % kStages: kBig rows x (kStageCols / 4) 16-byte pieces per operand.
    // Rows past NQ / NK and columns past D are not read (zeros; never stored / never used).
    const auto issue = [&](int c) {
      const int c0 = c * kStageCols;
      float* da = tile(c % kStages, 0);
      float* db = tile(c % kStages, 1);
      constexpr int kPieces = kBig * (kStageCols / 4);
#pragma unroll
      for (int u = 0; u < kPieces / kThreads; ++u) {
        const int p = tid + u * kThreads;
        const int r = p / (kStageCols / 4), col = (p % (kStageCols / 4)) * 4;
        const bool col_ok = c0 + col < d;
        const bool a_ok = col_ok && qb0 + r < g.nq, b_ok = col_ok && kb0 + r < g.nk;
        cp_async16(da + r * kStagePitch + col, a_ok ? pa + r * g.d + c0 + col : s.pq, a_ok);
        cp_async16(db + r * kStagePitch + col, b_ok ? pb + r * g.d + c0 + col : s.pk, b_ok);
      }
      cp_async_commit();
    };
    // Every thread has passed the previous tile's last reads of both buffers (its last barrier).
    issue(0);
    if (chunks > 1) issue(1);
    float acc[8][8] = {};
    for (int c = 0; c < chunks; ++c) {
      // Chunk c is the older of at most two committed groups (c + 1 issued when it exists).
      if (c + 1 < chunks) {
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();  // every thread's copies of chunk c are visible
      const float* as = tile(c % kStages, 0);
      const float* bs = tile(c % kStages, 1);
      const int width = d - c * kStageCols < kStageCols ? d - c * kStageCols : kStageCols;  // multiple of 8
      for (int k = 0; k < width; k += 4) {
        float4 b[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) b[j] = *reinterpret_cast<const float4*>(bs + (tx + 16 * j) * kStagePitch + k);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float4 a4 = *reinterpret_cast<const float4*>(as + (ty + 16 * i) * kStagePitch + k);
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            float v = acc[i][j];
            v = fmaf(a4.x, b[j].x, v);
            v = fmaf(a4.y, b[j].y, v);
            v = fmaf(a4.z, b[j].z, v);
            acc[i][j] = fmaf(a4.w, b[j].w, v);
          }
        }
      }
      __syncthreads();  // buffer c % kStages is read by everyone before chunk c + kStages overwrites it
      if (c + kStages < chunks) issue(c + kStages);
    }
    float* out = s.scores + (si * g.hq + h) * g.nq * g.nk;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const std::int64_t qb = qb0 + ty + 16 * i;
      if (qb >= g.nq) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const std::int64_t kb = kb0 + tx + 16 * j;
        if (kb < g.nk) out[qb * g.nk + kb] = acc[i][j] * scale;
      }
    }
  }
}

cudaError_t launch_stage(const Geometry& g, float scale, const Scratch& s, cudaStream_t st) {
  const std::int64_t tiles = g.nseq * g.hq * ((g.nq + kBig - 1) / kBig) * ((g.nk + kBig - 1) / kBig);
  if (tiles == 0) return cudaSuccess;
  cudaError_t e =
      cudaFuncSetAttribute(scores_stage_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kStageSmem));
  if (e != cudaSuccess) return e;
  const int grid = static_cast<int>(tiles < kMaxGrid ? tiles : kMaxGrid);
  scores_stage_kernel<<<grid, kThreads, kStageSmem, st>>>(g, scale, s);
  return cudaGetLastError();
}

cudaError_t launch_big(const Geometry& g, float scale, const Scratch& s, cudaStream_t st) {
  const std::int64_t tiles = g.nseq * g.hq * ((g.nq + kBig - 1) / kBig) * ((g.nk + kBig - 1) / kBig);
  if (tiles == 0) return cudaSuccess;
  const int grid = static_cast<int>(tiles < kMaxGrid ? tiles : kMaxGrid);
  scores_big_kernel<<<grid, kThreads, 0, st>>>(g, scale, s);
  return cudaGetLastError();
}

// SPARGE_BLOCKMAP_SCORES (read per call; every value gives the same bits): unset or `big128`,
// scores_big_kernel where NQ and NK are both >= 128 (the H200-verified default); `stage`, the staged
// 128 x 128 kernel there (session 4, not yet run on a GPU: opt-in until a device round verifies and
// times it); `small` keeps the (TILE/16)^2 micro-tiles for every shape.
enum class BigScores { kNone, kBig128, kStage };
BigScores big_scores() {
  const char* v = std::getenv("SPARGE_BLOCKMAP_SCORES");
  if (v != nullptr && std::strcmp(v, "small") == 0) return BigScores::kNone;
  if (v != nullptr && std::strcmp(v, "stage") == 0) return BigScores::kStage;
  return BigScores::kBig128;
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
  const BigScores big = big_scores();
  if (m >= 128 && big == BigScores::kStage) return "stage128";
  if (m >= 128 && big == BigScores::kBig128) return "big128";
  if (m >= 512) return "tile128";
  if (m >= 64) return "tile64";
  if (m >= 32) return "tile32";
  return "tile16";
}

cudaError_t launch_scores(const Geometry& g, float scale, const Scratch& s, cudaStream_t st) {
  const std::int64_t m = g.nq < g.nk ? g.nq : g.nk;
  const BigScores big = big_scores();
  if (m >= 128 && big == BigScores::kStage) return launch_stage(g, scale, s, st);
  if (m >= 128 && big == BigScores::kBig128) return launch_big(g, scale, s, st);
  if (m >= 512) return launch<128>(g, scale, s, st);
  if (m >= 64) return launch<64>(g, scale, s, st);
  if (m >= 32) return launch<32>(g, scale, s, st);
  return launch<16>(g, scale, s, st);
}

}  // namespace sparge::cuda::block_map
