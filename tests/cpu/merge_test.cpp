// merge_attention on the CPU backend (docs/semantics.md, Merge):
//   Merge     - against the formula evaluated naively here in fp64, over dtypes (each of o_a, o_b,
//               o independently), layouts, empty sides (-inf), both sides empty (O = 0 exactly,
//               LSE = -inf even when the empty sides' O hold inf/NaN), LSE spreads of 1e4;
//               symmetry (a, b) == (b, a), outputs aliasing inputs, any thread count (bitwise);
//   MergeBad  - one bad input per parameter: !ok, a message naming it, outputs untouched.
// (Merging real attention halves is checked in attention_test.cpp, ATTN_MERGE.)
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attention_ref.h"
#include "harness/harness.h"

namespace sparge::test {
namespace {
using namespace ref;

struct MSpec {
  std::int64_t b = 2, s = 37, h = 3, d = 24;
  DType ta = DType::f32, tb = DType::f32, to = DType::f32;
  Layout layout = Layout::nhd;
  double lse_spread = 5.0;  // lse values uniform in [-spread, spread]
  int threads = 0;
};

std::string mname(const char* op, const MSpec& m) {
  return Name(op)("b", m.b)("s", m.s)("h", m.h)("d", m.d)("o_a", to_string(m.ta))("o_b", to_string(m.tb))(
      "o", to_string(m.to))("layout", layout_name(m.layout))("lse_spread", m.lse_spread);
}

// Inputs and outputs of one merge. lse buffers are [B, H, S] contiguous.
struct MergeRun {
  MSpec m;
  Tensor4 oa, ob, o;
  Guarded<float> la, lb, l;
  std::vector<float> oal, obl;  // stored input values, logical
  MergeAttentionParams params() {
    MergeAttentionParams p;
    p.o_a = oa.view;
    p.o_b = ob.view;
    p.o = o.view;
    p.lse_a = make_tensor(la.data(), DType::f32, {m.b, m.h, m.s});
    p.lse_b = make_tensor(lb.data(), DType::f32, {m.b, m.h, m.s});
    p.lse = make_tensor(l.data(), DType::f32, {m.b, m.h, m.s});
    p.exec.cpu_threads = m.threads;
    return p;
  }
};

// Random inputs; every 7th row has lse_a = -inf, every 11th lse_b = -inf (so some rows have
// both), and an empty side's O holds inf/NaN garbage that must not leak into the result.
std::unique_ptr<MergeRun> make_merge(const MSpec& m, std::mt19937_64& rng) {
  auto r = std::make_unique<MergeRun>();
  r->m = m;
  r->oa = Tensor4(m.ta, m.b, m.s, m.h, m.d, m.layout);
  r->ob = Tensor4(m.tb, m.b, m.s, m.h, m.d, m.layout);
  r->o = Tensor4(m.to, m.b, m.s, m.h, m.d, m.layout == Layout::hnd ? Layout::pad : Layout::hnd);
  const size_t rows = static_cast<size_t>(m.b * m.h * m.s);
  for (Guarded<float>* g : {&r->la, &r->lb, &r->l}) {
    g->resize(rows);
    g->poison();
  }
  std::vector<float> a(static_cast<size_t>(m.b * m.s * m.h * m.d)), b(a.size());
  fill_normal(a, rng);
  fill_normal(b, rng);
  std::vector<float> la(rows), lb(rows);
  fill_uniform(la, rng, static_cast<float>(-m.lse_spread), static_cast<float>(m.lse_spread));
  fill_uniform(lb, rng, static_cast<float>(-m.lse_spread), static_cast<float>(m.lse_spread));
  for (size_t i = 0; i < rows; ++i) {
    const std::int64_t bi = static_cast<std::int64_t>(i) / (m.h * m.s), hi = (static_cast<std::int64_t>(i) / m.s) % m.h,
                       si = static_cast<std::int64_t>(i) % m.s;
    const std::int64_t o_row = (bi * m.s + si) * m.h + hi;  // logical O row of this lse entry
    if (i % 7 == 3) {
      la[i] = -INFINITY;
      for (std::int64_t e = 0; e < m.d; ++e) a[o_row * m.d + e] = e % 2 ? INFINITY : NAN;
    }
    if (i % 11 == 3) {
      lb[i] = -INFINITY;
      for (std::int64_t e = 0; e < m.d; ++e) b[o_row * m.d + e] = e % 2 ? -INFINITY : NAN;
    }
    r->la[i] = la[i];
    r->lb[i] = lb[i];
  }
  r->oa.fill(a);
  r->ob.fill(b);
  r->oal = r->oa.read();
  r->obl = r->ob.read();
  return r;
}

// The formula, naively in fp64, from the stored values.
void naive_merge(const MergeRun& r, std::vector<double>& o, std::vector<double>& lse) {
  const MSpec& m = r.m;
  o.assign(r.oal.size(), 0.0);
  lse.assign(r.la.size(), -kInf);
  for (std::int64_t b = 0; b < m.b; ++b)
    for (std::int64_t h = 0; h < m.h; ++h)
      for (std::int64_t s = 0; s < m.s; ++s) {
        const size_t li = static_cast<size_t>((b * m.h + h) * m.s + s);
        const double a = r.la[li], c = r.lb[li];
        if (a == -kInf && c == -kInf) continue;
        const double hi = std::max(a, c), lo = std::min(a, c);
        const double l = hi + std::log1p(std::exp(lo - hi));
        lse[li] = l;
        for (std::int64_t e = 0; e < m.d; ++e) {
          const size_t oi = static_cast<size_t>(((b * m.s + s) * m.h + h) * m.d + e);
          double v = 0;
          if (a != -kInf) v += std::exp(a - l) * r.oal[oi];
          if (c != -kInf) v += std::exp(c - l) * r.obl[oi];
          o[oi] = v;
        }
      }
}

void run_ok(MergeRun& r, MergeAttentionParams p) {
  const Status st = merge_attention(p);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(r.o.buf.guards_intact());
  EXPECT_TRUE(r.l.guards_intact());
}

void check_against_naive(MergeRun& r) {
  std::vector<double> o, lse;
  naive_merge(r, o, lse);
  const std::vector<float> got = r.o.read();
  EXPECT_EQ(check_close(got.data(), o.data(), o.size(), out_rel_tol(r.m.to) + 1e-9, 1e-6), "") << "O";
  EXPECT_EQ(check_close(r.l.data(), lse.data(), lse.size(), 1e-6, 1e-6), "") << "LSE";
  for (size_t i = 0; i < lse.size(); ++i) {
    if (lse[i] != -kInf) continue;  // both sides empty: exactly O = 0 and LSE = -inf
    EXPECT_EQ(r.l[i], -INFINITY);
    const std::int64_t b = static_cast<std::int64_t>(i) / (r.m.h * r.m.s), h = (static_cast<std::int64_t>(i) / r.m.s) % r.m.h,
                       s = static_cast<std::int64_t>(i) % r.m.s;
    for (std::int64_t e = 0; e < r.m.d; ++e) EXPECT_EQ(got[static_cast<size_t>(((b * r.m.s + s) * r.m.h + h) * r.m.d + e)], 0.0f);
  }
}

SPARGE_CASES(Merge) {
  const DType types[] = {DType::f32, DType::f16, DType::bf16};
  int c = 0;
  for (DType ta : types)
    for (DType tb : types)
      for (DType to : types) {
        MSpec m;
        m.ta = ta; m.tb = tb; m.to = to;
        m.layout = static_cast<Layout>(c % 3);
        m.d = c % 2 ? 24 : 128;
        m.s = c % 3 ? 37 : 1;
        ++c;
        const std::string name = mname("MERGE", m);
        cases.push_back({name, [=] {
          auto rng = rng_for(name);
          auto r = make_merge(m, rng);
          run_ok(*r, r->params());
          check_against_naive(*r);
        }});
      }
  for (double spread : {1e4, 80.0, 0.0}) {
    MSpec m;
    m.lse_spread = spread;
    const std::string name = mname("MERGE_SPREAD", m);
    cases.push_back({name, [=] {
      auto rng = rng_for(name);
      auto r = make_merge(m, rng);
      run_ok(*r, r->params());
      for (float x : r->o.read()) ASSERT_TRUE(std::isfinite(x));
      check_against_naive(*r);
    }});
  }
  // Symmetry, aliasing and threads, bitwise against a plain run.
  for (DType t : types) {
    MSpec m;
    m.ta = m.tb = m.to = t;
    m.layout = Layout::pad;
    const std::string name = Name(mname("MERGE_PROPS", m))("props", "symmetric,alias_a,alias_b,threads");
    cases.push_back({name, [=] {
      auto rng = rng_for(name);
      auto r = make_merge(m, rng);
      run_ok(*r, r->params());
      const std::vector<float> ref_o = r->o.read();
      const std::vector<float> ref_l(r->l.data(), r->l.data() + r->l.size());
      // (b, a)
      MergeAttentionParams sw = r->params();
      std::swap(sw.o_a, sw.o_b);
      std::swap(sw.lse_a, sw.lse_b);
      r->o.buf.poison();
      r->l.poison();
      run_ok(*r, sw);
      EXPECT_EQ(check_bitwise(r->o.read().data(), ref_o.data(), ref_o.size()), "") << "symmetric O";
      EXPECT_EQ(check_bitwise(r->l.data(), ref_l.data(), ref_l.size()), "") << "symmetric LSE";
      // Threads.
      for (int th : {1, 3, 8}) {
        MergeAttentionParams tp = r->params();
        tp.exec.cpu_threads = th;
        r->o.buf.poison();
        r->l.poison();
        run_ok(*r, tp);
        EXPECT_EQ(check_bitwise(r->o.read().data(), ref_o.data(), ref_o.size()), "") << "threads=" << th;
        EXPECT_EQ(check_bitwise(r->l.data(), ref_l.data(), ref_l.size()), "") << "threads=" << th;
      }
      // Outputs aliasing input a, then input b (same dtype and layout as the output needs).
      for (int side = 0; side < 2; ++side) {
        auto r2 = make_merge(m, rng);
        // Same inputs as r (copy the stored values), output written into the aliased input.
        r2->oa.fill(r->oal);
        r2->ob.fill(r->obl);
        for (size_t i = 0; i < r->la.size(); ++i) {
          r2->la[i] = r->la[i];
          r2->lb[i] = r->lb[i];
        }
        MergeAttentionParams ap = r2->params();
        ap.o = side == 0 ? ap.o_a : ap.o_b;
        ap.lse = side == 0 ? ap.lse_a : ap.lse_b;
        const Status st = merge_attention(ap);
        ASSERT_TRUE(st.ok()) << st.message();
        const std::vector<float> got = (side == 0 ? r2->oa : r2->ob).read();
        const Guarded<float>& gl = side == 0 ? r2->la : r2->lb;
        EXPECT_EQ(check_bitwise(got.data(), ref_o.data(), ref_o.size()), "") << "alias side " << side;
        EXPECT_EQ(check_bitwise(gl.data(), ref_l.data(), ref_l.size()), "") << "alias side " << side;
      }
    }});
  }
}

// ---- MergeBad -----------------------------------------------------------------------------------
SPARGE_CASES(MergeBad) {
  using P = MergeAttentionParams;
  struct Bad { const char* what; std::function<void(P&, MergeRun&)> f; std::string expect; };
  const std::vector<Bad> bad = {
      {"o_a_missing", [](P& p, MergeRun&) { p.o_a.data = nullptr; }, "o_a is missing"},
      {"o_a_dtype", [](P& p, MergeRun&) { p.o_a.dtype = DType::i32; }, "o_a.dtype = i32"},
      {"o_a_ndim", [](P& p, MergeRun&) { p.o_a.ndim = 3; }, "o_a.ndim = 3"},
      {"o_a_stride", [](P& p, MergeRun&) { p.o_a.stride[3] = -1; }, "o_a.stride[3] = -1"},
      {"o_b_shape", [](P& p, MergeRun&) { p.o_b.shape[3] = 23; }, "o_b.shape[3] = 23 differs from o_a.shape[3] = 24"},
      {"o_b_dtype", [](P& p, MergeRun&) { p.o_b.dtype = DType::u8; }, "o_b.dtype = u8"},
      {"o_b_missing", [](P& p, MergeRun&) { p.o_b.data = nullptr; }, "o_b is missing"},
      {"o_shape", [](P& p, MergeRun&) { p.o.shape[1] = 36; }, "o.shape[1] = 36 differs from o_a.shape[1] = 37"},
      {"o_stride0", [](P& p, MergeRun&) { p.o.stride[2] = 0; }, "o.stride[2] = 0"},
      {"o_missing", [](P& p, MergeRun&) { p.o.data = nullptr; }, "o is missing"},
      {"lse_a_dtype", [](P& p, MergeRun&) { p.lse_a.dtype = DType::f16; }, "lse_a.dtype = f16"},
      {"lse_a_shape", [](P& p, MergeRun&) { p.lse_a.shape[2] = 38; }, "lse_a.shape[2] = 38"},
      {"lse_a_missing", [](P& p, MergeRun&) { p.lse_a.data = nullptr; }, "lse_a is missing"},
      {"lse_b_heads", [](P& p, MergeRun&) { p.lse_b.shape[1] = 1; }, "lse_b.shape[1] = 1"},
      {"lse_b_ndim", [](P& p, MergeRun&) { p.lse_b.ndim = 4; }, "lse_b.ndim = 4"},
      {"lse_shape", [](P& p, MergeRun&) { p.lse.shape[0] = 1; }, "lse.shape[0] = 1"},
      {"lse_stride0", [](P& p, MergeRun&) { p.lse.stride[2] = 0; }, "lse.stride[2] = 0"},
      {"lse_a_nan", [](P&, MergeRun& r) { r.la[5] = NAN; }, "lse_a[b=0, h=0, s=5] = nan"},
      {"lse_b_posinf", [](P&, MergeRun& r) { r.lb[40] = INFINITY; }, "lse_b[b=0, h=1, s=3] = inf"},
      {"threads", [](P& p, MergeRun&) { p.exec.cpu_threads = -3; }, "exec.cpu_threads = -3"},
      {"backend", [](P& p, MergeRun&) { p.exec.backend = static_cast<Backend>(9); }, "exec.backend = 9"},
  };
  for (const Bad& b : bad) {
    MSpec m;
    const std::string name = Name("MERGE_BAD")("param", b.what);
    cases.push_back({name, [=] {
      auto rng = rng_for(name);
      auto r = make_merge(m, rng);
      P p = r->params();
      b.f(p, *r);
      const Status st = merge_attention(p);
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(static_cast<int>(st.code()), static_cast<int>(StatusCode::invalid_argument)) << st.message();
      EXPECT_EQ(st.message().rfind("merge_attention: ", 0), 0u) << st.message();
      EXPECT_NE(st.message().find(b.expect), std::string::npos) << st.message();
      EXPECT_FALSE(supported(p).ok());
      for (size_t i = 0; i < r->l.size(); ++i) {
        std::uint32_t bits;
        std::memcpy(&bits, &r->l[i], 4);
        ASSERT_EQ(bits, 0x7fbadbadu) << "lse written on bad input";
      }
      Tensor4 fresh(m.to, m.b, m.s, m.h, m.d, Layout::hnd);
      EXPECT_EQ(std::memcmp(r->o.buf.data(), fresh.buf.data(), r->o.buf.size() * dtype_size(m.to)), 0) << "o written on bad input";
    }});
  }
}

}  // namespace
}  // namespace sparge::test
