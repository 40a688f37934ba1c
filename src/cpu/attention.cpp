// Block-sparse attention over a LUT (docs/semantics.md, Stage 2), the specification the GPU kernels
// must reproduce. Per (sequence, query head, query block) the LUT row is walked in order with an
// online softmax in fp64: per-token causal masking and key tails inside each block, and the
// pv_threshold skip decided for the whole query block. The LUT entries were range-checked by
// detail::validate, so every block read here lies inside its sequence.
//
// Recipe fp8 (docs/quantized.md): Q, K, V are quantized by the rule of src/quant/quant_rule.h
// (src/cpu/quant.h), dequantized to f32, and the same fp64 walk runs over the dequantized tensors
// (K smoothed); each row's LSE then gets its lse_shift added back (fp64, before rounding to f32).
#include <algorithm>
#include <type_traits>
#include <vector>

#include "cpu/attention_common.h"
#include "cpu/cpu.h"
#include "cpu/quant.h"
#include "validate/validate.h"

namespace sparge::cpu {

namespace {
using namespace attn;

struct SparseTask {
  const BlockSparseAttentionParams& p;
  const Seq& s;
  std::int64_t b;  // sequence index (the lut/counts/lse batch index)
  const KvHead& kv;
  double scale;
  const double* lse_shift;  // [B, Hq, Sq] added to every finite LSE (fp8 recipe), or nullptr
};

void sparse_query_block(const SparseTask& t, std::int64_t h, std::int64_t qb) {
  const BlockSparseAttentionParams& p = t.p;
  const Seq& s = t.s;
  const std::int64_t blkq = p.blkq, blkk = p.blkk;
  const std::int64_t i0 = qb * blkq;
  const std::int64_t n = std::min(blkq, s.sq - i0);
  const std::int64_t d = t.kv.d;

  std::vector<double> q;
  load_q_rows(p.q, s, h, i0, n, q);
  std::vector<std::int64_t> limit(static_cast<size_t>(n));
  for (std::int64_t r = 0; r < n; ++r) limit[r] = key_limit(p.is_causal, i0 + r, s.sq, s.sk);

  std::vector<double> m(static_cast<size_t>(n), kNegInf), l(static_cast<size_t>(n), 0.0);
  std::vector<double> x(static_cast<size_t>(n)), m_new(static_cast<size_t>(n));
  std::vector<double> acc(static_cast<size_t>(n * d), 0.0);
  std::vector<double> sc(static_cast<size_t>(n * blkk));

  const bool thresholded = !p.pv_threshold.empty();
  const double thr = thresholded ? detail::per_head(p.pv_threshold, static_cast<int>(h)) : 0.0;
  const std::int32_t count = p.counts.ptr<std::int32_t>()[p.counts.offset(t.b, h, qb)];
  for (std::int32_t e = 0; e < count; ++e) {
    const std::int64_t kb = p.lut.ptr<std::int32_t>()[p.lut.offset(t.b, h, qb, e)];
    const std::int64_t j0 = kb * blkk;
    const std::int64_t nj = std::min(blkk, s.sk - j0);
    const std::int64_t chunks = (nj + kChunk - 1) / kChunk;
    for (std::int64_t c = 0; c < chunks; ++c) {
      score_chunk(q.data(), n, t.kv, j0 / kChunk + c, t.scale, sc.data() + c * kChunk, blkk);
    }
    // Mask (causal per token, key tail), then each row's block max and running max.
    for (std::int64_t r = 0; r < n; ++r) {
      double* row = sc.data() + r * blkk;
      const std::int64_t valid = std::clamp<std::int64_t>(limit[r] - j0, 0, nj);
      double mx = kNegInf;
      for (std::int64_t j = 0; j < valid; ++j) mx = std::max(mx, row[j]);
      for (std::int64_t j = valid; j < chunks * kChunk; ++j) row[j] = kNegInf;
      x[r] = mx;
      m_new[r] = std::max(m[r], mx);
    }
    // The PV product is skipped only when every row of the query block passes the test; a row
    // with no visible key here (x = -inf) passes. With pv_threshold > 0 a row's first visible
    // block never passes (x == m_new), so no row loses all its values.
    bool skip = thresholded;
    for (std::int64_t r = 0; r < n && skip; ++r) {
      if (x[r] == kNegInf) continue;
      skip = (x[r] - m_new[r]) * kLog2e + thr <= 0.0;
    }
    // Online softmax: rescale the running state to the new max, add this block's exponentials.
    for (std::int64_t r = 0; r < n; ++r) {
      double* row = sc.data() + r * blkk;
      if (m_new[r] == kNegInf) {
        std::fill(row, row + chunks * kChunk, 0.0);
        continue;
      }
      const double alpha = m[r] == kNegInf ? 0.0 : std::exp(m[r] - m_new[r]);
      double sum = 0.0;
      for (std::int64_t j = 0; j < chunks * kChunk; ++j) {
        row[j] = std::exp(row[j] - m_new[r]);
        sum += row[j];
      }
      l[r] = l[r] * alpha + sum;
      if (alpha != 1.0) {
        for (std::int64_t k = 0; k < d; ++k) acc[r * d + k] *= alpha;
      }
      m[r] = m_new[r];
    }
    if (!skip) pv_accumulate(sc.data(), blkk, n, t.kv, j0, nj, acc.data());
  }
  for (std::int64_t r = 0; r < n; ++r) {
    // store_row's LSE is m + log(l): shifting m shifts the LSE and leaves O and empty rows alone.
    const double shift = t.lse_shift == nullptr ? 0.0 : t.lse_shift[(t.b * p.q.shape[2] + h) * s.sq + i0 + r];
    store_row(p.o, p.maybe_lse, s, t.b, h, i0 + r, acc.data() + r * d, m[r] + shift, l[r]);
  }
}

void run_sparse(const BlockSparseAttentionParams& p, const double* lse_shift) {
  const double scale = effective_scale(p.scale, p.q.shape[3]);
  for_each_query_tile(p.q, p.k, p.v, p.varlen, p.blkq, p.exec.cpu_threads,
                      [&](const Seq& s, std::int64_t b, std::int64_t h, std::int64_t qb, const KvHead& kv) {
                        sparse_query_block(SparseTask{p, s, b, kv, scale, lse_shift}, h, qb);
                      });
}

// The fp8 recipe (no varlen: rejected by validation): quantize, dequantize to contiguous f32, and
// run the same walk with the LSE shift. The scale of the walk is the caller's (p.scale or
// 1/sqrt(D)), unchanged by quantization.
void run_sparse_fp8(const BlockSparseAttentionParams& p) {
  const int threads = p.exec.cpu_threads;
  const double scale = effective_scale(p.scale, p.q.shape[3]);
  QuantHost qh;
  if (const QuantizedQK& in = p.maybe_fp8_qk; in.present()) {
    // Q and K come quantized (by build_block_map; contiguous, validated): their bytes and scales as
    // given, the LSE shift from the original q and the given k_mean, V quantized here.
    qh.b = p.q.shape[0];
    qh.sq = p.q.shape[1];
    qh.hq = p.q.shape[2];
    qh.d = p.q.shape[3];
    qh.sk = p.k.shape[1];
    qh.hk = p.k.shape[2];
    qh.blkk = p.blkk;
    const auto take = [](const Tensor& t, auto& v) {
      const auto* src = static_cast<const std::remove_cvref_t<decltype(v[0])>*>(t.data);
      v.assign(src, src + t.numel());
    };
    take(in.q8, qh.q8);
    take(in.q_scale, qh.q_scale);
    take(in.k8, qh.k8);
    take(in.k_scale, qh.k_scale);
    take(in.k_mean, qh.k_mean);
    qh.lse_shift = p.smooth_k ? lse_shift_host(p.q, qh.k_mean, qh.hk, scale, threads)
                              : std::vector<double>(static_cast<size_t>(qh.b * qh.hq * qh.sq), 0.0);
    quantize_v_host(p.v, qh, threads);
  } else {
    std::vector<float> km = p.smooth_k ? k_mean_host(p.k, threads)
                                       : std::vector<float>(static_cast<size_t>(p.k.shape[0] * p.k.shape[2] * p.k.shape[3]), 0.0f);
    qh = quantize_host(p.q, p.k, p.v, p.blkk, p.smooth_k, scale, std::move(km), threads);
  }
  Dequantized dq = dequantize_host(qh, threads);
  BlockSparseAttentionParams pd = p;
  pd.recipe = Recipe::none;
  pd.q = make_tensor(dq.q.data(), DType::f32, {qh.b, qh.sq, qh.hq, qh.d});
  pd.k = make_tensor(dq.k.data(), DType::f32, {qh.b, qh.sk, qh.hk, qh.d});
  pd.v = make_tensor(dq.v.data(), DType::f32, {qh.b, qh.sk, qh.hk, qh.d});
  run_sparse(pd, qh.lse_shift.data());
}
}  // namespace

Status block_sparse_attention(const BlockSparseAttentionParams& p) {
  if (p.recipe == Recipe::fp8) {
    run_sparse_fp8(p);
  } else {
    run_sparse(p, nullptr);
  }
  return {};
}

}  // namespace sparge::cpu
