// Inputs of the fold tests (tests/cpu/fold_test.cpp, tests/gpu/fold_gpu_test.cpp): logical
// [B, S, H, D] f32 values, rounded through the case's dtype. q ~ N(0, 2^2), v ~ N(0, 1), k ~ N(0, 1)
// plus a mean per (kv head, channel) ~ N(0, k_bias^2) (what smooth_k removes).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "harness/harness.h"

namespace sparge::test {

struct FoldQkv {
  std::vector<float> q, k, v;
};

inline FoldQkv random_fold_qkv(int b, int hq, int hk, int sq, int sk, int d, float k_bias, DType dt,
                               std::mt19937_64& rng) {
  FoldQkv r;
  r.q.resize(static_cast<size_t>(b) * sq * hq * d);
  r.k.resize(static_cast<size_t>(b) * sk * hk * d);
  r.v.resize(r.k.size());
  fill_normal(r.q, rng, 0.0f, 2.0f);
  fill_normal(r.k, rng);
  fill_normal(r.v, rng);
  std::vector<float> bias(static_cast<size_t>(hk) * d);
  fill_normal(bias, rng, 0.0f, k_bias);
  for (std::int64_t row = 0; row < std::int64_t{b} * sk; ++row)
    for (int h = 0; h < hk; ++h)
      for (int e = 0; e < d; ++e) r.k[(row * hk + h) * d + e] += bias[h * d + e];
  r.q = round_through(r.q, dt);
  r.k = round_through(r.k, dt);
  r.v = round_through(r.v, dt);
  return r;
}

// x (logical [B, S, H, D]) in storage order: HND ([B, H, S, D]) or NHD, after `off` leading zeros.
inline std::vector<float> fold_store(const std::vector<float>& x, std::int64_t b, std::int64_t S, std::int64_t H,
                                     std::int64_t D, bool hnd, std::int64_t off = 0) {
  std::vector<float> out(x.size() + static_cast<size_t>(off), 0.0f);
  for (std::int64_t bb = 0; bb < b; ++bb)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t e = 0; e < D; ++e) {
          const std::int64_t at = hnd ? ((bb * H + h) * S + s) * D + e : ((bb * S + s) * H + h) * D + e;
          out[static_cast<size_t>(off + at)] = x[static_cast<size_t>(((bb * S + s) * H + h) * D + e)];
        }
  return out;
}

// The logical [B, S, H, D] view of storage written by fold_store.
inline Tensor fold_view(void* data, DType dt, std::int64_t b, std::int64_t S, std::int64_t H, std::int64_t D, bool hnd) {
  return hnd ? make_tensor(data, dt, {b, S, H, D}, {H * S * D, D, S * D, 1}) : make_tensor(data, dt, {b, S, H, D});
}

// The QuantizedQK views of contiguous buffers of the right sizes.
inline QuantizedQK fold_qk(void* q8, float* q_scale, void* k8, float* k_scale, float* k_mean, std::int64_t b,
                           std::int64_t hq, std::int64_t hk, std::int64_t sq, std::int64_t sk, std::int64_t d, int blkk,
                           bool smooth) {
  QuantizedQK qk;
  qk.q8 = make_tensor(q8, DType::u8, {b, hq, sq, d});
  qk.q_scale = make_tensor(q_scale, DType::f32, {b, hq, sq});
  qk.k8 = make_tensor(k8, DType::u8, {b, hk, sk, d});
  qk.k_scale = make_tensor(k_scale, DType::f32, {b, hk, num_blocks(sk, blkk)});
  qk.k_mean = make_tensor(k_mean, DType::f32, {b, hk, d});
  qk.blkk = blkk;
  qk.smooth_k = smooth;
  return qk;
}

// The block map params of the fold tests: top-k with one value, no similarity test.
inline BlockMapParams fold_map_params(const Tensor& q, const Tensor& k, int blkq, int blkk, const float* topk, bool causal,
                                      bool smooth, const Tensor& lut, const Tensor& counts, const QuantizedQK* fp8) {
  BlockMapParams p;
  p.q = q;
  p.k = k;
  p.blkq = blkq;
  p.blkk = blkk;
  p.topk = PerHead(topk, 1);
  p.is_causal = causal;
  p.smooth_k = smooth;
  p.lut = lut;
  p.counts = counts;
  if (fp8 != nullptr) p.maybe_fp8_qk = *fp8;
  return p;
}

}  // namespace sparge::test
