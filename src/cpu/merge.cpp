// Merging two partial attention results by their LSE (docs/semantics.md, Merge), in fp64:
// lse = M + log1p(exp(min - M)) with M = max(lse_a, lse_b), o = exp(lse_a - lse) o_a +
// exp(lse_b - lse) o_b. Both sides empty (-inf) gives O = 0, LSE = -inf. Each (b, s, h) row reads
// all its inputs before writing, so outputs may alias inputs element for element.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/attention_common.h"
#include "cpu/cpu.h"

namespace sparge::cpu {

Status merge_attention(const MergeAttentionParams& p) {
  const std::int64_t batch = p.o_a.shape[0], seq = p.o_a.shape[1], heads = p.o_a.shape[2], d = p.o_a.shape[3];
  const std::int64_t rows = batch * seq * heads;
  parallel_for(rows, p.exec.cpu_threads, [&](std::int64_t row) {
    const std::int64_t h = row % heads, s = (row / heads) % seq, b = row / (heads * seq);
    const double la = p.lse_a.ptr<const float>()[p.lse_a.offset(b, h, s)];
    const double lb = p.lse_b.ptr<const float>()[p.lse_b.offset(b, h, s)];
    const double hi = std::max(la, lb), lo = std::min(la, lb);
    double lse = attn::kNegInf, wa = 0.0, wb = 0.0;
    if (hi != attn::kNegInf) {
      lse = hi + std::log1p(std::exp(lo - hi));
      wa = std::exp(la - lse);
      wb = std::exp(lb - lse);
    }
    // A side with weight 0 (an empty partial) is not read into the sum, so whatever its O holds
    // cannot leak in (0 * inf would be NaN).
    double out[256];
    std::vector<double> big;
    double* o = out;
    if (d > 256) {
      big.resize(static_cast<size_t>(d));
      o = big.data();
    }
    for (std::int64_t e = 0; e < d; ++e) {
      double v = 0.0;
      if (wa > 0.0) v += wa * load_as_float(p.o_a.data, p.o_a.dtype, p.o_a.offset(b, s, h, e));
      if (wb > 0.0) v += wb * load_as_float(p.o_b.data, p.o_b.dtype, p.o_b.offset(b, s, h, e));
      o[e] = v;
    }
    for (std::int64_t e = 0; e < d; ++e) store_from_float(p.o.data, p.o.dtype, p.o.offset(b, s, h, e), static_cast<float>(o[e]));
    p.lse.ptr<float>()[p.lse.offset(b, h, s)] = static_cast<float>(lse);
  }, 64);
  return {};
}

}  // namespace sparge::cpu
