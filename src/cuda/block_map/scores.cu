// The pooled scores S = scale * pq . pk^T: per query head a small fp32 GEMM [NQ x D] x [D x NK]
// (the pooled rows are fp32 and stay fp32, as docs/semantics.md asks of the GPU). Where NQ and NK
// are both >= 128 a CTA computes a 128 x 128 tile with its operands staged by cp.async
// (scores_stage_kernel); smaller shapes take TILE x TILE tiles of 256 threads (16 x 16, each a
// (TILE/16)^2 micro-tile), staging 8 head-dim columns at a time in shared memory. Tiles that no
// query block of the tile can see (causal, or past a varlen sequence's end) are skipped: the
// selection never reads them.
//
// The 128 x 128 tile multiplies on the tensor cores (sm_80+, the default since session 9) as three
// TF32 products per element pair, x = hi + lo with hi a TF32 value (x's top 19 bits) and lo = x - hi,
// and a.b ~ a_lo.b_hi + a_hi.b_lo + a_hi.b_hi accumulated in fp32 (the dropped a_lo.b_lo and lo's own
// truncation to TF32 are near 2^-21 relative): fp32-level rounding, within the tolerances that the
// selection's near-tie rule assumes (docs/semantics.md). Every other path, and the 128 x 128 tile
// with SPARGE_BLOCKMAP_SCORES=fma, takes one fmaf chain over d = 0 .. D-1 in order. Either way every element of a call is computed by the same
// instructions from its own row and column, so equal pooled K rows give bit-equal scores (exact
// ties stay exact ties) and the result is the same on every run.
#include <cstdlib>
#include <cstring>

#include "cuda/block_map/block_map.cuh"
#include "cuda/block_map/load.cuh"
#include "cuda/block_map/pdl.cuh"
#include "cuda/func_attr.h"

namespace sparge::cuda::block_map {

namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 8;  // head-dim columns staged per step; D is a multiple of 8
constexpr std::int64_t kMaxGrid = std::int64_t{1} << 30;

template <int TILE>
__global__ void __launch_bounds__(kThreads) scores_kernel(Geometry g, float scale, Scratch s) {
  pdl_wait();  // the pooled rows of the launches before (a no-op without PDL)
  pdl_launch_dependents();
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

// hi keeps x's top 19 bits (a TF32 value: sign, exponent, 10 mantissa bits) and lo = x - hi is exact;
// the tensor core reads lo's top 19 bits too (so lo is rounded toward zero, 2^-21 relative to x at
// most, as small as the dropped lo . lo).
__device__ __forceinline__ void split_tf32(float x, std::uint32_t& hi, std::uint32_t& lo, std::uint32_t mask) {
  hi = __float_as_uint(x) & mask;
  lo = __float_as_uint(x - __uint_as_float(hi));
}
// c (4 consecutive floats of the accumulator) += a . b, one m16n8k8 TF32 tile.
__device__ __forceinline__ void mma_tf32(float* c, const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
  asm(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The 128 x 128 tile (NQ and NK >= 128; the default there since 2026-11-30, session 5: 0.0238 ms
// against 0.0302 for the register-staged tile it replaced, bits equal on all 290 block-map cases).
// The rows of A (pq) and B (pk) come in head-dim chunks of kStageCols columns through cp.async,
// kStages chunks in flight (all of them at D <= 64; at D = 128 the next one while one is
// multiplied), each thread issuing 16-byte copies into [row][column] arrays whose pitch
// (kStageCols + 4 floats) keeps both the copies and the float4 reads below conflict free. Thread
// (ty, tx) owns rows ty + 16 i (i < BM / 16) and columns tx + 16 j (j < 8) and takes the head dim 4 columns at
// a time: per row of A one float4, per column of B one float4, then the 4 fmaf steps in column
// order. Every score is the same fmaf chain over d = 0 .. D-1 as in scores_kernel, so the same bits.
constexpr int kBig = 128;
constexpr std::uint32_t kTf32HiMask = 0xffffe000u;  // sign, exponent and 10 mantissa bits
constexpr int kStageCols = 32;
constexpr int kStagePitch = kStageCols + 4;
constexpr int kStages = 2;
constexpr int BM = 128;  // tile rows
constexpr int kStagePitchTc = kStageCols + 8;  // TC: 8-byte fragment reads, lane (fr, fc) at banks 8 fr + 2 fc
constexpr std::size_t stage_smem_bytes(bool tc) {
  return sizeof(float) * kStages * (BM + kBig) * (tc ? kStagePitchTc : kStagePitch);  // 73,728 / 81,920 bytes
}

// At the issue's shape the grid is 128 CTAs of 8 warps, one per SM (12.5% of the warps active). The
// launch bounds state no CTA count: an explicit 1 changes ptxas's choices, 162 registers instead of
// 220, and the H200 timed the 220-register code. Tried, same bits, and deleted: 64 x 128 tiles with 2
// CTAs per SM (SPARGE_BLOCKMAP_SCORES=half, session 5; session 8: the scores stage 0.0236 against
// 0.0244 ms in one profile, bench totals no better), and in session 8 (ncu: this kernel issues in
// 60% of its cycles with 2 warps per scheduler, its FFMAs waiting on shared-memory reads) the head-dim
// loop of whole chunks unrolled (bench no better) and 512 threads with 8 x 4 per thread (124
// registers, 4 warps per scheduler; the scores stage 0.0246 against 0.0233 ms).
// TC (sm_80+): the tile's products on the tensor cores as three TF32 mma.sync per element pair (the
// file's comment), warp w owning rows 64 (w / 4) .. + 63 and columns 32 (w % 4) .. + 31 as 4 x 4
// m16n8k8 tiles. The staged layout is [row][column] as for FMA, pitch 40. A k-step of 8 head-dim
// columns k .. k + 7 gives fragment slot fc (fc + 4) the column k + 2 fc (k + 2 fc + 1) on both
// sides, so a lane reads each row's pair with one 8-byte load (a dot product may take its terms in
// any order, as long as A and B agree). H200 (session 9, r6): the scores stage 0.0195-0.0199 ms against
// 0.0236 for the fmaf tile; ncu 22.1 us and 5.17 M instructions against 27.7 us and 11.2 M (160 registers,
// 5.1 cycles per issued instruction: latency-bound at one CTA of 8 warps per SM). A first cut with
// cvt.rna.tf32.f32 (~5 integer instructions each in SASS) and 4-byte fragment reads took 0.0284 ms.
// Session 10 (ncu source counters, r1 -> r3): the A fragments' mask as a kernel argument (with the
// constant, ptxas fed the raw values to the mma as their high parts and moved them into the
// fragment's register order, ~70 moves per k-step), the copies' addresses hoisted out of the chunk
// loop, and whole tiles stored without tests: 5.17 M -> 2.98 M instructions, 22.2 -> 20.3 us (ncu),
// the scores stage 0.0193 -> 0.0178 ms. Two CTAs per SM (128 registers; 44 bytes of spills in the
// tile decode, none in the loop) put 256 tiles in one wave: 64 x 64 LUTs 0.0296 -> 0.0266 ms. A
// 16-warp tile (SPARGE_BLOCKMAP_SCORES=tc16, session 9) was no faster (r1, r2) and is deleted.
// The fmaf tile states no CTA count (0): with 1, ptxas takes 160 registers instead of 212.
template <bool TC>
__global__ void __launch_bounds__(kThreads, TC ? 2 : 0)
    scores_stage_kernel(Geometry g, float scale, Scratch s, std::uint32_t tf32_hi_mask) {
  constexpr int kMT = 4;  // TC: m16 fragments per warp (rows 16 kMT per warp)
  constexpr int kRows = BM / 16;  // rows per thread
  pdl_wait();  // the pooled rows of the launches before (a no-op without PDL)
  pdl_launch_dependents();
  constexpr int kPitch = TC ? kStagePitchTc : kStagePitch;
  extern __shared__ __align__(16) float stage_smem[];
  // Buffer b: A [BM][pitch], then B [kBig][pitch].
  const auto tile = [&](int buf, int op) {
    return stage_smem + buf * (BM + kBig) * kPitch + (op == 0 ? 0 : BM * kPitch);
  };
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % 16, ty = tid / 16;
  const std::int64_t tiles_q = (g.nq + BM - 1) / BM, tiles_k = (g.nk + kBig - 1) / kBig;
  const std::int64_t total = g.nseq * g.hq * tiles_q * tiles_k;
  const std::int64_t group = g.hq / g.hk;
  const bool small = total < (std::int64_t{1} << 31) && g.hq < (std::int64_t{1} << 31);
  const int d = static_cast<int>(g.d);
  const int chunks = (d + kStageCols - 1) / kStageCols;
  // The copies of a chunk: thread tid takes the 16-byte piece at column kCol of rows kRow0 + kRowStep u
  // (of A: u < kCopies; of B likewise), the same column and rows in every chunk.
  constexpr int kPerRow = kStageCols / 4;
  constexpr int kRowStep = kThreads / kPerRow;
  constexpr int kCopies = BM / kRowStep;
  static_assert(BM == kBig && BM % kRowStep == 0, "the copy pattern assumes square tiles");
  const int kRow0 = tid / kPerRow, kCol = (tid % kPerRow) * 4;
  for (std::int64_t w = blockIdx.x; w < total; w += gridDim.x) {
    std::int64_t tk, tq, h, si;
    if (small) {  // 32-bit divisions (the general ones are 64-bit)
      const auto uw = static_cast<std::uint32_t>(w), utk = static_cast<std::uint32_t>(tiles_k);
      const auto utq = static_cast<std::uint32_t>(tiles_q), uhq = static_cast<std::uint32_t>(g.hq);
      const std::uint32_t a = uw / utk, b = a / utq;
      tk = uw - a * utk, tq = a - b * utq, h = b % uhq, si = b / uhq;
    } else {
      tk = w % tiles_k, tq = (w / tiles_k) % tiles_q;
      h = (w / (tiles_k * tiles_q)) % g.hq, si = w / (tiles_k * tiles_q * g.hq);
    }
    const std::int64_t qb0 = tq * BM, kb0 = tk * kBig;
    const Seq seq = sequence(g, si);
    const std::int64_t nq_seq = (seq.q_len + g.blkq - 1) / g.blkq;
    const std::int64_t qb_hi = (qb0 + BM < nq_seq ? qb0 + BM : nq_seq) - 1;
    if (qb_hi < qb0 || kb0 >= visible_blocks(g, seq, qb_hi)) continue;  // uniform over the CTA

    // Rows past NQ / NK and columns past D are not read (zeros; never stored / never used).
    const float* pa = s.pq + ((si * g.hq + h) * g.nq + qb0 + kRow0) * g.d + kCol;
    const float* pb = s.pk + ((si * g.hk + h / group) * g.nk + kb0 + kRow0) * g.d + kCol;
    const int rows_a = static_cast<int>(g.nq - qb0 < BM ? g.nq - qb0 : BM);
    const int rows_b = static_cast<int>(g.nk - kb0 < kBig ? g.nk - kb0 : kBig);
    // Chunk c into buffer c % kStages.
    const auto issue = [&](int c) {
      const int c0 = c * kStageCols;
      const bool col_ok = c0 + kCol < d;
      float* da = tile(c % kStages, 0) + kRow0 * kPitch + kCol;
      float* db = tile(c % kStages, 1) + kRow0 * kPitch + kCol;
#pragma unroll
      for (int u = 0; u < kCopies; ++u) {
        const bool a_ok = col_ok && kRow0 + kRowStep * u < rows_a;
        cp_async16(da + kRowStep * u * kPitch, a_ok ? pa + kRowStep * u * d + c0 : s.pq, a_ok);
      }
#pragma unroll
      for (int u = 0; u < kCopies; ++u) {
        const bool b_ok = col_ok && kRow0 + kRowStep * u < rows_b;
        cp_async16(db + kRowStep * u * kPitch, b_ok ? pb + kRowStep * u * d + c0 : s.pk, b_ok);
      }
      cp_async_commit();
    };
    // Every thread has passed the previous tile's last reads of both buffers (its last barrier).
    issue(0);
    if (chunks > 1) issue(1);
    // FMA: acc[i][j] is row ty + 16 i, column tx + 16 j. TC: acc[mt][nt][e] is row
    // 16 kMT wm + 16 mt + fr (+ 8 for e >= 2), column 32 wn + 8 nt + 2 fc + (e & 1) (fr = lane / 4,
    // fc = lane % 4).
    float acc[kRows][8] = {};
    [[maybe_unused]] const int lane = tid % 32, wm = tid / 128, wn = (tid / 32) % 4, fr = lane / 4, fc = lane % 4;
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
      if constexpr (TC) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#pragma unroll 2
        for (int k = 0; k < width; k += 8) {
          std::uint32_t bh[4][2], bl[4][2];
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            const float2 b2 = *reinterpret_cast<const float2*>(bs + (32 * wn + 8 * nt + fr) * kPitch + k + 2 * fc);
            split_tf32(b2.x, bh[nt][0], bl[nt][0], kTf32HiMask);
            split_tf32(b2.y, bh[nt][1], bl[nt][1], kTf32HiMask);
          }
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            const float* ap = as + (16 * kMT * wm + 16 * mt + fr) * kPitch + k + 2 * fc;
            const float2 lo_row = *reinterpret_cast<const float2*>(ap);
            const float2 hi_row = *reinterpret_cast<const float2*>(ap + 8 * kPitch);
            std::uint32_t ah[4], al[4];
            // The mask from a kernel argument: with the constant, ptxas feeds the raw values to the
            // mma as their high parts (it truncates them itself) and then moves them into the
            // fragment's register order, up to 70 moves per k-step (session 10 ncu source counters).
            split_tf32(lo_row.x, ah[0], al[0], tf32_hi_mask);
            split_tf32(hi_row.x, ah[1], al[1], tf32_hi_mask);
            split_tf32(lo_row.y, ah[2], al[2], tf32_hi_mask);
            split_tf32(hi_row.y, ah[3], al[3], tf32_hi_mask);
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
              float* cc = &acc[2 * mt + nt / 2][4 * (nt % 2)];
              mma_tf32(cc, al, bh[nt]);
              mma_tf32(cc, ah, bl[nt]);
              mma_tf32(cc, ah, bh[nt]);
            }
          }
        }
#else
        __trap();  // launched on sm_80+ only
#endif
      } else {
        for (int k = 0; k < width; k += 4) {
          float4 b[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) b[j] = *reinterpret_cast<const float4*>(bs + (tx + 16 * j) * kPitch + k);
#pragma unroll
          for (int i = 0; i < kRows; ++i) {
            const float4 a4 = *reinterpret_cast<const float4*>(as + (ty + 16 * i) * kPitch + k);
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
      }
      __syncthreads();  // buffer c % kStages is read by everyone before chunk c + kStages overwrites it
      if (c + kStages < chunks) issue(c + kStages);
    }
    float* out = s.scores + ((si * g.hq + h) * g.nq + qb0) * g.nk + kb0;
    if constexpr (TC) {
      // A whole tile with an even row pitch stores 8-byte pairs with no tests.
      const bool whole = rows_a == BM && rows_b == kBig && (g.nk & 1) == 0;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // rows fr and fr + 8: two adjacent columns each
          const int r = 16 * kMT * wm + 16 * mt + fr + 8 * half;
          float* orow = out + r * g.nk + 32 * wn + 2 * fc;
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            const int col = 32 * wn + 8 * nt + 2 * fc;
            const float x = acc[2 * mt + nt / 2][4 * (nt % 2) + 2 * half] * scale;
            const float y = acc[2 * mt + nt / 2][4 * (nt % 2) + 2 * half + 1] * scale;
            if (whole) {
              *reinterpret_cast<float2*>(orow + 8 * nt) = make_float2(x, y);
            } else if (r < rows_a && col < rows_b) {
              if ((g.nk & 1) == 0 && col + 1 < rows_b) {  // 8-byte aligned: even row pitch, even column
                *reinterpret_cast<float2*>(orow + 8 * nt) = make_float2(x, y);
              } else {
                orow[8 * nt] = x;
                if (col + 1 < rows_b) orow[8 * nt + 1] = y;
              }
            }
          }
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int r = ty + 16 * i;
        if (r >= rows_a) continue;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int col = tx + 16 * j;
          if (col < rows_b) out[r * g.nk + col] = acc[i][j] * scale;
        }
      }
    }
  }
}

// SPARGE_BLOCKMAP_SCORES (read per call): unset, the 128 x 128 tile on the tensor cores; `fma` by fmaf
// chains (the default until session 9). Below sm_80 always fma.
enum class ScoresKind { kFma, kTc };
ScoresKind scores_kind() {
  if (device_major() < 8) return ScoresKind::kFma;
  const char* v = std::getenv("SPARGE_BLOCKMAP_SCORES");
  if (v != nullptr && std::strcmp(v, "fma") == 0) return ScoresKind::kFma;
  return ScoresKind::kTc;
}

cudaError_t launch_stage(const Geometry& g, float scale, const Scratch& s, cudaStream_t st) {
  const std::int64_t tiles = g.nseq * g.hq * ((g.nq + BM - 1) / BM) * ((g.nk + kBig - 1) / kBig);
  if (tiles == 0) return cudaSuccess;
  const bool tc = scores_kind() == ScoresKind::kTc;
  const auto kernel = tc ? scores_stage_kernel<true> : scores_stage_kernel<false>;
  const std::size_t smem = stage_smem_bytes(tc);
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  const int grid = static_cast<int>(tiles < kMaxGrid ? tiles : kMaxGrid);
  return launch_maybe_pdl(kernel, grid, kThreads, smem, st, pdl_enabled(), g, scale, s, kTf32HiMask);
}

template <int TILE>
cudaError_t launch(const Geometry& g, float scale, const Scratch& s, cudaStream_t st) {
  const std::int64_t tiles = g.nseq * g.hq * ((g.nq + TILE - 1) / TILE) * ((g.nk + TILE - 1) / TILE);
  if (tiles == 0) return cudaSuccess;
  const int grid = static_cast<int>(tiles < kMaxGrid ? tiles : kMaxGrid);
  return launch_maybe_pdl(scores_kernel<TILE>, grid, kThreads, 0, st, pdl_enabled(), g, scale, s);
}

}  // namespace

// PDL is on unless SPARGE_BLOCKMAP_PDL=0 (H200, session 5 round 2, profile-off bench medians with the
// pivot selection: 0.2926 / 0.3412 / 0.2973 ms at 128 x 64 / 64 x 64 / 64 x 128 against 0.3053 /
// 0.3518 / 0.3074 without PDL; with the bit search it made no difference, 0.2992 vs 0.2986).
bool pdl_enabled() {
  const char* v = std::getenv("SPARGE_BLOCKMAP_PDL");
  if (v != nullptr && v[0] == '0') return false;
  return device_major() >= 9;
}

int device_major() { return current_device_major(); }  // cuda/func_attr.h: read once per device

// The kernel of a shape (the 128 x 128 tile on the tensor cores, or fmaf chains).
const char* scores_variant(const Geometry& g) {
  const std::int64_t m = g.nq < g.nk ? g.nq : g.nk;
  const bool pdl = pdl_enabled();
  if (m >= 128) {
    switch (scores_kind()) {
      case ScoresKind::kTc: return pdl ? "tc128+pdl" : "tc128";
      default: return pdl ? "stage128+pdl" : "stage128";
    }
  }
  if (m >= 64) return pdl ? "tile64+pdl" : "tile64";
  if (m >= 32) return pdl ? "tile32+pdl" : "tile32";
  return pdl ? "tile16+pdl" : "tile16";
}

cudaError_t launch_scores(const Geometry& g, float scale, const Scratch& s, cudaStream_t st) {
  const std::int64_t m = g.nq < g.nk ? g.nq : g.nk;
  if (m >= 128) return launch_stage(g, scale, s, st);
  if (m >= 64) return launch<64>(g, scale, s, st);
  if (m >= 32) return launch<32>(g, scale, s, st);
  return launch<16>(g, scale, s, st);
}

}  // namespace sparge::cuda::block_map
