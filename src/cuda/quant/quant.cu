// The fp8 prepass (docs/quantized.md, "The prepass"): Q, K, V -> e4m3 copies and power-of-two
// scales by the rule of src/quant/quant_rule.h, in two launches per group of kv heads:
//   1. stats_kernel, one pass over K and V: per CTA of 128 keys of one kv head, fp64 column sums
//      of K (written per chunk, never atomically) and the column max |V| (atomicMax on the bits:
//      order independent). The CTA that finishes a kv head last adds that head's chunk sums in
//      chunk order (so k_mean has the same bits on every launch) and turns the V maxima into
//      v_scale.
//   2. quant_kernel, CTAs of two roles: a KV tile (128 keys of one kv head) smooths K with k_mean,
//      takes one scale per key block and writes k8; it quantizes V with v_scale and writes it
//      transposed with the keys permuted (through shared memory, so each row of v8t leaves as
//      128-byte stores), zero bytes for keys >= Sk up to sk_pad. A Q tile (128 rows of one query
//      head) writes q8, q_scale and lse_shift (which needs k_mean: hence Q waits for pass 1 too).
// Traffic: Q once, K and V twice each (the second read hits L2 when the kv heads are processed in
// small groups: SPARGE_QUANT_GROUP), the 8-bit copies once. Head dims 64 and 128.
//
// Three ways to run the same work (SPARGE_QUANT_VARIANT, same bytes every way):
//   launches (default): per group of kv heads, stats_kernel then quant_kernel;
//   fused: one persistent launch; CTAs take items by ticket in schedule.h's order, and a
//   quantization item first waits (its loads already in flight) for its kv head's ready flag,
//   which the CTA that finalizes the kv head's statistics raises;
//   stream: one persistent launch of 128-row items in schedule.h's order, each CTA prefetching its
//   next items into a ring of shared-memory stages with cp.async (see stream_kernel).
#include "cuda/quant/quant.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "cuda/quant/load.cuh"
#include "cuda/quant/schedule.h"
#include "cuda/scratch_pool.h"
#include "quant/quant_rule.h"

namespace sparge::cuda::quant {

namespace rule = ::sparge::quant;

namespace {

constexpr int kThreads = 256;
constexpr int kStatRows = 128;  // keys per stats CTA: one fp64 partial sum per chunk and channel
constexpr int kTileKeys = 128;  // keys per KV tile (sk_pad's granularity, a multiple of blkk)
constexpr int kTileRows = 128;  // query rows per Q tile
constexpr int kVPitch = kTileKeys + 4;  // bytes per row of the V transpose tile: 33 words, no bank conflicts on reads

struct Args {
  Src q, k, v;
  QuantBuffers out;
  std::int64_t hq, hk, sq, sk, sk_pad, nkb, nch;
  int blkk;
  bool smooth;
  bool qk;                  // Q and K too (quantize_qkv); false: V only (quantize_v)
  double scale;             // the attention's scale (p.scale or 1/sqrt(D)), for lse_shift
  double* part;             // [B * Hk][nch][D] fp64 column sums of K per chunk (smooth_k only)
  std::uint32_t* vamax;     // [B * Hk][D] bits of max |v| (zeroed before pass 1)
  std::uint32_t* done;      // [B * Hk] pass-1 CTAs finished (zeroed before pass 1)
  std::uint32_t* ready;     // fused variant: [B * Hk] statistics final (zeroed), else nullptr;
                            // stream variant: k_mean final
  unsigned long long* ticket;  // fused and stream variants: the next item (zeroed)
  std::int64_t ntiles, qtiles, qper;  // KV tiles and Q tiles per kv head; qper = ntiles + Hq/Hk * qtiles
  std::uint32_t* done_v;    // stream variant: [B * Hk] V statistics items finished (zeroed)
  std::uint32_t* ready_v;   // stream variant: [B * Hk] v_scale final (zeroed)
};

// Fused variant: thread 0 waits for the kv head's ready flag; the statistics are then read with
// __ldcg (L2, where the finalizing CTA's fenced writes are).
__device__ __forceinline__ void wait_ready(const Args& a, std::int64_t pair) {
  if (a.ready == nullptr) return;
  if (threadIdx.x == 0) {
    while (atomicAdd(&a.ready[pair], 0u) == 0u) __nanosleep(100);
    __threadfence();
  }
  __syncthreads();
}

// 8 quantized bytes of x * inv[e], in memory order (x[0] at the lowest address).
__device__ __forceinline__ uint2 quantize8(const float (&x)[8], const float (&inv)[8]) {
  std::uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = rule::e4m3x2_device(x[2 * i] * inv[2 * i], x[2 * i + 1] * inv[2 * i + 1]);
  return make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
}

// V's channel maxima: mx[e] = max(mx[e], bits of |v_e|) over the 8 values of one 16-byte unit (a
// maximum of bits: any order gives the same result).
template <class T>
__device__ __forceinline__ void max_abs8(const uint4& raw, std::uint32_t (&mx)[8]) {
  float x[8];
  unpack8<T>(raw, x);
#pragma unroll
  for (int e = 0; e < 8; ++e) mx[e] = max(mx[e], rule::abs_bits(x[e]));
}

// ---- pass 1 ------------------------------------------------------------------------------------
// Keys [128 chunk, 128 chunk + 128) of kv head `pair`. Thread (rg, u) reads channels [8u, 8u + 8)
// of keys j0 + rg + R i.
template <int D, class T>
__device__ __forceinline__ void stats_item(const Args& a, std::int64_t pair, std::int64_t chunk) {
  constexpr int U = D / 8, R = kThreads / U, kRows = kStatRows / R;
  __shared__ double s_sum[R][D];
  __shared__ std::uint32_t s_max[R][D];
  __shared__ bool s_last;
  const int tid = threadIdx.x, u = tid % U, rg = tid / U;
  const std::int64_t b = pair / a.hk, h = pair % a.hk;
  const std::int64_t j0 = chunk * kStatRows;
  const bool ksum = a.smooth && a.qk;  // K's column sums (for k_mean)

  // All loads first (kRows x 2 vectors in flight per thread); keys past Sk read as zeros, which
  // change neither a sum nor a maximum.
  uint4 kr[kRows], vr[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const std::int64_t j = j0 + rg + i * R;
    kr[i] = vr[i] = make_uint4(0, 0, 0, 0);
    if (j < a.sk) {
      if (ksum) kr[i] = load8(a.k, b, j, h, u);
      vr[i] = load8(a.v, b, j, h, u);
    }
  }
  double sum[8] = {};
  std::uint32_t mx[8] = {};
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    if (ksum) {
      float x[8];
      unpack8<T>(kr[i], x);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum[e] += static_cast<double>(x[e]);
    }
    max_abs8<T>(vr[i], mx);
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    s_sum[rg][u * 8 + e] = sum[e];
    s_max[rg][u * 8 + e] = mx[e];
  }
  __syncthreads();
  if (tid < D) {
    double s = 0.0;
    std::uint32_t m = 0;
    for (int r = 0; r < R; ++r) {  // fixed order: the chunk sum has the same bits on every launch
      s += s_sum[r][tid];
      m = max(m, s_max[r][tid]);
    }
    if (ksum) a.part[(pair * a.nch + chunk) * D + tid] = s;
    if (m != 0) atomicMax(&a.vamax[pair * D + tid], m);
    __threadfence();  // this thread's partial and maximum are visible before the ticket below
  }
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(&a.done[pair], 1u) == static_cast<std::uint32_t>(a.nch - 1);
  __syncthreads();
  if (!s_last) return;
  // The last CTA of this kv head: every other CTA's writes were fenced before its ticket.
  __threadfence();
  if (tid < D) {
    // Chunk order, 16 loads in flight at a time (the adds of 0.0 past nch leave s unchanged: s
    // starts at +0.0 and is never -0.0).
    double s = 0.0;
    if (ksum) {
      const double* col = a.part + pair * a.nch * D + tid;
      for (std::int64_t c0 = 0; c0 < a.nch; c0 += 16) {
        double v[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = c0 + i < a.nch ? __ldcg(col + (c0 + i) * D) : 0.0;
#pragma unroll
        for (int i = 0; i < 16; ++i) s += v[i];
      }
    }
    if (a.qk) a.out.k_mean[pair * D + tid] = a.smooth ? static_cast<float>(s / static_cast<double>(a.sk)) : 0.0f;
    a.out.v_scale[pair * D + tid] = rule::pow2_scale(__ldcg(&a.vamax[pair * D + tid])).scale;
    __threadfence();
  }
  if (a.ready != nullptr) {
    __syncthreads();  // every k_mean / v_scale write of this kv head is fenced
    if (tid == 0) atomicExch(&a.ready[pair], 1u);
  }
}

// Launches variant, pass 1: grid (nch, kv heads of the group).
template <int D, class T>
__global__ void __launch_bounds__(kThreads, 2) stats_kernel(const Args a, std::int64_t pair0) {
  stats_item<D, T>(a, pair0 + blockIdx.y, blockIdx.x);
}

// ---- pass 2: KV tiles --------------------------------------------------------------------------
// The K rows kr of tile j0 (thread (rg, u): rows rg + i R, 16-byte unit u): each key block's scale
// from the smoothed values' maximum, then the k8 bytes. The K mean is read when smoothing (always with
// kMeanAlways: kv_tile's K half; the stream variant's K tiles read it only when smoothing).
template <int D, class T, bool kMeanAlways>
__device__ __forceinline__ void quantize_k_tile(const Args& a, std::int64_t pair, std::int64_t j0,
                                                const uint4 (&kr)[kTileKeys / (kThreads / (D / 8))]) {
  constexpr int U = D / 8, R = kThreads / U, kRows = kTileKeys / R, kWarps = kThreads / 32;
  __shared__ std::uint32_t s_amax[kWarps][2];
  const int tid = threadIdx.x, u = tid % U, rg = tid / U, lane = tid % 32, warp = tid / 32;
  float km[8] = {};
  if (kMeanAlways || a.smooth) {
#pragma unroll
    for (int e = 0; e < 8; ++e) km[e] = __ldcg(&a.out.k_mean[pair * D + u * 8 + e]);
  }

  // K: the smoothed values' maximum per key block (two blocks of 64 or one of 128 per tile).
  const auto block_of = [&](int row) { return a.blkk == 64 ? row / 64 : 0; };
  const auto smoothed = [&](const uint4& raw, float (&x)[8]) {
    unpack8<T>(raw, x);
    if (a.smooth) {
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = rule::smooth(x[e], km[e]);
    }
  };
  std::uint32_t am[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int row = rg + i * R;
    if (j0 + row >= a.sk) continue;
    float x[8];
    smoothed(kr[i], x);
    std::uint32_t m = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) m = max(m, rule::abs_bits(x[e]));
    if (block_of(row) == 0) am[0] = max(am[0], m); else am[1] = max(am[1], m);
  }
  am[0] = __reduce_max_sync(0xffffffffu, am[0]);
  am[1] = __reduce_max_sync(0xffffffffu, am[1]);
  if (lane == 0) {
    s_amax[warp][0] = am[0];
    s_amax[warp][1] = am[1];
  }
  __syncthreads();
  std::uint32_t m0 = 0, m1 = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    m0 = max(m0, s_amax[w][0]);
    m1 = max(m1, s_amax[w][1]);
  }
  const rule::Pow2Scale sc0 = rule::pow2_scale(m0), sc1 = rule::pow2_scale(m1);
  if (tid < kTileKeys / a.blkk) {  // one thread per key block of the tile
    const std::int64_t kb = j0 / a.blkk + tid;
    if (kb < a.nkb) a.out.k_scale[pair * a.nkb + kb] = tid == 0 ? sc0.scale : sc1.scale;
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int row = rg + i * R;
    const std::int64_t j = j0 + row;
    if (j >= a.sk) continue;
    float x[8], inv[8];
    smoothed(kr[i], x);
#pragma unroll
    for (int e = 0; e < 8; ++e) inv[e] = block_of(row) == 0 ? sc0.inv : sc1.inv;
    *reinterpret_cast<uint2*>(a.out.k8 + (pair * a.sk + j) * D + u * 8) = quantize8(x, inv);
  }
}

// The V half of a KV tile.
template <int D, class T>
__device__ __forceinline__ void v_part_of_tile(const Args& a, std::int64_t pair, std::int64_t j0,
                                               const uint4 (&vr)[(D / 8) * (kTileKeys / 4) / kThreads][4]) {
  constexpr int U = D / 8, kWarps = kThreads / 32;
  __shared__ __align__(16) std::uint8_t s_v[D][kVPitch];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  constexpr int kVCombos = U * (kTileKeys / 4) / kThreads;
  const auto v_unit = [&](int k) { return 2 * ((tid + kThreads * k) / 64) + tid % 2; };
  const auto v_quad = [&](int k) { return ((tid + kThreads * k) / 2) % 32; };
  const auto v_key = [&](int quad, int i) {  // key within the tile at position 4 quad + i
    return quad / 8 * rule::kVPermGroup + rule::v_key_perm(4 * (quad % 8) + i);
  };

  // V: quantize with the channel scales, transpose into s_v[d][position] (keys past Sk: zeros),
  // then each warp writes whole 128-byte rows of v8t.
#pragma unroll
  for (int k = 0; k < kVCombos; ++k) {
    const int vu = v_unit(k), quad = v_quad(k);
    float vinv[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) vinv[e] = 1.0f / __ldcg(&a.out.v_scale[pair * D + vu * 8 + e]);  // exact: 2^-k
    uint2 q8[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q8[i] = make_uint2(0, 0);
      if (j0 + v_key(quad, i) < a.sk) {
        float x[8];
        unpack8<T>(vr[k][i], x);
        q8[i] = quantize8(x, vinv);
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      std::uint32_t word = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) word |= (((e < 4 ? q8[i].x : q8[i].y) >> (8 * (e % 4))) & 0xffu) << (8 * i);
      *reinterpret_cast<std::uint32_t*>(&s_v[vu * 8 + e][4 * quad]) = word;
    }
  }
  __syncthreads();
  for (int d = warp; d < D; d += kWarps) {
    const std::uint32_t w = *reinterpret_cast<const std::uint32_t*>(&s_v[d][4 * lane]);
    *reinterpret_cast<std::uint32_t*>(a.out.v8t + (pair * D + d) * a.sk_pad + j0 + 4 * lane) = w;
  }
}

template <int D, class T>
__device__ __forceinline__ void kv_tile(const Args& a, std::int64_t pair, std::int64_t tile) {
  constexpr int U = D / 8, R = kThreads / U, kRows = kTileKeys / R;
  const int tid = threadIdx.x, u = tid % U, rg = tid / U;
  const std::int64_t b = pair / a.hk, h = pair % a.hk;
  const std::int64_t j0 = tile * kTileKeys;

  // K: thread (rg, u) holds channels [8u, 8u + 8) of keys j0 + rg + R i. V: thread t holds
  // kVCombos (unit, quad) combinations x = t + kThreads k: unit 2 (x / 64) + x % 2, and the 4 keys
  // whose bytes sit at positions 4 quad .. 4 quad + 3 of the tile's v8t rows, quad = (x / 2) % 32,
  // so each channel's 4 bytes leave as one 32-bit shared-memory store (two lanes per 32-byte
  // sector of the loads; 2-way bank conflicts on the stores).
  constexpr int kVCombos = U * (kTileKeys / 4) / kThreads;
  const auto v_unit = [&](int k) { return 2 * ((tid + kThreads * k) / 64) + tid % 2; };
  const auto v_quad = [&](int k) { return ((tid + kThreads * k) / 2) % 32; };
  const auto v_key = [&](int quad, int i) {  // key within the tile at position 4 quad + i
    return quad / 8 * rule::kVPermGroup + rule::v_key_perm(4 * (quad % 8) + i);
  };
  uint4 kr[kRows], vr[kVCombos][4];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const std::int64_t j = j0 + rg + i * R;
    kr[i] = a.qk && j < a.sk ? load8(a.k, b, j, h, u) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int k = 0; k < kVCombos; ++k) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const std::int64_t j = j0 + v_key(v_quad(k), i);
      vr[k][i] = j < a.sk ? load8(a.v, b, j, h, v_unit(k)) : make_uint4(0, 0, 0, 0);
    }
  }
  wait_ready(a, pair);
  if (a.qk) quantize_k_tile<D, T, true>(a, pair, j0, kr);  // the K half
  v_part_of_tile<D, T>(a, pair, j0, vr);
}

// ---- pass 2: Q tiles ---------------------------------------------------------------------------
// The U lanes of a row are consecutive lanes of one warp: the row's amax is a shuffle reduction,
// and its LSE shift adds the U chunk sums by quant_rule.h's pairwise tree (an xor butterfly).
// Q tile `qt` of query head g of those reading kv head `pair`. QUANT = false: the LSE shift alone
// (lse_shift_kernel: Q and K came quantized, only the shift is wanted).
template <int D, class T, bool QUANT = true>
__device__ __forceinline__ void q_tile(const Args& a, std::int64_t pair, std::int64_t g, std::int64_t qt) {
  constexpr int U = D / 8, R = kThreads / U, kRows = kTileRows / R;
  const int tid = threadIdx.x, u = tid % U, rg = tid / U;
  const std::int64_t b = pair / a.hk, h = (pair % a.hk) * (a.hq / a.hk) + g;
  const std::int64_t i0 = qt * kTileRows;

  uint4 qr[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const std::int64_t row = i0 + rg + i * R;
    qr[i] = row < a.sq ? load8(a.q, b, row, h, u) : make_uint4(0, 0, 0, 0);
  }
  wait_ready(a, pair);
  float km[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) km[e] = __ldcg(&a.out.k_mean[pair * D + u * 8 + e]);
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const std::int64_t row = i0 + rg + i * R;
    float x[8];
    unpack8<T>(qr[i], x);
    rule::Pow2Scale sc{1.0f, 1.0f};
    if constexpr (QUANT) {
      std::uint32_t m = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) m = max(m, rule::abs_bits(x[e]));
#pragma unroll
      for (int off = U / 2; off > 0; off /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
      sc = rule::pow2_scale(m);
    }
    // The rule's pairwise tree over the row's U chunk sums, as an xor butterfly (every lane ends
    // with the same bits: a + b == b + a).
    double sum = 0.0;
    if (a.smooth) {
      sum = rule::dot_chunk(x, km);
#pragma unroll
      for (int off = 1; off < U; off *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    }
    if (row >= a.sq) continue;
    const std::int64_t r = (b * a.hq + h) * a.sq + row;
    if constexpr (QUANT) {
      float inv[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) inv[e] = sc.inv;
      *reinterpret_cast<uint2*>(a.out.q8 + r * D + u * 8) = quantize8(x, inv);
    }
    if (u == 0) {
      if constexpr (QUANT) a.out.q_scale[r] = sc.scale;
      a.out.lse_shift[r] = a.smooth ? static_cast<float>(a.scale * sum) : 0.0f;
    }
  }
}

// Quantization item k of kv head `pair`: its KV tiles first, then the Q tiles of its query heads.
template <int D, class T>
__device__ __forceinline__ void quant_item(const Args& a, std::int64_t pair, std::int64_t k) {
  if (k < a.ntiles) {
    kv_tile<D, T>(a, pair, k);
  } else {
    k -= a.ntiles;
    q_tile<D, T>(a, pair, k / a.qtiles, k % a.qtiles);
  }
}

// The LSE shift alone: one CTA per Q tile (blockIdx.x = (pair * group + g) * qtiles + qt), MINB CTAs
// per SM (the same code and bits at every MINB; SPARGE_QUANT_SHIFT_OCC).
template <int D, class T, int MINB>
__global__ void __launch_bounds__(kThreads, MINB) lse_shift_kernel(const Args a) {
  const std::int64_t idx = blockIdx.x, group = a.hq / a.hk;
  q_tile<D, T, false>(a, idx / (group * a.qtiles), idx / a.qtiles % group, idx % a.qtiles);
}

// Launches variant, pass 2: one CTA per quantization item of the group's kv heads. At most 128
// registers, so two CTAs share an SM (one CTA's barrier waits overlap the other's loads).
template <int D, class T>
__global__ void __launch_bounds__(kThreads, 2) quant_kernel(const Args a, std::int64_t pair0) {
  const std::int64_t idx = blockIdx.x;
  quant_item<D, T>(a, pair0 + idx / a.qper, idx % a.qper);
}

// Fused variant: persistent CTAs take tickets in schedule.h's order. Thread 0 asks for the next
// ticket when an item starts and publishes it when the item ends, so the atomic's latency hides
// behind the item's loads. No deadlock: an item waits only for stats items with smaller tickets;
// those are held (as current or prefetched items) by CTAs whose current item has a smaller
// ticket still, so the smallest waiting item always has its dependencies running or done.
template <int D, class T>
__global__ void __launch_bounds__(kThreads, 2) fused_kernel(const Args a, const Schedule sched) {
  __shared__ unsigned long long s_ticket;
  const std::int64_t total = sched.total();
  if (threadIdx.x == 0) s_ticket = atomicAdd(a.ticket, 1ull);
  __syncthreads();
  for (;;) {
    const auto t = static_cast<std::int64_t>(s_ticket);
    __syncthreads();  // everyone has read s_ticket before thread 0 replaces it
    if (t >= total) return;
    unsigned long long next = 0;
    if (threadIdx.x == 0) next = atomicAdd(a.ticket, 1ull);
    const Item it = decode(sched, t);
    if (it.stats) {
      stats_item<D, T>(a, it.pair, it.index);
    } else {
      quant_item<D, T>(a, it.pair, it.index);
    }
    if (threadIdx.x == 0) s_ticket = next;
    __syncthreads();
  }
}

// ---- the stream variant ------------------------------------------------------------------------
// One persistent launch like `fused`, built for DRAM bandwidth: every item is 128 rows of one
// tensor and one head (a K or V statistics chunk, a K tile, a V tile, a Q tile: 32 KB at head dim
// 128), and each CTA keeps its next items' rows in flight with cp.async (16 bytes per copy, L2 only)
// into a ring of `ns` shared-memory stages while it computes the current one from shared memory.
// With ns = 3, two items (64 KB) are in flight while a CTA computes one: 128 KB per SM at two CTAs
// per SM, where ~32-40 KB per SM covers the DRAM latency at 4.2 TB/s (the other variants load,
// then compute, then store, so an SM's bytes in flight drop to zero whenever both of its CTAs
// compute). K and V statistics are separate items with separate counters and flags, so a K tile or
// a Q tile waits only for k_mean and a V tile only for v_scale. Rows live in the stage at a pitch
// of 2 D + 16 bytes, which makes the 16-byte row reads (K, Q, statistics) and the V tile's
// transposing reads free of bank conflicts. The per-thread arithmetic and every reduction order
// are the other variants' (same bits).
constexpr int kItemRows = 128;  // rows per stream item: kStatRows = kTileKeys = kTileRows
constexpr int kMaxStages = 4;
static_assert(kItemRows == kStatRows && kItemRows == kTileKeys && kItemRows == kTileRows, "one item size");

template <int D>
constexpr int stage_pitch() { return 2 * D + 16; }
template <int D>
constexpr int stage_bytes() { return kItemRows * stage_pitch<D>(); }

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const auto s = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most n - 1 of this thread's committed groups are pending (n = the stage count).
__device__ __forceinline__ void cp_async_wait_stages(int n) {
  if (n <= 2) {
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
  } else if (n == 3) {
    asm volatile("cp.async.wait_group 2;\n" ::: "memory");
  } else {
    asm volatile("cp.async.wait_group 3;\n" ::: "memory");
  }
}

// 16 bytes of staged row r at unit u (values [8u, 8u + 8)).
template <int D>
__device__ __forceinline__ uint4 lds16(const unsigned char* st, int r, int u) {
  return *reinterpret_cast<const uint4*>(st + r * stage_pitch<D>() + u * 16);
}

enum class Kind : std::uint32_t { k_stats, v_stats, k_tile, q_tile, v_tile, none };
struct StreamItem {
  Kind kind;
  std::uint32_t pair;   // kv head b * Hk + hk
  std::uint32_t index;  // chunk or tile of the kv head; q_tile: g * qtiles + qt
};

// The stream schedule: schedule.h's order decoded in 32-bit arithmetic (every thread decodes the
// tickets it issues; 64-bit divisions would cost as much as an item's arithmetic), and the two
// divisions an item's rows need.
struct StreamSched {
  Schedule32 sch;
  std::uint32_t total;
  FastDiv div_hk, div_qtiles;
};

// The schedule's items per kv head: stats = [K chunks (smooth_k only), V chunks]; quantization =
// [K tiles, V tiles, Q tiles of its query heads]: the tiles that re-read K and V (L2 hits if the
// lines are still there) right after the statistics, Q (read once, from DRAM) last.
__device__ __forceinline__ StreamItem stream_decode(const Args& a, const StreamSched& s, std::uint32_t t) {
  if (t >= s.total) return {Kind::none, 0, 0};
  const Item it = s.sch.decode(t);
  const auto pair = static_cast<std::uint32_t>(it.pair), index = static_cast<std::uint32_t>(it.index);
  const auto nch = static_cast<std::uint32_t>(a.nch), ntiles = static_cast<std::uint32_t>(a.ntiles);
  if (!a.qk) return {it.stats ? Kind::v_stats : Kind::v_tile, pair, index};  // V only (quantize_v)
  if (it.stats) {
    if (a.smooth && index < nch) return {Kind::k_stats, pair, index};
    return {Kind::v_stats, pair, a.smooth ? index - nch : index};
  }
  if (index < ntiles) return {Kind::k_tile, pair, index};
  if (index < 2 * ntiles) return {Kind::v_tile, pair, index - ntiles};
  return {Kind::q_tile, pair, index - 2 * ntiles};
}

// Rows [row0, row0 + 128) of head h of x into the stage (rows >= nrows: zeros). Thread t copies the
// 16-byte units c = t + kThreads k (row c / U, unit c % U): a warp covers two whole rows. Inputs
// without vector loads take the 8 strided loads and a shared store (synchronous: a fallback).
template <int D>
__device__ __forceinline__ void stage_rows(unsigned char* st, const Src& x, std::int64_t b, std::int64_t h,
                                           std::int64_t row0, std::int64_t nrows) {
  constexpr int U = D / 8, kCopies = kItemRows * U / kThreads;
  static_assert(kItemRows * U % kThreads == 0, "whole copies per thread");
  const int tid = threadIdx.x;
  if (x.vec) {
    const std::uint16_t* src = x.data + b * x.stride[0] + h * x.stride[2];
#pragma unroll
    for (int k = 0; k < kCopies; ++k) {
      const int c = tid + kThreads * k, r = c / U, u = c % U;
      unsigned char* dst = st + r * stage_pitch<D>() + u * 16;
      if (row0 + r < nrows) {
        cp_async16(dst, src + (row0 + r) * x.stride[1] + u * 8);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
    }
  } else {
#pragma unroll 1
    for (int k = 0; k < kCopies; ++k) {
      const int c = tid + kThreads * k, r = c / U, u = c % U;
      *reinterpret_cast<uint4*>(st + r * stage_pitch<D>() + u * 16) =
          row0 + r < nrows ? load8(x, b, row0 + r, h, u) : make_uint4(0, 0, 0, 0);
    }
  }
}

// Issues the rows of an item (nothing for none).
template <int D>
__device__ __forceinline__ void stream_issue(const Args& a, const StreamSched& s, const StreamItem& it, unsigned char* st) {
  if (it.kind == Kind::none) return;
  const std::uint32_t b = s.div_hk.div(it.pair), hk = it.pair - b * static_cast<std::uint32_t>(a.hk);
  const std::int64_t row0 = static_cast<std::int64_t>(it.index) * kItemRows;
  switch (it.kind) {
    case Kind::k_stats:
    case Kind::k_tile: stage_rows<D>(st, a.k, b, hk, row0, a.sk); break;
    case Kind::v_stats:
    case Kind::v_tile: stage_rows<D>(st, a.v, b, hk, row0, a.sk); break;
    case Kind::q_tile: {
      const std::uint32_t g = s.div_qtiles.div(it.index), qt = it.index - g * static_cast<std::uint32_t>(a.qtiles);
      stage_rows<D>(st, a.q, b, hk * (a.hq / a.hk) + g, static_cast<std::int64_t>(qt) * kTileRows, a.sq);
      break;
    }
    default: break;
  }
}

// The flag an item waits for (nullptr: none).
__device__ __forceinline__ std::uint32_t* dep_flag(const Args& a, const StreamItem& it) {
  switch (it.kind) {
    case Kind::k_tile:
    case Kind::q_tile: return a.smooth ? &a.ready[it.pair] : nullptr;
    case Kind::v_tile: return &a.ready_v[it.pair];
    default: return nullptr;
  }
}

// Thread 0 waits for a flag; the values it guards are then read with __ldcg (L2).
__device__ __forceinline__ void wait_flag(std::uint32_t* flag) {
  if (threadIdx.x == 0) {
    while (atomicAdd(flag, 0u) == 0u) __nanosleep(100);
    __threadfence();
  }
  __syncthreads();
}

// K statistics: the fp64 column sums of 128 keys, in stats_item's order (thread (rg, u) adds its
// kRows keys rg + R i ascending from 0.0, then the R row groups ascending), so the chunk partials
// and k_mean have the bits of the other variants. The row-group sums go through the stage itself
// (its rows are in registers by then), laid out [r][e][u] so that both the writes and the reads
// are consecutive 8-byte words. The last K item of a kv head writes k_mean and raises `ready`.
template <int D, class T>
__device__ __forceinline__ void stream_k_stats(const Args& a, std::int64_t pair, std::int64_t chunk, unsigned char* st) {
  constexpr int U = D / 8, R = kThreads / U, kRows = kItemRows / R;
  static_assert(R * D * static_cast<int>(sizeof(double)) <= stage_bytes<D>(), "row-group sums fit in a stage");
  __shared__ bool s_last;
  const int tid = threadIdx.x, u = tid % U, rg = tid / U;
  double sum[8] = {};
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    float x[8];
    unpack8<T>(lds16<D>(st, rg + i * R, u), x);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum[e] += static_cast<double>(x[e]);
  }
  __syncthreads();  // every thread has read its rows: the stage now holds the row-group sums
  double* s_sum = reinterpret_cast<double*>(st);
#pragma unroll
  for (int e = 0; e < 8; ++e) s_sum[(rg * 8 + e) * U + u] = sum[e];
  __syncthreads();
  if (tid < D) {
    const int e = tid / U, uu = tid % U;  // channel uu * 8 + e
    double s = 0.0;
    for (int r = 0; r < R; ++r) s += s_sum[r * D + tid];
    a.part[(pair * a.nch + chunk) * D + uu * 8 + e] = s;
    __threadfence();  // the partial is visible before the ticket below
  }
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(&a.done[pair], 1u) == static_cast<std::uint32_t>(a.nch - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  if (tid < D) {
    const double* col = a.part + pair * a.nch * D + tid;
    double s = 0.0;
    for (std::int64_t c0 = 0; c0 < a.nch; c0 += 16) {  // chunk order, as stats_item
      double v[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = c0 + i < a.nch ? __ldcg(col + (c0 + i) * D) : 0.0;
#pragma unroll
      for (int i = 0; i < 16; ++i) s += v[i];
    }
    a.out.k_mean[pair * D + tid] = static_cast<float>(s / static_cast<double>(a.sk));
    __threadfence();
  }
  __syncthreads();
  if (tid == 0) atomicExch(&a.ready[pair], 1u);
}

// V statistics: the column maximum of |v| over 128 keys (any order: a maximum of bits), one
// atomicMax per channel. The last V item of a kv head writes v_scale (and the zero k_mean without
// smoothing) and raises `ready_v`.
template <int D, class T>
__device__ __forceinline__ void stream_v_stats(const Args& a, std::int64_t pair, unsigned char* st) {
  constexpr int U = D / 8, R = kThreads / U, kRows = kItemRows / R;
  __shared__ bool s_last;
  const int tid = threadIdx.x, u = tid % U, rg = tid / U;
  std::uint32_t mx[8] = {};
#pragma unroll
  for (int i = 0; i < kRows; ++i) max_abs8<T>(lds16<D>(st, rg + i * R, u), mx);
  __syncthreads();
  std::uint32_t* s_max = reinterpret_cast<std::uint32_t*>(st);
#pragma unroll
  for (int e = 0; e < 8; ++e) s_max[(rg * 8 + e) * U + u] = mx[e];
  __syncthreads();
  if (tid < D) {
    std::uint32_t m = 0;
    for (int r = 0; r < R; ++r) m = max(m, s_max[r * D + tid]);
    if (m != 0) atomicMax(&a.vamax[pair * D + (tid % U) * 8 + tid / U], m);
    __threadfence();
  }
  __syncthreads();
  if (tid == 0) s_last = atomicAdd(&a.done_v[pair], 1u) == static_cast<std::uint32_t>(a.nch - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  if (tid < D) {
    a.out.v_scale[pair * D + tid] = rule::pow2_scale(__ldcg(&a.vamax[pair * D + tid])).scale;
    if (!a.smooth && a.qk) a.out.k_mean[pair * D + tid] = 0.0f;
    __threadfence();
  }
  __syncthreads();
  if (tid == 0) atomicExch(&a.ready_v[pair], 1u);
}

// A K tile from the stage: kv_tile's K half, the same arithmetic.
template <int D, class T>
__device__ __forceinline__ void stream_k_tile(const Args& a, std::int64_t pair, std::int64_t tile, const unsigned char* st,
                                              bool known) {
  constexpr int U = D / 8, R = kThreads / U, kRows = kTileKeys / R;
  const int tid = threadIdx.x, u = tid % U, rg = tid / U;
  const std::int64_t j0 = tile * kTileKeys;
  uint4 kr[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) kr[i] = lds16<D>(st, rg + i * R, u);
  if (a.smooth && !known) wait_flag(&a.ready[pair]);
  quantize_k_tile<D, T, false>(a, pair, j0, kr);
}

// 1 / s for a power of two s = 2^k, k in [-126, 127) (v_scale's range): 2^-k from the bits, exact.
__device__ __forceinline__ float inv_pow2(float s) { return __uint_as_float((254u << 23) - __float_as_uint(s)); }

// A V tile from the stage: thread (unit, quad) as kv_tile, its 4 keys read from the stage (keys
// k0 + {0, 2, 4, 6} and units 2a, 2a + 1 in a phase of 8 lanes: 8 distinct 16-byte slots mod 128
// bytes at the pitch of 17 slots), and each channel's 4 bytes stored straight to v8t: a warp's
// store covers 64 consecutive bytes of two v8t rows (whole 32-byte sectors), no transpose tile.
// kFromMax (the split variant): the scales from the V maxima themselves (the rule's pow2_scale of
// vamax, the value the other variants store in v_scale first), so no flag and no v_scale read.
template <int D, class T, bool kFromMax = false>
__device__ __forceinline__ void stream_v_tile(const Args& a, std::int64_t pair, std::int64_t tile, const unsigned char* st,
                                              bool known) {
  constexpr int U = D / 8, kVCombos = U * (kTileKeys / 4) / kThreads;
  const int tid = threadIdx.x;
  const std::int64_t j0 = tile * kTileKeys;
  if (!kFromMax && !known) wait_flag(&a.ready_v[pair]);
#pragma unroll
  for (int k = 0; k < kVCombos; ++k) {
    const int x = tid + kThreads * k, vu = 2 * (x / 64) + x % 2, quad = (x / 2) % 32;
    float vinv[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const std::int64_t c = pair * D + vu * 8 + e;
      vinv[e] = inv_pow2(kFromMax ? rule::pow2_scale(a.vamax[c]).scale : __ldcg(&a.out.v_scale[c]));
    }
    uint2 q8[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = quad / 8 * rule::kVPermGroup + rule::v_key_perm(4 * (quad % 8) + i);
      q8[i] = make_uint2(0, 0);
      if (j0 + key < a.sk) {
        float xv[8];
        unpack8<T>(lds16<D>(st, key, vu), xv);
        q8[i] = quantize8(xv, vinv);
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      std::uint32_t word = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) word |= (((e < 4 ? q8[i].x : q8[i].y) >> (8 * (e % 4))) & 0xffu) << (8 * i);
      *reinterpret_cast<std::uint32_t*>(a.out.v8t + (pair * D + vu * 8 + e) * a.sk_pad + j0 + 4 * quad) = word;
    }
  }
}

// A Q tile from the stage: q_tile's arithmetic (the row's U lanes are consecutive lanes of a warp).
template <int D, class T>
__device__ __forceinline__ void stream_q_tile(const Args& a, std::int64_t pair, std::int64_t idx, const unsigned char* st,
                                              bool known) {
  constexpr int U = D / 8, R = kThreads / U, kRows = kTileRows / R;
  const int tid = threadIdx.x, u = tid % U, rg = tid / U;
  // 32-bit divisions (all below 2^31: the schedule has fewer items).
  const auto qtiles = static_cast<std::uint32_t>(a.qtiles), hk = static_cast<std::uint32_t>(a.hk);
  const std::int64_t g = static_cast<std::uint32_t>(idx) / qtiles, qt = static_cast<std::uint32_t>(idx) % qtiles;
  const std::int64_t b = static_cast<std::uint32_t>(pair) / hk, h = (static_cast<std::uint32_t>(pair) % hk) * (a.hq / a.hk) + g;
  const std::int64_t i0 = qt * kTileRows;
  float km[8] = {};
  if (a.smooth) {
    if (!known) wait_flag(&a.ready[pair]);
#pragma unroll
    for (int e = 0; e < 8; ++e) km[e] = __ldcg(&a.out.k_mean[pair * D + u * 8 + e]);
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const std::int64_t row = i0 + rg + i * R;
    float x[8];
    unpack8<T>(lds16<D>(st, rg + i * R, u), x);
    std::uint32_t m = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) m = max(m, rule::abs_bits(x[e]));
#pragma unroll
    for (int off = U / 2; off > 0; off /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
    const rule::Pow2Scale sc = rule::pow2_scale(m);
    double sum = 0.0;
    if (a.smooth) {
      sum = rule::dot_chunk(x, km);
#pragma unroll
      for (int off = 1; off < U; off *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    }
    if (row >= a.sq) continue;
    float inv[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) inv[e] = sc.inv;
    const std::int64_t r = (b * a.hq + h) * a.sq + row;
    *reinterpret_cast<uint2*>(a.out.q8 + r * D + u * 8) = quantize8(x, inv);
    if (u == 0) {
      a.out.q_scale[r] = sc.scale;
      a.out.lse_shift[r] = a.smooth ? static_cast<float>(a.scale * sum) : 0.0f;
    }
  }
}

// The persistent loop. Slot j % (ns + 1) of s_tk holds the ticket of the CTA's j-th item, stage
// j % ns its rows, s_item[j % ns] the item (decoded by every thread when issued, stored by thread
// 0, which is also the only writer of s_tk). Iteration `it`: issue item it + ns - 1 into the stage
// item it - 1 used (freed by the barrier that ended iteration it - 1), ask for the ticket of item
// it + ns (its atomic hides behind the compute), read the flag item it + 1 will wait for (likewise),
// wait for item it's rows, compute it, publish the new ticket into slot (it + ns) % (ns + 1) =
// (it - 1) % (ns + 1) (last read during iteration it - 1) and whether item it + 1's flag was seen
// raised (s_known, by parity: written in iteration j - 1, read in j), barrier. An item whose flag
// was seen raised skips the wait and its round trip; else it waits as `fused` does. Tickets
// saturate at the total and rise per CTA, so a ticket at the end means no later one is valid and
// nothing is in flight. No deadlock (as fused): an item waits only for statistics items of smaller
// tickets, each done, current in a CTA (statistics never wait) or queued behind a current item of
// a smaller ticket still.
template <int D, class T>
__global__ void __launch_bounds__(kThreads, 2) stream_kernel(const Args a, const StreamSched sched, int ns) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ std::uint32_t s_tk[kMaxStages + 1];
  __shared__ StreamItem s_item[kMaxStages];
  __shared__ std::uint32_t s_known[2];
  const auto stage = [&](std::int64_t j) { return smem + static_cast<int>(j % ns) * stage_bytes<D>(); };
  // Tickets saturate at total (the counter itself runs on; sched.total < 2^31).
  const auto ticket = [&]() {
    const unsigned long long t = atomicAdd(a.ticket, 1ull);
    return static_cast<std::uint32_t>(t < sched.total ? t : sched.total);
  };
  if (threadIdx.x == 0) {
    for (int j = 0; j < ns; ++j) s_tk[j] = ticket();
    s_known[0] = 0;  // the first item checks its flag itself
  }
  __syncthreads();
  for (int j = 0; j + 1 < ns; ++j) {
    const StreamItem item = stream_decode(a, sched, s_tk[j]);
    if (threadIdx.x == 0) s_item[j] = item;
    stream_issue<D>(a, sched, item, stage(j));
    cp_async_commit();
  }
  for (std::int64_t it = 0;; ++it) {
    {
      const StreamItem item = stream_decode(a, sched, s_tk[(it + ns - 1) % (ns + 1)]);
      if (threadIdx.x == 0) s_item[(it + ns - 1) % ns] = item;  // slot of item it - 1: read before the last barrier
      stream_issue<D>(a, sched, item, stage(it + ns - 1));
      cp_async_commit();
    }
    std::uint32_t next = 0, seen = 0;
    std::uint32_t* flag = nullptr;
    if (threadIdx.x == 0) {
      next = ticket();
      flag = dep_flag(a, s_item[(it + 1) % ns]);  // item it + 1, issued by now (it + 1 <= it + ns - 1)
      if (flag != nullptr) seen = atomicAdd(flag, 0u);
    }
    cp_async_wait_stages(ns);
    __syncthreads();  // item it's rows have landed, from every thread's copies; s_item is visible
    const StreamItem item = s_item[it % ns];
    if (item.kind == Kind::none) return;
    const bool known = s_known[it & 1] != 0;
    unsigned char* st = stage(it);
    switch (item.kind) {
      case Kind::k_stats: stream_k_stats<D, T>(a, item.pair, item.index, st); break;
      case Kind::v_stats: stream_v_stats<D, T>(a, item.pair, st); break;
      case Kind::k_tile: stream_k_tile<D, T>(a, item.pair, item.index, st, known); break;
      case Kind::q_tile: stream_q_tile<D, T>(a, item.pair, item.index, st, known); break;
      case Kind::v_tile: stream_v_tile<D, T>(a, item.pair, item.index, st, known); break;
      default: break;
    }
    if (threadIdx.x == 0) {
      s_tk[(it + ns) % (ns + 1)] = next;
      // Seen raised: the fence orders this observation before the other threads' reads (after the
      // barriers below) of what the flag guards, as wait_flag's does.
      if (flag != nullptr && seen != 0) __threadfence();
      s_known[(it + 1) & 1] = flag != nullptr && seen != 0 ? 1u : 0u;
    }
    __syncthreads();  // the stage and the ticket slot are free; the new ticket and s_known are visible
  }
}

// ---- the split variant (V only) --------------------------------------------------------------------
// Two plain launches at the copy bandwidth instead of one scheduled persistent one:
//   vmax_kernel: grid (X, column groups, B); thread (column, row lane) owns 8 channels of one kv
//     head and walks the rows s = x R + lane + i X R, kUnroll rows of loads in flight, keeping the
//     maximum of |v| bits in registers; one atomicMax per channel and thread at the end. The rows
//     read last are each sequence's last.
//   vtile_kernel: one CTA per V tile (128 keys of one kv head), last tile first (those rows are
//     still in L2 from vmax_kernel), staged in shared memory and written by stream_v_tile with the
//     scales taken from the maxima; the CTAs of tile 0 also store v_scale.
// Same arithmetic as the other variants (the maximum of bits is order independent): the same bytes.
template <int D, class T>
__global__ void __launch_bounds__(kThreads) vmax_kernel(const Args a, int ceff, int lanes, std::int64_t b0) {
  constexpr int U = D / 8, kUnroll = 8;
  const int tid = threadIdx.x, lane = tid / ceff;
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.y) * ceff + tid % ceff;
  if (lane >= lanes || col >= a.hk * U) return;
  const std::int64_t b = b0 + blockIdx.z, hk = col / U;
  const int u = static_cast<int>(col % U);
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * lanes;
  std::uint32_t mx[8] = {};
  for (std::int64_t s0 = static_cast<std::int64_t>(blockIdx.x) * lanes + lane; s0 < a.sk; s0 += kUnroll * step) {
    uint4 r[kUnroll];
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      const std::int64_t s = s0 + i * step;
      r[i] = s < a.sk ? load8(a.v, b, s, hk, u) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) max_abs8<T>(r[i], mx);
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (mx[e] != 0) atomicMax(&a.vamax[(b * a.hk + hk) * D + u * 8 + e], mx[e]);
  }
}

template <int D, class T>
__global__ void __launch_bounds__(kThreads) vtile_kernel(const Args a, std::int64_t pairs) {
  extern __shared__ __align__(16) unsigned char smem[];
  const std::int64_t idx = static_cast<std::int64_t>(gridDim.x) - 1 - blockIdx.x;
  const std::int64_t pair = idx % pairs, tile = idx / pairs;
  const std::int64_t b = pair / a.hk, hk = pair % a.hk;
  stage_rows<D>(smem, a.v, b, hk, tile * kTileKeys, a.sk);
  cp_async_commit();
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();
  stream_v_tile<D, T, true>(a, pair, tile, smem, true);
  if (tile == 0 && threadIdx.x < D) a.out.v_scale[pair * D + threadIdx.x] = rule::pow2_scale(a.vamax[pair * D + threadIdx.x]).scale;
}

// The device's SM count and how many CTAs of `kernel` (kThreads threads, smem bytes of dynamic
// shared memory) one SM holds at once: the persistent and one-wave grids of the launchers below.
template <class Kernel>
cudaError_t residency(Kernel kernel, int smem, int* sms, int* per_sm) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, kernel, kThreads, smem);
  return e;
}

template <int D, class T>
cudaError_t launch_split(const Args& a, std::int64_t pairs, cudaStream_t stream) {
  constexpr int U = D / 8;
  const std::int64_t b_total = pairs / a.hk, cols = a.hk * U;
  const int ceff = static_cast<int>(std::min<std::int64_t>(cols, kThreads)), lanes = kThreads / ceff;
  const std::int64_t groups = (cols + ceff - 1) / ceff;
  int sms = 0, per_sm = 0;
  cudaError_t e = residency(vmax_kernel<D, T>, 0, &sms, &per_sm);
  if (e != cudaSuccess) return e;
  if (groups > 65535) return cudaErrorInvalidValue;  // Hk * D / 8 > 16.7 M columns
  // About one resident wave of CTAs in all, each walking its share of the rows.
  const std::int64_t want = std::max<std::int64_t>(1, static_cast<std::int64_t>(sms) * std::max(per_sm, 1) / (groups * b_total));
  const std::int64_t x = std::min<std::int64_t>(want, (a.sk + lanes - 1) / lanes);
  for (std::int64_t b0 = 0; b0 < b_total; b0 += 65535) {
    const auto nb = static_cast<unsigned>(std::min<std::int64_t>(65535, b_total - b0));
    vmax_kernel<D, T><<<dim3(static_cast<unsigned>(x), static_cast<unsigned>(groups), nb), kThreads, 0, stream>>>(a, ceff, lanes, b0);
  }
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const std::int64_t tiles = pairs * a.ntiles;
  if (tiles > 0x7fffffff) return cudaErrorInvalidValue;
  constexpr int smem = stage_bytes<D>();
  e = cudaFuncSetAttribute(vtile_kernel<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  vtile_kernel<D, T><<<static_cast<unsigned>(tiles), kThreads, smem, stream>>>(a, pairs);
  return cudaGetLastError();
}

Src make_src(const Tensor& t) {
  Src s{};
  s.data = static_cast<const std::uint16_t*>(t.data);
  for (int i = 0; i < 4; ++i) s.stride[i] = t.stride[i];
  s.vec = t.stride[3] == 1 && reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0 && t.stride[0] % 8 == 0 &&
          t.stride[1] % 8 == 0 && t.stride[2] % 8 == 0;
  return s;
}

// kv heads per group: SPARGE_QUANT_GROUP=N (N >= 1) processes N kv heads (b, hk) with both passes
// before the next N, so pass 2's second reads of K and V can hit L2 (N = 4 at head dim 128 and
// Sk = 16384 is 32 MB of K and V); unset or 0: all kv heads in one group for the launches
// variant, 2 for the fused and stream ones. SPARGE_QUANT_VARIANT=fused selects the single
// persistent launch, =stream the pipelined persistent launch (SPARGE_QUANT_STAGES=2..4 stages of
// 128 rows, default 3). All of them change speed, never bytes.
std::int64_t env_int(const char* name) {
  const char* e = std::getenv(name);
  return e == nullptr ? 0 : std::atoll(e);
}
enum class Variant { launches, fused, stream, split };
Variant variant_from_env() {
  const char* e = std::getenv("SPARGE_QUANT_VARIANT");
  if (e == nullptr) return Variant::launches;
  const std::string v(e);
  return v == "fused" ? Variant::fused : v == "stream" ? Variant::stream : Variant::launches;
}

// SPARGE_QUANT_VONLY (read per call): the V-only prepass (quantize_v) as `split` (default:
// vmax_kernel then vtile_kernel), `stream` (the persistent pipelined launch over V chunks and V
// tiles) or `launches` (the two passes per group). H200, b2 h32 s16384 d128, 671 MB (V read twice,
// v8t written), session 6 round 1: split 0.218 ms (3.08 TB/s), stream 0.330, launches 0.436.
Variant v_only_variant_from_env() {
  const char* e = std::getenv("SPARGE_QUANT_VONLY");
  if (e == nullptr) return Variant::split;
  const std::string v(e);
  return v == "launches" ? Variant::launches : v == "stream" ? Variant::stream : Variant::split;
}

template <int D, class T>
cudaError_t launch_fused(const Args& a, std::int64_t pairs, cudaStream_t stream) {
  std::int64_t per = env_int("SPARGE_QUANT_GROUP");
  if (per <= 0) per = 2;
  const Schedule sched{pairs, std::min(per, pairs), a.nch, a.qper};
  int sms = 0, per_sm = 0;
  const cudaError_t e = residency(fused_kernel<D, T>, 0, &sms, &per_sm);
  if (e != cudaSuccess) return e;
  const std::int64_t grid = std::min<std::int64_t>(std::max(1, sms * per_sm), sched.total());
  fused_kernel<D, T><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a, sched);
  return cudaGetLastError();
}

// Stream variant: the stage count that fits the device's per-block shared memory (the requested
// one, else fewer, at least 2), its grid of resident CTAs, and the launch.
template <int D, class T>
cudaError_t launch_stream(const Args& a, std::int64_t pairs, cudaStream_t stream) {
  std::int64_t per = env_int("SPARGE_QUANT_GROUP");
  if (per <= 0) per = 2;
  std::int64_t ns = env_int("SPARGE_QUANT_STAGES");
  if (ns < 2 || ns > kMaxStages) ns = 3;
  // Per kv head: [K chunks (smooth_k), V chunks] then [K tiles, V tiles, Q tiles]; V only: V chunks, V tiles.
  const Schedule sched{pairs, std::min(per, pairs), (a.smooth ? 2 : 1) * a.nch, a.qk ? a.qper + a.ntiles : a.ntiles};
  // Beyond 2^31 - 1 items (about 2^38 keys and query rows at B Hk kv heads) the 32-bit decoding
  // does not apply: run the fused variant, whose bytes are the same.
  if (!Schedule32::fits32(sched)) return launch_fused<D, T>(a, pairs, stream);
  const StreamSched ss{Schedule32(sched), static_cast<std::uint32_t>(sched.total()),
                       FastDiv(static_cast<std::uint32_t>(a.hk)), FastDiv(static_cast<std::uint32_t>(a.qtiles))};
  int dev = 0, sms = 0, optin = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e != cudaSuccess) return e;
  // The kernel's static shared memory is a few dozen bytes; keep 1 KB of margin for it.
  while (ns > 2 && ns * stage_bytes<D>() + 1024 > optin) --ns;
  const int smem = static_cast<int>(ns) * stage_bytes<D>();
  e = cudaFuncSetAttribute(stream_kernel<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e == cudaSuccess) e = residency(stream_kernel<D, T>, smem, &sms, &per_sm);
  if (e != cudaSuccess) return e;
  if (per_sm <= 0) return cudaErrorInvalidConfiguration;
  const std::int64_t grid = std::min<std::int64_t>(static_cast<std::int64_t>(sms) * per_sm, sched.total());
  stream_kernel<D, T><<<static_cast<unsigned>(grid), kThreads, smem, stream>>>(a, ss, static_cast<int>(ns));
  return cudaGetLastError();
}

template <int D, class T>
cudaError_t launch(Args a, std::int64_t pairs, Variant variant, cudaStream_t stream) {
  if (variant == Variant::split && !a.qk) return launch_split<D, T>(a, pairs, stream);
  if (variant == Variant::stream) return launch_stream<D, T>(a, pairs, stream);
  if (variant == Variant::fused) return launch_fused<D, T>(a, pairs, stream);
  std::int64_t per = env_int("SPARGE_QUANT_GROUP");
  if (per <= 0 || per > pairs) per = pairs;
  per = std::min<std::int64_t>(per, 65535);  // gridDim.y of pass 1
  a.ready = nullptr;
  for (std::int64_t p0 = 0; p0 < pairs; p0 += per) {
    const std::int64_t n = std::min(per, pairs - p0);
    stats_kernel<D, T><<<dim3(static_cast<unsigned>(a.nch), static_cast<unsigned>(n)), kThreads, 0, stream>>>(a, p0);
    quant_kernel<D, T><<<static_cast<unsigned>(n * a.qper), kThreads, 0, stream>>>(a, p0);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

QuantShape quant_shape(const BlockSparseAttentionParams& p) {
  return {p.q.shape[0], p.q.shape[2], p.k.shape[2], p.q.shape[1], p.k.shape[1], p.q.shape[3], p.blkk};
}

namespace {
// The prepass of quantize_qkv (qk) or quantize_v (!qk: V only, always the launches variant).
cudaError_t run_prepass(const BlockSparseAttentionParams& p, const QuantBuffers& out, bool qk, cudaStream_t stream) {
  const QuantShape sh = quant_shape(p);
  const DType t = p.q.dtype;
  if ((sh.d != 64 && sh.d != 128) || sh.sk <= 0 || sh.hk <= 0 || sh.hq % sh.hk != 0 ||
      (t != DType::f16 && t != DType::bf16) || p.k.dtype != t || p.v.dtype != t || (p.blkk != 64 && p.blkk != 128)) {
    return cudaErrorInvalidValue;
  }
  const std::int64_t pairs = sh.b * sh.hk, nch = (sh.sk + kStatRows - 1) / kStatRows;
  if (pairs == 0) return cudaSuccess;
  const std::size_t part_bytes = qk && p.smooth_k ? static_cast<std::size_t>(pairs * nch * sh.d) * sizeof(double) : 0;
  const std::size_t max_bytes = static_cast<std::size_t>(pairs * sh.d) * sizeof(std::uint32_t);
  // The counters: done[pairs], ready[pairs] (stream: then done_v[pairs], ready_v[pairs]), then the
  // ticket (8-byte aligned).
  const Variant variant = qk ? variant_from_env() : v_only_variant_from_env();
  const std::int64_t ncounters = (variant == Variant::stream ? 4 : 2) * pairs;
  const std::size_t done_bytes = (static_cast<std::size_t>(ncounters) * sizeof(std::uint32_t) + 7) / 8 * 8 + 8;
  void* mem = nullptr;
  cudaError_t e = scratch_alloc(&mem, part_bytes + max_bytes + done_bytes, stream);
  if (e != cudaSuccess) return e;
  auto* base = static_cast<unsigned char*>(mem);
  Args a{};
  a.q = make_src(p.q);
  a.k = make_src(p.k);
  a.v = make_src(p.v);
  a.out = out;
  a.hq = sh.hq;
  a.hk = sh.hk;
  a.sq = sh.sq;
  a.sk = sh.sk;
  a.sk_pad = sh.sk_pad();
  a.nkb = sh.nkb();
  a.nch = nch;
  a.blkk = p.blkk;
  a.smooth = qk && p.smooth_k;  // V only: no K statistics
  a.qk = qk;
  a.scale = p.scale == 0.0f ? 1.0 / std::sqrt(static_cast<double>(sh.d)) : static_cast<double>(p.scale);
  a.part = reinterpret_cast<double*>(base);
  a.vamax = reinterpret_cast<std::uint32_t*>(base + part_bytes);
  a.done = reinterpret_cast<std::uint32_t*>(base + part_bytes + max_bytes);
  a.ready = a.done + pairs;
  a.done_v = variant == Variant::stream ? a.done + 2 * pairs : nullptr;
  a.ready_v = variant == Variant::stream ? a.done + 3 * pairs : nullptr;
  a.ticket = reinterpret_cast<unsigned long long*>(base + part_bytes + max_bytes + done_bytes - 8);
  a.ntiles = sh.sk_pad() / kTileKeys;
  a.qtiles = (sh.sq + kTileRows - 1) / kTileRows;
  a.qper = qk ? a.ntiles + sh.hq / sh.hk * a.qtiles : a.ntiles;
  e = cudaMemsetAsync(base + part_bytes, 0, max_bytes + done_bytes, stream);
  if (e == cudaSuccess) {
    const bool bf = t == DType::bf16;
    if (sh.d == 128) {
      e = bf ? launch<128, __nv_bfloat16>(a, pairs, variant, stream) : launch<128, __half>(a, pairs, variant, stream);
    } else {
      e = bf ? launch<64, __nv_bfloat16>(a, pairs, variant, stream) : launch<64, __half>(a, pairs, variant, stream);
    }
  }
  const cudaError_t f = cudaFreeAsync(mem, stream);
  return e != cudaSuccess ? e : f;
}
}  // namespace

cudaError_t quantize_qkv(const BlockSparseAttentionParams& p, const QuantBuffers& out, cudaStream_t stream) {
  return run_prepass(p, out, true, stream);
}

cudaError_t quantize_v(const BlockSparseAttentionParams& p, const QuantBuffers& out, cudaStream_t stream) {
  return run_prepass(p, out, false, stream);
}

cudaError_t lse_shift(const BlockSparseAttentionParams& p, const float* k_mean, float* shift, cudaStream_t stream) {
  const QuantShape sh = quant_shape(p);
  const DType t = p.q.dtype;
  if ((sh.d != 64 && sh.d != 128) || sh.hk <= 0 || sh.hq % sh.hk != 0 || (t != DType::f16 && t != DType::bf16)) {
    return cudaErrorInvalidValue;
  }
  Args a{};
  a.q = make_src(p.q);
  a.out.k_mean = const_cast<float*>(k_mean);  // read only
  a.out.lse_shift = shift;
  a.hq = sh.hq;
  a.hk = sh.hk;
  a.sq = sh.sq;
  a.smooth = true;
  a.scale = p.scale == 0.0f ? 1.0 / std::sqrt(static_cast<double>(sh.d)) : static_cast<double>(p.scale);
  a.ready = nullptr;
  a.qtiles = (sh.sq + kTileRows - 1) / kTileRows;
  const std::int64_t ctas = sh.b * sh.hq * a.qtiles;  // (pair * group + g) * qtiles + qt
  if (ctas == 0) return cudaSuccess;
  if (ctas > 0x7fffffff) return cudaErrorInvalidValue;
  // SPARGE_QUANT_SHIFT_OCC=2|3|4 (read per call; default 3): CTAs per SM the kernel's registers are
  // capped for (H200, session 5 final round, b2 h32 s16384 d128: 0.253 ms at 2, 0.194 at 3, 0.222 at
  // 4, for 273 MB: a CTA loads, then computes, so more resident CTAs keep more loads in flight).
  // Same bits at every value (FOLD_GPU compares 2, 3 and 4 with the prepass's shift).
  const std::int64_t occ = env_int("SPARGE_QUANT_SHIFT_OCC");
  const bool bf = t == DType::bf16;
  const auto grid = static_cast<unsigned>(ctas);
  const auto go = [&](auto d_tag, auto type) {
    constexpr int D = decltype(d_tag)::value;
    using T = decltype(type);
    if (occ == 4) {
      lse_shift_kernel<D, T, 4><<<grid, kThreads, 0, stream>>>(a);
    } else if (occ == 2) {
      lse_shift_kernel<D, T, 2><<<grid, kThreads, 0, stream>>>(a);
    } else {
      lse_shift_kernel<D, T, 3><<<grid, kThreads, 0, stream>>>(a);
    }
  };
  if (sh.d == 128) {
    if (bf) go(std::integral_constant<int, 128>{}, __nv_bfloat16{}); else go(std::integral_constant<int, 128>{}, __half{});
  } else {
    if (bf) go(std::integral_constant<int, 64>{}, __nv_bfloat16{}); else go(std::integral_constant<int, 64>{}, __half{});
  }
  return cudaGetLastError();
}

}  // namespace sparge::cuda::quant
