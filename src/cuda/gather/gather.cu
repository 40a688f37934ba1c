// gather_attention on CUDA (docs/semantics.md, "Stage 3"): each query row attends the keys of its
// own index list. Two kernels per wave of groups (gather_common.cuh):
//   union.cuh      per group: sorted union of the rows' lists + each row's membership mask;
//   attention.cuh  flash attention of BM rows of a group over the union, masked per row.
// Tiles: with group_union, a group is the Hq/Hk heads of one kv head x union_rows consecutive query
// positions, so adjacent tokens that select overlapping keys share each K/V load. Without it, a
// group is the Hq/Hk heads of one kv head at ONE query position: the path that always runs, with
// no assumption about how lists overlap (its tile is mostly empty rows when Hq/Hk is small; it is
// memory-bound anyway, one K/V row per listed key).
// Both walk the union in ascending key order, so a row's summation order differs from the CPU's
// list order: results agree within rounding, bitwise only with themselves (deterministic).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/gather/attention.cuh"
#include "cuda/gather/union.cuh"
#include "cuda/topk/error_flags.cuh"
#include "validate/validate.h"

namespace sparge::cuda {

namespace {

constexpr const char* kOp = "gather_attention";
// The union bitmap and its ranks live in shared memory: 8 bytes per 32 keys.
constexpr std::int64_t kMaxUnionSmem = 160 * 1024;
// Scratch (union lists + masks) per wave of groups; more groups run in several waves.
constexpr std::int64_t kScratchBudget = 256ll << 20;

using AttnKernel = void (*)(const gather::AttnArgs);

struct GatherPlan {
  Status status;
  AttnKernel kernel = nullptr;
  int smem = 0;
};

bool aligned16(const Tensor& t) {
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0) return false;
  for (int i = 0; i < 3; ++i) {
    if (t.stride[i] % 8 != 0) return false;
  }
  return t.stride[3] == 1;
}

template <class T>
AttnKernel pick_dim(std::int64_t d) {
  if (d == 64) return gather::attention_kernel<T, 64>;
  if (d == 128) return gather::attention_kernel<T, 128>;
  return nullptr;
}

// The one selection function of gather_attention (run and supported() share it).
GatherPlan select_gather(const GatherAttentionParams& p) {
  GatherPlan plan;
  auto fail = [](Status s) { return GatherPlan{std::move(s)}; };
  if (p.q.ndim != 4 || p.k.ndim != 4 || p.v.ndim != 4 || p.o.ndim != 4 || p.indices.ndim != 4 || p.counts.ndim != 3) {
    return fail(detail::bad(kOp, "q, k, v, o and indices must be 4-d and counts 3-d"));
  }
  if (p.q.dtype != DType::f16 && p.q.dtype != DType::bf16) {
    return fail(unsupported(detail::cat(kOp, ": q.dtype = ", to_string(p.q.dtype), " is not supported on cuda (expected f16 or bf16)")));
  }
  if (p.k.dtype != p.q.dtype || p.v.dtype != p.q.dtype) {
    return fail(detail::bad(kOp, "k.dtype = ", to_string(p.k.dtype), ", v.dtype = ", to_string(p.v.dtype), " differ from q.dtype = ", to_string(p.q.dtype)));
  }
  if (p.o.dtype != p.q.dtype && p.o.dtype != DType::f32) {
    return fail(unsupported(detail::cat(kOp, ": o.dtype = ", to_string(p.o.dtype), " is not supported on cuda (expected q.dtype or f32)")));
  }
  const std::int64_t d = p.q.shape[3];
  plan.kernel = p.q.dtype == DType::f16 ? pick_dim<__half>(d) : pick_dim<__nv_bfloat16>(d);
  if (plan.kernel == nullptr) {
    return fail(unsupported(detail::cat(kOp, ": head dim q.shape[3] = ", d, " is not supported on cuda (expected 64 or 128)")));
  }
  const char* names[3] = {"q", "k", "v"};
  const Tensor* ts[3] = {&p.q, &p.k, &p.v};
  for (int i = 0; i < 3; ++i) {
    if (!aligned16(*ts[i])) {
      return fail(unsupported(detail::cat(kOp, ": ", names[i], " must have a contiguous head dim (", names[i], ".stride[3] = ", ts[i]->stride[3],
                                          ") and 16-byte aligned rows (data and strides 0..2 multiples of 8 elements) on cuda")));
    }
  }
  const std::int64_t sk = p.k.shape[1];
  if (sk > INT32_MAX || p.indices.shape[3] > INT32_MAX) return fail(detail::bad(kOp, "k.shape[1] = ", sk, " exceeds 2^31 - 1"));
  const std::int64_t union_smem = 8 * ((sk + 31) / 32);
  if (union_smem > kMaxUnionSmem) {
    return fail(unsupported(detail::cat(kOp, ": Sk = ", sk, " is too long for the cuda union bitmap (at most ", kMaxUnionSmem / 8 * 32, " keys)")));
  }
  if (p.group_union && (p.union_rows < 1 || p.union_rows > 4096)) {
    return fail(detail::bad(kOp, "union_rows = ", p.union_rows, " (expected 1..4096 with group_union)")); 
  }
  plan.smem = static_cast<int>((gather::kBM + 4 * gather::kBN) * d * 2);
  return plan;
}

template <class T>
struct StreamBuffer {
  T* ptr = nullptr;
  cudaStream_t stream;
  explicit StreamBuffer(cudaStream_t s) : stream(s) {}
  ~StreamBuffer() {
    if (ptr != nullptr) cudaFreeAsync(ptr, stream);
  }
  cudaError_t alloc(std::int64_t n) {
    return cudaMallocAsync(reinterpret_cast<void**>(&ptr), static_cast<size_t>(std::max<std::int64_t>(n, 1)) * sizeof(T), stream);
  }
};

// The error of row `row` (linear (b * Hq + h) * Sq + i), found the way the CPU backend finds it.
Status describe_bad_row(const GatherAttentionParams& p, const gather::Geometry& geo, std::uint64_t row) {
  const auto i = static_cast<std::int64_t>(row % static_cast<std::uint64_t>(geo.sq));
  const auto h = static_cast<std::int64_t>((row / static_cast<std::uint64_t>(geo.sq)) % static_cast<std::uint64_t>(geo.hq));
  const auto b = static_cast<std::int64_t>(row / static_cast<std::uint64_t>(geo.sq * geo.hq));
  const std::int64_t n_max = p.indices.shape[3];
  std::int32_t n = 0;
  if (cudaMemcpy(&n, p.counts.ptr<std::int32_t>() + p.counts.offset(b, h, i), 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
    return runtime_error(detail::cat(kOp, ": cannot read counts back to report an error"));
  }
  if (n < 0 || n > n_max) {
    return detail::bad(kOp, "counts[", b, ", ", h, ", ", i, "] = ", n, " is out of range (expected 0..", n_max, " = indices.shape[3])");
  }
  std::vector<std::int32_t> seen_list;
  for (std::int32_t t = 0; t < n; ++t) {
    std::int32_t j = 0;
    if (cudaMemcpy(&j, p.indices.ptr<std::int32_t>() + p.indices.offset(b, h, i, t), 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
      return runtime_error(detail::cat(kOp, ": cannot read indices back to report an error"));
    }
    if (j < 0 || j >= geo.sk) {
      return detail::bad(kOp, "indices[", b, ", ", h, ", ", i, ", ", t, "] = ", j, " is out of range (expected 0..", geo.sk - 1,
                         " = Sk - 1; b = ", b, ", h = ", h, ", i = ", i, ", within counts = ", n, ")");
    }
    if (std::find(seen_list.begin(), seen_list.end(), j) != seen_list.end()) {
      return detail::bad(kOp, "indices[", b, ", ", h, ", ", i, ", ", t, "] = ", j, " repeats an earlier entry of the same list (b = ", b,
                         ", h = ", h, ", i = ", i, "); a key may be listed once per row");
    }
    seen_list.push_back(j);
  }
  return runtime_error(detail::cat(kOp, ": the kernel flagged row (", b, ", ", h, ", ", i, ") but its list reads back valid"));
}

}  // namespace

Status supported(const GatherAttentionParams& p) { return select_gather(p).status; }

Status gather_attention(const GatherAttentionParams& p) {
  const GatherPlan plan = select_gather(p);
  SPARGE_RETURN_IF_ERROR(plan.status);
  auto stream = static_cast<cudaStream_t>(p.exec.stream);
  auto cuda_fail = [](const char* what, cudaError_t e) {
    return runtime_error(detail::cat(kOp, ": ", what, ": ", cudaGetErrorString(e)));
  };

  gather::Geometry geo{};
  geo.batch = p.q.shape[0];
  geo.sq = p.q.shape[1];
  geo.hq = p.q.shape[2];
  geo.sk = p.k.shape[1];
  geo.hk = p.k.shape[2];
  geo.g = static_cast<int>(geo.hq / geo.hk);
  geo.ur = p.group_union ? static_cast<int>(std::min<std::int64_t>(p.union_rows, std::max<std::int64_t>(geo.sq, 1))) : 1;
  geo.rows = geo.g * geo.ur;
  geo.chunks = (geo.sq + geo.ur - 1) / geo.ur;
  geo.causal = p.is_causal;
  const std::int64_t total_groups = geo.batch * geo.hk * geo.chunks;
  if (total_groups == 0) return {};

  const int n_max = static_cast<int>(p.indices.shape[3]);
  gather::Scratch sc{};
  sc.ucap = std::min<std::int64_t>(geo.sk, static_cast<std::int64_t>(geo.rows) * n_max);
  sc.words_cap = (sc.ucap + 63) / 64;
  const std::int64_t per_group = 4 + sc.ucap * 4 + sc.words_cap * geo.rows * 8;
  const std::int64_t wave = std::clamp<std::int64_t>(kScratchBudget / per_group, 1, std::min<std::int64_t>(total_groups, 65535));

  StreamBuffer<std::int32_t> sizes(stream), keys(stream);
  StreamBuffer<unsigned long long> masks(stream);
  cudaError_t e = sizes.alloc(wave);
  if (e == cudaSuccess) e = keys.alloc(wave * sc.ucap);
  if (e == cudaSuccess) e = masks.alloc(wave * sc.words_cap * geo.rows);
  if (e != cudaSuccess) return cuda_fail("scratch allocation failed", e);
  sc.union_size = sizes.ptr;
  sc.union_keys = keys.ptr;
  sc.masks = masks.ptr;
  flags::DeviceFlags<gather::kNumFlags> fl(stream);
  e = fl.init();
  if (e != cudaSuccess) return cuda_fail("flag allocation failed", e);

  gather::UnionArgs ua{};
  ua.geo = geo;
  ua.indices = p.indices.ptr<std::int32_t>();
  ua.x0 = p.indices.stride[0];
  ua.x1 = p.indices.stride[1];
  ua.x2 = p.indices.stride[2];
  ua.x3 = p.indices.stride[3];
  ua.counts = p.counts.ptr<std::int32_t>();
  ua.n0 = p.counts.stride[0];
  ua.n1 = p.counts.stride[1];
  ua.n2 = p.counts.stride[2];
  ua.n_max = n_max;
  ua.words_k = static_cast<int>((geo.sk + 31) / 32);
  ua.scratch = sc;
  ua.flags = fl.device();
  const int union_smem = 8 * ua.words_k;

  gather::AttnArgs aa{};
  aa.geo = geo;
  aa.q = p.q.data;
  aa.k = p.k.data;
  aa.v = p.v.data;
  aa.q0 = p.q.stride[0]; aa.q1 = p.q.stride[1]; aa.q2 = p.q.stride[2];
  aa.k0 = p.k.stride[0]; aa.k1 = p.k.stride[1]; aa.k2 = p.k.stride[2];
  aa.v0 = p.v.stride[0]; aa.v1 = p.v.stride[1]; aa.v2 = p.v.stride[2];
  aa.o = p.o.data;
  aa.o_f32 = p.o.dtype == DType::f32;
  aa.o0 = p.o.stride[0]; aa.o1 = p.o.stride[1]; aa.o2 = p.o.stride[2]; aa.o3 = p.o.stride[3];
  aa.lse = p.maybe_lse.present() ? p.maybe_lse.ptr<float>() : nullptr;
  if (aa.lse != nullptr) {
    aa.l0 = p.maybe_lse.stride[0]; aa.l1 = p.maybe_lse.stride[1]; aa.l2 = p.maybe_lse.stride[2];
  }
  const float scale = p.scale == 0.0f ? 1.0f / std::sqrt(static_cast<float>(p.q.shape[3])) : p.scale;
  aa.scale_log2 = scale * 1.4426950408889634f;
  aa.scratch = sc;

  e = cudaFuncSetAttribute(gather::union_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, std::max(union_smem, 1));
  if (e == cudaSuccess) e = cudaFuncSetAttribute(plan.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.smem);
  if (e != cudaSuccess) return cuda_fail("cannot configure shared memory", e);
  const unsigned row_tiles = static_cast<unsigned>((geo.rows + gather::kBM - 1) / gather::kBM);
  for (std::int64_t g0 = 0; g0 < total_groups; g0 += wave) {
    const auto n = static_cast<unsigned>(std::min(wave, total_groups - g0));
    ua.first_group = g0;
    aa.first_group = g0;
    gather::union_kernel<<<n, gather::kUnionThreads, union_smem, stream>>>(ua);
    plan.kernel<<<dim3(row_tiles, n), gather::kThreads, plan.smem, stream>>>(aa);
  }
  e = cudaGetLastError();
  if (e != cudaSuccess) return cuda_fail("kernel launch failed", e);
  e = fl.fetch();
  if (e != cudaSuccess) return cuda_fail("kernel failed", e);

  // The kernels only say which rows failed; the lowest one is re-read here and checked entry by
  // entry in list order, so the message names the same entry as the CPU backend's.
  std::uint64_t bad_row = flags::kNone;
  for (int f = 0; f < gather::kNumFlags; ++f) {
    if (fl[f] != flags::kNone) bad_row = std::min<std::uint64_t>(bad_row, flags::row_of(fl[f]));
  }
  if (bad_row != flags::kNone) return describe_bad_row(p, geo, bad_row);
  return {};
}

}  // namespace sparge::cuda
