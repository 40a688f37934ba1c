// The memory-bound part of the block map: the K mean (smooth_k) and the pooling / self-similarity
// of every Q and K block, in two passes over the inputs (docs/block_map_gpu.md). By default (since
// session 10, where PDL is on; SPARGE_BLOCKMAP_ORDER, sums_first below) with smooth_k:
//   pass 1: K sums of kKSumRows-row chunks;
//   k_mean: the chunk sums of each (sequence, kv head) in chunk order, / k_len (its own launch);
//   pass 2: Q pooling, then K pooling of the rows shifted by the mean, launched with PDL on the
//           k_mean launch: its Q items run while the mean is computed, its K items wait for it.
// The order before (ORDER=mixed, and with the fold / KFIRST / TICKET / PDL=2 switches):
//   pass 1: Q pooling, and K sums (smooth_k) or K pooling (no smoothing);
//   k_mean: as above, or by the warp that adds the unit's last chunk (folded into pass 1);
//   pass 2 (smooth_k): K pooling of the shifted rows, in reverse item order, so that it starts on
//           the K rows pass 1 read last.
// So Q is read once and K twice (the smoothed rows' similarity needs the mean first). A single
// DRAM read of K (thread block clusters, 2026-11-30) was slower and is deleted (docs).
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

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "cuda/block_map/block_map.cuh"
#include "cuda/block_map/load.cuh"
#include "cuda/block_map/pdl.cuh"
#include "cuda/attention/sm90/pipeline.cuh"
#include "quant/quant_rule.h"

namespace sparge::cuda::block_map {

namespace {

constexpr int kWarps = kPoolThreads / 32;
constexpr int kBatch = 8;  // steps of 16-byte loads in flight per lane
constexpr std::int64_t kMaxGrid = std::int64_t{1} << 30;

// 8 e4m3 bytes of x * inv, in memory order (x[0] at the lowest address): the fp8 prepass's
// encoding (src/cuda/quant/quant.cu), so the same bytes. From sm_89 on a conversion instruction per
// pair; below, quant_rule.h's integer encoder, kept out of line there (inlined 64 times per loop
// body of every pass kernel it made ptxas take minutes for sm_80, where the fp8 recipe's attention
// does not run anyway).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
__device__ __noinline__ uint2 quantize8_soft(float4 a, float4 b, float inv) {
  const auto e = [inv](float x) { return static_cast<std::uint32_t>(::sparge::quant::e4m3_encode_soft(x * inv)); };
  return make_uint2(e(a.x) | (e(a.y) << 8) | (e(a.z) << 16) | (e(a.w) << 24),
                    e(b.x) | (e(b.y) << 8) | (e(b.z) << 16) | (e(b.w) << 24));
}
#endif
__device__ __forceinline__ uint2 quantize8(const float (&x)[8], float inv) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  return quantize8_soft(make_float4(x[0], x[1], x[2], x[3]), make_float4(x[4], x[5], x[6], x[7]), inv);
#else
  std::uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = ::sparge::quant::e4m3x2_device(x[2 * i] * inv, x[2 * i + 1] * inv);
  return make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
#endif
}

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
  // K mean folded into the chunk sums (!pool): per-unit counters (zeroed before the launch) and
  // the mean [nseq, heads, D]; null: no fold.
  unsigned* done = nullptr;
  float* mean = nullptr;
  // The fp8 recipe's quantized rows (BlockMapParams::maybe_fp8_qk; pool segments only), or null:
  // Q rows quantized per row into f8 [nseq, heads, rows, D] with f8_scale [nseq, heads, rows]; K
  // (after the shift) per item (= per key block of blkk keys) with f8_scale [nseq, heads, nblk].
  std::uint8_t* f8 = nullptr;
  float* f8_scale = nullptr;
  std::int64_t f8_rows = 0;  // rows per sequence (Sq or Sk)
};

struct PassArgs {
  Geometry g;
  Segment seg[2];  // items [0, seg[0].count), then [.., + seg[1].count)
  bool small = false;  // every item index and count fits in 32 bits: 32-bit index arithmetic
  // griddepcontrol.launch_dependents at the top, so that the next launch (under PDL) may start on
  // the SMs this grid's last CTAs leave free (the PDL chain, pooling_pdl()).
  bool trigger = false;
  // Launched as a programmatic dependent (launch_pass's pdl): a warp calls pdl_wait() once, before it
  // first reads the shift. Without it no pdl_wait() is issued at all.
  bool waits = false;
  // Non-null (SPARGE_BLOCKMAP_TICKET=1): a counter zeroed before the launch; each warp takes its
  // next item index from it (atomicAdd), so items start in index order across the whole grid and a
  // warp that finishes early takes the next one (the grid is the resident CTAs). Null: warp w takes
  // items w, w + grid warps, ...
  unsigned long long* ticket = nullptr;
  // The TMA ring (the default where the host entry could encode the maps): the ring kernel loads by
  // TMA, through the map of each segment's tensor (boxes of one ring batch of rows; launch_pooling
  // sets both, for power-of-two head dims only).
  bool use_tma = false;
  CUtensorMap tmap[2];
};

// The rows of pooling item (si, h, b) of segment sg: row r (< n) starts at row0 + r * x.stride[1].
struct ItemRows {
  const std::uint16_t* row0;
  int n;
};
__device__ __forceinline__ ItemRows item_rows(const Geometry& g, const Segment& sg, std::int64_t si, std::int64_t h,
                                              std::int64_t b) {
  const Seq seq = sequence(g, si);
  const std::int64_t len = sg.is_k ? seq.k_len : seq.q_len;
  const std::int64_t begin = (sg.is_k ? seq.k_begin : seq.q_begin) + b * sg.blk;
  const Rows& x = sg.x;
  return {x.data + seq.batch * x.stride[0] + begin * x.stride[1] + h * x.stride[2],
          static_cast<int>(clamp64(len - b * sg.blk, 0, sg.blk))};
}

// The TMA ring of a warp (pass_kernel's TMA): the segment's map, the warp's STAGES "full" barriers
// and how many batches the warp has loaded so far (the barriers' phases run on across items).
struct TmaRing {
  const CUtensorMap* map;
  std::uint64_t* bars;
  std::uint32_t count;
};

// VEC: 16-byte loads (every Rows::vec); else 8 strided 2-byte loads per lane (any strides).
// SHIFT: sg.shift is set (the K rows of pass 2: the unit's K mean is subtracted from every row);
// without it the subtraction of zeros is left out (x - 0 is x, -0 included: the same bits).
// STAGES > 0 (VEC only): the loads go through this warp's ring in shared memory (`ring`, STAGES
// batches of kBatch x 32 16-byte slots) by cp.async, STAGES - 1 batches ahead of the one being
// added up, so a warp keeps loads in flight while it adds and needs one register set. Each lane
// reads back only the slots it copied into (it waits for its own cp.async groups; no warp
// barrier). Rows past the item and lanes past D / 8 get zero-filled slots, as `fetch` gives zeros.
// STAGES == 0: the warp alternates between loading a batch into registers and adding it up.
// Pool batches without fp8 outputs take their row norms by the transposing tree (consume_tree);
// the fp8 recipe's batches (which also need each Q row's maximum) and the K-mean chunk sums take
// consume, row by row.
// F8: the kernel may be asked for the fp8 recipe's outputs (sg.f8); false leaves their code out (the
// ring kernel runs without it when no segment has them).
// TMA (the default since session 9, sm_90; STAGES > 0 and D = 8 * LANES): a batch of the ring is
// one TMA box of the batch's rows (lane 0 issues it on the stage's barrier, every lane waits for the
// barrier's phase), which lands in the same slot order as the lanes' own copies: row r, columns
// 8 sub .. 8 sub + 7 at slot (r % (32 / LANES)) * LANES + sub of step r / (32 / LANES). Rows past the
// item are loaded too (the next item's rows, or zeros past the tensor) and masked as rows past the
// item always are (full batches only where every row is inside the item).
template <class T, int LANES, bool VEC, bool SHIFT, int STAGES, bool F8 = true, bool TMA = false>
__device__ __forceinline__ void pool_item(const Geometry& g, const Segment& sg, std::int64_t si, std::int64_t h,
                                          std::int64_t b, uint4* ring, bool wait, TmaRing* tma = nullptr) {
  constexpr int kRowsPerStep = 32 / LANES;
  constexpr int kRowsPerBatch = kBatch * kRowsPerStep;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int sub = lane % LANES, grp = lane / LANES;
  const bool col_ok = sub < g.d / 8;
  {
    const std::int64_t o = (si * sg.heads + h) * sg.nblk + b;  // output row
    const ItemRows rows = item_rows(g, sg, si, h, b);
    const int n = rows.n;
    const bool pool = sg.pool;

    // Row r of the item starts at row0 + r * rstep (elements); this lane's 8 values follow at
    // column step cstep (1 with vector loads).
    const Rows& x = sg.x;
    const std::uint16_t* row0 = rows.row0;
    const std::int64_t rstep = x.stride[1], cstep = x.stride[3];
    const auto fetch = [&](uint4 (&raw)[kBatch], int s0) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int r = s0 + u * kRowsPerStep + grp;
        raw[u] = make_uint4(0, 0, 0, 0);
        if (col_ok && r < n) {
          const std::uint16_t* p = row0 + r * rstep;
          if constexpr (VEC) {
            raw[u] = __ldg(reinterpret_cast<const uint4*>(p + sub * 8));
          } else {
            std::uint16_t v[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = __ldg(p + (sub * 8 + j) * cstep);
            raw[u].x = v[0] | (static_cast<std::uint32_t>(v[1]) << 16);
            raw[u].y = v[2] | (static_cast<std::uint32_t>(v[3]) << 16);
            raw[u].z = v[4] | (static_cast<std::uint32_t>(v[5]) << 16);
            raw[u].w = v[6] | (static_cast<std::uint32_t>(v[7]) << 16);
          }
        }
      }
    };

    // The shift (the K mean) is written by the launch before this one: under the PDL chain
    // (PassArgs::trigger, pooling_pdl) this grid may start before that launch ends, so the shift is
    // read after pdl_wait(), and the ring's first loads (of the input, which nothing writes) are
    // issued before it (a warp waits once: PassArgs::waits).
    float shift[8] = {};
    const auto load_shift = [&] {
      if constexpr (SHIFT) {
        if (wait) pdl_wait();
        if (col_ok) {
#pragma unroll
          for (int j = 0; j < 8; ++j) shift[j] = sg.shift[(si * sg.heads + h) * g.d + sub * 8 + j];
        }
      }
    };
    float sum[8] = {}, unit[8] = {};
    // The fp8 recipe's outputs (pool segments with sg.f8): a Q item's rows are quantized as they
    // are added up; a K item's maximum is taken here and the block quantized after the loop.
    const bool f8 = F8 && pool && sg.f8 != nullptr;
    const std::int64_t f8_row0 = (si * sg.heads + h) * sg.f8_rows + b * sg.blk;  // the item's first row
    std::uint32_t f8_amax = 0;
    // FULL: every row of the batch is in the item (warp-uniform), so no per-row checks: a lane
    // past the row's D / 8 columns loaded zeros and has a zero shift, so it adds zeros. The
    // arithmetic on a valid row is the same either way (same bits). kF8 (= f8, warp-uniform) is a
    // template argument so that the unrolled steps of a batch have no branch between them: the
    // compiler can interleave their loads, shuffle trees and exponent-free arithmetic.
    const auto consume = [&](const uint4 (&raw)[kBatch], int s0, bool full, auto f8_tag) {
      constexpr bool kF8 = decltype(f8_tag)::value;
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const bool valid = full || (col_ok && s0 + u * kRowsPerStep + grp < n);
        float v[8];
        unpack8<T>(raw[u], v);
        if (!pool) {
          // Rows past the item add nothing (not even +0, which would turn a -0 sum into +0): the
          // bits do not depend on where a batch ends.
          if (valid) {
#pragma unroll
            for (int j = 0; j < 8; ++j) sum[j] += v[j];
          }
          continue;
        }
        // The shift, the zero of a row past the item and |row|^2 in one loop, as consume_tree's row
        // and n2 steps do them apart (the same operations per value; kept fused here because the
        // split loops change the SASS of the fp8 kernels, checked with cuobjdump in session 8).
        float n2 = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if constexpr (SHIFT) v[j] -= shift[j];
          v[j] = valid ? v[j] : 0.0f;
          n2 = fmaf(v[j], v[j], n2);
        }
        // |row|^2 over the LANES lanes of the row (every lane of the warp takes part).
#pragma unroll
        for (int xm = LANES / 2; xm > 0; xm >>= 1) n2 += __shfl_xor_sync(0xffffffffu, n2, xm);
        if constexpr (kF8) {  // the fp8 recipe's bytes (docs/quantized.md)
          std::uint32_t m = 0;  // max |x| as bits (rows and lanes past the data hold zeros)
#pragma unroll
          for (int j = 0; j < 8; ++j) m = max(m, ::sparge::quant::abs_bits(v[j]));
          if (sg.is_k) {
            f8_amax = max(f8_amax, m);  // the block's maximum; quantized after the item
          } else {
            // A Q row: its maximum over the row's LANES lanes, its scale, its 8 bytes per lane.
#pragma unroll
            for (int xm = LANES / 2; xm > 0; xm >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, xm));
            if (valid && col_ok) {
              const ::sparge::quant::Pow2Scale sc = ::sparge::quant::pow2_scale(m);
              const std::int64_t row = f8_row0 + s0 + u * kRowsPerStep + grp;
              *reinterpret_cast<uint2*>(sg.f8 + row * g.d + sub * 8) = quantize8(v, sc.inv);
              if (sub == 0) sg.f8_scale[row] = sc.scale;
            }
          }
        }
        if (valid) {
#pragma unroll
          for (int j = 0; j < 8; ++j) sum[j] += v[j];
        }
        // A zero row adds nothing to the sum of unit rows (but counts in n): its factor is 0, and
        // unit + (+-0) is unit bit for bit (unit starts at +0 and a round-to-nearest sum is -0
        // only when both terms are, so it is never -0). Rows past the item have v = 0, so n2 = 0,
        // the same. A select, not a branch: the steps of the batch stay one block of code.
        // rsqrtf (one MUFU, ~2 ulp) instead of 1 / sqrtf (two correctly rounded multi-instruction
        // sequences): the sims stay within 1e-6 of the fp64 CPU values.
        {
          const float inv = n2 > 0.0f ? rsqrtf(n2) : 0.0f;
#pragma unroll
          for (int j = 0; j < 8; ++j) unit[j] = fmaf(v[j], inv, unit[j]);
        }
      }
    };
    // consume_tree: the batch's |row|^2 partials reduced by a transposing tree. At each of the
    // first levels a lane keeps half of its values and sends the other half to its partner (lane ^ xm),
    // which keeps the halves the other way round; so a level adds the same pairs as the butterfly of
    // consume (own + partner's value of the same step, commutative: the same bits) with half the
    // shuffles, and after log2(kBatch) levels a lane holds whole-row sums of one step (of kHeld
    // steps when LANES < kBatch). Levels after that are the butterfly. The lane's rows' factors
    // 1 / |row| are then taken once per held step and broadcast to the row's lanes by index shuffles.
    const auto consume_tree = [&](const uint4 (&raw)[kBatch], int s0, bool full, std::false_type /*no fp8*/) {
      const auto row = [&](int u, float (&v)[8]) {  // consume's row preparation, without |row|^2
        const bool valid = full || (col_ok && s0 + u * kRowsPerStep + grp < n);
        unpack8<T>(raw[u], v);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if constexpr (SHIFT) v[j] -= shift[j];
          v[j] = valid ? v[j] : 0.0f;
        }
        return valid;
      };
      float n2[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        float v[8];
        row(u, v);
        n2[u] = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) n2[u] = fmaf(v[j], v[j], n2[u]);
      }
      // held: how many steps' sums this lane still holds (the first `held` of n2); a lane whose bit
      // xm is set kept the upper half at that level.
      int held = kBatch;
#pragma unroll
      for (int xm = LANES / 2; xm > 0; xm >>= 1) {
        if (held > 1) {
          const int half = held / 2;
          const bool upper = (lane & xm) != 0;
#pragma unroll
          for (int j = 0; j < half; ++j) {
            const float keep = upper ? n2[j + half] : n2[j];
            const float send = upper ? n2[j] : n2[j + half];
            n2[j] = keep + __shfl_xor_sync(0xffffffffu, send, xm);
          }
          held = half;
        } else {
          n2[0] += __shfl_xor_sync(0xffffffffu, n2[0], xm);
        }
      }
      constexpr int kHeld = LANES >= kBatch ? 1 : kBatch / LANES;
      float inv[kHeld];
#pragma unroll
      for (int j = 0; j < kHeld; ++j) inv[j] = n2[j] > 0.0f ? rsqrtf(n2[j]) : 0.0f;  // as consume
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        // The lane of this row group that holds step u: the transposing levels' bits of u / kHeld.
        int src = grp * LANES;
        {
          int rest = u / kHeld, bitv = kBatch / kHeld / 2;
#pragma unroll
          for (int xm = LANES / 2; xm > 0 && bitv > 0; xm >>= 1, bitv >>= 1) {
            if (rest & bitv) src += xm;
          }
        }
        const float f = __shfl_sync(0xffffffffu, inv[u % kHeld], src);
        float v[8];
        const bool valid = row(u, v);
        if (valid) {
#pragma unroll
          for (int j = 0; j < 8; ++j) sum[j] += v[j];
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) unit[j] = fmaf(v[j], f, unit[j]);
      }
    };
    const auto consume_any = [&](const uint4 (&raw)[kBatch], int s0) {
      // `full` passed as a literal: the callee is inlined with the constant (no per-row checks).
      const bool full = s0 + kRowsPerBatch <= n;
      const auto by_full = [&](const auto& step, auto f8_tag) {
        if (full) {
          step(raw, s0, true, f8_tag);
        } else {
          step(raw, s0, false, f8_tag);
        }
      };
      if (F8 && f8) {
        by_full(consume, std::true_type{});
      } else if (pool) {
        by_full(consume_tree, std::false_type{});
      } else {
        by_full(consume, std::false_type{});  // the K-mean chunk sums
      }
    };
    // Warp-uniform loop: row r = s0 + u * kRowsPerStep + grp.
    if constexpr (STAGES > 0 && TMA) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      namespace tm = ::sparge::cuda::attn::sm90;
      const int nb = (n + kRowsPerBatch - 1) / kRowsPerBatch;
      const Seq seq = sequence(g, si);
      const auto row_begin = static_cast<int>((sg.is_k ? seq.k_begin : seq.q_begin) + b * sg.blk);
      const auto batch = static_cast<int>(seq.batch);
      const std::uint32_t base = tma->count;
      const auto issue = [&](int t) {
        if (t < nb && lane == 0) {
          const std::uint32_t st = (base + t) % STAGES;
          tm::barrier_expect_bytes(tma->bars + st, kBatch * 32 * sizeof(uint4));
          tm::tma_load_4d(ring + st * (kBatch * 32), tma->map, 0, row_begin + t * kRowsPerBatch, static_cast<int>(h),
                          batch, tma->bars + st);
        }
      };
#pragma unroll
      for (int t = 0; t < STAGES - 1; ++t) issue(t);
      load_shift();
      for (int t = 0; t < nb; ++t) {
        __syncwarp();  // every lane has read batch t - 1's stage, which issue(t + STAGES - 1) refills
        issue(t + STAGES - 1);
        const std::uint32_t gt = base + t;
        tm::barrier_wait(tma->bars + gt % STAGES, (gt / STAGES) & 1u);
        uint4 cur[kBatch];
        const uint4* slot = ring + (gt % STAGES) * (kBatch * 32) + lane;
#pragma unroll
        for (int u = 0; u < kBatch; ++u) cur[u] = slot[u * 32];
        consume_any(cur, t * kRowsPerBatch);
      }
      __syncwarp();  // the last stage is read before the next item's first issue
      tma->count = base + static_cast<std::uint32_t>(nb);
#else
      __trap();  // launched on sm_90 only
#endif
    } else if constexpr (STAGES > 0) {
      static_assert(VEC, "the cp.async ring takes 16-byte rows");
      const int nb = (n + kRowsPerBatch - 1) / kRowsPerBatch;  // batches of the item
      // Batch t into ring stage t % STAGES; past the last batch an empty group, so that every
      // iteration below waits for the same count.
      const auto issue = [&](int t) {
        if (t < nb) {
          uint4* slot = ring + (t % STAGES) * (kBatch * 32) + lane;
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            const int r = t * kRowsPerBatch + u * kRowsPerStep + grp;
            const bool ok = col_ok && r < n;
            cp_async16(slot + u * 32, ok ? row0 + r * rstep + sub * 8 : row0, ok);
          }
        }
        cp_async_commit();
      };
#pragma unroll
      for (int t = 0; t < STAGES - 1; ++t) issue(t);
      load_shift();
      for (int t = 0; t < nb; ++t) {
        // Stage (t + STAGES - 1) % STAGES was read into registers (and added) in iteration t - 1.
        issue(t + STAGES - 1);
        cp_async_wait<STAGES - 1>();  // batch t has landed (this lane's own copies)
        uint4 cur[kBatch];
        const uint4* slot = ring + (t % STAGES) * (kBatch * 32) + lane;
#pragma unroll
        for (int u = 0; u < kBatch; ++u) cur[u] = slot[u * 32];
        consume_any(cur, t * kRowsPerBatch);
      }
    } else {
      uint4 cur[kBatch];
      load_shift();
      if (n > 0) fetch(cur, 0);
      for (int s0 = 0; s0 < n; s0 += kRowsPerBatch) {
        consume_any(cur, s0);
        if (s0 + kRowsPerBatch < n) fetch(cur, s0 + kRowsPerBatch);
      }
    }
    // The row groups of the warp, in a fixed tree; lanes of group 0 end with the totals.
#pragma unroll
    for (int xm = LANES; xm < 32; xm <<= 1) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        sum[j] += __shfl_xor_sync(0xffffffffu, sum[j], xm);
        unit[j] += __shfl_xor_sync(0xffffffffu, unit[j], xm);
      }
    }
    const bool writer = grp == 0 && col_ok;
    float* out = sg.out + o * g.d + sub * 8;  // 32-byte aligned: D % 8 == 0, regions 256-byte aligned
    if (!pool) {
      if (writer) {
        reinterpret_cast<float4*>(out)[0] = make_float4(sum[0], sum[1], sum[2], sum[3]);
        reinterpret_cast<float4*>(out)[1] = make_float4(sum[4], sum[5], sum[6], sum[7]);
      }
      return;
    }
    float u2 = 0.0f;
    if (writer) {
      float pm[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        pm[j] = n > 0 ? sum[j] / static_cast<float>(n) : 0.0f;
        u2 = fmaf(unit[j], unit[j], u2);
      }
      reinterpret_cast<float4*>(out)[0] = make_float4(pm[0], pm[1], pm[2], pm[3]);
      reinterpret_cast<float4*>(out)[1] = make_float4(pm[4], pm[5], pm[6], pm[7]);
    }
#pragma unroll
    for (int xm = 16; xm > 0; xm >>= 1) u2 += __shfl_xor_sync(0xffffffffu, u2, xm);
    if (lane == 0) {
      const float fn = static_cast<float>(n);
      const float sim = n > 0 ? u2 / (fn * fn) : 0.0f;
      sg.sim[o] = sim;
      if (sg.maybe_sim.data != nullptr) {
        const Out<float>& m = sg.maybe_sim;
        m.data[si * m.stride[0] + h * m.stride[1] + b * m.stride[2]] = sim;
      }
    }
    if (F8 && f8 && sg.is_k) {
      // The K block's scale from its maximum (over the warp), then a second read of the block
      // (just read: from L2), shifted as above and quantized, two batches of loads at a time.
      const ::sparge::quant::Pow2Scale sc = ::sparge::quant::pow2_scale(__reduce_max_sync(0xffffffffu, f8_amax));
      if (lane == 0) sg.f8_scale[o] = sc.scale;
      const auto put = [&](const uint4 (&raw)[kBatch], int s0) {
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int r = s0 + u * kRowsPerStep + grp;
          if (col_ok && r < n) {
            float v[8];
            unpack8<T>(raw[u], v);
            if constexpr (SHIFT) {
#pragma unroll
              for (int j = 0; j < 8; ++j) v[j] -= shift[j];
            }
            *reinterpret_cast<uint2*>(sg.f8 + (f8_row0 + r) * g.d + sub * 8) = quantize8(v, sc.inv);
          }
        }
      };
      for (int s0 = 0; s0 < n; s0 += 2 * kRowsPerBatch) {
        uint4 r0[kBatch], r1[kBatch];
        fetch(r0, s0);
        fetch(r1, s0 + kRowsPerBatch);
        put(r0, s0);
        put(r1, s0 + kRowsPerBatch);
      }
    }
  }
}

// The (sequence, head, block) of pooling item i of segment sg (items numbered head fastest).
__device__ __forceinline__ void decode_item(const Segment& sg, std::int64_t i, bool small, std::int64_t& si,
                                            std::int64_t& h, std::int64_t& b) {
  if (small) {  // 32-bit divisions (a 64-bit one is a long software sequence)
    const auto ui = static_cast<std::uint32_t>(i), uh = static_cast<std::uint32_t>(sg.heads);
    const auto ub = static_cast<std::uint32_t>(sg.nblk);
    const std::uint32_t q = ui / uh;
    h = ui - q * uh, b = q % ub, si = q / ub;
  } else {
    h = i % sg.heads, b = (i / sg.heads) % sg.nblk, si = i / (sg.heads * sg.nblk);
  }
}

// ---- K mean folded into pass 1 (smooth_k, SPARGE_BLOCKMAP_KMEAN=fold) ----------------------------------------------
// The warp that adds the last chunk sum of a unit u = (sequence, kv head) (an integer counter per
// unit, zeroed by launch_pooling) computes the unit's mean, in k_mean_kernel's order, so the bits
// are those of the separate launch: "thread" v = grp * D + dim (v < groups * D, groups =
// kPoolThreads / D) adds the chunks grp, grp + groups, ... of dim in chunk order, then dim adds the
// groups' sums in group order to 0 and divides by k_len. A lane plays the threads lane + 32 j.
// The classic last-block pattern: every writer fences its chunk sums before the count, the last
// one fences before it reads them (through L2: __ldcg). Nothing waits, so nothing can deadlock.
// Not inlined: it runs once per unit, and as a call its registers do not add to the pooling loop's.
__device__ __noinline__ void warp_k_mean(const Geometry& g, const float* k_part, float* k_mean, std::int64_t nchunks,
                                         std::int64_t u, float* red) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int d_count = static_cast<int>(g.d);
  const int groups = kPoolThreads / d_count;
  const int nv = groups * d_count;  // <= kPoolThreads
  constexpr int kChains = kPoolThreads / 32;
  const float* part = k_part + u * nchunks * d_count;
  float acc[kChains];
  std::int64_t c0[kChains];
#pragma unroll
  for (int j = 0; j < kChains; ++j) {
    acc[j] = 0.0f;
    const int v = lane + 32 * j;
    c0[j] = v < nv ? v / d_count : nchunks;  // past nv: no chunks
  }
  const std::int64_t steps = (nchunks + groups - 1) / groups;
  // Unrolled so that 4 * kChains independent L2 loads are in flight (the adds stay in chain order).
#pragma unroll 4
  for (std::int64_t k = 0; k < steps; ++k) {
#pragma unroll
    for (int j = 0; j < kChains; ++j) {
      const std::int64_t c = c0[j] + k * groups;
      if (c < nchunks) acc[j] += __ldcg(part + c * d_count + (lane + 32 * j) % d_count);
    }
  }
#pragma unroll
  for (int j = 0; j < kChains; ++j) {
    if (lane + 32 * j < nv) red[lane + 32 * j] = acc[j];
  }
  __syncwarp();
  const Seq seq = sequence(g, u / g.hk);
  for (int dim = lane; dim < d_count; dim += 32) {
    float t = 0.0f;
    for (int i = 0; i < groups; ++i) t += red[i * d_count + dim];
    k_mean[u * d_count + dim] = seq.k_len > 0 ? t / static_cast<float>(seq.k_len) : 0.0f;
  }
  __syncwarp();  // red is reused by this warp's next mean
}

// The pass: a 1-D grid-stride loop (or ticket loop) over the items of one or two segments.
// STAGES > 0: the cp.async ring of pool_item, STAGES * kBatch * 512 bytes of dynamic shared memory
// per warp.
template <class T, int LANES, bool VEC, int MINB, int STAGES = 0, bool F8 = true, bool TMA = false>
__global__ void __launch_bounds__(kPoolThreads, MINB) pass_kernel(const __grid_constant__ PassArgs a) {
  __shared__ float red_all[kWarps][kPoolThreads];  // the folded K mean's group sums, per warp
  __shared__ std::uint64_t tma_bars[TMA ? kWarps : 1][TMA ? STAGES : 1];
  extern __shared__ __align__(128) uint4 pool_ring[];  // 128-byte aligned: TMA boxes land in it (TMA)
  if (a.trigger) pdl_launch_dependents();
  uint4* const ring = pool_ring + (threadIdx.x / 32) * (STAGES * kBatch * 32);
  const std::int64_t total = a.seg[0].count + a.seg[1].count;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kWarps;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const auto next = [&](std::int64_t w) {  // the item after w for this warp (a ticket, or the grid stride)
    if (a.ticket == nullptr) return w + stride;
    unsigned long long t = 0;
    if (lane == 0) t = atomicAdd(a.ticket, 1ull);
    return static_cast<std::int64_t>(__shfl_sync(0xffffffffu, t, 0));
  };
  const std::int64_t w0 = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  bool wait = a.waits;  // pdl_wait() before the first shift this warp reads
  TmaRing tring{nullptr, tma_bars[TMA ? threadIdx.x / 32 : 0], 0};
  if constexpr (TMA) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (lane == 0) {
      for (int s = 0; s < STAGES; ++s) ::sparge::cuda::attn::sm90::barrier_init(tring.bars + s, 1);
      ::sparge::cuda::attn::sm90::barrier_init_fence();
    }
    __syncwarp();
#endif
  }
  for (std::int64_t w = a.ticket == nullptr ? w0 : next(0); w < total; w = next(w)) {
    // Item w: its segment and (sequence, head, block).
    const bool first = w < a.seg[0].count;
    const Segment& sg = first ? a.seg[0] : a.seg[1];  // __grid_constant__: no copy
    std::int64_t i = first ? w : w - a.seg[0].count;
    if (sg.reverse) i = sg.count - 1 - i;
    std::int64_t h, b, si;
    decode_item(sg, i, a.small, si, h, b);
    if constexpr (TMA) tring.map = &a.tmap[first ? 0 : 1];
    if (sg.shift != nullptr) {  // warp-uniform
      pool_item<T, LANES, VEC, true, STAGES, F8, TMA>(a.g, sg, si, h, b, ring, wait, &tring);
      wait = false;
    } else {
      pool_item<T, LANES, VEC, false, STAGES, F8, TMA>(a.g, sg, si, h, b, ring, false, &tring);
    }
    if (sg.done != nullptr) {  // warp-uniform: chunk sums with the K mean folded in
      __threadfence();  // this lane's chunk sums, before the count
      __syncwarp();
      unsigned old = 0;
      if (lane == 0) {
        __threadfence();  // and, after the warp barrier, the other lanes' sums before lane 0's count
        old = atomicAdd(sg.done + si * sg.heads + h, 1u);
      }
      old = __shfl_sync(0xffffffffu, old, 0);
      if (old + 1 == static_cast<unsigned>(sg.nblk)) {  // the unit's last chunk: its mean
        __threadfence();
        warp_k_mean(a.g, sg.out, sg.mean, sg.nblk, si * sg.heads + h, red_all[threadIdx.x / 32]);
      }
    }
  }
}

// ---- K mean: the chunk sums of one (sequence, kv head) in chunk order, / k_len ----------------
// One CTA of kPoolThreads threads (all of them call it): thread tid = grp * D + d (tid < groups * D,
// groups = kPoolThreads / D) adds the chunks grp, grp + groups, ... of dimension d in chunk order,
// then thread d adds the groups' sums in group order to 0 and divides by k_len, into mean[d].
// `part` is the unit's [nchunks, D] chunk sums. red: kPoolThreads floats of shared memory. Ends
// with a barrier (red and mean may be used right after).
__device__ __forceinline__ void unit_k_mean(const Geometry& g, const float* part, std::int64_t nchunks,
                                            std::int64_t k_len, float* red, float* mean) {
  const int tid = static_cast<int>(threadIdx.x);
  const int d_count = static_cast<int>(g.d);
  const int groups = kPoolThreads / d_count;  // D <= 256, so at least 1
  const int grp = tid / d_count, d = tid % d_count;
  float acc = 0.0f;
  if (grp < groups) {
    // kMeanLoads loads in flight, then added in chunk order (the order, and so the bits, of one
    // load and add at a time; a chunk past the end adds nothing, not even +0). The loads of a full
    // batch are volatile asm, which the compiler keeps in program order ahead of the adds that use
    // them: as plain loads it interleaved loads and adds at 40 registers, so a thread waited for
    // its 32 L2 round trips one after the other (ncu, session 8: 7.5 us for 2 MB on 64 CTAs).
    constexpr int kMeanLoads = 32;
    for (std::int64_t c0 = grp; c0 < nchunks; c0 += std::int64_t{kMeanLoads} * groups) {
      float v[kMeanLoads];
      const float* p0 = part + c0 * d_count + d;
      const std::int64_t step = std::int64_t{groups} * d_count;
      if (c0 + std::int64_t{kMeanLoads - 1} * groups < nchunks) {
#pragma unroll
        for (int u = 0; u < kMeanLoads; ++u) v[u] = ld_cg_in_order(p0 + u * step);
      } else {
#pragma unroll
        for (int u = 0; u < kMeanLoads; ++u) {
          const std::int64_t c = c0 + std::int64_t{u} * groups;
          v[u] = c < nchunks ? p0[u * step] : 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < kMeanLoads; ++u) {
        if (c0 + std::int64_t{u} * groups < nchunks) acc += v[u];
      }
    }
  }
  red[tid] = acc;
  __syncthreads();
  if (tid < d_count) {
    float t = 0.0f;
    for (int i = 0; i < groups; ++i) t += red[i * d_count + tid];
    mean[tid] = k_len > 0 ? t / static_cast<float>(k_len) : 0.0f;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kPoolThreads) k_mean_kernel(Geometry g, Scratch s, bool trigger) {
  __shared__ float red[kPoolThreads];
  pdl_wait();  // pass 1's chunk sums (a no-op without PDL)
  if (trigger) pdl_launch_dependents();
  for (std::int64_t w = blockIdx.x; w < g.nseq * g.hk; w += gridDim.x) {
    const Seq seq = sequence(g, w / g.hk);
    unit_k_mean(g, s.k_part + w * s.nchunks * g.d, s.nchunks, seq.k_len, red, s.k_mean + w * g.d);
  }
}

// SPARGE_BLOCKMAP_POOL (read per call) picks the pass kernel for vector rows; all give the same
// bits:
//   tma (the default since session 9, unset or any other value; opt-in in session 8): the ring's
//     batches loaded as TMA boxes (pool_item's TMA), where the maps apply (sm_90+, power-of-two head
//     dims, 16-byte rows, no fp8 outputs); elsewhere async3 runs. H200, session 9: 0.262-0.267 ms
//     against async3's 0.266-0.272 (rounds 1 and 2, alternating in one process), even to 1% better in
//     rounds 4-5, 1-2% better in round 7;
//   async3 (the default of sessions 5 to 8, and where TMA does not apply): the loads go through a
//     per-warp cp.async ring of 3 batches (two ahead of the one being added up), 2 CTAs per SM,
//     96 KB of dynamic shared memory per CTA. H200, b2 h32 s16384 d128 128x64: pool Q + K sums
//     0.1425 ms, pool K 0.0838 (base3: 0.158 / 0.092);
//   base3: loads into registers and adds in turn, 3 CTAs per SM (the default of 2026-11-29 to
//     session 4, ~100 bytes of register spills per thread). Kept as the path of devices whose
//     CTAs cannot have the ring's shared memory (async3 falls back to it) and as the reference
//     the ring is compared with.
//   The row norms of a batch (without fp8 outputs) by the transposing tree in every kernel since
//     session 8 (consume_tree; bits unchanged): opt-in as async3t in round 1, 0.271-0.285 ms against
//     0.291-0.296 for the row-by-row trees at 128 x 64 (pool K 0.075 against 0.091 ms), 0.311-0.318
//     against 0.338-0.340 at 64 x 64. async3i (session 7: each tree level over the batch's steps, same
//     bits) measured between the two (0.288-0.297, pool K 0.0845) and is deleted.
// Deleted after the session-5 measurement (same bits, not faster): prefetch, base, wide, small4,
// async, async4x4, and the cross-item rings stream3 / stream4x4 (stream4x4 equalled async3's total,
// with an issue cursor across items: more code for nothing).
// Measured in session 9 and deleted (same bits, slower): tmas / tmas6, the TMA ring fed across
// items by an issue cursor on a grid of the resident CTAs (3 stages 0.297-0.300 ms, 6 stages and
// one CTA per SM 0.285-0.286, against 0.266), and MERGE, the pooling in one launch (K sums with the
// K mean folded in, Q blocks, then K blocks waiting on a per-unit flag: 0.306-0.318 ms), and L2
// eviction priorities on the TMA boxes (pass 2 2-4% faster, pass 1 slower, and the branch in lane 0's
// issue cost the default 2-3%), and tma2, two adjacent items per warp with the TMA ring fed across
// the pair (1.14-1.16x the copy against 1.02-1.03x: pass 2 0.092 against 0.075 ms).
enum class PoolVariant { kAsync3, kBase3, kTma };
PoolVariant pool_variant() {
  const char* v = std::getenv("SPARGE_BLOCKMAP_POOL");
  if (v != nullptr && std::strcmp(v, "base3") == 0) return PoolVariant::kBase3;
  if (v != nullptr && std::strcmp(v, "async3") == 0) return PoolVariant::kAsync3;
  return PoolVariant::kTma;
}

// SPARGE_BLOCKMAP_KMEAN (read per call; same bits either way): `launch` (default) runs
// k_mean_kernel as its own launch between the passes; `fold` computes the K mean in pass 1 (the
// warp that adds a unit's last chunk sum, above). H200, 2026-11-30 (b2 h32 s16384 d128, 128x64):
// folded, pass 1 took 0.241 ms against 0.151 + 0.018 for pass 1 and the launch (bench 0.404 vs
// 0.345 ms): the last arrivers' serial reductions end up on the critical path.
bool kmean_folded() {
  const char* v = std::getenv("SPARGE_BLOCKMAP_KMEAN");
  return v != nullptr && std::strcmp(v, "fold") == 0;
}
// SPARGE_BLOCKMAP_KFIRST=1 (read per call; same bits): pass 1 takes the K chunk sums before the Q
// blocks (the K means are then ready half way through pass 1, but pass 2 no longer starts on K rows
// still in L2). Default 0: Q first, K sums last.
bool k_first() {
  const char* v = std::getenv("SPARGE_BLOCKMAP_KFIRST");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// The order of the pooling launches (SPARGE_BLOCKMAP_ORDER, read per call; same bits either way).
// Default (`sums`, since session 10) where PDL is on: the K chunk sums are a pass of their own, then
// the K mean, then one pass pools Q and then K; that pass is launched with PDL on the mean (which
// lets it start at its top), so its Q items, which need no mean, run while the mean is computed, and
// only its K items wait for it (H200, s10r6: 0.944-0.961x the device copy at 128 x 64 against
// 0.977-0.985x, 64 x 64 1.047-1.065x against 1.076-1.095x). `mixed` (the order before, and the one
// the K-mean fold, KFIRST, TICKET and PDL=2 switches apply to): pass 1 = Q items + K sums, the mean,
// pass 2 = K items.
bool sums_first() {
  const char* v = std::getenv("SPARGE_BLOCKMAP_ORDER");
  return !(v != nullptr && std::strcmp(v, "mixed") == 0) && pdl_enabled();
}

// SPARGE_BLOCKMAP_PERSIST=1 (read per call; same bits): the pass grids hold only the CTAs that are
// resident at once (SMs x occupancy) and each warp walks its items by the grid stride, instead of
// one CTA per 8 items (a CTA then lives as long as its slowest warp's item).
bool persist() {
  const char* v = std::getenv("SPARGE_BLOCKMAP_PERSIST");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// SPARGE_BLOCKMAP_TICKET=1 (read per call; same bits): the passes of launch_pooling hand out their
// items by a ticket counter (PassArgs::ticket) to a grid of the resident CTAs; with
// SPARGE_BLOCKMAP_KFIRST=1 the long K-sum items then all start before the Q items, and the last
// items to start are short ones wherever they run.
bool ticket_on() {
  const char* v = std::getenv("SPARGE_BLOCKMAP_TICKET");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// SPARGE_BLOCKMAP_PDL=2 (read per call; same bits; sm_90+): the pooling launches form a PDL chain
// too (PassArgs::trigger, launch_k_mean's pdl): pass 1 and the K mean allow their dependents at
// their top, the K mean and pass 2 are launched with PDL, and pass 2 issues its first K loads
// before it waits for the mean. Unset or 1: PDL for the scores and selection only; 0: none.
bool pooling_pdl() {
  const char* v = std::getenv("SPARGE_BLOCKMAP_PDL");
  return v != nullptr && std::strcmp(v, "2") == 0 && pdl_enabled();
}

// The grid for `kernel` (with `smem` bytes of dynamic shared memory): `grid`, or with persist() or
// a ticket at most the resident CTAs. A failed query keeps `grid` (and clears the error it left).
template <class Kernel>
int pass_grid(Kernel kernel, int grid, bool resident_only, int smem = 0) {
  if (!resident_only) return grid;
  int dev = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kPoolThreads, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    return grid;
  }
  const int resident = sms * (per_sm > 0 ? per_sm : 1);
  return grid < resident ? grid : resident;
}

// The 16-bit element type and the lanes per row, as template arguments.
// pdl: launched as a programmatic dependent of the launch before it (the kernels read what that
// launch writes only after pdl_wait()).
cudaError_t launch_pass(bool bf16, PassArgs a, cudaStream_t st, bool pdl = false) {
  const std::int64_t items = a.seg[0].count + a.seg[1].count;
  if (items == 0) return cudaSuccess;
  a.small = items < (std::int64_t{1} << 31);
  const std::int64_t cols = a.g.d / 8;
  // Both segments read vector rows or the strided kernel runs (it is correct for any input).
  const bool vec = a.seg[0].x.vec && (a.seg[1].count == 0 || a.seg[1].x.vec);
  cudaError_t launched = cudaSuccess;
  const bool fp8_out = a.seg[0].f8 != nullptr || (a.seg[1].count > 0 && a.seg[1].f8 != nullptr);
  a.waits = pdl;
  const PoolVariant variant = pool_variant();
  const auto go = [&](auto lanes) {
    constexpr int L = decltype(lanes)::value;
    const int grid = grid_for(items);
    const auto run = [&](auto type) {
      using T = decltype(type);
      const bool resident_only = persist() || a.ticket != nullptr;
      const auto go_kernel = [&](auto kernel) {
        launched = launch_maybe_pdl(kernel, pass_grid(kernel, grid, resident_only), kPoolThreads, 0, st, pdl, a);
      };
      // The cp.async ring: kStages * kBatch * 512 bytes of dynamic shared memory per warp. A device
      // that cannot give a CTA that much runs base3 (same bits).
      constexpr int kStages = 3;
      const auto go_ring = [&](auto kernel) {
        const int bytes = kWarps * kStages * kBatch * 32 * static_cast<int>(sizeof(uint4));
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess) {
          (void)cudaGetLastError();
          return false;
        }
        launched = launch_maybe_pdl(kernel, pass_grid(kernel, grid, resident_only, bytes), kPoolThreads, bytes, st, pdl, a);
        return true;
      };
      if (!vec) {
        go_kernel(pass_kernel<T, L, false, 2>);
      } else if (variant == PoolVariant::kBase3 ||
                 !(fp8_out   ? go_ring(pass_kernel<T, L, true, 2, kStages>)
                   : a.use_tma ? go_ring(pass_kernel<T, L, true, 2, kStages, false, true>)
                               : go_ring(pass_kernel<T, L, true, 2, kStages, false>))) {
        go_kernel(pass_kernel<T, L, true, 3>);
      }
    };
    if (bf16) {
      run(__nv_bfloat16{});
    } else {
      run(__half{});
    }
    return launched != cudaSuccess ? launched : cudaGetLastError();
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

const char* pool_variant_name(bool tma_ran) {
  const bool chain = pooling_pdl();
  switch (pool_variant()) {
    case PoolVariant::kBase3: return chain ? "base3+pdl" : "base3";
    case PoolVariant::kTma:
      if (tma_ran) return chain ? "tma+pdl" : "tma";
      [[fallthrough]];  // the maps do not apply: the cp.async ring ran
    default: return chain ? "async3+pdl" : "async3";
  }
}

bool pool_tma_asked() { return pool_variant() == PoolVariant::kTma; }

int pool_tma_rows(std::int64_t d) {
  if (d < 8 || d > 256 || (d & (d - 1)) != 0) return 0;
  return kBatch * 32 / static_cast<int>(d / 8);  // kBatch steps of 32 / LANES rows, LANES = d / 8
}

cudaError_t launch_k_mean(const Geometry& g, const Scratch& s, cudaStream_t st, bool pdl) {
  const std::int64_t work = g.nseq * g.hk;
  if (work == 0) return cudaSuccess;
  return launch_maybe_pdl(k_mean_kernel, static_cast<int>(work < kMaxGrid ? work : kMaxGrid), kPoolThreads, 0, st, pdl,
                          g, s, pdl);
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
                           const Out<float>& maybe_q_sim, const Out<float>& maybe_k_sim, cudaStream_t st,
                           const Marks& marks, const Fp8Out& fp8, const TmaMaps* tma) {
  // The TMA maps of a pass's segments (after any reordering of the segments).
  const auto with_tma = [&](PassArgs& a) {
    if (tma == nullptr) return;
    a.use_tma = true;
    for (int i = 0; i < 2; ++i) a.tmap[i] = a.seg[i].is_k ? tma->k : tma->q;
  };
  const auto with_f8 = [&](Segment sg) {  // a pool segment that also writes the fp8 recipe's rows
    if (fp8.q8 != nullptr) {
      sg.f8 = sg.is_k ? fp8.k8 : fp8.q8;
      sg.f8_scale = sg.is_k ? fp8.k_scale : fp8.q_scale;
      sg.f8_rows = sg.is_k ? g.sk : g.sq;
    }
    return sg;
  };
  PassArgs p1, p2;
  if (s.tickets != nullptr && ticket_on()) {
    const cudaError_t e = cudaMemsetAsync(s.tickets, 0, 2 * sizeof(unsigned long long), st);
    if (e != cudaSuccess) return e;
    p1.ticket = s.tickets;
    p2.ticket = s.tickets + 1;
  }
  // The PDL chain: each pooling launch lets the next start on the SMs its last CTAs leave free (the
  // K mean waits for pass 1 at its top; pass 2 issues its first loads of K, then waits for the mean).
  const bool chain = pooling_pdl();
  p1.trigger = p2.trigger = chain;
  p1.g = g;
  p1.seg[0] = with_f8(pool_segment(g, q, false, nullptr, s, maybe_q_sim));
  if (!smooth) {
    p1.seg[1] = with_f8(pool_segment(g, k, true, nullptr, s, maybe_k_sim));
    with_tma(p1);
    const cudaError_t e = launch_pass(bf16, p1, st);
    marks("pool Q+K");
    return e;
  }
  p1.seg[1] = k_sums_segment(g, k, s);
  p2.g = g;
  const Segment k_shifted = with_f8(pool_segment(g, k, true, s.k_mean, s, maybe_k_sim));  // K items after the mean
  // The fold needs the counters and at least one chunk per unit (Sk = 0: the launch writes zeros).
  const bool fold = s.k_done != nullptr && s.nchunks > 0 && kmean_folded();
  cudaError_t e = cudaSuccess;
  if (!fold && !chain && p1.ticket == nullptr && !k_first() && sums_first()) {
    PassArgs sums;
    sums.g = g;
    sums.seg[0] = p1.seg[1];
    with_tma(sums);
    if ((e = launch_pass(bf16, sums, st)) != cudaSuccess) return e;
    marks("K sums");
    if ((e = launch_k_mean(g, s, st, true)) != cudaSuccess) return e;  // lets the next pass start at its top
    marks("K mean");
    p2.seg[0] = p1.seg[0];
    p2.seg[1] = k_shifted;
    with_tma(p2);
    e = launch_pass(bf16, p2, st, true);  // its K items wait for the mean
    marks("pool Q + K");
    return e;
  }
  if (fold) {
    p1.seg[1].done = s.k_done;
    p1.seg[1].mean = s.k_mean;
    e = cudaMemsetAsync(s.k_done, 0, static_cast<std::size_t>(g.nseq * g.hk) * sizeof(unsigned), st);
    if (e != cudaSuccess) return e;
  }
  if (k_first()) std::swap(p1.seg[0], p1.seg[1]);
  with_tma(p1);
  if ((e = launch_pass(bf16, p1, st)) != cudaSuccess) return e;
  if (fold) {
    marks("pool Q + K sums + K mean");
  } else {
    marks("pool Q + K sums");
    if ((e = launch_k_mean(g, s, st, chain)) != cudaSuccess) return e;
    marks("K mean");
  }

  p2.seg[0] = k_shifted;
  p2.seg[0].reverse = true;  // start on the K rows pass 1 read last
  with_tma(p2);
  e = launch_pass(bf16, p2, st, chain);
  marks("pool K");
  return e;
}

}  // namespace sparge::cuda::block_map
