// Host entries of the attention kernels: cuda::block_sparse_attention, cuda::dense_attention and
// their `supported`. Both entries and both `supported` go through one selection function, so
// "supported" and "runs" never disagree. It picks the Hopper kernel (sm90/, wgmma + TMA) on sm_90
// devices when the problem fits it and the portable kernel (mma.sync) otherwise;
// SPARGE_ATTN_PATH=portable|sm90 forces one (A/B benchmarks, tests). Dense attention is the same
// kernel with the implicit full LUT (KernelParams::lut == nullptr).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "cuda/attention/launch.h"
#include "cuda/attention/sm90/launch.h"
#include "cuda/attention/sm90/tensor_map.h"
#include "cuda/cuda_backend.h"
#include "cuda/quant/quant.h"
#include "cuda/scratch_pool.h"
#include "validate/validate.h"

namespace sparge::cuda {
namespace {

using attn::KernelParams;

using AttributesFn = cudaError_t (*)(cudaFuncAttributes*);
using LaunchFn = cudaError_t (*)(const KernelParams&, int, cudaStream_t);

struct Variant {
  DType dtype;
  int head_dim, blkq, blkk;
  AttributesFn attributes;
  LaunchFn launch;
};

#define SPARGE_VARIANT(dt, ty, hd, bq, bk) \
  Variant{dt, hd, bq, bk, &attn::Kernel<ty, hd, bq, bk>::attributes, &attn::Kernel<ty, hd, bq, bk>::launch}
#define SPARGE_VARIANTS_OF(dt, ty)                                                                        \
  SPARGE_VARIANT(dt, ty, 64, 64, 64), SPARGE_VARIANT(dt, ty, 64, 64, 128), SPARGE_VARIANT(dt, ty, 64, 128, 64), \
      SPARGE_VARIANT(dt, ty, 64, 128, 128), SPARGE_VARIANT(dt, ty, 128, 64, 64),                            \
      SPARGE_VARIANT(dt, ty, 128, 64, 128), SPARGE_VARIANT(dt, ty, 128, 128, 64),                           \
      SPARGE_VARIANT(dt, ty, 128, 128, 128)

// Every instantiation in inst/ (generate.sh writes the same set).
const Variant kVariants[] = {SPARGE_VARIANTS_OF(DType::f16, __half), SPARGE_VARIANTS_OF(DType::bf16, __nv_bfloat16)};

#undef SPARGE_VARIANTS_OF
#undef SPARGE_VARIANT

using Sm90LaunchFn = cudaError_t (*)(const attn::sm90::Sm90Params&, int, cudaStream_t);
struct Sm90Variant {
  DType dtype;
  int head_dim, blkq, blkk;
  AttributesFn attributes;
  Sm90LaunchFn launch;
};

#define SPARGE_SM90_VARIANT(dt, ty, hd, bq, bk)                                      \
  Sm90Variant{dt, hd, bq, bk, &attn::sm90::Kernel<ty, hd, bq, bk>::attributes, \
              &attn::sm90::Kernel<ty, hd, bq, bk>::launch}
#define SPARGE_SM90_VARIANTS_OF(dt, ty)                                                            \
  SPARGE_SM90_VARIANT(dt, ty, 64, 64, 64), SPARGE_SM90_VARIANT(dt, ty, 64, 64, 128),               \
      SPARGE_SM90_VARIANT(dt, ty, 64, 128, 64), SPARGE_SM90_VARIANT(dt, ty, 64, 128, 128),         \
      SPARGE_SM90_VARIANT(dt, ty, 128, 64, 64), SPARGE_SM90_VARIANT(dt, ty, 128, 64, 128),         \
      SPARGE_SM90_VARIANT(dt, ty, 128, 128, 64), SPARGE_SM90_VARIANT(dt, ty, 128, 128, 128)

// Every instantiation in sm90/inst/ (its generate.sh writes the same set).
// Plus the dense-only tiles of attn::sm90::dense_tile: 192 x 128 at head dim 64 (the default;
// SPARGE_SM90_VARIANT bit 8 selects 128 x 128) and 128 x 176 at head dim 128 (the default, causal
// too since session 14; bit 4096 selects 128 x 128).
const Sm90Variant kSm90Variants[] = {SPARGE_SM90_VARIANTS_OF(DType::f16, __half),
                                     SPARGE_SM90_VARIANTS_OF(DType::bf16, __nv_bfloat16),
                                     SPARGE_SM90_VARIANT(DType::f16, __half, 64, 192, 128),
                                     SPARGE_SM90_VARIANT(DType::bf16, __nv_bfloat16, 64, 192, 128),
                                     SPARGE_SM90_VARIANT(DType::f16, __half, 128, 128, 176),
                                     SPARGE_SM90_VARIANT(DType::bf16, __nv_bfloat16, 128, 128, 176)};

#undef SPARGE_SM90_VARIANTS_OF
#undef SPARGE_SM90_VARIANT

// The fp8 recipe's kernels (sm90/inst/sm90_fp8_*): head dim 128, BLKQ 128; the dtype is the inputs'
// (and the output's, unless o is f32).
struct Fp8Variant {
  DType dtype;
  int blkk;
  AttributesFn attributes;
  Sm90LaunchFn launch;
};
#define SPARGE_FP8_VARIANT(dt, ty, bk) \
  Fp8Variant{dt, bk, &attn::sm90::KernelFp8<ty, 128, bk>::attributes, &attn::sm90::KernelFp8<ty, 128, bk>::launch}
const Fp8Variant kFp8Variants[] = {SPARGE_FP8_VARIANT(DType::f16, __half, 64), SPARGE_FP8_VARIANT(DType::f16, __half, 128),
                                   SPARGE_FP8_VARIANT(DType::bf16, __nv_bfloat16, 64),
                                   SPARGE_FP8_VARIANT(DType::bf16, __nv_bfloat16, 128)};
#undef SPARGE_FP8_VARIANT

// Dense attention's tile: 128 query rows (8 warps) and 64-key tiles, FA2's forward shape for both
// head dims (docs/attention_portable.md). A tuning choice: it changes speed, never results beyond
// summation order.
constexpr int kDenseBlockQ = 128;
constexpr int kDenseBlockK = 64;
// The Hopper kernel's dense tile: attn::sm90::dense_tile (128 x 176 at head dim 128, FA3's tile without
// causal masking, 192 x 128 at head dim 64; variant bits 4096 and 8 ask for 128 x 128).

// What the selection function needs to know, shared by the sparse and the dense entry.
struct Problem {
  const char* op;
  const Tensor *q, *k, *v, *o, *lse;
  const Varlen* varlen;
  int blkq, blkk;
  int sm90_blkq, sm90_blkk;  // the tile the Hopper kernel would use (dense picks its own)
};

enum class Path { automatic, portable, sm90 };

// SPARGE_ATTN_PATH: "portable" or "sm90" forces that kernel; unset (or anything else) lets the
// selection decide. Read on every call, so a test or benchmark can switch between launches.
Path requested_path() {
  const char* e = std::getenv("SPARGE_ATTN_PATH");
  if (e == nullptr) return Path::automatic;
  if (std::strcmp(e, "portable") == 0) return Path::portable;
  if (std::strcmp(e, "sm90") == 0) return Path::sm90;
  return Path::automatic;
}

// What the selection chose: the portable variant, or the Hopper variant with its tensor maps.
struct Selection {
  Path path = Path::portable;
  const Variant* portable = nullptr;
  const Sm90Variant* sm90 = nullptr;
  CUtensorMap q_map{}, k_map{}, v_map{};
  int blkq = 0, blkk = 0;
};

Status check_rows(const char* op, const char* name, const Tensor& t) {
  if (t.stride[3] != 1 && t.shape[3] > 1) {
    return unsupported(detail::cat(op, ": ", name, ".stride[3] = ", t.stride[3],
                                   " is not supported on cuda (the head dim must be contiguous)"));
  }
  const std::size_t es = dtype_size(t.dtype);
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0) {
    return unsupported(detail::cat(op, ": ", name, ".data is not 16-byte aligned (required on cuda)"));
  }
  for (int i = 0; i < 3; ++i) {
    if ((static_cast<std::uint64_t>(t.stride[i]) * es) % 16 != 0) {
      return unsupported(detail::cat(op, ": ", name, ".stride[", i, "] = ", t.stride[i], " (", t.stride[i] * es,
                                     " bytes) is not supported on cuda (rows must be 16-byte aligned)"));
    }
  }
  return {};
}

// The dtypes, row layouts and size limits every cuda attention kernel needs. qkv_rows: q, k and v are
// read by the kernel itself (the fp8 recipe's kernel reads the prepass's copies, which take any strides).
Status check_io(const Problem& pb, bool qkv_rows) {
  const Tensor& q = *pb.q;
  if (q.dtype != DType::f16 && q.dtype != DType::bf16) {
    return unsupported(detail::cat(pb.op, ": q.dtype = ", to_string(q.dtype), " is not supported on cuda (f16, bf16)"));
  }
  if (pb.o->dtype != q.dtype && pb.o->dtype != DType::f32) {
    return unsupported(detail::cat(pb.op, ": o.dtype = ", to_string(pb.o->dtype), " is not supported on cuda (",
                                   to_string(q.dtype), " or f32)"));
  }
  if (qkv_rows) {
    SPARGE_RETURN_IF_ERROR(check_rows(pb.op, "q", q));
    SPARGE_RETURN_IF_ERROR(check_rows(pb.op, "k", *pb.k));
    SPARGE_RETURN_IF_ERROR(check_rows(pb.op, "v", *pb.v));
  }
  SPARGE_RETURN_IF_ERROR(check_rows(pb.op, "o", *pb.o));
  const detail::Dims dims = detail::attention_dims(q, *pb.k, *pb.varlen);
  const std::int64_t tiles = num_blocks(dims.sq, pb.blkq) * dims.hq * dims.batch;
  if (tiles > std::numeric_limits<int>::max()) {
    return unsupported(detail::cat(pb.op, ": ", tiles, " query tiles (batch x Hq x ceil(Sq / blkq)) exceed the grid limit 2^31 - 1"));
  }
  if (dims.sq > std::numeric_limits<int>::max() / 2 || dims.sk > std::numeric_limits<int>::max() / 2) {
    return unsupported(detail::cat(pb.op, ": sequence lengths up to 2^30 are supported on cuda (Sq = ", dims.sq,
                                   ", Sk = ", dims.sk, ")"));
  }
  return {};
}

// Checks shared by both kernels, then the portable kernel's instantiation (or why none can run).
Status select_portable(const Problem& pb, const Variant** out) {
  const Tensor& q = *pb.q;
  const std::int64_t d = q.shape[3];
  if (d != 64 && d != 128) {
    return unsupported(detail::cat(pb.op, ": head dim ", d, " is not supported on cuda (64, 128)"));
  }
  SPARGE_RETURN_IF_ERROR(check_io(pb, true));
  const Variant* chosen = nullptr;
  for (const Variant& v : kVariants) {
    if (v.dtype == q.dtype && v.head_dim == d && v.blkq == pb.blkq && v.blkk == pb.blkk) chosen = &v;
  }
  if (chosen == nullptr) {
    return unsupported(detail::cat(pb.op, ": blkq = ", pb.blkq, ", blkk = ", pb.blkk,
                                   " is not supported on cuda (64 or 128 each)"));
  }
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return unsupported(detail::cat(pb.op, ": no CUDA device"));
  cudaFuncAttributes attr{};
  const cudaError_t err = chosen->attributes(&attr);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it, so that a later unrelated call does not report it
    return unsupported(detail::cat(pb.op, ": this build has no kernel image for device ", dev, " (", cudaGetErrorString(err),
                                   "); build with SPARGE_CUDA_ARCHS including its architecture (sm_80 covers sm_80..sm_89)"));
  }
  int smem_optin = 0;
  cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  const int need = attn::smem_bytes(static_cast<int>(d), pb.blkq, pb.blkk);
  if (need > smem_optin) {
    return unsupported(detail::cat(pb.op, ": head dim ", d, " with blkq = ", pb.blkq, ", blkk = ", pb.blkk, " needs ",
                                   need, " bytes of shared memory; device ", dev, " allows ", smem_optin));
  }
  *out = chosen;
  return {};
}

// Whether the Hopper kernel can run this problem; on success fills sel's sm90 fields. The reason
// it cannot is returned as an `unsupported` Status (reported only when SPARGE_ATTN_PATH=sm90).
Status select_sm90(const Problem& pb, Selection* sel) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return unsupported(detail::cat(pb.op, ": no CUDA device"));
  if (!attn::sm90::image_available(dev)) {
    return unsupported(detail::cat(pb.op, ": the sm90 kernel needs an sm_90 device and a build with SPARGE_CUDA_ARCHS including 90a"));
  }
  const Sm90Variant* chosen = nullptr;
  for (const Sm90Variant& v : kSm90Variants) {
    if (v.dtype == pb.q->dtype && v.head_dim == pb.q->shape[3] && v.blkq == pb.sm90_blkq && v.blkk == pb.sm90_blkk) {
      chosen = &v;
    }
  }
  if (chosen == nullptr) return unsupported(detail::cat(pb.op, ": no sm90 instantiation for this shape"));
  cudaFuncAttributes attr{};
  if (chosen->attributes(&attr) != cudaSuccess) {
    cudaGetLastError();
    return unsupported(detail::cat(pb.op, ": this build has no sm90 kernel image for device ", dev));
  }
  int smem_optin = 0;
  cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  const int need = attn::sm90::smem_bytes(static_cast<int>(pb.q->shape[3]), pb.sm90_blkq, pb.sm90_blkk);
  if (need > smem_optin) {
    return unsupported(detail::cat(pb.op, ": the sm90 kernel needs ", need, " bytes of shared memory; device ", dev,
                                   " allows ", smem_optin));
  }
  if (!attn::sm90::encode_tensor_map(&sel->q_map, *pb.q, pb.sm90_blkq) ||
      !attn::sm90::encode_tensor_map(&sel->k_map, *pb.k, pb.sm90_blkk) ||
      !attn::sm90::encode_tensor_map(&sel->v_map, *pb.v, pb.sm90_blkk)) {
    return unsupported(detail::cat(pb.op, ": the q/k/v layout cannot be described by a TMA tensor map"));
  }
  sel->sm90 = chosen;
  sel->blkq = pb.sm90_blkq;
  sel->blkk = pb.sm90_blkk;
  sel->path = Path::sm90;
  return {};
}

// The one selection function: the shared checks and the portable variant (the fallback), then the
// Hopper kernel when requested or when it fits.
Status select(const Problem& pb, Selection* sel) {
  SPARGE_RETURN_IF_ERROR(select_portable(pb, &sel->portable));
  sel->path = Path::portable;
  sel->blkq = pb.blkq;
  sel->blkk = pb.blkk;
  const Path want = requested_path();
  if (want == Path::portable) return {};
  const Status st = select_sm90(pb, sel);
  if (!st.ok()) {
    sel->path = Path::portable;
    sel->blkq = pb.blkq;
    sel->blkk = pb.blkk;
    if (want == Path::sm90) return st;
  }
  return {};
}

// A tuning switch of the portable kernel: unset or empty = `fallback`, "0" = off, anything else = on.
// Read on every call, so one process can compare both settings.
bool env_switch(const char* name, bool fallback) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return fallback;
  return std::strcmp(e, "0") != 0;
}

void fill_strides(std::int64_t (&dst)[3], const Tensor& t) {
  for (int i = 0; i < 3; ++i) dst[i] = t.stride[i];
}

// Fills the parts of KernelParams common to the sparse and the dense entry.
KernelParams make_params(const Problem& pb, const Selection& sel, float scale, bool is_causal) {
  const Tensor &q = *pb.q, &k = *pb.k, &v = *pb.v, &o = *pb.o;
  const detail::Dims dims = detail::attention_dims(q, k, *pb.varlen);
  KernelParams kp{};
  kp.q = q.data;
  kp.k = k.data;
  kp.v = v.data;
  kp.o = o.data;
  fill_strides(kp.q_stride, q);
  fill_strides(kp.k_stride, k);
  fill_strides(kp.v_stride, v);
  fill_strides(kp.o_stride, o);
  kp.o_is_f32 = o.dtype == DType::f32;
  if (pb.lse->present()) {
    kp.lse = pb.lse->ptr<float>();
    fill_strides(kp.lse_stride, *pb.lse);
  }
  kp.cu_seqlens_q = pb.varlen->enabled() ? pb.varlen->cu_seqlens_q : nullptr;
  kp.cu_seqlens_k = pb.varlen->enabled() ? pb.varlen->cu_seqlens_k : nullptr;
  kp.seq_q = static_cast<int>(dims.sq);
  kp.seq_k = static_cast<int>(dims.sk);
  kp.batch = static_cast<int>(dims.batch);
  kp.hq = static_cast<int>(dims.hq);
  kp.hk = static_cast<int>(dims.hk);
  kp.nq = static_cast<int>(num_blocks(dims.sq, sel.blkq));
  const float s = scale == 0.0f ? 1.0f / std::sqrt(static_cast<float>(dims.d)) : scale;
  kp.scale_log2 = s * 1.4426950408889634f;
  kp.is_causal = is_causal;
  kp.heavy_first = is_causal;
  // docs/attention_portable.md, "Run-time switches".
  kp.lazy_rescale = env_switch("SPARGE_PORTABLE_LAZY_RESCALE", true);
  return kp;
}

Status launch(const Problem& pb, const Selection& sel, const KernelParams& kp, cudaStream_t stream) {
  const std::int64_t tiles = static_cast<std::int64_t>(kp.nq) * kp.hq * kp.batch;
  if (tiles == 0) return {};
  cudaError_t err;
  if (sel.path == Path::sm90) {
    attn::sm90::Sm90Params sp;
    sp.q_map = sel.q_map;
    sp.k_map = sel.k_map;
    sp.v_map = sel.v_map;
    // The staged epilogues' map (64-row boxes: one consumer warpgroup): for the Q-staged one when the variant
    // bits ask for it, for the V-staged one (Traits::kVStaged: head dim 128, BLKQ 128, 128-key stages) unless
    // they switch it off; without it O is stored from registers.
    const int vbits = attn::sm90::variant_bits();
    const bool v_staged = pb.q->shape[3] == 128 && sel.blkq == 128 && (sel.blkk == 128 || sel.blkk == 64) &&
                          (vbits & attn::sm90::kVariantNoVStaged) == 0;
    sp.o_tma = !kp.o_is_f32 && (attn::sm90::staged_bits(vbits) || v_staged) &&
                       attn::sm90::encode_tensor_map(&sp.o_map, *pb.o, 64)
                   ? 1
                   : 0;
    sp.p = kp;
    err = sel.sm90->launch(sp, static_cast<int>(tiles), stream);
  } else {
    err = sel.portable->launch(kp, static_cast<int>(tiles), stream);
  }
  if (err != cudaSuccess) return runtime_error(detail::cat(pb.op, ": kernel launch failed: ", cudaGetErrorString(err)));
  return {};
}

Problem sparse_problem(const BlockSparseAttentionParams& p) {
  return {"block_sparse_attention", &p.q, &p.k, &p.v, &p.o, &p.maybe_lse, &p.varlen, p.blkq, p.blkk, p.blkq, p.blkk};
}
Problem dense_problem(const DenseAttentionParams& p) {
  const attn::sm90::DenseTile t = attn::sm90::dense_tile(static_cast<int>(p.q.shape[3]));
  return {"dense_attention", &p.q, &p.k, &p.v, &p.o, &p.maybe_lse, &p.varlen, kDenseBlockQ, kDenseBlockK, t.blkq, t.blkk};
}

Status select_dense(const DenseAttentionParams& p, Selection* out) {
  if (p.maybe_mask.present()) {
    return unsupported("dense_attention: maybe_mask is not supported on cuda (it is the CPU oracle's test hook)");
  }
  return select(dense_problem(p), out);
}


// The LUT and pv_threshold parts of a sparse call's KernelParams. pv_threshold: one value travels in
// the params; Hq values go to a stream-ordered device copy (*thr_dev, to be freed by the caller behind
// the kernel on the same stream).
Status fill_sparse(const BlockSparseAttentionParams& p, KernelParams& kp, float** thr_dev, cudaStream_t stream) {
  kp.lut = p.lut.ptr<const std::int32_t>();
  kp.counts = p.counts.ptr<const std::int32_t>();
  for (int i = 0; i < 4; ++i) kp.lut_stride[i] = p.lut.stride[i];
  for (int i = 0; i < 3; ++i) kp.counts_stride[i] = p.counts.stride[i];
  kp.nk_lut = static_cast<int>(p.lut.shape[3]);
  *thr_dev = nullptr;
  if (p.pv_threshold.empty()) return {};
  kp.use_pv_threshold = true;
  if (p.pv_threshold.size() == 1) {
    kp.pv_threshold = p.pv_threshold[0];
    return {};
  }
  const std::size_t bytes = p.pv_threshold.size() * sizeof(float);
  if (scratch_alloc(reinterpret_cast<void**>(thr_dev), bytes, stream) != cudaSuccess ||
      cudaMemcpyAsync(*thr_dev, p.pv_threshold.data(), bytes, cudaMemcpyHostToDevice, stream) != cudaSuccess) {
    const cudaError_t err = cudaGetLastError();
    if (*thr_dev != nullptr) cudaFreeAsync(*thr_dev, stream);
    *thr_dev = nullptr;
    return runtime_error(detail::cat("block_sparse_attention: copying pv_threshold to the device failed: ",
                                     cudaGetErrorString(err)));
  }
  kp.pv_threshold_per_head = *thr_dev;
  return {};
}

// The fp8 recipe (docs/quantized.md): the quantization prepass (cuda/quant), then the sm90 fp8
// kernel on its outputs. Only the Hopper kernel has it: anything it cannot run is `unsupported`,
// never a silent fp16 run.
Status select_fp8(const BlockSparseAttentionParams& p, const Fp8Variant** out) {
  constexpr const char* op = "block_sparse_attention";
  if (requested_path() == Path::portable) {
    return unsupported(detail::cat(op, ": recipe = fp8 runs only on the sm90 kernel (SPARGE_ATTN_PATH=portable)"));
  }
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return unsupported(detail::cat(op, ": no CUDA device"));
  if (!attn::sm90::image_available(dev)) {
    return unsupported(detail::cat(op, ": recipe = fp8 needs an sm_90 device and a build with SPARGE_CUDA_ARCHS including 90a"));
  }
  if (p.varlen.enabled()) return unsupported(detail::cat(op, ": recipe = fp8 with varlen is not supported"));
  if (p.q.shape[3] != 128) {
    return unsupported(detail::cat(op, ": recipe = fp8 supports head dim 128 on cuda (got ", p.q.shape[3], ")"));
  }
  if (p.blkq != 128) {
    return unsupported(detail::cat(op, ": recipe = fp8 supports blkq = 128 on cuda (got blkq = ", p.blkq, ")"));
  }
  SPARGE_RETURN_IF_ERROR(check_io(sparse_problem(p), false));
  if (const QuantizedQK& f = p.maybe_fp8_qk; f.present()) {
    // The kernel loads q8 / k8 with TMA (16-byte aligned global addresses).
    for (const auto& [name, t] : {std::pair{"maybe_fp8_qk.q8", &f.q8}, std::pair{"maybe_fp8_qk.k8", &f.k8}}) {
      if (reinterpret_cast<std::uintptr_t>(t->data) % 16 != 0) {
        return invalid_argument(detail::cat(op, ": ", name, ".data = ", t->data, " is not 16-byte aligned (the CUDA backend needs it)"));
      }
    }
  }
  const Fp8Variant* chosen = nullptr;
  for (const Fp8Variant& v : kFp8Variants) {
    if (v.dtype == p.q.dtype && v.blkk == p.blkk) chosen = &v;
  }
  if (chosen == nullptr) return unsupported(detail::cat(op, ": recipe = fp8: blkk = ", p.blkk, " has no kernel"));
  cudaFuncAttributes attr{};
  if (chosen->attributes(&attr) != cudaSuccess) {
    cudaGetLastError();
    return unsupported(detail::cat(op, ": this build has no sm90 fp8 kernel image for device ", dev));
  }
  *out = chosen;
  return {};
}

Status run_fp8(const BlockSparseAttentionParams& p) {
  constexpr const char* op = "block_sparse_attention";
  const Fp8Variant* kern = nullptr;
  SPARGE_RETURN_IF_ERROR(select_fp8(p, &kern));
  const Problem pb = sparse_problem(p);
  Selection sel;
  sel.path = Path::sm90;
  sel.blkq = p.blkq;
  sel.blkk = p.blkk;
  KernelParams kp = make_params(pb, sel, p.scale, p.is_causal);
  const std::int64_t tiles = static_cast<std::int64_t>(kp.nq) * kp.hq * kp.batch;
  if (tiles == 0) return {};
  auto stream = static_cast<cudaStream_t>(p.exec.stream);

  // One scratch allocation for the prepass's buffers, each 256-byte aligned. With Q and K given
  // quantized (maybe_fp8_qk, from build_block_map) only V's buffers, and the LSE shift's when the
  // LSE is returned with smooth_k (O does not depend on it).
  const QuantizedQK& given = p.maybe_fp8_qk;
  const bool folded = given.present();
  const bool want_shift = p.smooth_k && (!folded || p.maybe_lse.present());
  const bool shift_buf = !folded || want_shift;  // quantize_qkv writes lse_shift (zeros without smooth_k)
  const quant::QuantShape qs = quant::quant_shape(p);
  const auto align = [](std::int64_t n) { return (n + 255) / 256 * 256; };
  const std::int64_t n_q = folded ? 0 : align(qs.q8_bytes()), n_k = folded ? 0 : align(qs.k8_bytes()),
                     n_v = align(qs.v8t_bytes());
  const std::int64_t n_rows = align(qs.b * qs.hq * qs.sq * 4), n_kb = folded ? 0 : align(qs.b * qs.hk * qs.nkb() * 4),
                     n_ch = align(qs.b * qs.hk * qs.d * 4);
  const std::int64_t total = n_q + n_k + n_v + (folded ? 0 : n_rows) + (shift_buf ? n_rows : 0) + n_kb +
                             (folded ? 1 : 2) * n_ch;
  unsigned char* scratch = nullptr;
  if (scratch_alloc(reinterpret_cast<void**>(&scratch), static_cast<std::size_t>(total), stream) != cudaSuccess) {
    const cudaError_t err = cudaGetLastError();
    return runtime_error(detail::cat(op, ": allocating ", total, " bytes for the fp8 prepass failed: ", cudaGetErrorString(err)));
  }
  quant::QuantBuffers qb;
  unsigned char* at = scratch;
  const auto take = [&at](std::int64_t n) {
    unsigned char* r = at;
    at += n;
    return r;
  };
  qb.v8t = take(n_v);
  qb.v_scale = reinterpret_cast<float*>(take(n_ch));
  qb.lse_shift = shift_buf ? reinterpret_cast<float*>(take(n_rows)) : nullptr;
  if (folded) {
    qb.q8 = static_cast<std::uint8_t*>(given.q8.data);
    qb.k8 = static_cast<std::uint8_t*>(given.k8.data);
    qb.q_scale = static_cast<float*>(given.q_scale.data);
    qb.k_scale = static_cast<float*>(given.k_scale.data);
    qb.k_mean = static_cast<float*>(given.k_mean.data);
  } else {
    qb.q8 = take(n_q);
    qb.k8 = take(n_k);
    qb.q_scale = reinterpret_cast<float*>(take(n_rows));
    qb.k_scale = reinterpret_cast<float*>(take(n_kb));
    qb.k_mean = reinterpret_cast<float*>(take(n_ch));
  }
  float* thr_dev = nullptr;
  const Status st = [&]() -> Status {
    attn::sm90::Sm90Params sp;
    if (!attn::sm90::encode_fp8_rows_map(&sp.q_map, qb.q8, qs.b, qs.hq, qs.sq, 128) ||
        !attn::sm90::encode_fp8_rows_map(&sp.k_map, qb.k8, qs.b, qs.hk, qs.sk, p.blkk) ||
        !attn::sm90::encode_fp8_vt_map(&sp.v_map, qb.v8t, qs.b, qs.hk, qs.sk_pad())) {
      return runtime_error(detail::cat(op, ": encoding the fp8 TMA tensor maps failed"));
    }
    if (folded) {
      if (const cudaError_t err = quant::quantize_v(p, qb, stream); err != cudaSuccess) {
        return runtime_error(detail::cat(op, ": the fp8 V prepass failed: ", cudaGetErrorString(err)));
      }
      if (want_shift) {
        if (const cudaError_t err = quant::lse_shift(p, qb.k_mean, qb.lse_shift, stream); err != cudaSuccess) {
          return runtime_error(detail::cat(op, ": the fp8 LSE shift failed: ", cudaGetErrorString(err)));
        }
      }
    } else if (const cudaError_t err = quant::quantize_qkv(p, qb, stream); err != cudaSuccess) {
      return runtime_error(detail::cat(op, ": the fp8 quantization prepass failed: ", cudaGetErrorString(err)));
    }
    SPARGE_RETURN_IF_ERROR(fill_sparse(p, kp, &thr_dev, stream));
    sp.p = kp;
    sp.q_scale = qb.q_scale;
    sp.k_scale = qb.k_scale;
    sp.v_scale = qb.v_scale;
    sp.lse_shift = want_shift ? qb.lse_shift : nullptr;
    sp.nkb = static_cast<int>(qs.nkb());
    if (const cudaError_t err = kern->launch(sp, static_cast<int>(tiles), stream); err != cudaSuccess) {
      return runtime_error(detail::cat(op, ": fp8 kernel launch failed: ", cudaGetErrorString(err)));
    }
    return {};
  }();
  if (thr_dev != nullptr) cudaFreeAsync(thr_dev, stream);
  cudaFreeAsync(scratch, stream);
  return st;
}

}  // namespace

Status supported(const BlockSparseAttentionParams& p) {
  if (p.recipe == Recipe::fp8) {
    const Fp8Variant* kern = nullptr;
    return select_fp8(p, &kern);
  }
  Selection sel;
  return select(sparse_problem(p), &sel);
}

Status block_sparse_attention(const BlockSparseAttentionParams& p) {
  if (p.recipe == Recipe::fp8) return run_fp8(p);
  Selection sel;
  const Problem pb = sparse_problem(p);
  SPARGE_RETURN_IF_ERROR(select(pb, &sel));
  KernelParams kp = make_params(pb, sel, p.scale, p.is_causal);
  auto stream = static_cast<cudaStream_t>(p.exec.stream);
  float* thr_dev = nullptr;
  SPARGE_RETURN_IF_ERROR(fill_sparse(p, kp, &thr_dev, stream));
  const Status st = launch(pb, sel, kp, stream);
  if (thr_dev != nullptr) cudaFreeAsync(thr_dev, stream);
  return st;
}

Status supported(const DenseAttentionParams& p) {
  Selection sel;
  return select_dense(p, &sel);
}

Status dense_attention(const DenseAttentionParams& p) {
  Selection sel;
  SPARGE_RETURN_IF_ERROR(select_dense(p, &sel));
  const KernelParams kp = make_params(dense_problem(p), sel, p.scale, p.is_causal);
  return launch(dense_problem(p), sel, kp, static_cast<cudaStream_t>(p.exec.stream));
}

}  // namespace sparge::cuda
