// tma_probe.h: TMA row gathers against 16-byte cp.async gathers (measurement only).
#include "cuda/gather/tma_probe.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/attention/sm90/pipeline.cuh"
#include "cuda/attention/sm90/tensor_map.h"
#include "cuda/gather/attention_wgmma.cuh"

namespace sparge::cuda::gather {

namespace probe {
constexpr int kKeysPerCta = 32 * 64;
}  // namespace probe

// (External linkage: the sm_80 pass compiles the kernels empty and would warn about unused
// internal helpers.)
__device__ __forceinline__ unsigned char* probe_aligned_base(unsigned char* raw) {
  return raw + ((1024u - (smem_addr(raw) & 1023u)) & 1023u);
}

// The CTA's keys into shared memory (one round trip, before any gather).
__device__ __forceinline__ void probe_load_keys(const std::int32_t* keys, std::int32_t* skeys) {
  const std::int32_t* src = keys + static_cast<std::int64_t>(blockIdx.x) * probe::kKeysPerCta;
  for (int i = static_cast<int>(threadIdx.x); i < probe::kKeysPerCta; i += blockDim.x) skeys[i] = src[i];
}

namespace {

constexpr int kSk = 16384, kHeads = 8, kD = 128;
constexpr int kSteps = 32, kStages = 4, kCtas = 264, kThreads = 128;
constexpr int kTileBytes = 64 * kD * 2;          // 64 rows of one of K / V: 16 KB
constexpr int kStageBytes = 2 * kTileBytes;      // K and V of a step
constexpr int kKeysPerCta = probe::kKeysPerCta;
static_assert(kKeysPerCta == kSteps * 64, "keys per CTA");
constexpr int kSmem = kStages * kStageBytes + kKeysPerCta * 4 + 1024 + 64;


// One CTA: the 64 rows keys[0..63] of K, two 64-column slabs, one TMA box per row and slab into
// row r of the slab; then every 16-byte chunk is compared with where sw128 expects it.
__global__ void swizzle_kernel(const __grid_constant__ CUtensorMap kmap, const std::int32_t* keys, const std::uint16_t* k, int* mismatches) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  namespace wg = ::sparge::cuda::attn::sm90;
  extern __shared__ unsigned char raw[];
  unsigned char* base = probe_aligned_base(raw);
  __shared__ std::uint64_t bar;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    wg::barrier_init(&bar, 1);
    wg::barrier_init_fence();
  }
  __syncthreads();
  if (tid < 32) {
    if (tid == 0) wg::barrier_expect_bytes(&bar, kTileBytes);
    __syncwarp();
    for (int r = tid; r < 64; r += 32)
      for (int s = 0; s < 2; ++s) wg::tma_load_4d(base + s * 8192 + r * 128, &kmap, s * 64, keys[r], 0, 0, &bar);
  }
  wg::barrier_wait(&bar, 0);
  for (int i = tid; i < 64 * 16; i += blockDim.x) {
    const int r = i / 16, c = i % 16;
    const std::uint16_t* got = reinterpret_cast<const std::uint16_t*>(base + sw128(r, c));
    const std::uint16_t* want = k + static_cast<std::int64_t>(keys[r]) * kHeads * kD + c * 8;
    bool same = true;
    for (int e = 0; e < 8; ++e) same = same && got[e] == want[e];
    if (!same) atomicAdd(mismatches, 1);
  }
#endif
}

// 16-byte cp.async gathers (the kernels' way), 128 threads, kStages - 1 steps in flight.
__global__ void __launch_bounds__(kThreads, 1) gather_cp_async_kernel(const std::uint16_t* k, const std::uint16_t* v, const std::int32_t* keys) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char raw[];
  unsigned char* base = probe_aligned_base(raw);
  std::int32_t* skeys = reinterpret_cast<std::int32_t*>(base + kStages * kStageBytes);
  probe_load_keys(keys, skeys);
  __syncthreads();
  const int tid = static_cast<int>(threadIdx.x);
  auto issue = [&](int s) {
    unsigned char* st = base + (s % kStages) * kStageBytes;
#pragma unroll
    for (int it = 0; it < 64 * 16 / kThreads; ++it) {
      const int idx = tid + it * kThreads;
      const int row = idx / 16, chunk = idx % 16;
      const std::int64_t j = skeys[s * 64 + row];
      cp_async16(st + sw128(row, chunk), k + j * kHeads * kD + chunk * 8, true);
      cp_async16(st + kTileBytes + sw128(row, chunk), v + j * kHeads * kD + chunk * 8, true);
    }
  };
  for (int s = 0; s < kStages - 1; ++s) {
    issue(s);
    cp_async_commit();
  }
  for (int s = 0; s < kSteps; ++s) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (s + kStages - 1 < kSteps) issue(s + kStages - 1);
    cp_async_commit();
  }
  cp_async_wait<0>();
#endif
}

// The same rows by TMA: warp 0 issues one box (64 columns x 1 row) per row and slab of K and V,
// completed on the stage's barrier (32 KB of transactions); kStages steps in flight.
__global__ void __launch_bounds__(kThreads, 1) gather_tma_kernel(const __grid_constant__ CUtensorMap kmap, const __grid_constant__ CUtensorMap vmap,
                                                                 const std::int32_t* keys) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  namespace wg = ::sparge::cuda::attn::sm90;
  extern __shared__ unsigned char raw[];
  unsigned char* base = probe_aligned_base(raw);
  std::int32_t* skeys = reinterpret_cast<std::int32_t*>(base + kStages * kStageBytes);
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(skeys + kKeysPerCta);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) wg::barrier_init(full + s, 1);
    wg::barrier_init_fence();
  }
  probe_load_keys(keys, skeys);
  __syncthreads();
  if (tid >= 32) return;
  const int lane = tid;
  for (int s = 0; s < kSteps; ++s) {
    const int st = s % kStages, use = s / kStages;
    if (use > 0) wg::barrier_wait(full + st, static_cast<std::uint32_t>((use - 1) & 1));  // the stage's previous step landed
    if (lane == 0) wg::barrier_expect_bytes(full + st, kStageBytes);
    __syncwarp();
    unsigned char* dst = base + st * kStageBytes;
    for (int r = lane; r < 64; r += 32) {
      const int j = skeys[s * 64 + r];
      for (int sl = 0; sl < 2; ++sl) {
        wg::tma_load_4d(dst + sl * 8192 + r * 128, &kmap, sl * 64, j, 0, 0, full + st);
        wg::tma_load_4d(dst + kTileBytes + sl * 8192 + r * 128, &vmap, sl * 64, j, 0, 0, full + st);
      }
    }
  }
  for (int s = std::max(0, kSteps - kStages); s < kSteps; ++s) wg::barrier_wait(full + s % kStages, static_cast<std::uint32_t>((s / kStages) & 1));
#endif
}

__global__ void fill_kernel(std::uint16_t* p, std::int64_t n, std::uint32_t salt) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    p[i] = static_cast<std::uint16_t>((i * 2654435761u + salt) >> 7);
  }
}

}  // namespace

TmaProbe tma_gather_probe() {
  TmaProbe res;
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || major != 9) {
    res.note = "no sm_90 device";
    return res;
  }
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, reinterpret_cast<const void*>(gather_tma_kernel)) != cudaSuccess || fa.ptxVersion < 90) {
    res.note = "no sm_90a build";
    return res;
  }
  const std::int64_t n = static_cast<std::int64_t>(kSk) * kHeads * kD;
  std::uint16_t *k = nullptr, *v = nullptr;
  std::int32_t* keys = nullptr;
  int* mism = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  auto done = [&](const char* what, cudaError_t e) {
    if (e != cudaSuccess && res.note.empty()) res.note = std::string(what) + ": " + cudaGetErrorString(e);
    return e == cudaSuccess;
  };
  bool ok = done("malloc", cudaMalloc(&k, n * 2)) && done("malloc", cudaMalloc(&v, n * 2)) &&
            done("malloc", cudaMalloc(&keys, static_cast<size_t>(kCtas) * kKeysPerCta * 4)) && done("malloc", cudaMalloc(&mism, 4)) &&
            done("event", cudaEventCreate(&e0)) && done("event", cudaEventCreate(&e1));
  if (ok) {
    fill_kernel<<<264, 256>>>(k, n, 1u);
    fill_kernel<<<264, 256>>>(v, n, 7u);
    std::vector<std::int32_t> hk(static_cast<size_t>(kCtas) * kKeysPerCta);
    std::mt19937 rng(12345);
    std::uniform_int_distribution<std::int32_t> pick(0, kSk - 1);
    for (auto& x : hk) x = pick(rng);
    ok = done("copy", cudaMemcpy(keys, hk.data(), hk.size() * 4, cudaMemcpyHostToDevice)) && done("memset", cudaMemset(mism, 0, 4));
  }
  Tensor tk{}, tv{};
  CUtensorMap kmap{}, vmap{};
  if (ok) {
    tk.data = k;
    tk.dtype = DType::f16;
    tk.ndim = 4;
    tk.shape[0] = 1; tk.shape[1] = kSk; tk.shape[2] = kHeads; tk.shape[3] = kD;
    tk.stride[0] = n; tk.stride[1] = kHeads * kD; tk.stride[2] = kD; tk.stride[3] = 1;
    tv = tk;
    tv.data = v;
    ok = attn::sm90::encode_tensor_map(&kmap, tk, 1) && attn::sm90::encode_tensor_map(&vmap, tv, 1);
    if (!ok) res.note = "tensor map encoding failed";
  }
  if (ok) {
    ok = done("attr", cudaFuncSetAttribute(swizzle_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * 8192 + 1024)) &&
         done("attr", cudaFuncSetAttribute(gather_cp_async_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem)) &&
         done("attr", cudaFuncSetAttribute(gather_tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  }
  if (ok) {
    swizzle_kernel<<<1, 128, 2 * 8192 + 1024>>>(kmap, keys, k, mism);
    int m = -1;
    ok = done("swizzle kernel", cudaDeviceSynchronize()) && done("copy", cudaMemcpy(&m, mism, 4, cudaMemcpyDeviceToHost));
    res.swizzle_mismatches = m;
  }
  auto time = [&](auto launch) {
    float best = 1e30f;
    for (int rep = 0; rep < 7 && ok; ++rep) {
      cudaEventRecord(e0);
      launch();
      cudaEventRecord(e1);
      ok = done("probe kernel", cudaEventSynchronize(e1));
      float ms = 0;
      if (ok) cudaEventElapsedTime(&ms, e0, e1);
      if (rep > 0) best = std::min(best, ms);
    }
    const double bytes = static_cast<double>(kCtas) * kSteps * kStageBytes;
    return ok ? bytes / (best * 1e-3) / 1e9 : 0.0;
  };
  if (ok) res.cp_async_gbs = time([&] { gather_cp_async_kernel<<<kCtas, kThreads, kSmem>>>(k, v, keys); });
  if (ok) res.tma_gbs = time([&] { gather_tma_kernel<<<kCtas, kThreads, kSmem>>>(kmap, vmap, keys); });
  if (ok) ok = done("launch", cudaGetLastError());
  res.ran = ok;
  if (e0 != nullptr) cudaEventDestroy(e0);
  if (e1 != nullptr) cudaEventDestroy(e1);
  cudaFree(k);
  cudaFree(v);
  cudaFree(keys);
  cudaFree(mism);
  return res;
}

}  // namespace sparge::cuda::gather
