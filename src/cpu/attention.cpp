// Block-sparse attention over a LUT (docs/semantics.md, Stage 2), the specification the GPU kernels
// must reproduce. Per (sequence, query head, query block) the LUT row is walked in order with an
// online softmax in fp64: per-token causal masking and key tails inside each block, and the
// pv_threshold skip decided for the whole query block. The LUT entries were range-checked by
// detail::validate, so every block read here lies inside its sequence.
#include <algorithm>
#include <vector>

#include "cpu/attention_common.h"
#include "cpu/cpu.h"
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
  for (std::int64_t r = 0; r < n; ++r) store_row(p.o, p.maybe_lse, s, t.b, h, i0 + r, acc.data() + r * d, m[r], l[r]);
}
}  // namespace

Status block_sparse_attention(const BlockSparseAttentionParams& p) {
  const double scale = effective_scale(p.scale, p.q.shape[3]);
  for_each_query_tile(p.q, p.k, p.v, p.varlen, p.blkq, p.exec.cpu_threads,
                      [&](const Seq& s, std::int64_t b, std::int64_t h, std::int64_t qb, const KvHead& kv) {
                        sparse_query_block(SparseTask{p, s, b, kv, scale}, h, qb);
                      });
  return {};
}

}  // namespace sparge::cpu
