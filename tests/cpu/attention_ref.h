// Test helpers for attention-shaped operations, reusable by any test: float tensors of a chosen
// dtype and storage layout inside guarded buffers, LUT expansion into a dense u8 mask, random
// LUTs, and a deliberately naive attention (one row at a time, plain loops, fp64) that shares no
// code with the library.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "harness/harness.h"

namespace sparge::test::ref {

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class Layout { nhd, hnd, pad };
inline const char* layout_name(Layout l) { return l == Layout::nhd ? "nhd" : l == Layout::hnd ? "hnd" : "pad"; }

// A guarded host buffer of f32, f16 or bf16 elements.
class FloatBuf {
 public:
  FloatBuf() = default;
  FloatBuf(DType t, std::size_t n) : t_(t) {
    if (t == DType::f32) f_.resize(n); else h_.resize(n);
  }
  DType dtype() const { return t_; }
  void* data() { return t_ == DType::f32 ? static_cast<void*>(f_.data()) : static_cast<void*>(h_.data()); }
  const void* data() const { return t_ == DType::f32 ? static_cast<const void*>(f_.data()) : static_cast<const void*>(h_.data()); }
  std::size_t size() const { return t_ == DType::f32 ? f_.size() : h_.size(); }
  void poison() { if (t_ == DType::f32) f_.poison(); else h_.poison(); }
  bool guards_intact() const { return t_ == DType::f32 ? f_.guards_intact() : h_.guards_intact(); }
  float get(std::int64_t i) const { return load_as_float(data(), t_, i); }
  void set(std::int64_t i, float x) { store_from_float(data(), t_, i, x); }

 private:
  DType t_ = DType::f32;
  Guarded<float> f_;
  Guarded<std::uint16_t> h_;
};

// A logical [B, S, H, D] float tensor stored as NHD, HND, or NHD with padding between heads,
// rows and batches (the padding is never part of the view).
struct Tensor4 {
  std::int64_t b = 0, s = 0, h = 0, d = 0;
  Layout layout = Layout::nhd;
  FloatBuf buf;
  Tensor view;

  Tensor4() = default;
  Tensor4(DType t, std::int64_t b_, std::int64_t s_, std::int64_t h_, std::int64_t d_, Layout l)
      : b(b_), s(s_), h(h_), d(d_), layout(l) {
    std::int64_t st[4];
    std::int64_t total;
    if (l == Layout::hnd) {
      st[3] = 1; st[1] = d; st[2] = s * d; st[0] = h * s * d; total = b * st[0];
    } else if (l == Layout::nhd) {
      st[3] = 1; st[2] = d; st[1] = h * d; st[0] = s * h * d; total = b * st[0];
    } else {
      st[3] = 1; st[2] = d + 3; st[1] = h * (d + 3) + 1; st[0] = s * st[1] + 7; total = b * st[0];
    }
    buf = FloatBuf(t, static_cast<std::size_t>(std::max<std::int64_t>(total, 1)));
    buf.poison();
    view = make_tensor(buf.data(), t, {b, s, h, d}, {st[0], st[1], st[2], st[3]});
  }
  void refresh() { view.data = buf.data(); }  // after a copy/move of the owner
  std::int64_t logical(std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3) const {
    return ((i0 * s + i1) * h + i2) * d + i3;
  }
  // Stores logical NHD-contiguous values (rounded to the dtype).
  void fill(const std::vector<float>& x) {
    for (std::int64_t i0 = 0; i0 < b; ++i0)
      for (std::int64_t i1 = 0; i1 < s; ++i1)
        for (std::int64_t i2 = 0; i2 < h; ++i2)
          for (std::int64_t i3 = 0; i3 < d; ++i3) buf.set(view.offset(i0, i1, i2, i3), x[logical(i0, i1, i2, i3)]);
  }
  std::vector<float> read() const {
    std::vector<float> x(static_cast<std::size_t>(b * s * h * d));
    for (std::int64_t i0 = 0; i0 < b; ++i0)
      for (std::int64_t i1 = 0; i1 < s; ++i1)
        for (std::int64_t i2 = 0; i2 < h; ++i2)
          for (std::int64_t i3 = 0; i3 < d; ++i3) x[logical(i0, i1, i2, i3)] = buf.get(view.offset(i0, i1, i2, i3));
    return x;
  }
};

// A LUT [B, H, NQ, NK] with counts [B, H, NQ], -1 padded.
struct Lut {
  std::int64_t b = 0, h = 0, nq = 0, nk = 0;
  std::vector<std::int32_t> lut, counts;
  Lut() = default;
  Lut(std::int64_t b_, std::int64_t h_, std::int64_t nq_, std::int64_t nk_)
      : b(b_), h(h_), nq(nq_), nk(nk_), lut(static_cast<size_t>(std::max<std::int64_t>(b_ * h_ * nq_ * nk_, 1)), -1),
        counts(static_cast<size_t>(std::max<std::int64_t>(b_ * h_ * nq_, 1)), 0) {}  // never a null data()
  std::int32_t& at(std::int64_t bi, std::int64_t hi, std::int64_t qb, std::int64_t e) {
    return lut[static_cast<size_t>(((bi * h + hi) * nq + qb) * nk + e)];
  }
  std::int32_t& count(std::int64_t bi, std::int64_t hi, std::int64_t qb) {
    return counts[static_cast<size_t>((bi * h + hi) * nq + qb)];
  }
  void push(std::int64_t bi, std::int64_t hi, std::int64_t qb, std::int32_t kb) {
    std::int32_t& c = count(bi, hi, qb);
    at(bi, hi, qb, c++) = kb;
  }
  Tensor lut_view() { return make_tensor(lut.data(), DType::i32, {b, h, nq, nk}); }
  Tensor counts_view() { return make_tensor(counts.data(), DType::i32, {b, h, nq}); }
};

// Each key block of a sequence (nk_seq[bi] blocks) enters each row with probability `density`,
// ascending. density 0 = every row empty, 1 = every row full.
inline Lut random_lut(std::mt19937_64& rng, std::int64_t b, std::int64_t h, std::int64_t nq, std::int64_t nk,
                      const std::vector<std::int64_t>& nk_seq, double density) {
  Lut l(b, h, nq, nk);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t hi = 0; hi < h; ++hi)
      for (std::int64_t qb = 0; qb < nq; ++qb)
        for (std::int64_t kb = 0; kb < nk_seq[static_cast<size_t>(bi)]; ++kb)
          if (density >= 1.0 || u(rng) < density) l.push(bi, hi, qb, static_cast<std::int32_t>(kb));
  return l;
}

// The u8 mask [B, H, Sq, Sk] that a LUT selects (block granularity; causal masking is left to the
// attention's own is_causal). lens_q/lens_k: each sequence's lengths (entries beyond are 0).
inline std::vector<std::uint8_t> lut_to_mask(Lut& l, int blkq, int blkk, std::int64_t sq, std::int64_t sk,
                                             const std::vector<std::int64_t>& lens_q,
                                             const std::vector<std::int64_t>& lens_k) {
  std::vector<std::uint8_t> m(static_cast<size_t>(l.b * l.h * sq * sk), 0);
  for (std::int64_t bi = 0; bi < l.b; ++bi)
    for (std::int64_t hi = 0; hi < l.h; ++hi)
      for (std::int64_t qb = 0; qb < l.nq; ++qb)
        for (std::int32_t e = 0; e < l.count(bi, hi, qb); ++e) {
          const std::int64_t kb = l.at(bi, hi, qb, e);
          for (std::int64_t i = qb * blkq; i < std::min<std::int64_t>((qb + 1) * blkq, lens_q[bi]); ++i)
            for (std::int64_t j = kb * blkk; j < std::min<std::int64_t>((kb + 1) * blkk, lens_k[bi]); ++j)
              m[static_cast<size_t>(((bi * l.h + hi) * sq + i) * sk + j)] = 1;
        }
  return m;
}

// Naive attention of one sequence: logical NHD inputs q [Sq, Hq, D] (row q0 onwards of a tensor
// with Hq heads), etc. attend(h, i, j) says whether row i of head h attends key j; contributes
// (optional) whether that key's value enters the numerator (the pv_threshold reference; its
// exponential always enters the denominator). Returns O [Sq, Hq, D] and LSE [Hq, Sq].
struct NaiveOut {
  std::vector<double> o, lse;
};
using Pred = std::function<bool(std::int64_t h, std::int64_t i, std::int64_t j)>;
inline NaiveOut naive_attention(const float* q, const float* k, const float* v, std::int64_t sq, std::int64_t sk,
                                std::int64_t hq, std::int64_t hk, std::int64_t d, double scale, const Pred& attend,
                                const Pred& contributes = nullptr) {
  NaiveOut out;
  out.o.assign(static_cast<size_t>(sq * hq * d), 0.0);
  out.lse.assign(static_cast<size_t>(hq * sq), -kInf);
  std::vector<double> logit(static_cast<size_t>(sk));
  for (std::int64_t h = 0; h < hq; ++h) {
    const std::int64_t g = h / (hq / hk);
    for (std::int64_t i = 0; i < sq; ++i) {
      double mx = -kInf;
      for (std::int64_t j = 0; j < sk; ++j) {
        if (!attend(h, i, j)) { logit[j] = -kInf; continue; }
        double dot = 0.0;
        for (std::int64_t e = 0; e < d; ++e) dot += static_cast<double>(q[(i * hq + h) * d + e]) * k[(j * hk + g) * d + e];
        logit[j] = scale * dot;
        mx = std::max(mx, logit[j]);
      }
      if (mx == -kInf) continue;
      double den = 0.0;
      std::vector<double> num(static_cast<size_t>(d), 0.0);
      for (std::int64_t j = 0; j < sk; ++j) {
        if (logit[j] == -kInf) continue;
        const double w = std::exp(logit[j] - mx);
        den += w;
        if (contributes && !contributes(h, i, j)) continue;
        for (std::int64_t e = 0; e < d; ++e) num[e] += w * v[(j * hk + g) * d + e];
      }
      for (std::int64_t e = 0; e < d; ++e) out.o[static_cast<size_t>((i * hq + h) * d + e)] = num[e] / den;
      out.lse[static_cast<size_t>(h * sq + i)] = mx + std::log(den);
    }
  }
  return out;
}

// Elementwise |out - ref| <= rel * |ref| + abs, with NaN/Inf classes equal. Returns "" when
// everything matches, else a description of the first mismatch and the count.
template <class R>
std::string check_close(const float* out, const R* ref, std::size_t n, double rel, double abs) {
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double o = out[i], r = static_cast<double>(ref[i]);
    bool ok;
    if (!std::isfinite(o) || !std::isfinite(r)) {
      ok = (std::isnan(o) && std::isnan(r)) || (o == r);
    } else {
      ok = std::abs(o - r) <= rel * std::abs(r) + abs;
    }
    if (!ok && bad++ == 0) first = i;
  }
  if (bad == 0) return "";
  std::ostringstream os;
  os.precision(9);
  os << bad << " of " << n << " differ; first at " << first << ": out=" << out[first]
     << " ref=" << static_cast<double>(ref[first]);
  return os.str();
}

// Bitwise equality of two float arrays (NaN payloads and -0.0 included).
inline std::string check_bitwise(const float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      std::ostringstream os;
      os.precision(9);
      os << "first bitwise difference at " << i << ": " << a[i] << " vs " << b[i];
      return os.str();
    }
  }
  return "";
}

// Output rounding of a dtype, as a relative tolerance (about one unit in the last place).
inline double out_rel_tol(DType t) {
  return t == DType::f32 ? 3e-7 : t == DType::f16 ? 1.0e-3 : 8.0e-3;
}

}  // namespace sparge::test::ref
