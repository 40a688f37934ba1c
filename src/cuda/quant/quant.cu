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
#include "cuda/quant/quant.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "cuda/quant/load.cuh"
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
  std::int64_t pair0;       // first kv head (b * Hk + hk) of this launch group
};

// 8 quantized bytes of x * inv[e], in memory order (x[0] at the lowest address).
__device__ __forceinline__ uint2 quantize8(const float (&x)[8], const float (&inv)[8]) {
  std::uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = rule::e4m3x2_device(x[2 * i] * inv[2 * i], x[2 * i + 1] * inv[2 * i + 1]);
  return make_uint2(w[0] | (w[1] << 16), w[2] | (w[3] << 16));
}

// ---- pass 1 ------------------------------------------------------------------------------------
// grid (nch, pairs of the group). Thread (rg, u) reads channels [8u, 8u + 8) of keys j0 + rg + R i.
template <int D, class T>
__global__ void __launch_bounds__(kThreads, 2) stats_kernel(const Args a) {
  constexpr int U = D / 8, R = kThreads / U, kRows = kStatRows / R;
  __shared__ double s_sum[R][D];
  __shared__ std::uint32_t s_max[R][D];
  __shared__ bool s_last;
  const int tid = threadIdx.x, u = tid % U, rg = tid / U;
  const std::int64_t pair = a.pair0 + blockIdx.y, b = pair / a.hk, h = pair % a.hk;
  const std::int64_t chunk = blockIdx.x, j0 = chunk * kStatRows;

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
    double s = 0.0;
    if (a.smooth) {
      for (std::int64_t c = 0; c < a.nch; ++c) s += __ldcg(&a.part[(pair * a.nch + c) * D + tid]);
    }
    a.out.k_mean[pair * D + tid] = a.smooth ? static_cast<float>(s / static_cast<double>(a.sk)) : 0.0f;
    a.out.v_scale[pair * D + tid] = rule::pow2_scale(__ldcg(&a.vamax[pair * D + tid])).scale;
  }
}

// ---- pass 2: KV tiles --------------------------------------------------------------------------
template <int D, class T>
__device__ __forceinline__ void kv_tile(const Args& a, std::int64_t local_pair, std::int64_t tile) {
  constexpr int U = D / 8, R = kThreads / U, kRows = kTileKeys / R, kWarps = kThreads / 32;
  __shared__ std::uint32_t s_amax[kWarps][2];
  __shared__ __align__(16) std::uint8_t s_v[D][kVPitch];
  const int tid = threadIdx.x, u = tid % U, rg = tid / U, lane = tid % 32, warp = tid / 32;
  const std::int64_t pair = a.pair0 + local_pair, b = pair / a.hk, h = pair % a.hk;
  const std::int64_t j0 = tile * kTileKeys;

  uint4 kr[kRows], vr[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const std::int64_t j = j0 + rg + i * R;
    kr[i] = vr[i] = make_uint4(0, 0, 0, 0);
    if (j < a.sk) {
      kr[i] = load8(a.k, b, j, h, u);
      vr[i] = load8(a.v, b, j, h, u);
    }
  }
  float km[8], vinv[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    km[e] = a.out.k_mean[pair * D + u * 8 + e];
    vinv[e] = 1.0f / a.out.v_scale[pair * D + u * 8 + e];  // exact: a power of two
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

  // V: quantize, transpose into s_v[d][position] with the key permutation (rows past Sk: zeros),
  // then each warp writes whole 128-byte rows of v8t.
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int row = rg + i * R;
    uint2 q8 = make_uint2(0, 0);
    if (j0 + row < a.sk) {
      float x[8];
      unpack8<T>(vr[i], x);
      q8 = quantize8(x, vinv);
    }
    const int pos = row / rule::kVPermGroup * rule::kVPermGroup + rule::v_key_pos(row % rule::kVPermGroup);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const std::uint32_t word = e < 4 ? q8.x : q8.y;
      s_v[u * 8 + e][pos] = static_cast<std::uint8_t>(word >> (8 * (e % 4)));
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
// and its LSE shift gathers the U chunk sums in chunk order (quant_rule.h's fixed order).
template <int D, class T>
__device__ __forceinline__ void q_tile(const Args& a, std::int64_t idx, std::int64_t qtiles) {
  constexpr int U = D / 8, R = kThreads / U, kRows = kTileRows / R;
  const int tid = threadIdx.x, u = tid % U, rg = tid / U, lane = tid % 32;
  const std::int64_t group = a.hq / a.hk;
  const std::int64_t qt = idx % qtiles, head = idx / qtiles;  // head = local pair * group + g
  const std::int64_t pair = a.pair0 + head / group, b = pair / a.hk;
  const std::int64_t h = (pair % a.hk) * group + head % group;
  const std::int64_t i0 = qt * kTileRows;

  uint4 qr[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const std::int64_t row = i0 + rg + i * R;
    qr[i] = row < a.sq ? load8(a.q, b, row, h, u) : make_uint4(0, 0, 0, 0);
  }
  float km[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) km[e] = a.out.k_mean[pair * D + u * 8 + e];
  const int base = lane & ~(U - 1);
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
    const double part = rule::dot_chunk(x, km);
    double sum = 0.0;
#pragma unroll
    for (int c = 0; c < U; ++c) sum += __shfl_sync(0xffffffffu, part, base + c);
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

// At most 128 registers, so two CTAs share an SM (one CTA's barrier waits overlap the other's loads).
template <int D, class T>
__global__ void __launch_bounds__(kThreads, 2)
    quant_kernel(const Args a, std::int64_t n_kv, std::int64_t ntiles, std::int64_t qtiles) {
  const std::int64_t idx = blockIdx.x;
  if (idx < n_kv) {
    kv_tile<D, T>(a, idx / ntiles, idx % ntiles);
  } else {
    q_tile<D, T>(a, idx - n_kv, qtiles);
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

// kv heads per launch group: SPARGE_QUANT_GROUP=N (N >= 1) processes N kv heads (b, hk) with
// both passes before the next N, so pass 2's second reads of K and V can hit L2 (N = 4 at
// head dim 128 and Sk = 16384 is 32 MB of K and V); unset or 0: all kv heads in one group (two
// launches in all). Changes speed, never bytes.
std::int64_t group_pairs(std::int64_t pairs) {
  std::int64_t n = 0;
  if (const char* e = std::getenv("SPARGE_QUANT_GROUP")) n = std::atoll(e);
  if (n <= 0 || n > pairs) n = pairs;
  return std::min<std::int64_t>(n, 65535);  // gridDim.y of pass 1
}

template <int D, class T>
cudaError_t launch(Args a, std::int64_t pairs, cudaStream_t stream) {
  const std::int64_t per = group_pairs(pairs);
  const std::int64_t ntiles = a.sk_pad / kTileKeys, qtiles = (a.sq + kTileRows - 1) / kTileRows;
  const std::int64_t group = a.hq / a.hk;
  for (std::int64_t p0 = 0; p0 < pairs; p0 += per) {
    const std::int64_t n = std::min(per, pairs - p0);
    a.pair0 = p0;
    stats_kernel<D, T><<<dim3(static_cast<unsigned>(a.nch), static_cast<unsigned>(n)), kThreads, 0, stream>>>(a);
    const std::int64_t n_kv = n * ntiles, n_q = n * group * qtiles;
    quant_kernel<D, T><<<static_cast<unsigned>(n_kv + n_q), kThreads, 0, stream>>>(a, n_kv, ntiles, qtiles);
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
  const std::size_t done_bytes = static_cast<std::size_t>(pairs) * sizeof(std::uint32_t);
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
  e = cudaMemsetAsync(base + part_bytes, 0, max_bytes + done_bytes, stream);
  if (e == cudaSuccess) {
    const bool bf = t == DType::bf16;
    if (sh.d == 128) {
      e = bf ? launch<128, __nv_bfloat16>(a, pairs, stream) : launch<128, __half>(a, pairs, stream);
    } else {
      e = bf ? launch<64, __nv_bfloat16>(a, pairs, stream) : launch<64, __half>(a, pairs, stream);
    }
  }
  const cudaError_t f = cudaFreeAsync(mem, stream);
  return e != cudaSuccess ? e : f;
}

}  // namespace sparge::cuda::quant
