// The CPU block map: the executable specification of docs/semantics.md, Stage 1. Pooling,
// self-similarity and scores are computed in fp64 from the stored values. Three passes, each a
// parallel_for whose every index writes only its own outputs (so the result never depends on the
// thread count):
//   1. (smooth_k) raw K block sums, reduced per (sequence, kv head) in block order to the K mean;
//   2. per K block: pooled Ks and its self-similarity;
//   3. per (sequence, query head, query block): pooled Q, its self-similarity, the scores over the
//      visible key blocks, the selection (block_map_select.h) and the lut / counts row.
#include <algorithm>
#include <type_traits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/block_map_select.h"
#include "cpu/cpu.h"
#include "cpu/parallel.h"
#include "cpu/quant.h"
#include "sparge/half.h"
#include "validate/validate.h"

namespace sparge::cpu {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Where one sequence's rows live: the tensor batch index and the row ranges of q and k.
// Without varlen sequence b is batch b; with varlen every sequence is a row range of batch 0.
struct Sequence {
  std::int64_t batch = 0;
  std::int64_t q_begin = 0, q_len = 0;
  std::int64_t k_begin = 0, k_len = 0;
};

Sequence sequence(const BlockMapParams& p, std::int64_t s) {
  if (!p.varlen.enabled()) return {s, 0, p.q.shape[1], 0, p.k.shape[1]};
  const std::int32_t* cq = p.varlen.cu_seqlens_q;
  const std::int32_t* ck = p.varlen.cu_seqlens_k;
  return {0, cq[s], cq[s + 1] - cq[s], ck[s], ck[s + 1] - ck[s]};
}

// Key blocks [0, NV) are visible to query block qb; 0 for a query block past the sequence's end.
// Causal masking is bottom-right aligned: the block's last row i sees keys j <= i + Sk - Sq.
std::int64_t visible_blocks(const Sequence& seq, std::int64_t qb, int blkq, int blkk, bool causal) {
  const std::int64_t q0 = qb * blkq;
  if (q0 >= seq.q_len) return 0;
  const std::int64_t nk = num_blocks(seq.k_len, blkk);
  if (!causal) return nk;
  const std::int64_t last_row = std::min(q0 + blkq, seq.q_len) - 1;
  const std::int64_t last_key = last_row + seq.k_len - seq.q_len;
  if (last_key < 0) return 0;
  return std::min(nk, last_key / blkk + 1);
}

// Reads one row (b, row, h, :) of a [B, S, H, D] tensor as doubles; one dtype switch per row.
void load_row(const Tensor& t, std::int64_t b, std::int64_t row, std::int64_t h, double* out) {
  const std::int64_t d = t.shape[3];
  const std::int64_t base = t.offset(b, row, h, 0);
  const std::int64_t step = t.stride[3];
  switch (t.dtype) {
    case DType::f32: {
      const float* x = t.ptr<const float>() + base;
      for (std::int64_t i = 0; i < d; ++i) out[i] = x[i * step];
      break;
    }
    case DType::f16: {
      const std::uint16_t* x = t.ptr<const std::uint16_t>() + base;
      for (std::int64_t i = 0; i < d; ++i) out[i] = half_to_float(x[i * step]);
      break;
    }
    case DType::bf16: {
      const std::uint16_t* x = t.ptr<const std::uint16_t>() + base;
      for (std::int64_t i = 0; i < d; ++i) out[i] = bf16_to_float(x[i * step]);
      break;
    }
    default: break;
  }
}

// Mean and self-similarity of rows [r0, r1) of head h, each shifted by -shift (nullptr: none).
// sim = |sum_i x_i/|x_i||^2 / n^2, the mean pairwise cosine similarity in O(n d); a zero row adds
// nothing to the sum but counts in n. row and unit are scratch of D doubles.
double pool_block(const Tensor& t, std::int64_t b, std::int64_t r0, std::int64_t r1, std::int64_t h,
                  const double* shift, double* mean, double* row, double* unit) {
  const std::int64_t d = t.shape[3];
  std::fill(mean, mean + d, 0.0);
  std::fill(unit, unit + d, 0.0);
  for (std::int64_t r = r0; r < r1; ++r) {
    load_row(t, b, r, h, row);
    if (shift != nullptr) {
      for (std::int64_t i = 0; i < d; ++i) row[i] -= shift[i];
    }
    double norm2 = 0.0;
    for (std::int64_t i = 0; i < d; ++i) {
      mean[i] += row[i];
      norm2 += row[i] * row[i];
    }
    if (norm2 > 0.0) {
      const double inv = 1.0 / std::sqrt(norm2);
      for (std::int64_t i = 0; i < d; ++i) unit[i] += row[i] * inv;
    }
  }
  const auto n = static_cast<double>(r1 - r0);
  double sum2 = 0.0;
  for (std::int64_t i = 0; i < d; ++i) {
    mean[i] /= n;
    sum2 += unit[i] * unit[i];
  }
  return sum2 / (n * n);
}

// Four interleaved partial sums: a fixed order (so a fixed result) without one long chain of
// dependent fp64 additions, which made the pooled QK of long sequences latency-bound.
double dot(const double* a, const double* b, std::int64_t d) {
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  std::int64_t j = 0;
  for (; j + 4 <= d; j += 4) {
    for (int l = 0; l < 4; ++l) acc[l] += a[j + l] * b[j + l];
  }
  for (; j < d; ++j) acc[0] += a[j] * b[j];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

}  // namespace

Status build_block_map(const BlockMapParams& p) {
  const detail::Dims dims = detail::attention_dims(p.q, p.k, p.varlen);
  const std::int64_t nseq = dims.batch, hq = dims.hq, hk = dims.hk, d = dims.d;
  const std::int64_t nq = num_blocks(dims.sq, p.blkq);
  const std::int64_t nk = num_blocks(dims.sk, p.blkk);
  const int threads = p.exec.cpu_threads;
  const double scale = p.scale == 0.0f ? 1.0 / std::sqrt(static_cast<double>(d)) : static_cast<double>(p.scale);

  // pk[(s * Hk + hk) * NK + kb][D]: pooled (smoothed) K; k_sim alongside. Blocks past a sequence's
  // end keep pk = 0 and sim = 0 (they are never visible).
  std::vector<double> pk(static_cast<size_t>(nseq * hk * nk * d), 0.0);
  std::vector<double> k_sim(static_cast<size_t>(nseq * hk * nk), 0.0);
  std::vector<double> k_mean(static_cast<size_t>(nseq * hk * d), 0.0);
  const auto k_block = [&](std::int64_t i) { return pk.data() + i * d; };

  if (p.smooth_k) {
    // Raw block sums into pk, then the mean in block order: the same sum for any thread count.
    parallel_for(nseq * hk * nk, threads, [&](std::int64_t i) {
      const std::int64_t kb = i % nk, h = (i / nk) % hk, s = i / (nk * hk);
      const Sequence seq = sequence(p, s);
      const std::int64_t r0 = kb * p.blkk, r1 = std::min(r0 + p.blkk, seq.k_len);
      std::vector<double> row(static_cast<size_t>(d));
      double* sum = k_block(i);
      for (std::int64_t r = r0; r < r1; ++r) {
        load_row(p.k, seq.batch, seq.k_begin + r, h, row.data());
        for (std::int64_t j = 0; j < d; ++j) sum[j] += row[j];
      }
    });
    parallel_for(nseq * hk, threads, [&](std::int64_t i) {
      const Sequence seq = sequence(p, i / hk);
      if (seq.k_len == 0) return;
      double* mean = k_mean.data() + i * d;
      for (std::int64_t kb = 0; kb < nk; ++kb) {
        const double* sum = k_block(i * nk + kb);
        for (std::int64_t j = 0; j < d; ++j) mean[j] += sum[j];
      }
      for (std::int64_t j = 0; j < d; ++j) mean[j] /= static_cast<double>(seq.k_len);
    });
  }

  parallel_for(nseq * hk * nk, threads, [&](std::int64_t i) {
    const std::int64_t kb = i % nk, h = (i / nk) % hk, s = i / (nk * hk);
    const Sequence seq = sequence(p, s);
    const std::int64_t r0 = kb * p.blkk, r1 = std::min(r0 + p.blkk, seq.k_len);
    double sim = 0.0;
    if (r0 < r1) {
      std::vector<double> row(static_cast<size_t>(d)), unit(static_cast<size_t>(d));
      const double* shift = p.smooth_k ? k_mean.data() + (s * hk + h) * d : nullptr;
      sim = pool_block(p.k, seq.batch, seq.k_begin + r0, seq.k_begin + r1, h, shift, k_block(i), row.data(),
                       unit.data());
    } else {
      std::fill(k_block(i), k_block(i) + d, 0.0);
    }
    k_sim[static_cast<size_t>(i)] = sim;
    if (p.maybe_k_sim.present()) {
      p.maybe_k_sim.ptr<float>()[p.maybe_k_sim.offset(s, h, kb)] = static_cast<float>(sim);
    }
  });

  const std::int64_t group = hq / hk;
  parallel_for(nseq * hq * nq, threads, [&](std::int64_t i) {
    const std::int64_t qb = i % nq, h = (i / nq) % hq, s = i / (nq * hq);
    const std::int64_t kvh = h / group;
    const Sequence seq = sequence(p, s);
    const std::int64_t nv = visible_blocks(seq, qb, p.blkq, p.blkk, p.is_causal);
    const bool has_threshold = !p.simthreshd1.empty();
    const double threshold = has_threshold ? static_cast<double>(detail::per_head(p.simthreshd1, static_cast<int>(h))) : 0.0;

    double q_sim = 0.0;
    std::vector<double> pq(static_cast<size_t>(d)), row(static_cast<size_t>(d)), unit(static_cast<size_t>(d));
    const std::int64_t r0 = qb * p.blkq, r1 = std::min(r0 + p.blkq, seq.q_len);
    if (r0 < r1) {
      q_sim = pool_block(p.q, seq.batch, seq.q_begin + r0, seq.q_begin + r1, h, nullptr, pq.data(), row.data(),
                         unit.data());
    }

    // Scores of the visible blocks; a K block that is not self-similar is a forced column.
    std::vector<double> scores(static_cast<size_t>(nv));
    std::vector<unsigned char> forced_col(static_cast<size_t>(nv)), keep(static_cast<size_t>(nv));
    const std::int64_t kv_row = (s * hk + kvh) * nk;
    for (std::int64_t kb = 0; kb < nv; ++kb) {
      if (has_threshold && !(k_sim[static_cast<size_t>(kv_row + kb)] > threshold)) {
        forced_col[kb] = 1;
        scores[kb] = kNegInf;
        continue;
      }
      scores[kb] = scale * dot(pq.data(), k_block(kv_row + kb), d);
    }

    SelectionRule rule;
    rule.use_topk = !p.topk.empty();
    if (rule.use_topk) {
      rule.topk = detail::per_head(p.topk, static_cast<int>(h));
    } else {
      rule.cdfthreshd = detail::per_head(p.cdfthreshd, static_cast<int>(h));
    }
    rule.attention_sink = p.attention_sink;
    const bool forced_row = has_threshold && nv > 0 && !(q_sim > threshold);
    SelectionScratch scratch;
    const std::int64_t count = select_row(scores, forced_col, forced_row, rule, scratch, keep);

    std::int32_t* lut = p.lut.ptr<std::int32_t>();
    std::int64_t slot = 0;
    for (std::int64_t kb = 0; kb < nv; ++kb) {
      if (keep[kb]) lut[p.lut.offset(s, h, qb, slot++)] = static_cast<std::int32_t>(kb);
    }
    for (; slot < nk; ++slot) lut[p.lut.offset(s, h, qb, slot)] = -1;
    p.counts.ptr<std::int32_t>()[p.counts.offset(s, h, qb)] = static_cast<std::int32_t>(count);

    if (p.maybe_scores.present()) {
      float* out = p.maybe_scores.ptr<float>();
      for (std::int64_t kb = 0; kb < nk; ++kb) {
        out[p.maybe_scores.offset(s, h, qb, kb)] = kb < nv ? static_cast<float>(scores[kb]) : -INFINITY;
      }
    }
    if (p.maybe_q_sim.present()) {
      p.maybe_q_sim.ptr<float>()[p.maybe_q_sim.offset(s, h, qb)] = static_cast<float>(q_sim);
    }
  });

  // The fp8 recipe's Q and K (docs/quantized.md), K smoothed with this block map's own mean
  // rounded to f32 (no varlen: validation). The outputs are contiguous.
  if (const QuantizedQK& out = p.maybe_fp8_qk; out.present()) {
    std::vector<float> km(k_mean.size());
    for (size_t i = 0; i < km.size(); ++i) km[i] = static_cast<float>(k_mean[i]);
    const QuantHost qh = quantize_qk_host(p.q, p.k, p.blkk, p.smooth_k, scale, std::move(km), threads, false);
    const auto put = [](const Tensor& t, const auto& v) {
      std::copy(v.begin(), v.end(), static_cast<std::remove_cvref_t<decltype(v[0])>*>(t.data));
    };
    put(out.q8, qh.q8);
    put(out.q_scale, qh.q_scale);
    put(out.k8, qh.k8);
    put(out.k_scale, qh.k_scale);
    put(out.k_mean, qh.k_mean);
  }
  return {};
}

}  // namespace sparge::cpu
