// The fp8 recipe's quantization prepass on the GPU (docs/quantized.md): Q, K, V of one
// block_sparse_attention call -> e4m3 copies in the layouts the Hopper fp8 kernel loads with TMA,
// plus their power-of-two dequantization scales. The rule (scale choice, rounding, K smoothing, the
// V key permutation) is src/quant/quant_rule.h, shared with the CPU specification, so the GPU's
// bytes equal the CPU's for the same scales and the same K mean.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "sparge/ops.h"

namespace sparge::cuda::quant {

// Device buffers of one call (all contiguous, allocated by the caller; sizes from QuantShape).
//   q8   e4m3 [B, Hq, Sq, D]          q / q_scale[b, h, i], rounded to nearest even, saturated
//   k8   e4m3 [B, Hk, Sk, D]          (k - km) / k_scale[b, hk, kb], kb = key / blkk
//   v8t  e4m3 [B, Hk, D, sk_pad]      V transposed: v8t[b, hk, d, 32 g + c] = v[b, 32 g + perm(c), hk, d]
//                                     / v_scale[b, hk, d] (keys >= Sk: 0), perm = quant_rule.h's
//                                     v_key_perm (the wgmma fp8 A-fragment order of P)
//   q_scale   f32 [B, Hq, Sq]         per row, a power of two (1 for an all-zero row)
//   k_scale   f32 [B, Hk, NKB]        per key block of blkk keys, NKB = ceil(Sk / blkk)
//   v_scale   f32 [B, Hk, D]          per channel over the whole sequence
//   k_mean    f32 [B, Hk, D]          mean of K over the sequence (zeros when smooth_k is off)
//   lse_shift f32 [B, Hq, Sq]         scale * q . k_mean[b, h / (Hq / Hk)] (natural-log units; 0 when
//                                     smooth_k is off), added to the kernel's LSE
struct QuantBuffers {
  std::uint8_t* q8 = nullptr;
  std::uint8_t* k8 = nullptr;
  std::uint8_t* v8t = nullptr;
  float* q_scale = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
  float* k_mean = nullptr;
  float* lse_shift = nullptr;
};

struct QuantShape {
  std::int64_t b, hq, hk, sq, sk, d;
  int blkk;
  std::int64_t sk_pad() const { return (sk + 127) / 128 * 128; }
  std::int64_t nkb() const { return (sk + blkk - 1) / blkk; }
  std::int64_t q8_bytes() const { return b * hq * sq * d; }
  std::int64_t k8_bytes() const { return b * hk * sk * d; }
  std::int64_t v8t_bytes() const { return b * hk * d * sk_pad(); }
};

QuantShape quant_shape(const BlockSparseAttentionParams& p);

// Runs the prepass on `stream` (p already validated: f16/bf16 inputs, no varlen). Head dims 64
// and 128, blkk 64 or 128; anything else returns cudaErrorInvalidValue before any launch. The
// output pointers must be 16-byte aligned (the kernels store 8 and 4 bytes at a time). The
// scratch the kernels need beyond `out` (about B * Hk * ceil(Sk / 128) * D * 8 bytes of fp64
// partial sums with smooth_k) comes from the shared stream-ordered pool. Deterministic: the same
// bytes on every launch, whatever SPARGE_QUANT_GROUP says. Returns the first CUDA error.
cudaError_t quantize_qkv(const BlockSparseAttentionParams& p, const QuantBuffers& out, cudaStream_t stream);

// The prepass of a call whose Q and K came quantized (BlockSparseAttentionParams::maybe_fp8_qk,
// written by build_block_map): V alone (out.v8t, out.v_scale; the other pointers are not used), the
// same bytes as quantize_qkv's V. By default two plain launches (V's channel maxima, then the V
// tiles, last first); SPARGE_QUANT_VONLY=stream the stream variant's persistent launch over V chunks
// and V tiles, =launches one pass of V statistics and one of V tiles per group of kv heads
// (SPARGE_QUANT_GROUP applies to those two; SPARGE_QUANT_VARIANT to none). Same limits as
// quantize_qkv.
cudaError_t quantize_v(const BlockSparseAttentionParams& p, const QuantBuffers& out, cudaStream_t stream);

// lse_shift [B, Hq, Sq] = scale * p.q . k_mean[b, h / (Hq / Hk)] in the rule's fp64 order (the
// bytes quantize_qkv writes with the same k_mean), from p.q and k_mean ([B, Hk, D] f32, device).
// Head dims 64 and 128, f16 / bf16 q with any strides.
cudaError_t lse_shift(const BlockSparseAttentionParams& p, const float* k_mean, float* shift, cudaStream_t stream);

// Test hook: compares the rule's software e4m3 encoder with the device's conversion instruction
// (cvt.rn.satfinite.e4m3x2.f32, sm_89 and later) over all 2^32 floats on the current device,
// synchronously. On older devices the device path is the software encoder itself (vacuous).
cudaError_t e4m3_device_check(unsigned long long* mismatches, std::uint32_t* first_bad);

}  // namespace sparge::cuda::quant
