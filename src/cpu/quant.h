// The fp8 recipe on the host (docs/quantized.md): the quantization rule of src/quant/quant_rule.h
// applied to whole tensors, producing exactly the buffers of the GPU prepass
// (src/cuda/quant/quant.h's layouts), and their dequantization. The CPU backend's fp8
// block_sparse_attention runs on these; the tests use them as the reference for the GPU prepass.
#pragma once

#include <cstdint>
#include <vector>

#include "sparge/ops.h"

namespace sparge::cpu {

// Host copies of the prepass buffers. lse_shift is kept in fp64 (the GPU stores it rounded to f32).
struct QuantHost {
  std::int64_t b = 0, hq = 0, hk = 0, sq = 0, sk = 0, d = 0;
  int blkk = 64;
  std::vector<std::uint8_t> q8, k8, v8t;
  std::vector<float> q_scale, k_scale, v_scale, k_mean;
  std::vector<double> lse_shift;
  std::int64_t sk_pad() const { return (sk + 127) / 128 * 128; }
  std::int64_t nkb() const { return (sk + blkk - 1) / blkk; }
};

// The mean of K over the sequence per (b, hk, d), summed in fp64 in ascending key order and
// rounded to f32; [B, Hk, D]. k: [B, Sk, Hk, D] (f32 / f16 / bf16, any strides, no varlen).
std::vector<float> k_mean_host(const Tensor& k, int threads);

// Quantizes q [B, Sq, Hq, D], k, v [B, Sk, Hk, D] by the rule. With smooth_k, K is smoothed with
// k_mean ([B, Hk, D]: k_mean_host's, or the GPU's in the prepass test) and lse_shift is
// scale * q . k_mean; without, k_mean must be all zeros (the stored copy) and lse_shift is 0.
QuantHost quantize_host(const Tensor& q, const Tensor& k, const Tensor& v, int blkk, bool smooth_k, double scale,
                        std::vector<float> k_mean, int threads);

// The pieces of quantize_host: Q and K only (v8t and v_scale left empty; lse_shift only with
// with_lse_shift: what build_block_map writes for the recipe), V alone into r (r's shape fields
// set), and the LSE shift alone (scale * q . k_mean of the kv head a query head reads, fp64).
QuantHost quantize_qk_host(const Tensor& q, const Tensor& k, int blkk, bool smooth_k, double scale,
                           std::vector<float> k_mean, int threads, bool with_lse_shift);
void quantize_v_host(const Tensor& v, QuantHost& r, int threads);
std::vector<double> lse_shift_host(const Tensor& q, const std::vector<float>& k_mean, std::int64_t hk, double scale,
                                   int threads);

// The dequantized tensors, contiguous f32 in the logical layouts: q [B, Sq, Hq, D], k (smoothed)
// and v (unpermuted) [B, Sk, Hk, D].
struct Dequantized {
  std::vector<float> q, k, v;
};
Dequantized dequantize_host(const QuantHost& qh, int threads);

}  // namespace sparge::cpu
