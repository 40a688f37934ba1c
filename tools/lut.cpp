#include "lut.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

namespace sparge::tool {

std::int64_t BlockGeom::visible(std::int64_t qb) const {
  if (!causal) return nk();
  const std::int64_t last_row = std::min((qb + 1) * blkq, sq) - 1;
  const std::int64_t last_key = last_row + sk - sq;  // the last key the block's last row sees
  if (last_key < 0) return 0;
  return std::min(nk(), last_key / blkk + 1);
}

std::int64_t BlockGeom::pairs(std::int64_t qb, std::int64_t kb) const {
  const std::int64_t r0 = qb * blkq, r1 = std::min(r0 + blkq, sq);
  const std::int64_t k0 = kb * blkk, k1 = std::min(k0 + blkk, sk);
  if (r1 <= r0 || k1 <= k0) return 0;
  if (!causal) return (r1 - r0) * (k1 - k0);
  std::int64_t n = 0;
  for (std::int64_t i = r0; i < r1; ++i) {
    const std::int64_t end = std::min(k1, i + sk - sq + 1);  // keys [k0, end) are visible to row i
    n += std::max<std::int64_t>(0, end - k0);
  }
  return n;
}

std::vector<std::int64_t> pair_table(const BlockGeom& g) {
  const std::int64_t nq = g.nq(), nk = g.nk();
  std::vector<std::int64_t> t(static_cast<size_t>(nq * nk));
  for (std::int64_t qb = 0; qb < nq; ++qb) {
    for (std::int64_t kb = 0; kb < nk; ++kb) t[static_cast<size_t>(qb * nk + kb)] = g.pairs(qb, kb);
  }
  return t;
}

LutStats lut_stats(const BlockGeom& g, const std::vector<std::int64_t>& pairs, const std::int32_t* lut,
                   const std::int32_t* counts, std::int64_t rows) {
  LutStats s;
  const std::int64_t nq = g.nq(), nk = g.nk();
  s.rows = rows;
  s.grid = rows * nk;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t qb = r % nq;
    const std::int32_t c = counts[r];
    s.sum_counts += c;
    s.sum_visible += g.visible(qb);
    for (std::int32_t e = 0; e < c && e < nk; ++e) {
      const std::int32_t kb = lut[r * nk + e];
      if (kb >= 0 && kb < nk) s.pairs += pairs[static_cast<size_t>(qb * nk + kb)];
    }
  }
  return s;
}

std::int64_t check_lut(const BlockGeom& g, const std::int32_t* lut, const std::int32_t* counts,
                       std::int64_t rows, std::string* first) {
  const std::int64_t nq = g.nq(), nk = g.nk();
  std::int64_t bad = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t qb = r % nq, nv = g.visible(qb);
    const std::int32_t c = counts[r];
    const std::int32_t* row = lut + r * nk;
    std::ostringstream why;
    if (c < 0 || c > nv) {
      why << "count " << c << " outside [0, " << nv << "] (visible blocks)";
    } else if (c == 0 && nv > 0) {
      why << "count 0 although " << nv << " blocks are visible";
    } else {
      for (std::int64_t e = 0; e < nk && why.tellp() == 0; ++e) {
        const std::int32_t kb = row[e];
        if (e < c) {
          if (kb < 0 || kb >= nv) why << "entry " << e << " = " << kb << " is not a visible block (NV = " << nv << ")";
          else if (e > 0 && kb <= row[e - 1]) why << "entry " << e << " = " << kb << " does not ascend (previous " << row[e - 1] << ")";
        } else if (kb != -1) {
          why << "padding entry " << e << " = " << kb << " (expected -1 after count " << c << ")";
        }
      }
    }
    if (why.tellp() != 0) {
      if (bad == 0 && first != nullptr) {
        std::ostringstream os;
        os << "row " << r << " (flat b*h, qb " << qb << "): " << why.str();
        *first = os.str();
      }
      ++bad;
    }
  }
  return bad;
}

void full_lut(const BlockGeom& g, std::int64_t rows, std::vector<std::int32_t>& lut, std::vector<std::int32_t>& counts) {
  const std::int64_t nq = g.nq(), nk = g.nk();
  lut.assign(static_cast<size_t>(rows * nk), -1);
  counts.assign(static_cast<size_t>(rows), 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t nv = g.visible(r % nq);
    for (std::int64_t kb = 0; kb < nv; ++kb) lut[static_cast<size_t>(r * nk + kb)] = static_cast<std::int32_t>(kb);
    counts[static_cast<size_t>(r)] = static_cast<std::int32_t>(nv);
  }
}

namespace {
// Rankable blocks (visible, finite score) by score descending, ties toward the lower index.
std::vector<std::int32_t> ranking(const float* s, std::int64_t nv) {
  std::vector<std::int32_t> idx;
  for (std::int64_t kb = 0; kb < nv; ++kb) {
    if (std::isfinite(s[kb])) idx.push_back(static_cast<std::int32_t>(kb));
  }
  std::stable_sort(idx.begin(), idx.end(), [s](std::int32_t a, std::int32_t b) { return s[a] > s[b]; });
  return idx;
}

// Number of ranked blocks kept by the rule, and the cumulative probabilities.
std::int64_t kept(const float* s, std::int64_t nv, const std::vector<std::int32_t>& rank, const SelectRule& rule,
                  std::vector<double>* cum_out) {
  const std::int64_t r = static_cast<std::int64_t>(rank.size());
  if (r == 0) return 0;
  if (rule.topk > 0) {
    const auto n = static_cast<std::int64_t>(std::floor(rule.topk * static_cast<double>(nv)));
    return std::min(r, std::max<std::int64_t>(1, n));
  }
  const double m = s[rank[0]];
  double z = 0;
  for (auto kb : rank) z += std::exp(static_cast<double>(s[kb]) - m);
  std::vector<double> cum;
  double acc = 0;
  std::int64_t n = r;
  for (std::int64_t i = 0; i < r; ++i) {
    acc += std::exp(static_cast<double>(s[rank[static_cast<size_t>(i)]]) - m) / z;
    cum.push_back(acc);
    if (acc >= rule.cdf && n == r) n = i + 1;
  }
  if (cum_out != nullptr) *cum_out = std::move(cum);
  return n;
}
}  // namespace

std::vector<std::int32_t> select_from_scores(const float* s, std::int64_t nv, bool q_self_similar,
                                             const SelectRule& rule) {
  std::vector<char> on(static_cast<size_t>(nv), 0);
  if (!q_self_similar) {
    std::fill(on.begin(), on.end(), 1);
  } else {
    for (std::int64_t kb = 0; kb < nv; ++kb) on[static_cast<size_t>(kb)] = !std::isfinite(s[kb]);  // forced columns
    const auto rank = ranking(s, nv);
    const std::int64_t n = kept(s, nv, rank, rule, nullptr);
    for (std::int64_t i = 0; i < n; ++i) on[static_cast<size_t>(rank[static_cast<size_t>(i)])] = 1;
    if (rule.sink && nv > 0) on[0] = 1;
  }
  std::vector<std::int32_t> out;
  for (std::int64_t kb = 0; kb < nv; ++kb) {
    if (on[static_cast<size_t>(kb)]) out.push_back(static_cast<std::int32_t>(kb));
  }
  return out;
}

double selection_margin(const float* s, std::int64_t nv, const SelectRule& rule) {
  const auto rank = ranking(s, nv);
  std::vector<double> cum;
  const std::int64_t n = kept(s, nv, rank, rule, &cum);
  const std::int64_t r = static_cast<std::int64_t>(rank.size());
  double scale = 0;
  for (auto kb : rank) scale = std::max(scale, std::fabs(static_cast<double>(s[kb])));
  double margin = INFINITY;
  if (n > 0 && n < r) {
    const double gap = static_cast<double>(s[rank[static_cast<size_t>(n - 1)]]) - s[rank[static_cast<size_t>(n)]];
    margin = gap / std::max(scale, 1e-30);
  }
  if (rule.cdf > 0 && !cum.empty()) {
    // The cut moves when a cumulative sum near the cut crosses the threshold under rounding.
    if (n >= 1) margin = std::min(margin, std::fabs(cum[static_cast<size_t>(n - 1)] - rule.cdf));
    if (n >= 2) margin = std::min(margin, std::fabs(cum[static_cast<size_t>(n - 2)] - rule.cdf));
  }
  return margin;
}

void expand_row_mask(const BlockGeom& g, std::int64_t qb, const std::int32_t* lut_row, std::int32_t count,
                     std::uint8_t* mask) {
  const std::int64_t r0 = qb * g.blkq, r1 = std::min(r0 + g.blkq, g.sq);
  const std::int64_t rows = r1 - r0;
  std::fill(mask, mask + rows * g.sk, std::uint8_t{0});
  for (std::int32_t e = 0; e < count; ++e) {
    const std::int64_t kb = lut_row[e];
    if (kb < 0 || kb >= g.nk()) continue;
    const std::int64_t k0 = kb * g.blkk, k1 = std::min(k0 + g.blkk, g.sk);
    for (std::int64_t i = r0; i < r1; ++i) {
      for (std::int64_t j = k0; j < k1; ++j) mask[(i - r0) * g.sk + j] = g.sees(i, j) ? 1 : 0;
    }
  }
}

std::int32_t topk_reference(const float* row, std::int64_t n, int k, std::int32_t* out) {
  std::vector<float> sel;
  for (std::int64_t j = 0; j < n; ++j) {
    if (!(std::isinf(row[j]) && row[j] < 0)) sel.push_back(row[j]);
  }
  std::int32_t filled = 0;
  if (static_cast<std::int64_t>(sel.size()) < k) {
    // Fewer selectable values than k: the k-th largest is -inf, so every selectable index is
    // strictly above it and they come out ascending by index. (Exactly k selectable: the k-th largest
    // is the smallest of them, and its ties come after the values above it, as below.)
    for (std::int64_t j = 0; j < n; ++j) {
      if (!(std::isinf(row[j]) && row[j] < 0)) out[filled++] = static_cast<std::int32_t>(j);
    }
  } else {
    const std::int64_t kk = k;
    std::nth_element(sel.begin(), sel.begin() + (kk - 1), sel.end(), std::greater<float>());
    const float kth = sel[static_cast<size_t>(kk - 1)];
    for (std::int64_t j = 0; j < n; ++j) {
      if (row[j] > kth) out[filled++] = static_cast<std::int32_t>(j);
    }
    for (std::int64_t j = 0; j < n && filled < k; ++j) {
      if (row[j] == kth) out[filled++] = static_cast<std::int32_t>(j);
    }
  }
  for (std::int32_t e = filled; e < k; ++e) out[e] = -1;
  return filled;
}

}  // namespace sparge::tool
