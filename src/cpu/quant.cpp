// The fp8 quantization rule over whole tensors on the host (src/cpu/quant.h). Each group (a Q
// row, a K block, a V channel) is independent, so the loops run in parallel over heads and the
// bytes never depend on the thread count.
#include "cpu/quant.h"

#include <algorithm>

#include "cpu/parallel.h"
#include "quant/quant_rule.h"
#include "sparge/half.h"

namespace sparge::cpu {

namespace {
float at(const Tensor& t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t e) {
  return load_as_float(t.data, t.dtype, t.offset(b, s, h, e));
}
}  // namespace

std::vector<float> k_mean_host(const Tensor& k, int threads) {
  const std::int64_t nb = k.shape[0], sk = k.shape[1], hk = k.shape[2], d = k.shape[3];
  std::vector<float> mean(static_cast<size_t>(nb * hk * d), 0.0f);
  parallel_for(nb * hk, threads, [&](std::int64_t bh) {
    const std::int64_t b = bh / hk, h = bh % hk;
    for (std::int64_t e = 0; e < d; ++e) {
      double s = 0.0;
      for (std::int64_t j = 0; j < sk; ++j) s += at(k, b, j, h, e);
      mean[static_cast<size_t>(bh * d + e)] = static_cast<float>(s / static_cast<double>(sk));
    }
  });
  return mean;
}

std::vector<double> lse_shift_host(const Tensor& q, const std::vector<float>& k_mean, std::int64_t hk, double scale,
                                   int threads) {
  const std::int64_t nb = q.shape[0], sq = q.shape[1], hq = q.shape[2], d = q.shape[3], group = hq / hk;
  std::vector<double> shift(static_cast<size_t>(nb * hq * sq), 0.0);
  parallel_for(nb * hq, threads, [&](std::int64_t bh) {
    const std::int64_t b = bh / hq, h = bh % hq;
    const float* km = k_mean.data() + (b * hk + h / group) * d;
    std::vector<float> row(static_cast<size_t>(d));
    for (std::int64_t i = 0; i < sq; ++i) {
      for (std::int64_t e = 0; e < d; ++e) row[e] = at(q, b, i, h, e);
      shift[static_cast<size_t>(bh * sq + i)] = quant::lse_shift(row.data(), km, static_cast<int>(d), scale);
    }
  });
  return shift;
}

QuantHost quantize_qk_host(const Tensor& q, const Tensor& k, int blkk, bool smooth_k, double scale,
                           std::vector<float> k_mean, int threads, bool with_lse_shift) {
  QuantHost r;
  r.b = q.shape[0];
  r.sq = q.shape[1];
  r.hq = q.shape[2];
  r.d = q.shape[3];
  r.sk = k.shape[1];
  r.hk = k.shape[2];
  r.blkk = blkk;
  const std::int64_t d = r.d, sq = r.sq, sk = r.sk, hq = r.hq, hk = r.hk;
  r.k_mean = std::move(k_mean);
  r.q8.assign(static_cast<size_t>(r.b * hq * sq * d), 0);
  r.k8.assign(static_cast<size_t>(r.b * hk * sk * d), 0);
  r.q_scale.assign(static_cast<size_t>(r.b * hq * sq), 0.0f);
  r.k_scale.assign(static_cast<size_t>(r.b * hk * r.nkb()), 0.0f);

  // Q: one scale per row.
  parallel_for(r.b * hq, threads, [&](std::int64_t bh) {
    const std::int64_t b = bh / hq, h = bh % hq;
    std::vector<float> row(static_cast<size_t>(d));
    for (std::int64_t i = 0; i < sq; ++i) {
      std::uint32_t amax = 0;
      for (std::int64_t e = 0; e < d; ++e) {
        row[e] = at(q, b, i, h, e);
        amax = std::max(amax, quant::abs_bits(row[e]));
      }
      const quant::Pow2Scale s = quant::pow2_scale(amax);
      std::uint8_t* out = r.q8.data() + (bh * sq + i) * d;
      for (std::int64_t e = 0; e < d; ++e) out[e] = quant::quantize(row[e], s.inv);
      r.q_scale[static_cast<size_t>(bh * sq + i)] = s.scale;
    }
  });
  // The LSE shift from the original (unquantized) rows and the mean of the kv head each query
  // head reads.
  if (with_lse_shift) {
    r.lse_shift = smooth_k ? lse_shift_host(q, r.k_mean, hk, scale, threads)
                           : std::vector<double>(static_cast<size_t>(r.b * hq * sq), 0.0);
  }

  // K: one scale per key block of blkk keys over its valid rows, after smoothing.
  const std::int64_t nkb = r.nkb();
  parallel_for(r.b * hk, threads, [&](std::int64_t bh) {
    const std::int64_t b = bh / hk, h = bh % hk;
    const float* km = r.k_mean.data() + bh * d;
    std::vector<float> ks(static_cast<size_t>(blkk * d));
    for (std::int64_t kb = 0; kb < nkb; ++kb) {
      const std::int64_t j0 = kb * blkk, n = std::min<std::int64_t>(blkk, sk - j0);
      std::uint32_t amax = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        for (std::int64_t e = 0; e < d; ++e) {
          const float x = smooth_k ? quant::smooth(at(k, b, j0 + j, h, e), km[e]) : at(k, b, j0 + j, h, e);
          ks[j * d + e] = x;
          amax = std::max(amax, quant::abs_bits(x));
        }
      }
      const quant::Pow2Scale s = quant::pow2_scale(amax);
      std::uint8_t* out = r.k8.data() + (bh * sk + j0) * d;
      for (std::int64_t i = 0; i < n * d; ++i) out[i] = quant::quantize(ks[i], s.inv);
      r.k_scale[static_cast<size_t>(bh * nkb + kb)] = s.scale;
    }
  });
  return r;
}

void quantize_v_host(const Tensor& v, QuantHost& r, int threads) {
  const std::int64_t d = r.d, sk = r.sk, hk = r.hk, pad = r.sk_pad();
  r.v8t.assign(static_cast<size_t>(r.b * hk * d * pad), 0);
  r.v_scale.assign(static_cast<size_t>(r.b * hk * d), 0.0f);
  // One scale per channel over the whole sequence, stored transposed with the keys permuted in
  // groups of 32.
  parallel_for(r.b * hk, threads, [&](std::int64_t bh) {
    const std::int64_t b = bh / hk, h = bh % hk;
    for (std::int64_t e = 0; e < d; ++e) {
      std::uint32_t amax = 0;
      for (std::int64_t j = 0; j < sk; ++j) amax = std::max(amax, quant::abs_bits(at(v, b, j, h, e)));
      const quant::Pow2Scale s = quant::pow2_scale(amax);
      std::uint8_t* out = r.v8t.data() + (bh * d + e) * pad;
      for (std::int64_t j = 0; j < sk; ++j) {
        const std::int64_t g = j / quant::kVPermGroup * quant::kVPermGroup;
        out[g + quant::v_key_pos(static_cast<int>(j - g))] = quant::quantize(at(v, b, j, h, e), s.inv);
      }
      r.v_scale[static_cast<size_t>(bh * d + e)] = s.scale;
    }
  });
}

QuantHost quantize_host(const Tensor& q, const Tensor& k, const Tensor& v, int blkk, bool smooth_k, double scale,
                        std::vector<float> k_mean, int threads) {
  QuantHost r = quantize_qk_host(q, k, blkk, smooth_k, scale, std::move(k_mean), threads, true);
  quantize_v_host(v, r, threads);
  return r;
}

Dequantized dequantize_host(const QuantHost& qh, int threads) {
  const std::int64_t d = qh.d, sq = qh.sq, sk = qh.sk, hq = qh.hq, hk = qh.hk, nkb = qh.nkb(), pad = qh.sk_pad();
  Dequantized r;
  r.q.resize(static_cast<size_t>(qh.b * sq * hq * d));
  r.k.resize(static_cast<size_t>(qh.b * sk * hk * d));
  r.v.resize(r.k.size());
  parallel_for(qh.b * hq, threads, [&](std::int64_t bh) {
    const std::int64_t b = bh / hq, h = bh % hq;
    for (std::int64_t i = 0; i < sq; ++i) {
      const float s = qh.q_scale[static_cast<size_t>(bh * sq + i)];
      for (std::int64_t e = 0; e < d; ++e) {
        r.q[static_cast<size_t>(((b * sq + i) * hq + h) * d + e)] = quant::dequantize(qh.q8[(bh * sq + i) * d + e], s);
      }
    }
  });
  parallel_for(qh.b * hk, threads, [&](std::int64_t bh) {
    const std::int64_t b = bh / hk, h = bh % hk;
    for (std::int64_t j = 0; j < sk; ++j) {
      const float s = qh.k_scale[static_cast<size_t>(bh * nkb + j / qh.blkk)];
      const std::int64_t g = j / quant::kVPermGroup * quant::kVPermGroup;
      const std::int64_t pos = g + quant::v_key_pos(static_cast<int>(j - g));
      for (std::int64_t e = 0; e < d; ++e) {
        const size_t o = static_cast<size_t>(((b * sk + j) * hk + h) * d + e);
        r.k[o] = quant::dequantize(qh.k8[(bh * sk + j) * d + e], s);
        r.v[o] = quant::dequantize(qh.v8t[(bh * d + e) * pad + pos], qh.v_scale[static_cast<size_t>(bh * d + e)]);
      }
    }
  });
  return r;
}

}  // namespace sparge::cpu
