// CPU tests of the token-level operations (docs/semantics.md, "Stage 3"):
//   TOPK*     topk_select against a naive full stable sort plus the documented reordering
//   COMPACT*  compact_mask against a plain scan
//   GATHER*   gather_attention against a naive masked dense attention built from the lists (and,
//             when the CPU dense oracle is available, against sparge::dense_attention with maybe_mask)
// Every output lives in a Guarded buffer, poisoned before the run; every case checks the guards,
// that the logical outputs were all written and that the gaps of strided outputs were not.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "cpu/token_rows.h"
#include "harness/harness.h"
#include "sparge/half.h"
#include "sparge/ops.h"

namespace sparge::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr std::int32_t kPoisonI32 = 0x7fbadbad;

// ---- shared helpers ------------------------------------------------------------------------------

// Host storage for a float-typed input (f32 / f16 / bf16) in arbitrary strided storage.
struct FloatStore {
  std::vector<float> f32;
  std::vector<std::uint16_t> h16;
  void* data(DType t) { return t == DType::f32 ? static_cast<void*>(f32.data()) : static_cast<void*>(h16.data()); }
};

// Writes logical values into storage of `elems` elements at the given offsets.
FloatStore store_values(const std::vector<float>& vals, const std::vector<std::int64_t>& offsets,
                        std::int64_t elems, DType t) {
  FloatStore s;
  if (t == DType::f32) {
    s.f32.assign(static_cast<size_t>(std::max<std::int64_t>(elems, 1)), 0.0f);  // never nullptr
    for (size_t i = 0; i < vals.size(); ++i) s.f32[static_cast<size_t>(offsets[i])] = vals[i];
  } else {
    s.h16.assign(static_cast<size_t>(std::max<std::int64_t>(elems, 1)), 0);
    for (size_t i = 0; i < vals.size(); ++i) {
      s.h16[static_cast<size_t>(offsets[i])] = t == DType::f16 ? float_to_half(vals[i]) : float_to_bf16(vals[i]);
    }
  }
  return s;
}

// Row layouts of an [R, N] input: 0 = row-major, 1 = column-major, 2 = row-major with padded rows.
struct Layout2D {
  std::int64_t s0, s1, elems;
};
Layout2D layout2d(int layout, std::int64_t r, std::int64_t n) {
  switch (layout) {
    case 1: return {1, r, r * n};
    case 2: return {n + 3, 1, r * (n + 3)};
    default: return {n, 1, r * n};
  }
}

struct Rows2D {
  FloatStore store;
  Tensor t;
};
Rows2D make_rows(const std::vector<float>& vals, std::int64_t r, std::int64_t n, DType dt, int layout) {
  const Layout2D l = layout2d(layout, r, n);
  std::vector<std::int64_t> off(vals.size());
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t c = 0; c < n; ++c) off[static_cast<size_t>(i * n + c)] = i * l.s0 + c * l.s1;
  Rows2D out{store_values(vals, off, l.elems, dt), {}};
  out.t = make_tensor(out.store.data(dt), dt, {r, n}, {l.s0, l.s1});
  return out;
}

// A poisoned i32 output [R, width] whose rows are `ld >= width` apart (the gap stays poisoned).
struct IndexOut {
  Guarded<std::int32_t> buf;
  std::int64_t rows, width, ld;
  IndexOut(std::int64_t r, std::int64_t w, std::int64_t ld_) : buf(static_cast<size_t>(std::max<std::int64_t>(r * ld_, 1))), rows(r), width(w), ld(ld_) {
    buf.poison();
  }
  Tensor tensor() { return make_tensor(buf.data(), DType::i32, {rows, width}, {ld, 1}); }
  std::int32_t at(std::int64_t r, std::int64_t c) const { return buf[static_cast<size_t>(r * ld + c)]; }
  bool gaps_untouched() const {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = width; c < ld; ++c)
        if (at(r, c) != kPoisonI32) return false;
    return true;
  }
};

// Expected error: code and a fragment of the message.
void expect_error(const Status& st, StatusCode code, const std::string& fragment) {
  EXPECT_EQ(static_cast<int>(st.code()), static_cast<int>(code)) << "message: " << st.message();
  EXPECT_NE(st.message().find(fragment), std::string::npos)
      << "message \"" << st.message() << "\" lacks \"" << fragment << "\"";
}

// ---- topk_select ---------------------------------------------------------------------------------

// Reference: a full stable sort of the selectable entries (value descending, so equal values keep
// ascending index order), the first k taken, then put in the documented order: indices strictly
// above the k-th value ascending, then those equal to it ascending. Plain float comparison makes
// -0.0 and +0.0 equal, as the contract says.
void topk_reference(const std::vector<float>& v, std::int64_t rows, std::int64_t n, int k,
                    std::vector<std::int32_t>& idx, std::vector<std::int32_t>& counts) {
  idx.assign(static_cast<size_t>(rows * k), -1);
  counts.assign(static_cast<size_t>(rows), 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* x = &v[static_cast<size_t>(r * n)];
    std::vector<std::int32_t> order;
    for (std::int32_t c = 0; c < n; ++c)
      if (x[c] != -kInf) order.push_back(c);
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return x[a] > x[b]; });
    const size_t take = std::min<size_t>(order.size(), static_cast<size_t>(k));
    std::vector<std::int32_t> chosen(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(take));
    std::vector<std::int32_t> out;
    if (order.size() >= static_cast<size_t>(k)) {  // the k-th largest selectable value exists
      const float kth = x[chosen.back()];
      std::vector<std::int32_t> above, equal;
      for (std::int32_t c : chosen) (x[c] > kth ? above : equal).push_back(c);
      std::sort(above.begin(), above.end());
      std::sort(equal.begin(), equal.end());
      out = above;
      out.insert(out.end(), equal.begin(), equal.end());
    } else {
      out = chosen;
      std::sort(out.begin(), out.end());
    }
    for (size_t s = 0; s < out.size(); ++s) idx[static_cast<size_t>(r * k) + s] = out[s];
    counts[static_cast<size_t>(r)] = static_cast<std::int32_t>(out.size());
  }
}

struct TopkCase {
  std::int64_t r, n;
  int k;
  DType dtype;
  int ties;    // values quantised to a few levels, with mixed -0.0 / +0.0
  int inf;     // rows with -inf, +inf, all -inf, fewer than k selectable, exactly k selectable
  int layout;  // Layout2D
};

std::vector<float> topk_values(const TopkCase& c, std::mt19937_64& rng) {
  std::vector<float> v(static_cast<size_t>(c.r * c.n));
  fill_normal(v, rng);
  if (c.ties) {
    for (auto& x : v) {
      x = std::round(x * 2.0f) / 2.0f;                  // about 10 distinct levels
      if (x == 0.0f && (rng() & 1)) x = -0.0f;          // both zeros, as ties of each other
    }
  }
  v = round_through(v, c.dtype);
  if (!c.inf) return v;
  std::uniform_int_distribution<std::int64_t> col(0, c.n - 1);
  for (std::int64_t r = 0; r < c.r; ++r) {
    float* x = &v[static_cast<size_t>(r * c.n)];
    switch (r % 6) {
      case 0:  // scattered -inf and a few +inf
        for (std::int64_t i = 0; i < c.n; ++i) {
          const auto u = rng() % 10;
          if (u < 3) x[i] = -kInf;
          else if (u == 3 && rng() % 4 == 0) x[i] = kInf;
        }
        break;
      case 1:  // all -inf: nothing selectable
        std::fill(x, x + c.n, -kInf);
        break;
      case 2: {  // fewer than k selectable
        std::fill(x, x + c.n, -kInf);
        for (int i = 0; i < c.k / 2; ++i) x[col(rng)] = static_cast<float>(rng() % 3);
        break;
      }
      case 3:  // exactly min(k, n) selectable
        for (std::int64_t i = 0; i < c.n; ++i) x[i] = i < c.k ? x[i] : -kInf;
        std::shuffle(x, x + c.n, rng);
        break;
      case 4:  // more +inf than fit: ties at +inf
        for (int i = 0; i < c.k + 2 && i < c.n; ++i) x[col(rng)] = kInf;
        break;
      default:  // untouched
        break;
    }
  }
  return v;
}

void run_topk(const TopkCase& c, const std::string& name) {
  auto rng = rng_for(name);
  const std::vector<float> v = topk_values(c, rng);
  std::vector<std::int32_t> ref, ref_counts;
  topk_reference(v, c.r, c.n, c.k, ref, ref_counts);
  Rows2D in = make_rows(v, c.r, c.n, c.dtype, c.layout);
  for (int threads : {1, 3}) {
    SCOPED_TRACE("cpu_threads = " + std::to_string(threads));
    IndexOut idx(c.r, c.k, c.k + (c.layout == 2 ? 2 : 0));
    IndexOut counts(c.r, 1, c.layout == 2 ? 3 : 1);
    TopkSelectParams p;
    p.scores = in.t;
    p.k = c.k;
    p.indices = idx.tensor();
    p.maybe_counts = make_tensor(counts.buf.data(), DType::i32, {c.r}, {counts.ld});
    p.exec.cpu_threads = threads;
    const Status st = topk_select(p);
    ASSERT_TRUE(st.ok()) << st.message();
    std::int64_t bad = 0;
    for (std::int64_t r = 0; r < c.r; ++r) {
      for (int s = 0; s < c.k; ++s) {
        if (idx.at(r, s) != ref[static_cast<size_t>(r * c.k + s)] && bad++ < 5) {
          ADD_FAILURE() << "indices[" << r << ", " << s << "] = " << idx.at(r, s) << ", expected "
                        << ref[static_cast<size_t>(r * c.k + s)];
        }
      }
      if (counts.at(r, 0) != ref_counts[static_cast<size_t>(r)] && bad++ < 5) {
        ADD_FAILURE() << "counts[" << r << "] = " << counts.at(r, 0) << ", expected " << ref_counts[static_cast<size_t>(r)];
      }
    }
    EXPECT_EQ(bad, 0);
    EXPECT_TRUE(idx.gaps_untouched());
    EXPECT_TRUE(counts.gaps_untouched());
    EXPECT_TRUE(idx.buf.guards_intact());
    EXPECT_TRUE(counts.buf.guards_intact());
  }
}

// Small rows with the expected answer written out: the documented order, the two zeros as ties,
// +inf as the largest value.
struct TopkLiteral {
  const char* what;
  std::vector<float> row;
  int k;
  std::vector<std::int32_t> expected;
};

void run_topk_literal(const TopkLiteral& t, DType dt) {
  const auto n = static_cast<std::int64_t>(t.row.size());
  Rows2D in = make_rows(t.row, 1, n, dt, 0);
  IndexOut idx(1, t.k, t.k);
  Guarded<std::int32_t> count(1);
  count.poison();
  TopkSelectParams p;
  p.scores = in.t;
  p.k = t.k;
  p.indices = idx.tensor();
  p.maybe_counts = make_tensor(count.data(), DType::i32, {1});
  const Status st = topk_select(p);
  ASSERT_TRUE(st.ok()) << st.message();
  std::vector<std::int32_t> got(static_cast<size_t>(t.k));
  for (int s = 0; s < t.k; ++s) got[static_cast<size_t>(s)] = idx.at(0, s);
  EXPECT_EQ(got, t.expected) << t.what;
  const auto valid = std::count_if(t.expected.begin(), t.expected.end(), [](std::int32_t x) { return x >= 0; });
  EXPECT_EQ(count[0], valid);
  EXPECT_TRUE(idx.buf.guards_intact() && count.guards_intact());
}

// A valid small topk problem whose params a bad-input case then breaks.
struct TopkBadFixture {
  std::vector<float> scores = std::vector<float>(4 * 10, 1.0f);
  Guarded<std::int32_t> idx{4 * 3}, counts{4};
  TopkSelectParams p;
  TopkBadFixture() {
    p.scores = make_tensor(scores.data(), DType::f32, {4, 10});
    p.k = 3;
    p.indices = make_tensor(idx.data(), DType::i32, {4, 3});
    p.maybe_counts = make_tensor(counts.data(), DType::i32, {4});
  }
};

SPARGE_CASES(TokenTopk) {
  const TopkCase grid[] = {
      {7, 1000, 37, DType::f16, 1, 1, 0}, {7, 1000, 37, DType::f32, 1, 1, 1},
      {13, 257, 64, DType::f32, 0, 1, 2}, {13, 257, 64, DType::f16, 0, 0, 0},
      {24, 64, 64, DType::f32, 1, 1, 0},  // k = N
      {24, 64, 1, DType::f32, 1, 1, 1},   // k = 1
      {24, 64, 1, DType::f16, 0, 1, 2},   // k = 1
      {6, 5000, 300, DType::f32, 1, 1, 0}, {6, 5000, 300, DType::f16, 1, 0, 1},
      {1, 1, 1, DType::f32, 0, 0, 0},     {1, 1, 1, DType::f32, 0, 1, 0},
      {300, 33, 5, DType::f16, 1, 1, 2},  {0, 16, 4, DType::f32, 0, 0, 0},  // no rows
  };
  for (const TopkCase& c : grid) {
    const std::string name = Name("TOPK")("r", c.r)("n", c.n)("k", c.k)("dtype", to_string(c.dtype))("ties", c.ties)(
        "inf", c.inf)("layout", c.layout);
    cases.push_back({name, [c, name] { run_topk(c, name); }});
  }

  const TopkLiteral literals[] = {
      {"zeros tie regardless of sign", {-0.0f, 0.0f, -0.0f, 0.0f, -1.0f}, 2, {0, 1}},
      {"zeros tie regardless of sign, +0 first", {0.0f, -0.0f, -1.0f, -0.0f}, 3, {0, 1, 3}},
      {"strictly above first, then ties", {1.0f, 3.0f, 2.0f, 2.0f, 2.0f, 5.0f}, 4, {1, 5, 2, 3}},
      {"+inf is the largest, ties at +inf", {1.0f, kInf, 3.0f, kInf, -kInf}, 3, {1, 3, 2}},
      {"+inf ties, k = 1", {1.0f, kInf, 3.0f, kInf}, 1, {1}},
      {"-inf never selected", {-kInf, -5.0f, -kInf, -7.0f}, 4, {1, 3, -1, -1}},
      {"all -inf", {-kInf, -kInf, -kInf}, 2, {-1, -1}},
      {"exactly k selectable: the k-th value's ties last", {3.0f, 1.0f, 2.0f, -kInf}, 3, {0, 2, 1}},
      {"fewer than k selectable: ascending, then padding", {3.0f, 1.0f, 2.0f, -kInf}, 4, {0, 1, 2, -1}},
      {"large negative is selectable", {-kInf, -65504.0f, -kInf}, 1, {1}},
  };
  for (DType dt : {DType::f32, DType::f16}) {
    for (size_t i = 0; i < std::size(literals); ++i) {
      const TopkLiteral t = literals[i];
      cases.push_back({Name("TOPK_LITERAL")("i", i)("dtype", to_string(dt)), [t, dt] { run_topk_literal(t, dt); }});
    }
  }

  // NaN anywhere is an input error naming the lowest bad row and its first bad column, whatever the
  // thread count.
  for (DType dt : {DType::f32, DType::f16}) {
    cases.push_back({Name("TOPK_NAN")("dtype", to_string(dt)), [dt] {
                       std::vector<float> v(40 * 50, 1.0f);
                       v[3 * 50 + 40] = NAN;
                       v[3 * 50 + 17] = NAN;
                       v[29 * 50 + 2] = NAN;
                       Rows2D in = make_rows(v, 40, 50, dt, 0);
                       for (int threads : {1, 4}) {
                         Guarded<std::int32_t> idx(40 * 5);
                         TopkSelectParams p;
                         p.scores = in.t;
                         p.k = 5;
                         p.indices = make_tensor(idx.data(), DType::i32, {40, 5});
                         p.exec.cpu_threads = threads;
                         expect_error(topk_select(p), StatusCode::invalid_argument, "scores[3, 17] is NaN");
                         EXPECT_TRUE(idx.guards_intact());
                       }
                     }});
  }

  // One bad-input case per parameter.
  struct Bad {
    const char* what;
    std::function<void(TopkSelectParams&)> breakit;
    const char* fragment;
  };
  const Bad bads[] = {
      {"scores_missing", [](TopkSelectParams& p) { p.scores.data = nullptr; }, "scores is missing"},
      {"scores_bf16", [](TopkSelectParams& p) { p.scores.dtype = DType::bf16; }, "scores.dtype = bf16"},
      {"scores_i32", [](TopkSelectParams& p) { p.scores.dtype = DType::i32; }, "scores.dtype = i32"},
      {"scores_ndim", [](TopkSelectParams& p) { p.scores.ndim = 3; }, "scores.ndim = 3"},
      {"scores_negative_stride", [](TopkSelectParams& p) { p.scores.stride[1] = -1; }, "scores.stride[1] = -1"},
      {"scores_n0", [](TopkSelectParams& p) { p.scores.shape[1] = 0; }, "scores.shape[1] = 0"},
      {"k0", [](TopkSelectParams& p) { p.k = 0; }, "k = 0 is out of range"},
      {"k_negative", [](TopkSelectParams& p) { p.k = -2; }, "k = -2 is out of range"},
      {"k_above_n", [](TopkSelectParams& p) { p.k = 11; }, "k = 11 is out of range (expected 1..10"},
      {"indices_missing", [](TopkSelectParams& p) { p.indices.data = nullptr; }, "indices is missing"},
      {"indices_f32", [](TopkSelectParams& p) { p.indices.dtype = DType::f32; }, "indices.dtype = f32"},
      {"indices_width", [](TopkSelectParams& p) { p.indices.shape[1] = 4; }, "indices.shape[1] = 4 (expected 3 = k)"},
      {"indices_rows", [](TopkSelectParams& p) { p.indices.shape[0] = 5; }, "indices.shape[0] = 5"},
      {"indices_stride0", [](TopkSelectParams& p) { p.indices.stride[1] = 0; }, "indices.stride[1] = 0"},
      {"counts_rows", [](TopkSelectParams& p) { p.maybe_counts.shape[0] = 3; }, "maybe_counts.shape[0] = 3"},
      {"counts_dtype", [](TopkSelectParams& p) { p.maybe_counts.dtype = DType::u8; }, "maybe_counts.dtype = u8"},
      {"counts_ndim", [](TopkSelectParams& p) { p.maybe_counts.ndim = 2; }, "maybe_counts.ndim = 2"},
      {"cpu_threads", [](TopkSelectParams& p) { p.exec.cpu_threads = -1; }, "exec.cpu_threads = -1"},
      {"backend", [](TopkSelectParams& p) { p.exec.backend = static_cast<Backend>(7); }, "exec.backend = 7"},
  };
  for (const Bad& b : bads) {
    cases.push_back({Name("TOPK_BAD")("param", b.what), [b] {
                       TopkBadFixture f;
                       ASSERT_TRUE(topk_select(f.p).ok());  // the fixture itself is valid
                       b.breakit(f.p);
                       f.idx.poison();
                       expect_error(supported(f.p), StatusCode::invalid_argument, b.fragment);
                       const Status st = topk_select(f.p);
                       expect_error(st, StatusCode::invalid_argument, b.fragment);
                       EXPECT_EQ(st.message().rfind("topk_select: ", 0), 0u) << st.message();
                       for (size_t i = 0; i < f.idx.size(); ++i) EXPECT_EQ(f.idx[i], kPoisonI32) << "written on bad input";
                     }});
  }
}

// ---- compact_mask --------------------------------------------------------------------------------

struct CompactCase {
  std::int64_t r, n;
  int nmax;
  DType dtype;
  int layout;
};

// Row r keeps count[r] random positions: row 0 keeps exactly n_max (or all n), row 1 none, the
// rest a random number up to n_max. Kept values include both zeros, large negatives and large
// positives: everything finite is kept.
std::vector<float> compact_values(const CompactCase& c, std::mt19937_64& rng) {
  std::vector<float> v(static_cast<size_t>(c.r * c.n), -kInf);
  const float specials[] = {0.0f, -0.0f, -60000.0f, 60000.0f, 1e-6f, -3.5f};
  const std::int64_t cap = std::min<std::int64_t>(c.nmax, c.n);
  std::vector<std::int64_t> perm(static_cast<size_t>(c.n));
  for (std::int64_t r = 0; r < c.r; ++r) {
    const std::int64_t count = r == 0 ? cap : r == 1 ? 0 : static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(cap + 1));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (std::int64_t i = 0; i < count; ++i) {
      v[static_cast<size_t>(r * c.n + perm[static_cast<size_t>(i)])] = specials[rng() % std::size(specials)];
    }
  }
  return round_through(v, c.dtype);
}

void run_compact(const CompactCase& c, const std::string& name) {
  auto rng = rng_for(name);
  const std::vector<float> v = compact_values(c, rng);
  Rows2D in = make_rows(v, c.r, c.n, c.dtype, c.layout);
  for (int threads : {1, 3}) {
    SCOPED_TRACE("cpu_threads = " + std::to_string(threads));
    IndexOut idx(c.r, c.nmax, c.nmax + (c.layout == 2 ? 5 : 0));
    IndexOut counts(c.r, 1, c.layout == 2 ? 2 : 1);
    CompactMaskParams p;
    p.mask = in.t;
    p.n_max = c.nmax;
    p.indices = idx.tensor();
    p.counts = make_tensor(counts.buf.data(), DType::i32, {c.r}, {counts.ld});
    p.exec.cpu_threads = threads;
    const Status st = compact_mask(p);
    ASSERT_TRUE(st.ok()) << st.message();
    std::int64_t bad = 0;
    for (std::int64_t r = 0; r < c.r; ++r) {
      std::vector<std::int32_t> expect;
      for (std::int32_t col = 0; col < c.n; ++col)
        if (v[static_cast<size_t>(r * c.n + col)] != -kInf) expect.push_back(col);
      if (counts.at(r, 0) != static_cast<std::int32_t>(expect.size()) && bad++ < 5) {
        ADD_FAILURE() << "counts[" << r << "] = " << counts.at(r, 0) << ", expected " << expect.size();
      }
      expect.resize(static_cast<size_t>(c.nmax), -1);
      for (int s = 0; s < c.nmax; ++s) {
        if (idx.at(r, s) != expect[static_cast<size_t>(s)] && bad++ < 5) {
          ADD_FAILURE() << "indices[" << r << ", " << s << "] = " << idx.at(r, s) << ", expected " << expect[static_cast<size_t>(s)];
        }
      }
    }
    EXPECT_EQ(bad, 0);
    EXPECT_TRUE(idx.gaps_untouched() && counts.gaps_untouched());
    EXPECT_TRUE(idx.buf.guards_intact() && counts.buf.guards_intact());
  }
}

struct CompactBadFixture {
  std::vector<float> mask = std::vector<float>(6 * 20, 0.0f);
  Guarded<std::int32_t> idx{6 * 20}, counts{6};
  CompactMaskParams p;
  CompactBadFixture() {
    p.mask = make_tensor(mask.data(), DType::f32, {6, 20});
    p.n_max = 20;
    p.indices = make_tensor(idx.data(), DType::i32, {6, 20});
    p.counts = make_tensor(counts.data(), DType::i32, {6});
  }
};

SPARGE_CASES(TokenCompact) {
  const CompactCase grid[] = {
      {5, 4096, 300, DType::f32, 0}, {5, 4096, 300, DType::f16, 1}, {17, 100, 100, DType::f32, 2},
      {17, 100, 130, DType::f16, 0},  // n_max > N
      {1, 1, 1, DType::f32, 0},       {64, 333, 7, DType::f32, 2}, {0, 10, 3, DType::f32, 0},
  };
  for (const CompactCase& c : grid) {
    const std::string name = Name("COMPACT")("r", c.r)("n", c.n)("nmax", c.nmax)("dtype", to_string(c.dtype))("layout", c.layout);
    cases.push_back({name, [c, name] { run_compact(c, name); }});
  }

  // Overflow: row 2 has n_max + 1 finite entries, row 4 more still; the lowest row is reported with
  // its count. Row 0 has exactly n_max and alone fits.
  cases.push_back({"COMPACT_OVERFLOW(r=6,n=50,nmax=8)", [] {
                     std::vector<float> v(6 * 50, -kInf);
                     auto keep = [&](int r, int count) {
                       for (int c = 0; c < count; ++c) v[static_cast<size_t>(r * 50 + c * 3)] = 1.0f;
                     };
                     keep(0, 8);
                     keep(2, 9);
                     keep(4, 15);
                     keep(5, 9);
                     for (int threads : {1, 4}) {
                       IndexOut idx(6, 8, 10);  // even on overflow nothing is written past n_max
                       Guarded<std::int32_t> counts(6);
                       CompactMaskParams p;
                       p.mask = make_tensor(v.data(), DType::f32, {6, 50});
                       p.n_max = 8;
                       p.indices = idx.tensor();
                       p.counts = make_tensor(counts.data(), DType::i32, {6});
                       p.exec.cpu_threads = threads;
                       expect_error(compact_mask(p), StatusCode::overflow, "row 2 has 9 finite entries, more than n_max = 8");
                       EXPECT_TRUE(idx.gaps_untouched());
                       EXPECT_TRUE(idx.buf.guards_intact() && counts.guards_intact());
                       Guarded<std::int32_t> wide(6 * 15);  // n_max = 15: every row fits, row 4 exactly
                       p.n_max = 15;
                       p.indices = make_tensor(wide.data(), DType::i32, {6, 15});
                       ASSERT_TRUE(compact_mask(p).ok());
                       EXPECT_EQ(counts[0], 8);
                       EXPECT_EQ(counts[2], 9);
                       EXPECT_EQ(counts[4], 15);
                       EXPECT_TRUE(wide.guards_intact());
                       EXPECT_EQ(wide[4 * 15 + 14], 42);
                     }
                   }});
  // Input errors: NaN and +inf, naming row and column; the lowest failing row wins, even over an
  // overflow in a later row, and an overflow in an earlier row wins over them.
  for (DType dt : {DType::f32, DType::f16}) {
    cases.push_back({Name("COMPACT_NONFINITE")("dtype", to_string(dt)), [dt] {
                       for (int threads : {1, 4}) {
                         std::vector<float> v(30 * 40, -kInf);  // every row empty
                         v[7 * 40 + 11] = NAN;
                         v[7 * 40 + 30] = kInf;
                         v[12 * 40 + 1] = kInf;
                         Guarded<std::int32_t> idx(30 * 4), counts(30);
                         CompactMaskParams p;
                         p.n_max = 4;
                         p.indices = make_tensor(idx.data(), DType::i32, {30, 4});
                         p.counts = make_tensor(counts.data(), DType::i32, {30});
                         p.exec.cpu_threads = threads;
                         {
                           Rows2D in = make_rows(v, 30, 40, dt, 0);
                           p.mask = in.t;
                           expect_error(compact_mask(p), StatusCode::invalid_argument, "mask[7, 11] = nan");
                         }
                         v[7 * 40 + 11] = -kInf;
                         {
                           Rows2D in = make_rows(v, 30, 40, dt, 1);
                           p.mask = in.t;
                           expect_error(compact_mask(p), StatusCode::invalid_argument, "mask[7, 30] = inf");
                         }
                         for (int c = 0; c < 10; ++c) v[static_cast<size_t>(9 * 40 + c)] = 0.0f;  // overflow after row 7
                         {
                           Rows2D in = make_rows(v, 30, 40, dt, 0);
                           p.mask = in.t;
                           expect_error(compact_mask(p), StatusCode::invalid_argument, "mask[7, 30] = inf");
                         }
                         for (int c = 0; c < 10; ++c) v[static_cast<size_t>(3 * 40 + c)] = 0.0f;  // overflow before it
                         {
                           Rows2D in = make_rows(v, 30, 40, dt, 2);
                           p.mask = in.t;
                           expect_error(compact_mask(p), StatusCode::overflow, "row 3 has 10 finite entries");
                         }
                         EXPECT_TRUE(idx.guards_intact() && counts.guards_intact());
                       }
                     }});
  }

  struct Bad {
    const char* what;
    std::function<void(CompactMaskParams&)> breakit;
    const char* fragment;
  };
  const Bad bads[] = {
      {"mask_missing", [](CompactMaskParams& p) { p.mask.data = nullptr; }, "mask is missing"},
      {"mask_i32", [](CompactMaskParams& p) { p.mask.dtype = DType::i32; }, "mask.dtype = i32"},
      {"mask_ndim", [](CompactMaskParams& p) { p.mask.ndim = 1; }, "mask.ndim = 1"},
      {"mask_negative_stride", [](CompactMaskParams& p) { p.mask.stride[0] = -20; }, "mask.stride[0] = -20"},
      {"nmax0", [](CompactMaskParams& p) { p.n_max = 0; }, "n_max = 0"},
      {"nmax_negative", [](CompactMaskParams& p) { p.n_max = -3; }, "n_max = -3"},
      {"indices_missing", [](CompactMaskParams& p) { p.indices.data = nullptr; }, "indices is missing"},
      {"indices_width", [](CompactMaskParams& p) { p.indices.shape[1] = 19; }, "indices.shape[1] = 19 (expected 20 = n_max)"},
      {"indices_rows", [](CompactMaskParams& p) { p.indices.shape[0] = 7; }, "indices.shape[0] = 7"},
      {"indices_dtype", [](CompactMaskParams& p) { p.indices.dtype = DType::f16; }, "indices.dtype = f16"},
      {"indices_stride0", [](CompactMaskParams& p) { p.indices.stride[0] = 0; }, "indices.stride[0] = 0"},
      {"counts_missing", [](CompactMaskParams& p) { p.counts.data = nullptr; }, "counts is missing"},
      {"counts_rows", [](CompactMaskParams& p) { p.counts.shape[0] = 5; }, "counts.shape[0] = 5"},
      {"counts_ndim", [](CompactMaskParams& p) { p.counts.ndim = 2; }, "counts.ndim = 2"},
      {"cpu_threads", [](CompactMaskParams& p) { p.exec.cpu_threads = -4; }, "exec.cpu_threads = -4"},
  };
  for (const Bad& b : bads) {
    cases.push_back({Name("COMPACT_BAD")("param", b.what), [b] {
                       CompactBadFixture f;
                       ASSERT_TRUE(compact_mask(f.p).ok());
                       b.breakit(f.p);
                       f.idx.poison();
                       f.counts.poison();
                       const Status st = compact_mask(f.p);
                       expect_error(st, StatusCode::invalid_argument, b.fragment);
                       expect_error(supported(f.p), StatusCode::invalid_argument, b.fragment);
                       EXPECT_EQ(st.message().rfind("compact_mask: ", 0), 0u) << st.message();
                       for (size_t i = 0; i < f.idx.size(); ++i) EXPECT_EQ(f.idx[i], kPoisonI32) << "written on bad input";
                     }});
  }
}

// ---- gather_attention ----------------------------------------------------------------------------

struct GatherCase {
  std::int64_t b, hq, hk, sq, sk, d;
  int n;  // n_max
  int causal;
  DType dtype;
  DType odtype;
  int layout;  // 0: NHD q/k/v/o and natural lists; 1: HND q/k/v/o, lists/counts/lse in other orders
  int lse;
  float scale = 0.0f;
};

// Storage order of a logical 4-d tensor: `perm` lists the logical dimensions from outermost to
// innermost; returns the element strides of the logical dimensions.
std::array<std::int64_t, 4> strides_for(const std::array<std::int64_t, 4>& shape, const std::array<int, 4>& perm) {
  std::array<std::int64_t, 4> st{};
  std::int64_t s = 1;
  for (int i = 3; i >= 0; --i) {
    st[static_cast<size_t>(perm[static_cast<size_t>(i)])] = s;
    s *= shape[static_cast<size_t>(perm[static_cast<size_t>(i)])];
  }
  return st;
}

Tensor view4(void* data, DType t, const std::array<std::int64_t, 4>& shape, const std::array<std::int64_t, 4>& st) {
  return make_tensor(data, t, {shape[0], shape[1], shape[2], shape[3]}, {st[0], st[1], st[2], st[3]});
}

// A float tensor [shape] filled from logical row-major values, stored in order `perm`.
struct Float4 {
  FloatStore store;
  Tensor t;
};
Float4 make_float4(const std::vector<float>& vals, const std::array<std::int64_t, 4>& shape, const std::array<int, 4>& perm, DType dt) {
  const auto st = strides_for(shape, perm);
  std::vector<std::int64_t> off(vals.size());
  std::int64_t i = 0;
  for (std::int64_t a = 0; a < shape[0]; ++a)
    for (std::int64_t b = 0; b < shape[1]; ++b)
      for (std::int64_t c = 0; c < shape[2]; ++c)
        for (std::int64_t d = 0; d < shape[3]; ++d) off[static_cast<size_t>(i++)] = a * st[0] + b * st[1] + c * st[2] + d * st[3];
  Float4 f{store_values(vals, off, static_cast<std::int64_t>(vals.size()), dt), {}};
  f.t = view4(f.store.data(dt), dt, shape, st);
  return f;
}

// The lists of a gather problem, kept logically as [B, Hq, Sq] rows.
struct Lists {
  std::vector<std::vector<std::int32_t>> rows;
};

// Random duplicate-free lists in random order: some rows empty, some full (n_max or Sk keys).
Lists random_lists(const GatherCase& c, std::mt19937_64& rng) {
  Lists l;
  const std::int64_t nrows = c.b * c.hq * c.sq;
  l.rows.resize(static_cast<size_t>(nrows));
  const std::int64_t cap = std::min<std::int64_t>(c.n, c.sk);
  std::vector<std::int32_t> keys(static_cast<size_t>(c.sk));
  for (std::int64_t r = 0; r < nrows; ++r) {
    const auto u = rng() % 8;
    const std::int64_t count = u == 0 ? 0 : u == 1 ? cap : static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(cap + 1));
    std::iota(keys.begin(), keys.end(), 0);
    for (std::int64_t t = 0; t < count; ++t) {  // partial Fisher-Yates: a random ordered sample
      const auto pick = t + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(c.sk - t));
      std::swap(keys[static_cast<size_t>(t)], keys[static_cast<size_t>(pick)]);
    }
    l.rows[static_cast<size_t>(r)].assign(keys.begin(), keys.begin() + count);
  }
  return l;
}

// Naive reference: expand the lists to a dense u8 mask, then dense masked attention per row over
// every key in ascending order (fp64, max pass then sum pass). O [B, Sq, Hq, D], LSE [B, Hq, Sq].
void gather_reference(const GatherCase& c, const std::vector<float>& q, const std::vector<float>& k,
                      const std::vector<float>& v, const std::vector<std::uint8_t>& mask,
                      std::vector<double>& o, std::vector<double>& lse) {
  o.assign(static_cast<size_t>(c.b * c.sq * c.hq * c.d), 0.0);
  lse.assign(static_cast<size_t>(c.b * c.hq * c.sq), -std::numeric_limits<double>::infinity());
  const double scale = c.scale == 0.0f ? 1.0 / std::sqrt(static_cast<double>(c.d)) : c.scale;
  const std::int64_t group = c.hq / c.hk;
  std::vector<double> s(static_cast<size_t>(c.sk));
  for (std::int64_t b = 0; b < c.b; ++b)
    for (std::int64_t h = 0; h < c.hq; ++h)
      for (std::int64_t i = 0; i < c.sq; ++i) {
        const std::int64_t hk = h / group;
        auto qat = [&](std::int64_t e) { return static_cast<double>(q[static_cast<size_t>(((b * c.sq + i) * c.hq + h) * c.d + e)]); };
        auto kv = [&](const std::vector<float>& x, std::int64_t j, std::int64_t e) {
          return static_cast<double>(x[static_cast<size_t>(((b * c.sk + j) * c.hk + hk) * c.d + e)]);
        };
        double m = -std::numeric_limits<double>::infinity();
        bool any = false;
        for (std::int64_t j = 0; j < c.sk; ++j) {
          const bool on = mask[static_cast<size_t>(((b * c.hq + h) * c.sq + i) * c.sk + j)] != 0 &&
                          (!c.causal || j <= i + c.sk - c.sq);
          if (!on) continue;
          double dot = 0;
          for (std::int64_t e = 0; e < c.d; ++e) dot += qat(e) * kv(k, j, e);
          s[static_cast<size_t>(j)] = scale * dot;
          m = any ? std::max(m, s[static_cast<size_t>(j)]) : s[static_cast<size_t>(j)];
          any = true;
        }
        if (!any) continue;
        double l = 0;
        std::vector<double> acc(static_cast<size_t>(c.d), 0.0);
        for (std::int64_t j = 0; j < c.sk; ++j) {
          const bool on = mask[static_cast<size_t>(((b * c.hq + h) * c.sq + i) * c.sk + j)] != 0 &&
                          (!c.causal || j <= i + c.sk - c.sq);
          if (!on) continue;
          const double w = std::exp(s[static_cast<size_t>(j)] - m);
          l += w;
          for (std::int64_t e = 0; e < c.d; ++e) acc[static_cast<size_t>(e)] += w * kv(v, j, e);
        }
        for (std::int64_t e = 0; e < c.d; ++e) o[static_cast<size_t>(((b * c.sq + i) * c.hq + h) * c.d + e)] = acc[static_cast<size_t>(e)] / l;
        lse[static_cast<size_t>((b * c.hq + h) * c.sq + i)] = m + std::log(l);
      }
}

double rel_tol(DType t) { return t == DType::f32 ? 2.5e-7 : t == DType::f16 ? 1.0e-3 : 8.0e-3; }

// Everything one gather run needs: inputs in the case's layout and poisoned, guarded outputs.
struct GatherProblem {
  GatherCase c;
  std::vector<float> q, k, v;  // logical [B,S,H,D], already rounded to the dtype
  Lists lists;
  Float4 qs, ks, vs;
  Guarded<std::int32_t> idx, counts;
  Guarded<float> o32, lse;
  Guarded<std::uint16_t> o16;
  GatherAttentionParams p;

  GatherProblem(const GatherCase& gc, const std::string& name) : c(gc) {
    auto rng = rng_for(name);
    q.resize(static_cast<size_t>(c.b * c.sq * c.hq * c.d));
    k.resize(static_cast<size_t>(c.b * c.sk * c.hk * c.d));
    v.resize(k.size());
    fill_normal(q, rng, 0.0f, 1.5f);
    fill_normal(k, rng);
    fill_normal(v, rng);
    q = round_through(q, c.dtype);
    k = round_through(k, c.dtype);
    v = round_through(v, c.dtype);
    lists = random_lists(c, rng);
    const std::array<int, 4> io = c.layout ? std::array<int, 4>{0, 2, 1, 3} : std::array<int, 4>{0, 1, 2, 3};
    qs = make_float4(q, {c.b, c.sq, c.hq, c.d}, io, c.dtype);
    ks = make_float4(k, {c.b, c.sk, c.hk, c.d}, io, c.dtype);
    vs = make_float4(v, {c.b, c.sk, c.hk, c.d}, io, c.dtype);
    p.q = qs.t;
    p.k = ks.t;
    p.v = vs.t;
    // Lists: [B, Hq, Sq, n_max]; layout 1 stores them [B, Sq, Hq, n_max] with padded rows.
    const std::int64_t ld = c.n + (c.layout ? 3 : 0);
    idx.resize(static_cast<size_t>(c.b * c.hq * c.sq * ld));
    idx.poison();  // entries past counts are never read; poison shows it
    std::array<std::int64_t, 4> ist{c.hq * c.sq * ld, c.sq * ld, ld, 1};
    if (c.layout) ist = {c.sq * c.hq * ld, ld, c.hq * ld, 1};
    p.indices = view4(idx.data(), DType::i32, {c.b, c.hq, c.sq, c.n}, ist);
    counts.resize(static_cast<size_t>(c.b * c.hq * c.sq));
    std::array<std::int64_t, 3> cst{c.hq * c.sq, c.sq, 1};
    if (c.layout) cst = {c.sq * c.hq, 1, c.hq};
    p.counts = make_tensor(counts.data(), DType::i32, {c.b, c.hq, c.sq}, {cst[0], cst[1], cst[2]});
    for (std::int64_t b = 0; b < c.b; ++b)
      for (std::int64_t h = 0; h < c.hq; ++h)
        for (std::int64_t i = 0; i < c.sq; ++i) {
          const auto& row = lists.rows[static_cast<size_t>((b * c.hq + h) * c.sq + i)];
          counts[static_cast<size_t>(b * cst[0] + h * cst[1] + i * cst[2])] = static_cast<std::int32_t>(row.size());
          for (std::int64_t t = 0; t < c.n; ++t) {
            idx[static_cast<size_t>(b * ist[0] + h * ist[1] + i * ist[2] + t)] =
                t < static_cast<std::int64_t>(row.size()) ? row[static_cast<size_t>(t)] : -1;
          }
        }
    const std::array<std::int64_t, 4> oshape{c.b, c.sq, c.hq, c.d};
    const auto ost = strides_for(oshape, io);
    const auto on = static_cast<size_t>(c.b * c.sq * c.hq * c.d);
    if (c.odtype == DType::f32) {
      o32.resize(on);
      p.o = view4(o32.data(), DType::f32, oshape, ost);
    } else {
      o16.resize(on);
      p.o = view4(o16.data(), c.odtype, oshape, ost);
    }
    if (c.lse) {
      lse.resize(static_cast<size_t>(c.b * c.hq * c.sq));
      p.maybe_lse = make_tensor(lse.data(), DType::f32, {c.b, c.hq, c.sq}, {cst[0], cst[1], cst[2]});
    }
    p.scale = c.scale;
    p.is_causal = c.causal != 0;
  }

  Status run(int threads, bool group_union = false, int union_rows = 64) {
    o32.poison();
    o16.poison();
    lse.poison();
    p.exec.cpu_threads = threads;
    p.group_union = group_union;
    p.union_rows = union_rows;
    return gather_attention(p);
  }

  // Outputs as logical f32 arrays: O [B, Sq, Hq, D], LSE [B, Hq, Sq].
  std::vector<float> out_o() const {
    std::vector<float> r(static_cast<size_t>(c.b * c.sq * c.hq * c.d));
    std::int64_t n = 0;
    for (std::int64_t b = 0; b < c.b; ++b)
      for (std::int64_t i = 0; i < c.sq; ++i)
        for (std::int64_t h = 0; h < c.hq; ++h)
          for (std::int64_t e = 0; e < c.d; ++e) {
            const auto off = static_cast<size_t>(p.o.offset(b, i, h, e));
            r[static_cast<size_t>(n++)] = c.odtype == DType::f32 ? o32[off] : c.odtype == DType::f16 ? half_to_float(o16[off]) : bf16_to_float(o16[off]);
          }
    return r;
  }
  std::vector<float> out_lse() const {
    std::vector<float> r;
    for (std::int64_t b = 0; b < c.b; ++b)
      for (std::int64_t h = 0; h < c.hq; ++h)
        for (std::int64_t i = 0; i < c.sq; ++i) r.push_back(lse[static_cast<size_t>(p.maybe_lse.offset(b, h, i))]);
    return r;
  }
  std::vector<std::uint8_t> mask() const {
    std::vector<std::uint8_t> m(static_cast<size_t>(c.b * c.hq * c.sq * c.sk), 0);
    for (size_t r = 0; r < lists.rows.size(); ++r)
      for (std::int32_t j : lists.rows[r]) m[r * static_cast<size_t>(c.sk) + static_cast<size_t>(j)] = 1;
    return m;
  }
  bool guards_intact() const { return idx.guards_intact() && counts.guards_intact() && o32.guards_intact() && o16.guards_intact() && lse.guards_intact(); }
};

// out within rel * |ref| + rel * 1e-2 of ref, elementwise; -inf exactly where ref is -inf.
void expect_close(const std::vector<float>& out, const std::vector<double>& ref, double rel, const char* what) {
  ASSERT_EQ(out.size(), ref.size());
  std::int64_t bad = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double o = out[i], r = ref[i];
    const bool ok = std::isinf(r) ? o == r : (std::isfinite(o) && std::abs(o - r) <= rel * std::abs(r) + rel * 1e-2);
    if (!ok && bad++ < 5) ADD_FAILURE() << what << "[" << i << "] = " << o << ", expected " << r;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << out.size() << " elements off";
}

void run_gather(const GatherCase& c, const std::string& name) {
  GatherProblem g(c, name);
  const std::vector<std::uint8_t> mask = g.mask();
  std::vector<double> o_ref, lse_ref;
  gather_reference(c, g.q, g.k, g.v, mask, o_ref, lse_ref);

  ASSERT_TRUE(g.run(1).ok());
  const std::vector<float> o1 = g.out_o(), l1 = c.lse ? g.out_lse() : std::vector<float>{};
  expect_close(o1, o_ref, rel_tol(c.odtype), "O");
  if (c.lse) expect_close(l1, lse_ref, 4e-7, "LSE");
  EXPECT_TRUE(g.guards_intact());
  // Entries past counts were never read (they are -1, so reading one would have been an error).

  // Same bits with another thread count, and with group_union (a GPU loading strategy only).
  struct Variant {
    int threads;
    bool un;
    int rows;
  };
  for (const Variant& var : {Variant{3, false, 64}, Variant{2, true, 1}, Variant{0, true, 16}}) {
    SCOPED_TRACE(Name("variant")("threads", var.threads)("group_union", var.un)("union_rows", var.rows).str());
    const Status st = g.run(var.threads, var.un, var.rows);
    ASSERT_TRUE(st.ok()) << st.message();
    const std::vector<float> o2 = g.out_o();
    EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)), 0) << "O differs";
    if (c.lse) {
      const std::vector<float> l2 = g.out_lse();
      EXPECT_EQ(std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)), 0) << "LSE differs";
    }
    EXPECT_TRUE(g.guards_intact());
  }

  // The dense oracle with the lists expanded to a u8 mask, once it is implemented.
  Guarded<float> od(o1.size()), ld(lse_ref.size());
  od.poison();
  ld.poison();
  DenseAttentionParams dp;
  dp.q = g.p.q;
  dp.k = g.p.k;
  dp.v = g.p.v;
  dp.o = make_tensor(od.data(), DType::f32, {c.b, c.sq, c.hq, c.d});
  dp.maybe_lse = make_tensor(ld.data(), DType::f32, {c.b, c.hq, c.sq});
  std::vector<std::uint8_t> m = mask;
  dp.maybe_mask = make_tensor(m.data(), DType::u8, {c.b, c.hq, c.sq, c.sk});
  dp.scale = c.scale;
  dp.is_causal = c.causal != 0;
  const Status ds = dense_attention(dp);
  if (ds.code() == StatusCode::unsupported) return;  // the oracle has not landed in this build
  ASSERT_TRUE(ds.ok()) << ds.message();
  std::vector<double> od_ref(od.data(), od.data() + od.size()), ld_ref(ld.data(), ld.data() + ld.size());
  expect_close(o1, od_ref, rel_tol(c.odtype) + 1e-6, "O vs dense_attention");
  if (c.lse) expect_close(l1, ld_ref, 1e-6, "LSE vs dense_attention");
}

SPARGE_CASES(TokenGather) {
  const GatherCase grid[] = {
      {2, 8, 2, 113, 203, 64, 37, 1, DType::f32, DType::f32, 0, 1},
      {2, 8, 2, 113, 203, 64, 37, 0, DType::f16, DType::f16, 1, 1},
      {2, 8, 2, 113, 203, 64, 37, 1, DType::bf16, DType::bf16, 0, 1},
      {1, 4, 4, 77, 77, 32, 77, 1, DType::f16, DType::f32, 1, 1},     // n_max = Sk: full rows
      {1, 6, 1, 203, 113, 16, 50, 1, DType::f32, DType::f32, 1, 1},   // Sq > Sk: causal empty rows
      {2, 3, 3, 1, 300, 128, 100, 1, DType::bf16, DType::f32, 0, 0},  // decode row, no LSE
      {1, 2, 1, 5, 3, 8, 10, 0, DType::f32, DType::f32, 0, 1},        // n_max > Sk
      {1, 4, 2, 31, 64, 40, 16, 0, DType::f16, DType::f16, 1, 1, 0.37f},
      {1, 4, 2, 31, 64, 40, 16, 1, DType::f32, DType::f32, 0, 1, 2.5f},
  };
  for (const GatherCase& c : grid) {
    Name n("GATHER");
    n("b", c.b)("hq", c.hq)("hk", c.hk)("sq", c.sq)("sk", c.sk)("d", c.d)("n", c.n)("causal", c.causal)(
        "dtype", to_string(c.dtype))("o", to_string(c.odtype))("layout", c.layout)("lse", c.lse);
    if (c.scale != 0.0f) n("scale", c.scale);
    const std::string name = n;
    cases.push_back({name, [c, name] { run_gather(c, name); }});
  }

  // A list that is causally masked entirely gives O = 0 and LSE = -inf, as does an empty list;
  // a list with one visible key gives exactly V of that key and LSE = its logit.
  cases.push_back({"GATHER_EDGE(masked,empty,single)", [] {
                     GatherCase c{1, 2, 1, 4, 6, 8, 3, 1, DType::f32, DType::f32, 0, 1};
                     GatherProblem g(c, "GATHER_EDGE");
                     auto set = [&](std::int64_t h, std::int64_t i, std::vector<std::int32_t> row) {
                       g.counts[static_cast<size_t>(h * 4 + i)] = static_cast<std::int32_t>(row.size());
                       for (size_t t = 0; t < row.size(); ++t) g.idx[static_cast<size_t>((h * 4 + i) * 3) + t] = row[t];
                     };
                     set(0, 0, {5, 4, 3});  // row 0 sees keys <= 2: all masked
                     set(0, 1, {});
                     set(1, 2, {4});        // row 2 sees keys <= 4
                     set(1, 3, {5});
                     ASSERT_TRUE(g.run(2).ok());
                     const auto o = g.out_o();
                     const auto l = g.out_lse();
                     for (int e = 0; e < 8; ++e) {
                       EXPECT_EQ(o[static_cast<size_t>((0 * 2 + 0) * 8 + e)], 0.0f);
                       EXPECT_EQ(o[static_cast<size_t>((1 * 2 + 0) * 8 + e)], 0.0f);
                       EXPECT_EQ(o[static_cast<size_t>((2 * 2 + 1) * 8 + e)], g.v[static_cast<size_t>(4 * 8 + e)]);
                       EXPECT_EQ(o[static_cast<size_t>((3 * 2 + 1) * 8 + e)], g.v[static_cast<size_t>(5 * 8 + e)]);
                     }
                     EXPECT_EQ(l[0], -kInf);
                     EXPECT_EQ(l[1], -kInf);
                     double dot = 0;
                     for (int e = 0; e < 8; ++e) dot += static_cast<double>(g.q[static_cast<size_t>((2 * 2 + 1) * 8 + e)]) * g.k[static_cast<size_t>(4 * 8 + e)];
                     EXPECT_NEAR(l[4 + 2], dot / std::sqrt(8.0), 1e-5);
                     EXPECT_TRUE(g.guards_intact());
                   }});

  // Entries past counts are not read, whatever they hold.
  cases.push_back({"GATHER_PADDING_IGNORED", [] {
                     GatherCase c{1, 2, 2, 9, 11, 8, 6, 0, DType::f32, DType::f32, 0, 1};
                     GatherProblem g(c, "GATHER_PADDING_IGNORED");
                     ASSERT_TRUE(g.run(1).ok());
                     const auto o1 = g.out_o();
                     for (std::int64_t r = 0; r < 2 * 9; ++r)
                       for (std::int64_t t = g.counts[static_cast<size_t>(r)]; t < 6; ++t) g.idx[static_cast<size_t>(r * 6 + t)] = (t % 2) ? 1000 : -7;
                     ASSERT_TRUE(g.run(1).ok());
                     const auto o2 = g.out_o();
                     EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * 4), 0);
                   }});

  // Bad list contents: each names b, h, i, the position and the value. The lowest bad row wins.
  struct BadList {
    const char* what;
    std::int64_t row, pos;  // row = (b * Hq + h) * Sq + i
    std::int32_t value;     // written at pos (pos < 0: into counts instead)
    const char* fragment;
  };
  // Problem: B=2, Hq=4, Hk=2, Sq=5, Sk=7, n_max=4; row 27 = (1, 1, 2).
  const BadList bad_lists[] = {
      {"index_negative", 27, 1, -1, "indices[1, 1, 2, 1] = -1 is out of range (expected 0..6"},
      {"index_sk", 27, 0, 7, "indices[1, 1, 2, 0] = 7 is out of range"},
      {"index_huge", 27, 3, 1 << 30, "indices[1, 1, 2, 3] = 1073741824 is out of range"},
      {"duplicate", 27, 3, -2, "indices[1, 1, 2, 3] = "},  // -2: copy of position 0
      {"counts_above_nmax", 27, -1, 5, "counts[1, 1, 2] = 5 is out of range (expected 0..4"},
      {"counts_negative", 27, -1, -1, "counts[1, 1, 2] = -1 is out of range"},
      {"causally_masked_index", 5, 3, 9, "indices[0, 1, 0, 3] = 9 is out of range"},  // row i=0 sees only keys <= 2
  };
  for (const BadList& bl : bad_lists) {
    cases.push_back({Name("GATHER_BADLIST")("what", bl.what), [bl] {
                       GatherCase c{2, 4, 2, 5, 7, 8, 4, 1, DType::f32, DType::f32, 0, 1};
                       GatherProblem g(c, "GATHER_BADLIST");
                       for (std::int64_t r = 0; r < 40; ++r) {  // every row: the full list 0..3
                         g.counts[static_cast<size_t>(r)] = 4;
                         for (int t = 0; t < 4; ++t) g.idx[static_cast<size_t>(r * 4 + t)] = t;
                       }
                       for (std::int64_t r : {bl.row, std::int64_t{38}}) {  // row 38 fails the same way, later
                         if (bl.pos < 0) {
                           g.counts[static_cast<size_t>(r)] = bl.value;
                         } else {
                           g.idx[static_cast<size_t>(r * 4 + bl.pos)] = bl.value == -2 ? g.idx[static_cast<size_t>(r * 4)] : bl.value;
                         }
                       }
                       for (int threads : {1, 4}) {
                         const Status st = g.run(threads);
                         expect_error(st, StatusCode::invalid_argument, bl.fragment);
                         EXPECT_EQ(st.message().rfind("gather_attention: ", 0), 0u) << st.message();
                         EXPECT_TRUE(g.guards_intact());
                       }
                       if (std::string(bl.what) == "duplicate") {
                         EXPECT_NE(g.run(1).message().find("repeats an earlier entry"), std::string::npos);
                       }
                       // check_lists = false is a CUDA option: the CPU backend still checks.
                       g.p.check_lists = false;
                       expect_error(g.run(1), StatusCode::invalid_argument, bl.fragment);
                     }});
  }

  // One bad-input case per parameter (host checks, before anything runs).
  struct Bad {
    const char* what;
    std::function<void(GatherAttentionParams&)> breakit;
    const char* fragment;
  };
  const Bad bads[] = {
      {"q_missing", [](GatherAttentionParams& p) { p.q.data = nullptr; }, "q is missing"},
      {"k_dtype", [](GatherAttentionParams& p) { p.k.dtype = DType::f16; }, "k.dtype = f16 differs from q.dtype = f32"},
      {"v_shape", [](GatherAttentionParams& p) { p.v.shape[1] = 6; }, "v.shape[1] = 6 differs from k.shape[1] = 7"},
      {"o_shape", [](GatherAttentionParams& p) { p.o.shape[3] = 4; }, "o.shape[3] = 4"},
      {"o_stride0", [](GatherAttentionParams& p) { p.o.stride[1] = 0; }, "o.stride[1] = 0"},
      {"gqa_ratio", [](GatherAttentionParams& p) { p.k.shape[2] = 3; p.v.shape[2] = 3; }, "is not a multiple of k.shape[2] (Hk) = 3"},
      {"scale_nan", [](GatherAttentionParams& p) { p.scale = NAN; }, "scale = nan is out of range"},
      {"scale_inf", [](GatherAttentionParams& p) { p.scale = kInf; }, "scale = inf is out of range"},
      {"scale_negative", [](GatherAttentionParams& p) { p.scale = -0.5f; }, "scale = -0.5 is out of range"},
      {"indices_missing", [](GatherAttentionParams& p) { p.indices.data = nullptr; }, "indices is missing"},
      {"indices_dtype", [](GatherAttentionParams& p) { p.indices.dtype = DType::f32; }, "indices.dtype = f32"},
      {"indices_ndim", [](GatherAttentionParams& p) { p.indices.ndim = 3; }, "indices.ndim = 3"},
      {"indices_batch", [](GatherAttentionParams& p) { p.indices.shape[0] = 1; }, "indices.shape[0] = 1 (expected 2"},
      {"indices_heads", [](GatherAttentionParams& p) { p.indices.shape[1] = 3; }, "indices.shape[1] = 3 (expected 4"},
      {"indices_rows", [](GatherAttentionParams& p) { p.indices.shape[2] = 6; }, "indices.shape[2] = 6 (expected 5"},
      {"indices_nmax0", [](GatherAttentionParams& p) { p.indices.shape[3] = 0; }, "indices.shape[3] (n_max) = 0"},
      {"indices_negative_stride", [](GatherAttentionParams& p) { p.indices.stride[3] = -1; }, "indices.stride[3] = -1"},
      {"counts_missing", [](GatherAttentionParams& p) { p.counts.data = nullptr; }, "counts is missing"},
      {"counts_dtype", [](GatherAttentionParams& p) { p.counts.dtype = DType::f32; }, "counts.dtype = f32"},
      {"counts_shape", [](GatherAttentionParams& p) { p.counts.shape[2] = 4; }, "counts.shape[2] = 4 (expected 5"},
      {"counts_heads", [](GatherAttentionParams& p) { p.counts.shape[1] = 8; }, "counts.shape[1] = 8"},
      {"lse_dtype", [](GatherAttentionParams& p) { p.maybe_lse.dtype = DType::f16; }, "maybe_lse.dtype = f16"},
      {"lse_shape", [](GatherAttentionParams& p) { p.maybe_lse.shape[1] = 2; }, "maybe_lse.shape[1] = 2 (expected 4"},
      {"lse_ndim", [](GatherAttentionParams& p) { p.maybe_lse.ndim = 4; }, "maybe_lse.ndim = 4"},
      {"lse_stride0", [](GatherAttentionParams& p) { p.maybe_lse.stride[2] = 0; }, "maybe_lse.stride[2] = 0"},
      {"union_rows0", [](GatherAttentionParams& p) { p.group_union = true; p.union_rows = 0; }, "union_rows = 0"},
      {"union_rows_negative", [](GatherAttentionParams& p) { p.group_union = true; p.union_rows = -64; }, "union_rows = -64"},
      {"cpu_threads", [](GatherAttentionParams& p) { p.exec.cpu_threads = -1; }, "exec.cpu_threads = -1"},
  };
  for (const Bad& b : bads) {
    cases.push_back({Name("GATHER_BAD")("param", b.what), [b] {
                       GatherCase c{2, 4, 2, 5, 7, 8, 4, 1, DType::f32, DType::f32, 0, 1};
                       GatherProblem g(c, "GATHER_BAD");
                       ASSERT_TRUE(g.run(1).ok());
                       b.breakit(g.p);
                       g.o32.poison();
                       g.lse.poison();
                       const Status st = gather_attention(g.p);
                       expect_error(st, StatusCode::invalid_argument, b.fragment);
                       expect_error(supported(g.p), StatusCode::invalid_argument, b.fragment);
                       EXPECT_EQ(st.message().rfind("gather_attention: ", 0), 0u) << st.message();
                       for (size_t i = 0; i < g.o32.size(); ++i) ASSERT_TRUE(std::isnan(g.o32[i])) << "O written on bad input";
                     }});
  }
  // union_rows is only checked when group_union is set: the CPU result is per row either way.
  cases.push_back({"GATHER_UNION_ROWS_UNUSED", [] {
                     GatherCase c{1, 2, 1, 3, 4, 8, 2, 0, DType::f32, DType::f32, 0, 1};
                     GatherProblem g(c, "GATHER_UNION_ROWS_UNUSED");
                     EXPECT_TRUE(g.run(1, false, 0).ok());
                   }});
}

// ---- error reporting of the row loops ---------------------------------------------------------

// The row loop shared by the three operations must report the lowest failing row whatever the order
// in which the rows fail. Two schedules force the order: the low row (5) fails first and a high row
// (40) later, or the other way round. Catches "last writer wins" and "first writer wins".
void run_lowest_error(bool low_first) {
  using namespace std::chrono_literals;
  std::atomic<bool> high_started{false}, high_done{false};
  auto wait_for = [](const std::atomic<bool>& flag) {
    const auto until = std::chrono::steady_clock::now() + 2s;  // single-threaded fallback: no hang
    while (!flag.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(100us);
  };
  auto row_fn = [&](std::int64_t r) -> Status {
    if (r == 5) {
      wait_for(low_first ? high_started : high_done);
      if (!low_first) std::this_thread::sleep_for(20ms);  // let row 40's report land first
      return invalid_argument("row 5");
    }
    if (r >= 40) {
      high_started = true;
      if (low_first) std::this_thread::sleep_for(20ms);   // row 5 reports meanwhile
      high_done = true;
      return invalid_argument("row " + std::to_string(r));
    }
    return {};
  };
  const Status st = sparge::cpu::for_each_row(64, 4, row_fn, 8);
  EXPECT_EQ(st.message(), "row 5");
}

SPARGE_CASES(TokenRows) {
  cases.push_back({"ROWS_LOWEST_ERROR(order=low_first)", [] { run_lowest_error(true); }});
  cases.push_back({"ROWS_LOWEST_ERROR(order=high_first)", [] { run_lowest_error(false); }});
  cases.push_back({"ROWS_ALL_OK(threads=1..5)", [] {
                     for (int threads = 1; threads <= 5; ++threads) {
                       std::vector<std::atomic<int>> seen(1000);
                       const Status st = sparge::cpu::for_each_row(1000, threads, [&](std::int64_t r) {
                         seen[static_cast<size_t>(r)]++;
                         return Status{};
                       });
                       EXPECT_TRUE(st.ok());
                       for (auto& x : seen) ASSERT_EQ(x.load(), 1) << "every row exactly once";
                     }
                   }});
}

}  // namespace
}  // namespace sparge::test
