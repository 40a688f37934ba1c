// Stage 2 (block-sparse attention) and the dense oracle on the CPU backend, against
// docs/semantics.md:
//   Attn        - block_sparse_attention == dense_attention with the LUT expanded into a mask, over
//                 random LUTs (empty, one block, random, full, rows emptied), shapes with odd
//                 lengths, causal Sq < Sk and Sq > Sk, GQA, dtypes, layouts and block sizes;
//   AttnTail    - every tail size of the query and key blocks;
//   AttnOracle  - dense_attention (with and without masks) and the sparse path against a naive
//                 attention written here (LSE against a naive logsumexp);
//   AttnProp    - merging two halves == whole, varlen == per-sequence runs, GQA == repeated K/V,
//                 NHD == HND == padded, thread count independence, pv_threshold (constructed skip
//                 against a naive computation; a huge threshold == none), empty rows, logit spreads
//                 of 1e4, -0.0 inputs;
//   AttnBad     - one bad input per parameter of both operations: !ok, a message naming the
//                 parameter and value, outputs untouched.
// Every run poisons its outputs, checks that each logical element was written and that the guard
// regions are intact.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attention_ref.h"
#include "harness/harness.h"

namespace sparge::test {
namespace {
using namespace ref;

// One attention problem. With varlen (lens_q non-empty) q/k/v are [1, total, H, D].
struct Spec {
  int b = 1, hq = 1, hk = 1;
  std::int64_t sq = 64, sk = 64;
  int d = 32, blkq = 64, blkk = 64;
  bool causal = false;
  DType dtype = DType::f32;
  Layout layout = Layout::nhd;
  float scale = 0.0f;
  std::vector<std::int64_t> lens_q, lens_k;

  bool varlen() const { return !lens_q.empty(); }
  std::int64_t seqs() const { return varlen() ? static_cast<std::int64_t>(lens_q.size()) : b; }
  std::int64_t max_q() const { return varlen() ? *std::max_element(lens_q.begin(), lens_q.end()) : sq; }
  std::int64_t max_k() const { return varlen() ? *std::max_element(lens_k.begin(), lens_k.end()) : sk; }
  std::int64_t nq() const { return num_blocks(max_q(), blkq); }
  std::int64_t nk() const { return num_blocks(max_k(), blkk); }
  double eff_scale() const { return scale == 0.0f ? 1.0 / std::sqrt(static_cast<double>(d)) : scale; }
  std::vector<std::int64_t> seq_q() const { return varlen() ? lens_q : std::vector<std::int64_t>(b, sq); }
  std::vector<std::int64_t> seq_k() const { return varlen() ? lens_k : std::vector<std::int64_t>(b, sk); }
  std::vector<std::int64_t> nk_seq() const {
    std::vector<std::int64_t> n;
    for (auto l : seq_k()) n.push_back(num_blocks(l, blkk));
    return n;
  }
};

std::string dtype_name(DType t) { return to_string(t); }

Name spec_name(const char* op, const Spec& s) {
  Name n(op);
  if (s.varlen()) {
    std::string lq, lk;
    for (size_t i = 0; i < s.lens_q.size(); ++i) {
      lq += (i ? ":" : "") + std::to_string(s.lens_q[i]);
      lk += (i ? ":" : "") + std::to_string(s.lens_k[i]);
    }
    n("seqs", s.seqs())("hq", s.hq)("hk", s.hk)("lq", lq)("lk", lk);
  } else {
    n("b", s.b)("hq", s.hq)("hk", s.hk)("sq", s.sq)("sk", s.sk);
  }
  n("d", s.d)("causal", s.causal ? 1 : 0)("blk", std::to_string(s.blkq) + "x" + std::to_string(s.blkk));
  return n;
}

// Inputs of a problem, stored in the spec's dtype and layout; ql/kl/vl hold the stored values in
// logical NHD order (after rounding), for references.
struct Problem {
  Spec s;
  Tensor4 q, k, v;
  std::vector<float> ql, kl, vl;
  std::vector<std::int32_t> cu_q, cu_k;

  Varlen varlen() const {
    Varlen v;
    if (!s.varlen()) return v;
    v.cu_seqlens_q = cu_q.data();
    v.cu_seqlens_k = cu_k.data();
    v.num_seqs = static_cast<int>(s.seqs());
    v.max_seqlen_q = static_cast<int>(s.max_q());
    v.max_seqlen_k = static_cast<int>(s.max_k());
    return v;
  }
  std::int64_t rows_q() const { return s.varlen() ? cu_q.back() : s.sq; }
  std::int64_t rows_k() const { return s.varlen() ? cu_k.back() : s.sk; }
  std::int64_t tb() const { return s.varlen() ? 1 : s.b; }
};

using Shaper = std::function<void(const Spec&, std::vector<float>& q, std::vector<float>& k, std::vector<float>& v)>;

std::unique_ptr<Problem> make_problem(const Spec& s, std::mt19937_64& rng, const Shaper& shape = nullptr) {
  auto p = std::make_unique<Problem>();
  p->s = s;
  if (s.varlen()) {
    p->cu_q.push_back(0);
    p->cu_k.push_back(0);
    for (size_t i = 0; i < s.lens_q.size(); ++i) {
      p->cu_q.push_back(p->cu_q.back() + static_cast<std::int32_t>(s.lens_q[i]));
      p->cu_k.push_back(p->cu_k.back() + static_cast<std::int32_t>(s.lens_k[i]));
    }
  }
  const std::int64_t tb = p->tb(), rq = p->rows_q(), rk = p->rows_k();
  p->q = Tensor4(s.dtype, tb, rq, s.hq, s.d, s.layout);
  p->k = Tensor4(s.dtype, tb, rk, s.hk, s.d, s.layout);
  p->v = Tensor4(s.dtype, tb, rk, s.hk, s.d, s.layout);
  std::vector<float> q(static_cast<size_t>(tb * rq * s.hq * s.d)), k(static_cast<size_t>(tb * rk * s.hk * s.d)),
      v(k.size());
  fill_normal(q, rng);
  fill_normal(k, rng);
  fill_normal(v, rng);
  if (shape) shape(s, q, k, v);
  p->q.fill(q);
  p->k.fill(k);
  p->v.fill(v);
  p->ql = p->q.read();
  p->kl = p->k.read();
  p->vl = p->v.read();
  return p;
}

// The outputs of one run: O (in the requested dtype and layout) and LSE [seqs, Hq, max_q].
struct Outputs {
  Status st;
  Tensor4 o;
  Guarded<float> lse;
  std::vector<float> ol;
};

struct RunOpts {
  DType odtype = DType::f32;
  Layout olayout = Layout::nhd;
  int threads = 0;
  bool lse = true;
  std::vector<float> pv;  // pv_threshold
};

std::unique_ptr<Outputs> alloc_outputs(const Problem& p, const RunOpts& r) {
  auto out = std::make_unique<Outputs>();
  out->o = Tensor4(r.odtype, p.tb(), p.rows_q(), p.s.hq, p.s.d, r.olayout);
  out->lse.resize(static_cast<size_t>(p.s.seqs() * p.s.hq * p.s.max_q()));
  out->lse.poison();
  return out;
}

Tensor lse_view(Outputs& out, const Problem& p) {
  return make_tensor(out.lse.data(), DType::f32, {p.s.seqs(), p.s.hq, p.s.max_q()});
}

void finish(Outputs& out) {
  EXPECT_TRUE(out.o.buf.guards_intact()) << "o guard region overwritten";
  EXPECT_TRUE(out.lse.guards_intact()) << "lse guard region overwritten";
  out.ol = out.o.read();
}

BlockSparseAttentionParams sparse_params(Problem& p, Lut& l, Outputs& out, const RunOpts& r) {
  BlockSparseAttentionParams sp;
  sp.q = p.q.view;
  sp.k = p.k.view;
  sp.v = p.v.view;
  sp.o = out.o.view;
  if (r.lse) sp.maybe_lse = lse_view(out, p);
  sp.lut = l.lut_view();
  sp.counts = l.counts_view();
  sp.blkq = p.s.blkq;
  sp.blkk = p.s.blkk;
  sp.varlen = p.varlen();
  sp.scale = p.s.scale;
  sp.is_causal = p.s.causal;
  sp.pv_threshold = PerHead(r.pv.data(), r.pv.size());
  sp.exec.cpu_threads = r.threads;
  return sp;
}

std::unique_ptr<Outputs> run_sparse(Problem& p, Lut& l, const RunOpts& r = {}) {
  auto out = alloc_outputs(p, r);
  out->st = block_sparse_attention(sparse_params(p, l, *out, r));
  EXPECT_TRUE(out->st.ok()) << out->st.message();
  finish(*out);
  return out;
}

DenseAttentionParams dense_params(Problem& p, const std::uint8_t* mask, Outputs& out, const RunOpts& r) {
  DenseAttentionParams dp;
  dp.q = p.q.view;
  dp.k = p.k.view;
  dp.v = p.v.view;
  dp.o = out.o.view;
  if (r.lse) dp.maybe_lse = lse_view(out, p);
  if (mask != nullptr) {
    dp.maybe_mask = make_tensor(const_cast<std::uint8_t*>(mask), DType::u8, {p.s.seqs(), p.s.hq, p.s.max_q(), p.s.max_k()});
  }
  dp.varlen = p.varlen();
  dp.scale = p.s.scale;
  dp.is_causal = p.s.causal;
  dp.exec.cpu_threads = r.threads;
  return dp;
}

std::unique_ptr<Outputs> run_dense(Problem& p, const std::uint8_t* mask, const RunOpts& r = {}) {
  auto out = alloc_outputs(p, r);
  out->st = dense_attention(dense_params(p, mask, *out, r));
  EXPECT_TRUE(out->st.ok()) << out->st.message();
  finish(*out);
  return out;
}

// LSE entries of real rows (i < the sequence's length), in [seqs, Hq, max_q] order; the rest
// must still hold the poison pattern (never written).
std::vector<float> real_lse(const Problem& p, const Outputs& out, bool expect_written = true) {
  std::vector<float> v;
  const auto lq = p.s.seq_q();
  std::int64_t untouched_bad = 0;
  for (std::int64_t b = 0; b < p.s.seqs(); ++b)
    for (std::int64_t h = 0; h < p.s.hq; ++h)
      for (std::int64_t i = 0; i < p.s.max_q(); ++i) {
        const float x = out.lse[static_cast<size_t>((b * p.s.hq + h) * p.s.max_q() + i)];
        if (i < lq[b]) {
          v.push_back(x);
        } else {
          std::uint32_t bits;
          std::memcpy(&bits, &x, 4);
          untouched_bad += bits != 0x7fbadbadu;
        }
      }
  if (expect_written) EXPECT_EQ(untouched_bad, 0) << "lse entries past a sequence's length were written";
  return v;
}

// Sparse (any output dtype) against the dense oracle's f32 output.
void expect_close_to(const Problem& p, const Outputs& got, const Outputs& ref, DType got_dtype, const char* what) {
  const double rel = out_rel_tol(got_dtype);
  const std::string eo = check_close(got.ol.data(), ref.ol.data(), ref.ol.size(), rel, 1e-6);
  EXPECT_EQ(eo, "") << what << ": O";
  const auto gl = real_lse(p, got), rl = real_lse(p, ref);
  const std::string el = check_close(gl.data(), rl.data(), rl.size(), 1e-6, 1e-6);
  EXPECT_EQ(el, "") << what << ": LSE";
}

void expect_bitwise(const Outputs& a, const Outputs& b, const char* what) {
  ASSERT_EQ(a.ol.size(), b.ol.size());
  EXPECT_EQ(check_bitwise(a.ol.data(), b.ol.data(), a.ol.size()), "") << what << ": O";
  EXPECT_EQ(check_bitwise(a.lse.data(), b.lse.data(), a.lse.size()), "") << what << ": LSE";
}

// The naive reference of a whole problem (every sequence), with a block-level LUT mask or none.
NaiveOut naive_problem(const Problem& p, Lut* l, const Pred& contributes = nullptr) {
  const Spec& s = p.s;
  NaiveOut all;
  all.o.assign(p.ql.size(), 0.0);
  all.lse.assign(static_cast<size_t>(s.seqs() * s.hq * s.max_q()), -kInf);
  const auto lq = s.seq_q(), lk = s.seq_k();
  for (std::int64_t b = 0; b < s.seqs(); ++b) {
    const std::int64_t q0 = s.varlen() ? p.cu_q[b] : b * s.sq, k0 = s.varlen() ? p.cu_k[b] : b * s.sk;
    const std::int64_t sq = lq[b], sk = lk[b];
    std::vector<std::uint8_t> sel;
    if (l != nullptr) {
      sel.assign(static_cast<size_t>(s.hq * l->nq * l->nk), 0);
      for (std::int64_t h = 0; h < s.hq; ++h)
        for (std::int64_t qb = 0; qb < l->nq; ++qb)
          for (std::int32_t e = 0; e < l->count(b, h, qb); ++e) sel[(h * l->nq + qb) * l->nk + l->at(b, h, qb, e)] = 1;
    }
    auto attend = [&](std::int64_t h, std::int64_t i, std::int64_t j) {
      if (s.causal && j > i + sk - sq) return false;
      return l == nullptr || sel[(h * l->nq + i / s.blkq) * l->nk + j / s.blkk] != 0;
    };
    NaiveOut r = naive_attention(p.ql.data() + q0 * s.hq * s.d, p.kl.data() + k0 * s.hk * s.d,
                                 p.vl.data() + k0 * s.hk * s.d, sq, sk, s.hq, s.hk, s.d, s.eff_scale(), attend,
                                 contributes);
    std::copy(r.o.begin(), r.o.end(), all.o.begin() + q0 * s.hq * s.d);
    for (std::int64_t h = 0; h < s.hq; ++h)
      for (std::int64_t i = 0; i < sq; ++i) all.lse[(b * s.hq + h) * s.max_q() + i] = r.lse[h * sq + i];
  }
  return all;
}

void expect_close_to_naive(const Problem& p, const Outputs& got, const NaiveOut& ref, DType got_dtype,
                           const char* what) {
  const double rel = out_rel_tol(got_dtype) + 1e-9;
  EXPECT_EQ(check_close(got.ol.data(), ref.o.data(), ref.o.size(), rel, 1e-6), "") << what << ": O vs naive";
  std::vector<double> rl;
  const auto lq = p.s.seq_q();
  for (std::int64_t b = 0; b < p.s.seqs(); ++b)
    for (std::int64_t h = 0; h < p.s.hq; ++h)
      for (std::int64_t i = 0; i < lq[b]; ++i) rl.push_back(ref.lse[(b * p.s.hq + h) * p.s.max_q() + i]);
  const auto gl = real_lse(p, got);
  EXPECT_EQ(check_close(gl.data(), rl.data(), rl.size(), 1e-6, 1e-6), "") << what << ": LSE vs naive";
}

// LUT patterns.
enum class Pattern { empty, one, random, full, holes };
const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::empty: return "empty";
    case Pattern::one: return "one";
    case Pattern::random: return "random";
    case Pattern::full: return "full";
    case Pattern::holes: return "holes";
  }
  return "?";
}

Lut make_lut(const Spec& s, Pattern pat, std::mt19937_64& rng, double density = 0.4) {
  const auto nks = s.nk_seq();
  switch (pat) {
    case Pattern::empty: return random_lut(rng, s.seqs(), s.hq, s.nq(), s.nk(), nks, 0.0);
    case Pattern::full: return random_lut(rng, s.seqs(), s.hq, s.nq(), s.nk(), nks, 1.0);
    case Pattern::random: return random_lut(rng, s.seqs(), s.hq, s.nq(), s.nk(), nks, density);
    case Pattern::one: {
      Lut l(s.seqs(), s.hq, s.nq(), s.nk());
      for (std::int64_t b = 0; b < s.seqs(); ++b)
        for (std::int64_t h = 0; h < s.hq; ++h)
          for (std::int64_t qb = 0; qb < s.nq(); ++qb)
            if (nks[b] > 0) l.push(b, h, qb, static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(nks[b])));
      return l;
    }
    case Pattern::holes: {  // dense rows with every third row emptied
      Lut l = random_lut(rng, s.seqs(), s.hq, s.nq(), s.nk(), nks, 0.7);
      for (std::int64_t b = 0; b < s.seqs(); ++b)
        for (std::int64_t h = 0; h < s.hq; ++h)
          for (std::int64_t qb = 0; qb < s.nq(); ++qb)
            if ((b + h + qb) % 3 == 0) l.count(b, h, qb) = 0;
      return l;
    }
  }
  return {};
}

// sparse(lut) == dense(mask(lut)), both poisoned and guarded.
void check_sparse_vs_dense(const Spec& s, Pattern pat, const std::string& name, DType odtype, Layout olayout,
                           double density = 0.4) {
  auto rng = rng_for(name);
  auto p = make_problem(s, rng);
  Lut l = make_lut(s, pat, rng, density);
  RunOpts ro;
  ro.odtype = odtype;
  ro.olayout = olayout;
  auto sp = run_sparse(*p, l, ro);
  const auto mask = lut_to_mask(l, s.blkq, s.blkk, s.max_q(), s.max_k(), s.seq_q(), s.seq_k());
  auto dn = run_dense(*p, mask.data());
  expect_close_to(*p, *sp, *dn, odtype, "sparse vs dense+mask");
}

// ---- Attn: sparse == dense with the expanded mask ---------------------------------------------
SPARGE_CASES(Attn) {
  struct Shape { int b, hq, hk; std::int64_t sq, sk; int d; };
  const Shape shapes[] = {{1, 1, 1, 1, 1, 64},     {2, 8, 2, 113, 203, 128}, {1, 2, 1, 799, 799, 64},
                          {1, 4, 4, 203, 113, 64}, {2, 2, 1, 64, 64, 32},    {1, 3, 1, 257, 129, 44},
                          {1, 2, 2, 1, 300, 16},   {1, 2, 1, 300, 1, 16}};
  const Pattern pats[] = {Pattern::empty, Pattern::one, Pattern::random, Pattern::full, Pattern::holes};
  const int blks[4][2] = {{64, 64}, {128, 64}, {64, 128}, {128, 128}};
  int counter = 0;
  for (const Shape& sh : shapes)
    for (int causal = 0; causal < 2; ++causal)
      for (DType dt : {DType::f32, DType::f16, DType::bf16})
        for (Pattern pat : pats) {
          const int c = counter++;
          Spec s;
          s.b = sh.b; s.hq = sh.hq; s.hk = sh.hk; s.sq = sh.sq; s.sk = sh.sk; s.d = sh.d;
          s.causal = causal;
          s.dtype = dt;
          s.blkq = blks[c % 4][0];
          s.blkk = blks[(c / 4) % 4][1];
          s.layout = static_cast<Layout>(c % 3);
          const Layout olayout = static_cast<Layout>((c / 3) % 3);
          const DType odt = (c % 2) ? DType::f32 : dt;
          if (c % 7 == 3) s.scale = 0.3f;
          Name n = spec_name("ATTN", s);
          n("pattern", pattern_name(pat))("density", pat == Pattern::random ? 0.4 : pat == Pattern::full ? 1.0 : 0.0)
              ("dtype", dtype_name(dt))("o", dtype_name(odt))("layout", layout_name(s.layout))("olayout", layout_name(olayout));
          if (s.scale != 0.0f) n("scale", s.scale);
          const std::string name = n;
          cases.push_back({name, [=] { check_sparse_vs_dense(s, pat, name, odt, olayout); }});
        }
}

// ---- AttnTail: every tail size ------------------------------------------------------------------
SPARGE_CASES(AttnTail) {
  for (int blk : {64, 128}) {
    for (int t = 1; t <= blk; t += (blk == 64 ? 1 : 3)) {
      Spec s;
      s.hq = 2;
      s.hk = 1;
      s.d = 16;
      s.blkq = blk;
      s.blkk = blk;
      s.sk = blk + t;                   // the last key block holds t keys
      s.sq = blk + (t * 37) % blk + 1;  // the last query block holds 1..blk rows
      s.causal = t % 2 == 1;
      s.dtype = t % 3 == 0 ? DType::bf16 : DType::f32;
      Name n = spec_name("ATTN_TAIL", s);
      n("tail", t)("density", 0.6)("dtype", dtype_name(s.dtype));
      const std::string name = n;
      cases.push_back({name, [=] { check_sparse_vs_dense(s, Pattern::random, name, DType::f32, Layout::nhd, 0.6); }});
    }
  }
}

// ---- AttnOracle: the dense oracle and the sparse path against the naive reference -------------
SPARGE_CASES(AttnOracle) {
  struct Shape { int b, hq, hk; std::int64_t sq, sk; int d; };
  const Shape shapes[] = {{2, 4, 2, 113, 203, 64}, {1, 2, 1, 203, 113, 32}, {1, 1, 1, 1, 1, 8},
                          {1, 2, 2, 70, 70, 21},   {2, 3, 1, 33, 150, 16}};
  int c = 0;
  for (const Shape& sh : shapes)
    for (int causal = 0; causal < 2; ++causal)
      for (DType dt : {DType::f32, DType::bf16}) {
        Spec s;
        s.b = sh.b; s.hq = sh.hq; s.hk = sh.hk; s.sq = sh.sq; s.sk = sh.sk; s.d = sh.d;
        s.causal = causal;
        s.dtype = dt;
        s.layout = static_cast<Layout>(c % 3);
        s.blkq = c % 2 ? 128 : 64;
        s.blkk = c % 4 < 2 ? 64 : 128;
        if (c % 3 == 1) s.scale = 0.7f;
        ++c;
        // Full LUT == plain dense attention == naive; LSE against the naive logsumexp.
        const std::string full = Name(spec_name("ATTN_FULL", s))("dtype", dtype_name(dt));
        cases.push_back({full, [=] {
          auto rng = rng_for(full);
          auto p = make_problem(s, rng);
          Lut l = make_lut(s, Pattern::full, rng);
          auto sp = run_sparse(*p, l);
          auto dn = run_dense(*p, nullptr);
          const NaiveOut ref = naive_problem(*p, nullptr);
          expect_close_to_naive(*p, *dn, ref, DType::f32, "dense");
          expect_close_to_naive(*p, *sp, ref, DType::f32, "sparse (full LUT)");
        }});
        // Random LUT: sparse and dense+mask against the naive computation of the same selection.
        const std::string rnd = Name(spec_name("ATTN_NAIVE", s))("density", 0.5)("dtype", dtype_name(dt));
        cases.push_back({rnd, [=] {
          auto rng = rng_for(rnd);
          auto p = make_problem(s, rng);
          Lut l = make_lut(s, Pattern::random, rng, 0.5);
          auto sp = run_sparse(*p, l);
          const auto mask = lut_to_mask(l, s.blkq, s.blkk, s.max_q(), s.max_k(), s.seq_q(), s.seq_k());
          auto dn = run_dense(*p, mask.data());
          const NaiveOut ref = naive_problem(*p, &l);
          expect_close_to_naive(*p, *dn, ref, DType::f32, "dense+mask");
          expect_close_to_naive(*p, *sp, ref, DType::f32, "sparse");
        }});
      }
  // A token-level random mask, broadcast over batch and heads by stride 0.
  for (int causal = 0; causal < 2; ++causal) {
    Spec s;
    s.b = 2; s.hq = 4; s.hk = 2; s.sq = 77; s.sk = 91; s.d = 16; s.causal = causal;
    const std::string name = Name(spec_name("DENSE_MASK", s))("mask", "token_random_broadcast");
    cases.push_back({name, [=] {
      auto rng = rng_for(name);
      auto p = make_problem(s, rng);
      std::vector<std::uint8_t> m(static_cast<size_t>(s.sq * s.sk));
      for (auto& x : m) x = (rng() % 3 == 0) ? 0 : static_cast<std::uint8_t>(1 + rng() % 255);
      for (std::int64_t j = 0; j < s.sk; ++j) m[static_cast<size_t>(5 * s.sk + j)] = 0;  // row 5 empty
      RunOpts ro;
      auto out = alloc_outputs(*p, ro);
      DenseAttentionParams dp = dense_params(*p, nullptr, *out, ro);
      dp.maybe_mask = make_tensor(m.data(), DType::u8, {s.b, s.hq, s.sq, s.sk}, {0, 0, s.sk, 1});
      out->st = dense_attention(dp);
      ASSERT_TRUE(out->st.ok()) << out->st.message();
      finish(*out);
      NaiveOut ref = naive_attention(p->ql.data(), p->kl.data(), p->vl.data(), s.sq, s.sk, s.hq, s.hk, s.d, s.eff_scale(),
                                     [&](std::int64_t, std::int64_t i, std::int64_t j) {
                                       return m[i * s.sk + j] != 0 && (!s.causal || j <= i + s.sk - s.sq);
                                     });
      NaiveOut ref1 = naive_attention(p->ql.data() + s.sq * s.hq * s.d, p->kl.data() + s.sk * s.hk * s.d,
                                      p->vl.data() + s.sk * s.hk * s.d, s.sq, s.sk, s.hq, s.hk, s.d, s.eff_scale(),
                                      [&](std::int64_t, std::int64_t i, std::int64_t j) {
                                        return m[i * s.sk + j] != 0 && (!s.causal || j <= i + s.sk - s.sq);
                                      });
      ref.o.insert(ref.o.end(), ref1.o.begin(), ref1.o.end());
      ref.lse.insert(ref.lse.end(), ref1.lse.begin(), ref1.lse.end());
      expect_close_to_naive(*p, *out, ref, DType::f32, "dense+broadcast mask");
      for (std::int64_t h = 0; h < s.hq; ++h) {
        EXPECT_EQ(out->lse[static_cast<size_t>(h * s.sq + 5)], -INFINITY);
        for (int e = 0; e < s.d; ++e) EXPECT_EQ(out->ol[static_cast<size_t>((5 * s.hq + h) * s.d + e)], 0.0f);
      }
    }});
  }
}


// ---- AttnProp: equivalences and properties ------------------------------------------------------

// Merging two partial results (each with its LSE) through merge_attention.
std::unique_ptr<Outputs> merge_outputs(const Problem& p, Outputs& a, Outputs& b) {
  auto out = std::make_unique<Outputs>();
  out->o = Tensor4(DType::f32, p.tb(), p.rows_q(), p.s.hq, p.s.d, Layout::nhd);
  out->lse.resize(a.lse.size());
  out->lse.poison();
  MergeAttentionParams mp;
  mp.o_a = a.o.view;
  mp.o_b = b.o.view;
  mp.o = out->o.view;
  const std::int64_t hq = p.s.hq;
  mp.lse_a = make_tensor(a.lse.data(), DType::f32, {p.tb(), hq, p.rows_q()});
  mp.lse_b = make_tensor(b.lse.data(), DType::f32, {p.tb(), hq, p.rows_q()});
  mp.lse = make_tensor(out->lse.data(), DType::f32, {p.tb(), hq, p.rows_q()});
  out->st = merge_attention(mp);
  EXPECT_TRUE(out->st.ok()) << out->st.message();
  finish(*out);
  return out;
}

void add_merge_cases(std::vector<Case>& cases) {
  // Sparse: the LUT's entries split alternately into two LUTs; merged halves == whole.
  struct Shape { int b, hq, hk; std::int64_t sq, sk; int d; bool causal; DType dt; };
  const Shape shapes[] = {{2, 4, 2, 113, 203, 64, false, DType::f32}, {1, 2, 1, 203, 113, 32, true, DType::f16},
                          {1, 2, 2, 300, 300, 16, true, DType::bf16}, {2, 1, 1, 64, 1, 8, false, DType::f32}};
  for (const Shape& sh : shapes) {
    Spec s;
    s.b = sh.b; s.hq = sh.hq; s.hk = sh.hk; s.sq = sh.sq; s.sk = sh.sk; s.d = sh.d; s.causal = sh.causal; s.dtype = sh.dt;
    const std::string name = Name(spec_name("ATTN_MERGE", s))("split", "lut_alternate")("dtype", dtype_name(sh.dt));
    cases.push_back({name, [=] {
      auto rng = rng_for(name);
      auto p = make_problem(s, rng);
      Lut whole = make_lut(s, Pattern::random, rng, 0.6);
      Lut a(whole.b, whole.h, whole.nq, whole.nk), b = a;
      for (std::int64_t bi = 0; bi < whole.b; ++bi)
        for (std::int64_t h = 0; h < whole.h; ++h)
          for (std::int64_t qb = 0; qb < whole.nq; ++qb)
            for (std::int32_t e = 0; e < whole.count(bi, h, qb); ++e) (e % 2 ? b : a).push(bi, h, qb, whole.at(bi, h, qb, e));
      auto ra = run_sparse(*p, a), rb = run_sparse(*p, b), rw = run_sparse(*p, whole);
      auto merged = merge_outputs(*p, *ra, *rb);
      expect_close_to(*p, *merged, *rw, DType::f32, "merge(sparse a, sparse b) vs sparse whole");
    }});
  }
  // Dense: keys split at s1 through strided views of K and V (no copies), non-causal.
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    for (std::int64_t s1 : {1, 64, 130}) {
      Spec s;
      s.b = 2; s.hq = 4; s.hk = 2; s.sq = 97; s.sk = 203; s.d = 32; s.dtype = dt; s.layout = Layout::hnd;
      const std::string name = Name(spec_name("ATTN_MERGE", s))("split", s1)("dtype", dtype_name(dt));
      cases.push_back({name, [=] {
        auto rng = rng_for(name);
        auto p = make_problem(s, rng);
        auto whole = run_dense(*p, nullptr);
        std::unique_ptr<Outputs> half[2];
        for (int w = 0; w < 2; ++w) {
          RunOpts ro;
          half[w] = alloc_outputs(*p, ro);
          DenseAttentionParams dp = dense_params(*p, nullptr, *half[w], ro);
          const std::int64_t j0 = w == 0 ? 0 : s1, len = w == 0 ? s1 : s.sk - s1;
          for (Tensor* t : {&dp.k, &dp.v}) {
            t->data = static_cast<char*>(t->data) + j0 * t->stride[1] * static_cast<std::int64_t>(dtype_size(t->dtype));
            t->shape[1] = len;
          }
          half[w]->st = dense_attention(dp);
          ASSERT_TRUE(half[w]->st.ok()) << half[w]->st.message();
          finish(*half[w]);
        }
        auto merged = merge_outputs(*p, *half[0], *half[1]);
        expect_close_to(*p, *merged, *whole, DType::f32, "merge(dense keys [0,s1), dense keys [s1,Sk)) vs whole");
      }});
    }
  }
}

// Varlen == one run per sequence, bitwise; LSE entries past a sequence's length untouched.
void add_varlen_cases(std::vector<Case>& cases) {
  const std::vector<std::vector<std::int64_t>> lq = {{5, 0, 130, 64}, {113, 1, 200}, {70}};
  const std::vector<std::vector<std::int64_t>> lk = {{7, 200, 0, 64}, {203, 300, 64}, {150}};
  for (size_t set = 0; set < lq.size(); ++set)
    for (int causal = 0; causal < 2; ++causal)
      for (int sparse = 0; sparse < 2; ++sparse) {
        Spec s;
        s.hq = 4; s.hk = 2; s.d = 24; s.causal = causal; s.lens_q = lq[set]; s.lens_k = lk[set];
        s.blkq = set == 1 ? 128 : 64;
        s.blkk = set == 2 ? 128 : 64;
        s.dtype = set == 1 ? DType::f16 : DType::f32;
        s.layout = static_cast<Layout>(set % 3);
        const std::string name = Name(spec_name(sparse ? "ATTN_VARLEN" : "DENSE_VARLEN", s))("dtype", dtype_name(s.dtype));
        cases.push_back({name, [=] {
          auto rng = rng_for(name);
          auto p = make_problem(s, rng);
          Lut l = make_lut(s, Pattern::random, rng, 0.5);
          auto whole = sparse ? run_sparse(*p, l) : run_dense(*p, nullptr);
          real_lse(*p, *whole);  // checks that nothing past a sequence's length was written
          for (std::int64_t b = 0; b < s.seqs(); ++b) {
            Spec one = s;
            one.lens_q.clear();
            one.lens_k.clear();
            one.sq = s.lens_q[b];
            one.sk = s.lens_k[b];
            auto q1 = std::make_unique<Problem>();
            q1->s = one;
            q1->q = Tensor4(s.dtype, 1, one.sq, s.hq, s.d, Layout::nhd);
            q1->k = Tensor4(s.dtype, 1, one.sk, s.hk, s.d, Layout::nhd);
            q1->v = Tensor4(s.dtype, 1, one.sk, s.hk, s.d, Layout::nhd);
            auto slice = [](const std::vector<float>& x, std::int64_t r0, std::int64_t n, std::int64_t w) {
              return std::vector<float>(x.begin() + r0 * w, x.begin() + (r0 + n) * w);
            };
            q1->q.fill(slice(p->ql, p->cu_q[b], one.sq, s.hq * s.d));
            q1->k.fill(slice(p->kl, p->cu_k[b], one.sk, s.hk * s.d));
            q1->v.fill(slice(p->vl, p->cu_k[b], one.sk, s.hk * s.d));
            Lut l1(1, s.hq, one.nq(), one.nk());
            for (std::int64_t h = 0; h < s.hq; ++h)
              for (std::int64_t qb = 0; qb < one.nq(); ++qb)
                for (std::int32_t e = 0; e < l.count(b, h, qb); ++e) l1.push(0, h, qb, l.at(b, h, qb, e));
            auto r1 = sparse ? run_sparse(*q1, l1) : run_dense(*q1, nullptr);
            const size_t w = static_cast<size_t>(s.hq * s.d);
            EXPECT_EQ(check_bitwise(whole->ol.data() + p->cu_q[b] * w, r1->ol.data(), r1->ol.size()), "") << "O of sequence " << b;
            for (std::int64_t h = 0; h < s.hq; ++h)
              EXPECT_EQ(check_bitwise(whole->lse.data() + (b * s.hq + h) * s.max_q(), r1->lse.data() + h * one.sq,
                                      static_cast<size_t>(one.sq)), "")
                  << "LSE of sequence " << b << " head " << h;
          }
        }});
      }
}

// GQA == K/V repeated per query head, bitwise.
void add_gqa_cases(std::vector<Case>& cases) {
  for (int causal = 0; causal < 2; ++causal)
    for (int sparse = 0; sparse < 2; ++sparse) {
      Spec s;
      s.b = 2; s.hq = 6; s.hk = 2; s.sq = 113; s.sk = 150; s.d = 32; s.causal = causal; s.dtype = DType::bf16;
      const std::string name = spec_name(sparse ? "ATTN_GQA" : "DENSE_GQA", s);
      cases.push_back({name, [=] {
        auto rng = rng_for(name);
        auto p = make_problem(s, rng);
        Spec r = s;
        r.hk = s.hq;
        auto rep = std::make_unique<Problem>();
        rep->s = r;
        rep->q = Tensor4(s.dtype, s.b, s.sq, s.hq, s.d, Layout::nhd);
        rep->k = Tensor4(s.dtype, s.b, s.sk, s.hq, s.d, Layout::hnd);
        rep->v = Tensor4(s.dtype, s.b, s.sk, s.hq, s.d, Layout::pad);
        std::vector<float> k(static_cast<size_t>(s.b * s.sk * s.hq * s.d)), v(k.size());
        for (std::int64_t b = 0; b < s.b; ++b)
          for (std::int64_t j = 0; j < s.sk; ++j)
            for (std::int64_t h = 0; h < s.hq; ++h)
              for (std::int64_t e = 0; e < s.d; ++e) {
                const std::int64_t g = h / (s.hq / s.hk);
                k[((b * s.sk + j) * s.hq + h) * s.d + e] = p->kl[((b * s.sk + j) * s.hk + g) * s.d + e];
                v[((b * s.sk + j) * s.hq + h) * s.d + e] = p->vl[((b * s.sk + j) * s.hk + g) * s.d + e];
              }
        rep->q.fill(p->ql);
        rep->k.fill(k);
        rep->v.fill(v);
        Lut l = make_lut(s, Pattern::random, rng, 0.5);
        auto a = sparse ? run_sparse(*p, l) : run_dense(*p, nullptr);
        auto b = sparse ? run_sparse(*rep, l) : run_dense(*rep, nullptr);
        expect_bitwise(*a, *b, "GQA vs repeated K/V");
      }});
    }
}

// K/V with batch stride 0 (one K/V broadcast over the batch) == K/V copied per batch, bitwise.
void add_broadcast_cases(std::vector<Case>& cases) {
  for (int sparse = 0; sparse < 2; ++sparse) {
    Spec s;
    s.b = 3; s.hq = 4; s.hk = 2; s.sq = 77; s.sk = 130; s.d = 20; s.causal = sparse == 1; s.dtype = DType::f16;
    const std::string name = Name(spec_name(sparse ? "ATTN_BROADCAST" : "DENSE_BROADCAST", s))("kv_stride0", 1);
    cases.push_back({name, [=] {
      auto rng = rng_for(name);
      auto p = make_problem(s, rng);
      // Copy batch 0 of K/V into every batch: the reference problem.
      std::vector<float> k = p->kl, v = p->vl;
      const size_t per = static_cast<size_t>(s.sk * s.hk * s.d);
      for (int b = 1; b < s.b; ++b) {
        std::copy(k.begin(), k.begin() + per, k.begin() + b * per);
        std::copy(v.begin(), v.begin() + per, v.begin() + b * per);
      }
      p->k.fill(k);
      p->v.fill(v);
      Lut l = make_lut(s, Pattern::random, rng, 0.6);
      auto full = sparse ? run_sparse(*p, l) : run_dense(*p, nullptr);
      p->k.view.stride[0] = 0;  // every batch reads batch 0's K/V
      p->v.view.stride[0] = 0;
      p->k.view.shape[0] = p->v.view.shape[0] = s.b;
      auto bc = sparse ? run_sparse(*p, l) : run_dense(*p, nullptr);
      expect_bitwise(*full, *bc, "batch-broadcast K/V vs copies");
    }});
  }
}

// NHD == HND == padded storage (inputs and output), and any thread count, bitwise.
void add_invariance_cases(std::vector<Case>& cases) {
  for (int causal = 0; causal < 2; ++causal)
    for (int sparse = 0; sparse < 2; ++sparse) {
      Spec s;
      s.b = 2; s.hq = 4; s.hk = 2; s.sq = 203; s.sk = 113; s.d = 40; s.causal = causal; s.dtype = DType::f16;
      s.blkq = 128;
      const std::string lname = Name(spec_name(sparse ? "ATTN_LAYOUT" : "DENSE_LAYOUT", s))("layouts", "nhd=hnd=pad");
      cases.push_back({lname, [=] {
        auto rng = rng_for(lname);
        auto p = make_problem(s, rng);
        Lut l = make_lut(s, Pattern::random, rng, 0.5);
        std::unique_ptr<Outputs> first;
        for (Layout lay : {Layout::nhd, Layout::hnd, Layout::pad}) {
          Spec t = s;
          t.layout = lay;
          auto q = std::make_unique<Problem>();
          q->s = t;
          q->q = Tensor4(s.dtype, s.b, s.sq, s.hq, s.d, lay);
          q->k = Tensor4(s.dtype, s.b, s.sk, s.hk, s.d, lay);
          q->v = Tensor4(s.dtype, s.b, s.sk, s.hk, s.d, lay);
          q->q.fill(p->ql);
          q->k.fill(p->kl);
          q->v.fill(p->vl);
          RunOpts ro;
          ro.odtype = DType::f16;
          ro.olayout = lay;
          auto out = sparse ? run_sparse(*q, l, ro) : run_dense(*q, nullptr, ro);
          if (!first) first = std::move(out);
          else expect_bitwise(*first, *out, layout_name(lay));
        }
      }});
      const std::string tname = Name(spec_name(sparse ? "ATTN_THREADS" : "DENSE_THREADS", s))("threads", "1=2=3=7");
      cases.push_back({tname, [=] {
        auto rng = rng_for(tname);
        auto p = make_problem(s, rng);
        Lut l = make_lut(s, Pattern::random, rng, 0.5);
        std::unique_ptr<Outputs> first;
        for (int th : {1, 2, 3, 7}) {
          RunOpts ro;
          ro.threads = th;
          ro.pv = {3.0f};
          auto out = sparse ? run_sparse(*p, l, ro) : run_dense(*p, nullptr, ro);
          if (!first) first = std::move(out);
          else expect_bitwise(*first, *out, ("threads=" + std::to_string(th)).c_str());
        }
      }});
    }
}

// pv_threshold. Constructed so that key block 0 has logits near 5 and key block 1 near 0 for
// every row (5 nats = 7.2 log2 units below), LUT order [0, 1]: a threshold of 5 skips block 1's
// PV product, 10 does not. Checked against the naive computation with block 1's values left out
// of the numerator (but in the denominator).
void add_pv_cases(std::vector<Case>& cases) {
  Spec s;
  s.hq = 2; s.hk = 1; s.sq = 100; s.sk = 128; s.d = 64; s.blkq = 64; s.blkk = 64;
  auto shaper = [](bool spoil) {
    return [spoil](const Spec& sp, std::vector<float>& q, std::vector<float>& k, std::vector<float>&) {
      for (auto& x : q) x *= 0.01f;
      for (auto& x : k) x *= 0.01f;
      for (std::int64_t i = 0; i < sp.sq; ++i)
        for (int h = 0; h < sp.hq; ++h) q[(i * sp.hq + h) * sp.d] += (spoil && i == 70) ? -1.0f : 1.0f;
      for (std::int64_t j = 0; j < 64; ++j) k[j * sp.hk * sp.d] += 40.0f;
    };
  };
  struct PvCase { const char* what; std::vector<float> thr; bool spoil; bool reversed; int skip_heads; };
  const PvCase pcs[] = {
      {"skip", {5.0f}, false, false, 2},          // both heads skip block 1 in query block 0 and 1
      {"no_skip_thr10", {10.0f}, false, false, 0},
      {"per_head", {5.0f, 10.0f}, false, false, 1},  // head 0 skips, head 1 does not
      {"one_row_blocks", {5.0f}, true, false, -1},   // row 70 (query block 1) sees block 1 above
      {"lut_order_1_0", {5.0f}, false, true, 0},     // block 1 walked first: nothing to skip
  };
  for (const PvCase& pc : pcs) {
    std::string thr;
    for (size_t i = 0; i < pc.thr.size(); ++i) thr += (i ? ":" : "") + std::to_string(static_cast<int>(pc.thr[i]));
    const std::string name = Name(spec_name("ATTN_PV", s))("case", pc.what)("pv_threshold", thr);
    cases.push_back({name, [=] {
      auto rng = rng_for(name);
      auto p = make_problem(s, rng, shaper(pc.spoil));
      Lut l(1, s.hq, s.nq(), s.nk());
      for (int h = 0; h < s.hq; ++h)
        for (int qb = 0; qb < 2; ++qb) {
          l.push(0, h, qb, pc.reversed ? 1 : 0);
          l.push(0, h, qb, pc.reversed ? 0 : 1);
        }
      RunOpts ro;
      ro.pv = pc.thr;
      auto got = run_sparse(*p, l, ro);
      // Which (head, query block) pairs skip block 1.
      auto skipped = [&](std::int64_t h, std::int64_t qb) {
        if (pc.spoil) return qb == 0;
        return pc.skip_heads == 2 || (pc.skip_heads == 1 && h == 0);
      };
      const NaiveOut ref = naive_problem(*p, &l, [&](std::int64_t h, std::int64_t i, std::int64_t j) {
        return !(j >= 64 && skipped(h, i / 64));
      });
      expect_close_to_naive(*p, *got, ref, DType::f32, pc.what);
      // The skip must matter: without threshold the result differs where blocks were skipped.
      auto none = run_sparse(*p, l);
      double diff = 0;
      for (size_t i = 0; i < got->ol.size(); ++i) diff = std::max(diff, static_cast<double>(std::abs(got->ol[i] - none->ol[i])));
      const bool any_skip = pc.spoil || pc.skip_heads > 0;
      if (any_skip) EXPECT_GT(diff, 1e-3) << "the constructed skip does not change the result";
      else expect_bitwise(*got, *none, "no skip == no threshold");
      EXPECT_EQ(check_bitwise(got->lse.data(), none->lse.data(), got->lse.size()), "") << "LSE counts skipped blocks";
    }});
  }
  // A huge threshold never skips: bitwise equal to no threshold, on random data and LUTs.
  for (int causal = 0; causal < 2; ++causal) {
    Spec r;
    r.b = 2; r.hq = 4; r.hk = 2; r.sq = 203; r.sk = 300; r.d = 32; r.causal = causal; r.dtype = DType::bf16;
    const std::string name = Name(spec_name("ATTN_PV", r))("case", "huge")("pv_threshold", "3.4e38");
    cases.push_back({name, [=] {
      auto rng = rng_for(name);
      // Rows of a head share one query direction (plus noise), so whole query blocks agree on
      // which key blocks are far below their running max and a small threshold does skip.
      auto p = make_problem(r, rng, [](const Spec& sp, std::vector<float>& q, std::vector<float>&, std::vector<float>&) {
        for (std::int64_t i = 0; i < static_cast<std::int64_t>(q.size()); ++i) {
          const std::int64_t e = i % sp.d, h = (i / sp.d) % sp.hq;
          q[i] = 0.1f * q[i] + 3.0f * std::sin(static_cast<float>(e * 7 + h * 3));
        }
      });
      Lut l = make_lut(r, Pattern::random, rng, 0.7);
      RunOpts huge, small;
      huge.pv = {std::numeric_limits<float>::max()};
      small.pv = {0.5f};
      auto a = run_sparse(*p, l, huge), b = run_sparse(*p, l), c = run_sparse(*p, l, small);
      expect_bitwise(*a, *b, "huge threshold vs none");
      EXPECT_NE(check_bitwise(c->ol.data(), b->ol.data(), b->ol.size()), "") << "threshold 0.5 skipped nothing: weak case";
    }});
  }
}

// Empty rows (count 0, causal Sq > Sk, empty LUT) give exactly O = 0 and LSE = -inf; extreme
// inputs give no NaN/Inf.
void add_edge_cases(std::vector<Case>& cases) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (int sparse = 0; sparse < 2; ++sparse) {
      Spec s;
      s.b = 1; s.hq = 2; s.hk = 1; s.sq = 203; s.sk = 113; s.d = 16; s.causal = true; s.dtype = dt;
      const std::string name = Name(spec_name(sparse ? "ATTN_EMPTY" : "DENSE_EMPTY", s))("dtype", dtype_name(dt));
      cases.push_back({name, [=] {
        auto rng = rng_for(name);
        auto p = make_problem(s, rng);
        Lut l = make_lut(s, Pattern::holes, rng);
        RunOpts ro;
        ro.odtype = dt;
        auto out = sparse ? run_sparse(*p, l, ro) : run_dense(*p, nullptr, ro);
        for (std::int64_t h = 0; h < s.hq; ++h)
          for (std::int64_t i = 0; i < s.sq; ++i) {
            // Empty: no key is causally visible, or (sparse) no selected block holds a visible key.
            bool empty = i < s.sq - s.sk;
            if (sparse && !empty) {
              empty = true;
              for (std::int32_t e = 0; e < l.count(0, h, i / s.blkq); ++e)
                empty = empty && l.at(0, h, i / s.blkq, e) * s.blkk > i + s.sk - s.sq;
            }
            const float lse = out->lse[static_cast<size_t>(h * s.sq + i)];
            if (empty) {
              EXPECT_EQ(lse, -INFINITY) << "row " << i << " head " << h;
              for (int e = 0; e < s.d; ++e) EXPECT_EQ(out->ol[static_cast<size_t>((i * s.hq + h) * s.d + e)], 0.0f);
            } else {
              EXPECT_TRUE(std::isfinite(lse)) << "row " << i << " head " << h;
            }
          }
      }});
    }
  // Logit spreads of 1e4 (massive activations): finite and equal to the naive reference.
  for (DType dt : {DType::f32, DType::bf16}) {
    Spec s;
    s.b = 1; s.hq = 2; s.hk = 1; s.sq = 130; s.sk = 203; s.d = 64; s.dtype = dt; s.causal = dt == DType::bf16;
    const std::string name = Name(spec_name("ATTN_SPREAD", s))("logit_spread", "1e4")("dtype", dtype_name(dt));
    cases.push_back({name, [=] {
      auto rng = rng_for(name);
      auto p = make_problem(s, rng, [](const Spec&, std::vector<float>& q, std::vector<float>& k, std::vector<float>&) {
        for (auto& x : q) x *= 40.0f;
        for (auto& x : k) x *= 40.0f;  // logits ~ 40*40*8/8 ~ 1e3..1e4
      });
      Lut l = make_lut(s, Pattern::random, rng, 0.6);
      auto sp = run_sparse(*p, l);
      const NaiveOut ref = naive_problem(*p, &l);
      double spread = 0;
      for (double x : ref.lse) if (std::isfinite(x)) spread = std::max(spread, std::abs(x));
      EXPECT_GT(spread, 1e3) << "weak case: logits are not extreme";
      expect_close_to_naive(*p, *sp, ref, DType::f32, "sparse");
      const auto mask = lut_to_mask(l, s.blkq, s.blkk, s.sq, s.sk, s.seq_q(), s.seq_k());
      auto dn = run_dense(*p, mask.data());
      expect_close_to_naive(*p, *dn, ref, DType::f32, "dense");
    }});
  }
  // -0.0 everywhere in one input: uniform weights (q or k zero) or a -0.0 result (v zero).
  for (int which = 0; which < 3; ++which) {
    Spec s;
    s.hq = 2; s.hk = 2; s.sq = 70; s.sk = 130; s.d = 16; s.dtype = DType::f16; s.causal = which == 1;
    const char* names[] = {"q", "k", "v"};
    const std::string name = Name(spec_name("ATTN_NEGZERO", s))("zero", names[which]);
    cases.push_back({name, [=] {
      auto rng = rng_for(name);
      auto p = make_problem(s, rng, [which](const Spec&, std::vector<float>& q, std::vector<float>& k, std::vector<float>& v) {
        std::vector<float>& t = which == 0 ? q : which == 1 ? k : v;
        for (auto& x : t) x = -0.0f;
      });
      Lut l = make_lut(s, Pattern::random, rng, 0.7);
      auto sp = run_sparse(*p, l);
      const NaiveOut ref = naive_problem(*p, &l);
      for (float x : sp->ol) ASSERT_TRUE(std::isfinite(x));
      expect_close_to_naive(*p, *sp, ref, DType::f32, "sparse");
      auto dn = run_dense(*p, nullptr);
      for (float x : dn->ol) ASSERT_TRUE(std::isfinite(x));
      expect_close_to_naive(*p, *dn, naive_problem(*p, nullptr), DType::f32, "dense");
    }});
  }
}

SPARGE_CASES(AttnProp) {
  add_merge_cases(cases);
  add_varlen_cases(cases);
  add_gqa_cases(cases);
  add_broadcast_cases(cases);
  add_invariance_cases(cases);
  add_pv_cases(cases);
  add_edge_cases(cases);
}

// ---- AttnBad: one bad input per parameter -----------------------------------------------------
struct BadCase {
  const char* what;
  std::function<void(BlockSparseAttentionParams&)> sparse;
  std::function<void(DenseAttentionParams&)> dense;
  std::vector<std::string> expect;  // substrings of the message
  StatusCode code = StatusCode::invalid_argument;
};

SPARGE_CASES(AttnBad) {
  // A valid problem: b=1 hq=2 hk=1 sq=70 sk=130 d=16, blk 64x64 -> NQ=2, NK=3.
  Spec s;
  s.hq = 2; s.hk = 1; s.sq = 70; s.sk = 130; s.d = 16;
  using SP = BlockSparseAttentionParams;
  using DP = DenseAttentionParams;
  static std::vector<float> thr0 = {0.0f}, thrneg = {-1.0f}, thrnan = {NAN}, thr3 = {1.0f, 2.0f, 3.0f}, thrinf = {INFINITY};
  // Mutations applied to both operations (through their shared fields).
  struct Both { const char* what; std::function<void(Tensor& q, Tensor& k, Tensor& v, Tensor& o, Tensor& lse, float& scale, Exec& ex)> f; std::vector<std::string> expect; };
  const std::vector<Both> both = {
      {"q_missing", [](Tensor& q, Tensor&, Tensor&, Tensor&, Tensor&, float&, Exec&) { q.data = nullptr; }, {"q is missing"}},
      {"q_ndim", [](Tensor& q, Tensor&, Tensor&, Tensor&, Tensor&, float&, Exec&) { q.ndim = 3; }, {"q.ndim = 3"}},
      {"q_dtype", [](Tensor& q, Tensor&, Tensor&, Tensor&, Tensor&, float&, Exec&) { q.dtype = DType::i32; }, {"q.dtype = i32"}},
      {"q_stride", [](Tensor& q, Tensor&, Tensor&, Tensor&, Tensor&, float&, Exec&) { q.stride[1] = -16; }, {"q.stride[1] = -16"}},
      {"k_dtype", [](Tensor&, Tensor& k, Tensor&, Tensor&, Tensor&, float&, Exec&) { k.dtype = DType::f16; }, {"k.dtype = f16"}},
      {"k_headdim", [](Tensor&, Tensor& k, Tensor&, Tensor&, Tensor&, float&, Exec&) { k.shape[3] = 8; }, {"k.shape[3] = 8"}},
      {"k_heads", [](Tensor&, Tensor& k, Tensor&, Tensor&, Tensor&, float&, Exec&) { k.shape[2] = 3; }, {"Hk) = 3"}},
      {"k_batch", [](Tensor&, Tensor& k, Tensor&, Tensor&, Tensor&, float&, Exec&) { k.shape[0] = 2; }, {"k.shape[0] = 2"}},
      {"v_shape", [](Tensor&, Tensor&, Tensor& v, Tensor&, Tensor&, float&, Exec&) { v.shape[1] = 129; }, {"v.shape[1] = 129"}},
      {"v_dtype", [](Tensor&, Tensor&, Tensor& v, Tensor&, Tensor&, float&, Exec&) { v.dtype = DType::bf16; }, {"v.dtype = bf16"}},
      {"v_missing", [](Tensor&, Tensor&, Tensor& v, Tensor&, Tensor&, float&, Exec&) { v.data = nullptr; }, {"v is missing"}},
      {"o_shape", [](Tensor&, Tensor&, Tensor&, Tensor& o, Tensor&, float&, Exec&) { o.shape[1] = 69; }, {"o.shape[1] = 69"}},
      {"o_dtype", [](Tensor&, Tensor&, Tensor&, Tensor& o, Tensor&, float&, Exec&) { o.dtype = DType::i32; }, {"o.dtype = i32"}},
      {"o_stride0", [](Tensor&, Tensor&, Tensor&, Tensor& o, Tensor&, float&, Exec&) { o.stride[1] = 0; }, {"o.stride[1] = 0"}},
      {"o_missing", [](Tensor&, Tensor&, Tensor&, Tensor& o, Tensor&, float&, Exec&) { o.data = nullptr; }, {"o is missing"}},
      {"lse_shape", [](Tensor&, Tensor&, Tensor&, Tensor&, Tensor& l, float&, Exec&) { l.shape[2] = 71; }, {"maybe_lse.shape[2] = 71"}},
      {"lse_heads", [](Tensor&, Tensor&, Tensor&, Tensor&, Tensor& l, float&, Exec&) { l.shape[1] = 1; }, {"maybe_lse.shape[1] = 1"}},
      {"lse_dtype", [](Tensor&, Tensor&, Tensor&, Tensor&, Tensor& l, float&, Exec&) { l.dtype = DType::f16; }, {"maybe_lse.dtype = f16"}},
      {"lse_ndim", [](Tensor&, Tensor&, Tensor&, Tensor&, Tensor& l, float&, Exec&) { l.ndim = 4; }, {"maybe_lse.ndim = 4"}},
      {"lse_stride0", [](Tensor&, Tensor&, Tensor&, Tensor&, Tensor& l, float&, Exec&) { l.stride[2] = 0; }, {"maybe_lse.stride[2] = 0"}},
      {"scale_nan", [](Tensor&, Tensor&, Tensor&, Tensor&, Tensor&, float& sc, Exec&) { sc = NAN; }, {"scale = nan"}},
      {"scale_neg", [](Tensor&, Tensor&, Tensor&, Tensor&, Tensor&, float& sc, Exec&) { sc = -1.0f; }, {"scale = -1"}},
      {"scale_inf", [](Tensor&, Tensor&, Tensor&, Tensor&, Tensor&, float& sc, Exec&) { sc = INFINITY; }, {"scale = inf"}},
      {"threads", [](Tensor&, Tensor&, Tensor&, Tensor&, Tensor&, float&, Exec& e) { e.cpu_threads = -1; }, {"exec.cpu_threads = -1"}},
      {"backend", [](Tensor&, Tensor&, Tensor&, Tensor&, Tensor&, float&, Exec& e) { e.backend = static_cast<Backend>(7); }, {"exec.backend = 7"}},
  };
  std::vector<BadCase> bad;
  for (const Both& b : both) {
    auto f = b.f;
    bad.push_back({b.what, [f](SP& p) { f(p.q, p.k, p.v, p.o, p.maybe_lse, p.scale, p.exec); },
                   [f](DP& p) { f(p.q, p.k, p.v, p.o, p.maybe_lse, p.scale, p.exec); }, b.expect});
  }
  auto sp_only = [&](const char* what, std::function<void(SP&)> f, std::vector<std::string> e,
                     StatusCode c = StatusCode::invalid_argument) { bad.push_back({what, std::move(f), nullptr, std::move(e), c}); };
  auto dp_only = [&](const char* what, std::function<void(DP&)> f, std::vector<std::string> e,
                     StatusCode c = StatusCode::invalid_argument) { bad.push_back({what, nullptr, std::move(f), std::move(e), c}); };
  sp_only("blkq", [](SP& p) { p.blkq = 96; }, {"blkq = 96"}, StatusCode::unsupported);
  sp_only("blkk", [](SP& p) { p.blkk = 32; }, {"blkk = 32"}, StatusCode::unsupported);
  sp_only("lut_missing", [](SP& p) { p.lut.data = nullptr; }, {"lut is missing"});
  sp_only("lut_dtype", [](SP& p) { p.lut.dtype = DType::f32; }, {"lut.dtype = f32"});
  sp_only("lut_nq", [](SP& p) { p.lut.shape[2] = 3; }, {"lut.shape[2] = 3", "NQ"});
  sp_only("lut_nk", [](SP& p) { p.lut.shape[3] = 4; }, {"lut.shape[3] = 4", "NK"});
  sp_only("lut_heads", [](SP& p) { p.lut.shape[1] = 1; }, {"lut.shape[1] = 1"});
  sp_only("lut_stride", [](SP& p) { p.lut.stride[3] = -1; }, {"lut.stride[3] = -1"});
  sp_only("counts_missing", [](SP& p) { p.counts.data = nullptr; }, {"counts is missing"});
  sp_only("counts_dtype", [](SP& p) { p.counts.dtype = DType::u8; }, {"counts.dtype = u8"});
  sp_only("counts_nq", [](SP& p) { p.counts.shape[2] = 1; }, {"counts.shape[2] = 1"});
  sp_only("counts_batch", [](SP& p) { p.counts.shape[0] = 2; }, {"counts.shape[0] = 2"});
  sp_only("pv_zero", [](SP& p) { p.pv_threshold = PerHead(thr0.data(), 1); }, {"pv_threshold[0] = 0"});
  sp_only("pv_negative", [](SP& p) { p.pv_threshold = PerHead(thrneg.data(), 1); }, {"pv_threshold[0] = -1"});
  sp_only("pv_nan", [](SP& p) { p.pv_threshold = PerHead(thrnan.data(), 1); }, {"pv_threshold[0] = nan"});
  sp_only("pv_inf", [](SP& p) { p.pv_threshold = PerHead(thrinf.data(), 1); }, {"pv_threshold[0] = inf"});
  sp_only("pv_count", [](SP& p) { p.pv_threshold = PerHead(thr3.data(), 3); }, {"pv_threshold has 3 values"});
  sp_only("lut_entry_high", [](SP& p) { p.lut.ptr<std::int32_t>()[p.lut.offset(0, 1, 1, 0)] = 3; }, {"lut[b=0, h=1, qb=1, 0] = 3"});
  sp_only("lut_entry_negative", [](SP& p) { p.lut.ptr<std::int32_t>()[p.lut.offset(0, 0, 1, 1)] = -1; }, {"lut[b=0, h=0, qb=1, 1] = -1"});
  sp_only("count_high", [](SP& p) { p.counts.ptr<std::int32_t>()[p.counts.offset(0, 1, 0)] = 4; }, {"counts[b=0, h=1, qb=0] = 4"});
  sp_only("count_negative", [](SP& p) { p.counts.ptr<std::int32_t>()[p.counts.offset(0, 0, 1)] = -2; }, {"counts[b=0, h=0, qb=1] = -2"});
  dp_only("mask_dtype", [](DP& p) { p.maybe_mask.dtype = DType::i32; }, {"maybe_mask.dtype = i32"});
  dp_only("mask_shape", [](DP& p) { p.maybe_mask.shape[3] = 129; }, {"maybe_mask.shape[3] = 129"});
  dp_only("mask_rows", [](DP& p) { p.maybe_mask.shape[2] = 64; }, {"maybe_mask.shape[2] = 64"});
  dp_only("mask_ndim", [](DP& p) { p.maybe_mask.ndim = 2; }, {"maybe_mask.ndim = 2"});
  dp_only("mask_stride", [](DP& p) { p.maybe_mask.stride[0] = -5; }, {"maybe_mask.stride[0] = -5"});

  for (const BadCase& bc : bad) {
    for (int sparse = 0; sparse < 2; ++sparse) {
      if ((sparse && !bc.sparse) || (!sparse && !bc.dense)) continue;
      const std::string name = Name(sparse ? "ATTN_BAD" : "DENSE_BAD")("param", bc.what);
      cases.push_back({name, [=] {
        auto rng = rng_for(name);
        auto p = make_problem(s, rng);
        Lut l = make_lut(s, Pattern::full, rng);
        std::vector<std::uint8_t> mask(static_cast<size_t>(s.hq * s.sq * s.sk), 1);
        RunOpts ro;
        auto out = alloc_outputs(*p, ro);
        Status st;
        if (sparse) {
          SP sp = sparse_params(*p, l, *out, ro);
          bc.sparse(sp);
          st = block_sparse_attention(sp);
          EXPECT_FALSE(supported(sp).ok());
        } else {
          DP dp = dense_params(*p, mask.data(), *out, ro);
          bc.dense(dp);
          st = dense_attention(dp);
          EXPECT_FALSE(supported(dp).ok());
        }
        ASSERT_FALSE(st.ok());
        EXPECT_EQ(static_cast<int>(st.code()), static_cast<int>(bc.code)) << st.message();
        const std::string op = sparse ? "block_sparse_attention: " : "dense_attention: ";
        EXPECT_EQ(st.message().rfind(op, 0), 0u) << st.message();
        for (const std::string& e : bc.expect) EXPECT_NE(st.message().find(e), std::string::npos) << st.message();
        // Nothing ran: the outputs still hold the poison.
        Outputs fresh;
        fresh.o = Tensor4(ro.odtype, p->tb(), p->rows_q(), s.hq, s.d, Layout::nhd);
        EXPECT_EQ(std::memcmp(out->o.buf.data(), fresh.o.buf.data(), out->o.buf.size() * dtype_size(ro.odtype)), 0);
        for (size_t i = 0; i < out->lse.size(); ++i) {
          std::uint32_t bits;
          std::memcpy(&bits, &out->lse[i], 4);
          ASSERT_EQ(bits, 0x7fbadbadu);
        }
      }});
    }
  }

  // The mask is a cpu-only aid: unsupported on the cuda backend (f16 inputs, valid for cuda).
  {
    const std::string name = Name("DENSE_BAD")("param", "mask_on_cuda");
    cases.push_back({name, [=] {
      Spec h = s;
      h.dtype = DType::f16;
      auto rng = rng_for(name);
      auto p = make_problem(h, rng);
      std::vector<std::uint8_t> mask(static_cast<size_t>(s.hq * s.sq * s.sk), 1);
      RunOpts ro;
      ro.odtype = DType::f16;
      auto out = alloc_outputs(*p, ro);
      DP dp = dense_params(*p, mask.data(), *out, ro);
      dp.exec.backend = Backend::cuda;
      const Status st = dense_attention(dp);
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(static_cast<int>(st.code()), static_cast<int>(StatusCode::unsupported)) << st.message();
      EXPECT_NE(st.message().find("maybe_mask"), std::string::npos) << st.message();
    }});
  }

  // Varlen: bad cu_seqlens, and a LUT entry inside the global NK but past its own sequence.
  struct VarlenBad { const char* what; std::function<void(SP&, std::vector<std::int32_t>&, std::vector<std::int32_t>&)> f; std::string expect; };
  const std::vector<VarlenBad> vb = {
      {"cu_q_decreasing", [](SP&, std::vector<std::int32_t>& cq, std::vector<std::int32_t>&) { cq[1] = 110; }, "varlen.cu_seqlens_q[2] = 100 is below"},
      {"cu_k_start", [](SP&, std::vector<std::int32_t>&, std::vector<std::int32_t>& ck) { ck[0] = 1; }, "varlen.cu_seqlens_k[0] = 1"},
      {"max_seqlen_q_small", [](SP& p, std::vector<std::int32_t>&, std::vector<std::int32_t>&) { p.varlen.max_seqlen_q = 69; }, "varlen.max_seqlen_q = 69"},
      {"num_seqs_zero", [](SP& p, std::vector<std::int32_t>&, std::vector<std::int32_t>&) { p.varlen.num_seqs = 0; }, "varlen.num_seqs = 0"},
      {"cu_k_missing", [](SP& p, std::vector<std::int32_t>&, std::vector<std::int32_t>&) { p.varlen.cu_seqlens_k = nullptr; }, "cu_seqlens_k is missing"},
      {"cu_q_total", [](SP&, std::vector<std::int32_t>& cq, std::vector<std::int32_t>&) { cq[2] = 200; }, "exceeds"},
      {"lut_past_sequence", [](SP& p, std::vector<std::int32_t>&, std::vector<std::int32_t>&) {
         // sequence 1 has 10 keys (one key block): block 2 is inside NK = 3 but not inside it.
         p.lut.ptr<std::int32_t>()[p.lut.offset(1, 0, 0, 0)] = 2;
         p.counts.ptr<std::int32_t>()[p.counts.offset(1, 0, 0)] = 1;
       }, "lut[b=1, h=0, qb=0, 0] = 2 is not a key block of the sequence (expected 0..0, its Sk = 10"},
  };
  for (const VarlenBad& v : vb) {
    const std::string name = Name("ATTN_BAD")("param", v.what)("varlen", 1);
    cases.push_back({name, [=] {
      Spec t = s;
      t.lens_q = {70, 30};
      t.lens_k = {130, 10};
      auto rng = rng_for(name);
      auto p = make_problem(t, rng);
      Lut l(2, t.hq, t.nq(), t.nk());
      RunOpts ro;
      auto out = alloc_outputs(*p, ro);
      SP sp = sparse_params(*p, l, *out, ro);
      std::vector<std::int32_t> cq = p->cu_q, ck = p->cu_k;
      sp.varlen.cu_seqlens_q = cq.data();
      sp.varlen.cu_seqlens_k = ck.data();
      ASSERT_TRUE(supported(sp).ok()) << supported(sp).message();
      v.f(sp, cq, ck);
      const Status st = block_sparse_attention(sp);
      ASSERT_FALSE(st.ok());
      EXPECT_NE(st.message().find(v.expect), std::string::npos) << st.message();
      EXPECT_EQ(st.message().rfind("block_sparse_attention: ", 0), 0u) << st.message();
    }});
  }
}

}  // namespace
}  // namespace sparge::test
