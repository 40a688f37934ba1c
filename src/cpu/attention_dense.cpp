// The dense attention oracle (docs/semantics.md): every other path is tested against it. fp64
// throughout, two passes per row: the row's logits and their max first, then the exponentials,
// their sum and the weighted sum of V. Masks: the optional u8 mask, causal (bottom-right aligned
// per sequence) and the key tail.
#include <algorithm>
#include <vector>

#include "cpu/attention_common.h"
#include "cpu/cpu.h"
#include "validate/validate.h"

namespace sparge::cpu {

namespace {
using namespace attn;

// Query rows per task: enough to reuse each V row many times in the P.V loop, few enough that the
// [rows x Sk] logit buffer stays modest at long key lengths.
constexpr std::int64_t kRows = 16;

void dense_rows(const DenseAttentionParams& p, const Seq& s, std::int64_t b, std::int64_t h, const KvHead& kv,
                double scale, std::int64_t i0) {
  const std::int64_t n = std::min(kRows, s.sq - i0);
  const std::int64_t d = kv.d;
  std::vector<double> q;
  load_q_rows(p.q, s, h, i0, n, q);

  std::int64_t limit[kRows];
  std::int64_t longest = 0;
  for (std::int64_t r = 0; r < n; ++r) {
    limit[r] = key_limit(p.is_causal, i0 + r, s.sq, s.sk);
    longest = std::max(longest, limit[r]);
  }
  const std::int64_t chunks = (longest + kChunk - 1) / kChunk;
  const std::int64_t lds = std::max<std::int64_t>(chunks * kChunk, 1);
  std::vector<double> sc(static_cast<size_t>(n * lds));
  for (std::int64_t c = 0; c < chunks; ++c) score_chunk(q.data(), n, kv, c, scale, sc.data() + c * kChunk, lds);

  // Pass 1: mask, then the row max over the attended keys.
  const std::uint8_t* mask = p.maybe_mask.present() ? p.maybe_mask.ptr<std::uint8_t>() : nullptr;
  double m[kRows], l[kRows];
  for (std::int64_t r = 0; r < n; ++r) {
    double* row = sc.data() + r * lds;
    double mx = kNegInf;
    for (std::int64_t j = 0; j < chunks * kChunk; ++j) {
      const bool keep = j < limit[r] && (mask == nullptr || mask[p.maybe_mask.offset(b, h, i0 + r, j)] != 0);
      if (!keep) row[j] = kNegInf;
      mx = std::max(mx, row[j]);
    }
    m[r] = mx;
  }
  // Pass 2: exponentials (in place), their sum, and P.V.
  for (std::int64_t r = 0; r < n; ++r) {
    double* row = sc.data() + r * lds;
    double sum = 0.0;
    for (std::int64_t j = 0; j < chunks * kChunk; ++j) {
      row[j] = m[r] == kNegInf ? 0.0 : std::exp(row[j] - m[r]);
      sum += row[j];
    }
    l[r] = sum;
  }
  std::vector<double> acc(static_cast<size_t>(n * d), 0.0);
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t j0 = c * kChunk;
    pv_accumulate(sc.data() + j0, lds, n, kv, j0, std::min(kChunk, longest - j0), acc.data());
  }
  for (std::int64_t r = 0; r < n; ++r) store_row(p.o, p.maybe_lse, s, b, h, i0 + r, acc.data() + r * d, m[r], l[r]);
}
}  // namespace

Status dense_attention(const DenseAttentionParams& p) {
  const double scale = effective_scale(p.scale, p.q.shape[3]);
  for_each_query_tile(p.q, p.k, p.v, p.varlen, kRows, p.exec.cpu_threads,
                      [&](const Seq& s, std::int64_t b, std::int64_t h, std::int64_t t, const KvHead& kv) {
                        dense_rows(p, s, b, h, kv, scale, t * kRows);
                      });
  return {};
}

}  // namespace sparge::cpu
