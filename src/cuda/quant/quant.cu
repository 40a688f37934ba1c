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
// Two ways to run the same items (SPARGE_QUANT_VARIANT, same bytes either way):
//   launches (default): per group of kv heads, stats_kernel then quant_kernel;
//   fused: one persistent launch; CTAs take items by ticket in schedule.h's order, and a
//   quantization item first waits (its loads already in flight) for its kv head's ready flag,
//   which the CTA that finalizes the kv head's statistics raises.
#include "cuda/quant/quant.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

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
  double scale;             // the attention's scale (p.scale or 1/sqrt(D)), for lse_shift
  double* part;             // [B * Hk][nch][D] fp64 column sums of K per chunk (smooth_k only)
  std::uint32_t* vamax;     // [B * Hk][D] bits of max |v| (zeroed before pass 1)
  std::uint32_t* done;      // [B * Hk] pass-1 CTAs finished (zeroed before pass 1)
  std::uint32_t* ready;     // fused variant: [B * Hk] statistics final (zeroed), else nullptr
  unsigned long long* ticket;  // fused variant: the next item (zeroed)
  std::int64_t ntiles, qtiles, qper;  // KV tiles and Q tiles per kv head; qper = ntiles + Hq/Hk * qtiles
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

  // All loads first (kRows x 2 vectors in flight per thread); keys past Sk read as zeros, which
  // change neither a sum nor a maximum.
  uint4 kr[kRows], vr[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const std::int64_t j = j0 + rg + i * R;
    kr[i] = vr[i] = make_uint4(0, 0, 0, 0);
    if (j < a.sk) {
      if (a.smooth) kr[i] = load8(a.k, b, j, h, u);
      vr[i] = load8(a.v, b, j, h, u);
    }
  }
  double sum[8] = {};
  std::uint32_t mx[8] = {};
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    float x[8];
    if (a.smooth) {
      unpack8<T>(kr[i], x);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum[e] += static_cast<double>(x[e]);
    }
    unpack8<T>(vr[i], x);
#pragma unroll
    for (int e = 0; e < 8; ++e) mx[e] = max(mx[e], rule::abs_bits(x[e]));
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
    if (a.smooth) a.part[(pair * a.nch + chunk) * D + tid] = s;
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
    if (a.smooth) {
      const double* col = a.part + pair * a.nch * D + tid;
      for (std::int64_t c0 = 0; c0 < a.nch; c0 += 16) {
        double v[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = c0 + i < a.nch ? __ldcg(col + (c0 + i) * D) : 0.0;
#pragma unroll
        for (int i = 0; i < 16; ++i) s += v[i];
      }
    }
    a.out.k_mean[pair * D + tid] = a.smooth ? static_cast<float>(s / static_cast<double>(a.sk)) : 0.0f;
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
template <int D, class T>
__device__ __forceinline__ void kv_tile(const Args& a, std::int64_t pair, std::int64_t tile) {
  constexpr int U = D / 8, R = kThreads / U, kRows = kTileKeys / R, kWarps = kThreads / 32;
  __shared__ std::uint32_t s_amax[kWarps][2];
  __shared__ __align__(16) std::uint8_t s_v[D][kVPitch];
  const int tid = threadIdx.x, u = tid % U, rg = tid / U, lane = tid % 32, warp = tid / 32;
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
    kr[i] = j < a.sk ? load8(a.k, b, j, h, u) : make_uint4(0, 0, 0, 0);
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
  float km[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) km[e] = __ldcg(&a.out.k_mean[pair * D + u * 8 + e]);

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

// ---- pass 2: Q tiles ---------------------------------------------------------------------------
// The U lanes of a row are consecutive lanes of one warp: the row's amax is a shuffle reduction,
// and its LSE shift adds the U chunk sums by quant_rule.h's pairwise tree (an xor butterfly).
// Q tile `qt` of query head g of those reading kv head `pair`.
template <int D, class T>
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
    std::uint32_t m = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) m = max(m, rule::abs_bits(x[e]));
#pragma unroll
    for (int off = U / 2; off > 0; off /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
    const rule::Pow2Scale sc = rule::pow2_scale(m);
    // The rule's pairwise tree over the row's U chunk sums, as an xor butterfly (every lane ends
    // with the same bits: a + b == b + a).
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
// variant, 2 for the fused one. SPARGE_QUANT_VARIANT=fused selects the single persistent launch.
// Both change speed, never bytes.
std::int64_t env_int(const char* name) {
  const char* e = std::getenv(name);
  return e == nullptr ? 0 : std::atoll(e);
}
bool fused_variant() {
  const char* e = std::getenv("SPARGE_QUANT_VARIANT");
  return e != nullptr && std::string(e) == "fused";
}

template <int D, class T>
cudaError_t launch(Args a, std::int64_t pairs, bool fused, cudaStream_t stream) {
  std::int64_t per = env_int("SPARGE_QUANT_GROUP");
  if (fused) {
    if (per <= 0) per = 2;
    const Schedule sched{pairs, std::min(per, pairs), a.nch, a.qper};
    int dev = 0, sms = 0, per_sm = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fused_kernel<D, T>, kThreads, 0);
    if (e != cudaSuccess) return e;
    const std::int64_t grid = std::min<std::int64_t>(std::max(1, sms * per_sm), sched.total());
    fused_kernel<D, T><<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(a, sched);
    return cudaGetLastError();
  }
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

cudaError_t quantize_qkv(const BlockSparseAttentionParams& p, const QuantBuffers& out, cudaStream_t stream) {
  const QuantShape sh = quant_shape(p);
  const DType t = p.q.dtype;
  if ((sh.d != 64 && sh.d != 128) || sh.sk <= 0 || sh.hk <= 0 || sh.hq % sh.hk != 0 ||
      (t != DType::f16 && t != DType::bf16) || p.k.dtype != t || p.v.dtype != t || (p.blkk != 64 && p.blkk != 128)) {
    return cudaErrorInvalidValue;
  }
  const std::int64_t pairs = sh.b * sh.hk, nch = (sh.sk + kStatRows - 1) / kStatRows;
  if (pairs == 0) return cudaSuccess;
  const std::size_t part_bytes = p.smooth_k ? static_cast<std::size_t>(pairs * nch * sh.d) * sizeof(double) : 0;
  const std::size_t max_bytes = static_cast<std::size_t>(pairs * sh.d) * sizeof(std::uint32_t);
  // The counters: done[pairs], ready[pairs], then the ticket (8-byte aligned).
  const std::size_t done_bytes = (static_cast<std::size_t>(2 * pairs) * sizeof(std::uint32_t) + 7) / 8 * 8 + 8;
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
  a.smooth = p.smooth_k;
  a.scale = p.scale == 0.0f ? 1.0 / std::sqrt(static_cast<double>(sh.d)) : static_cast<double>(p.scale);
  a.part = reinterpret_cast<double*>(base);
  a.vamax = reinterpret_cast<std::uint32_t*>(base + part_bytes);
  a.done = reinterpret_cast<std::uint32_t*>(base + part_bytes + max_bytes);
  a.ready = a.done + pairs;
  a.ticket = reinterpret_cast<unsigned long long*>(base + part_bytes + max_bytes + done_bytes - 8);
  a.ntiles = sh.sk_pad() / kTileKeys;
  a.qtiles = (sh.sq + kTileRows - 1) / kTileRows;
  a.qper = a.ntiles + sh.hq / sh.hk * a.qtiles;
  e = cudaMemsetAsync(base + part_bytes, 0, max_bytes + done_bytes, stream);
  if (e == cudaSuccess) {
    const bool bf = t == DType::bf16, fused = fused_variant();
    if (sh.d == 128) {
      e = bf ? launch<128, __nv_bfloat16>(a, pairs, fused, stream) : launch<128, __half>(a, pairs, fused, stream);
    } else {
      e = bf ? launch<64, __nv_bfloat16>(a, pairs, fused, stream) : launch<64, __half>(a, pairs, fused, stream);
    }
  }
  const cudaError_t f = cudaFreeAsync(mem, stream);
  return e != cudaSuccess ? e : f;
}

}  // namespace sparge::cuda::quant
