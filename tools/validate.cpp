// `sparge validate`: quick semantic checks of one backend on small shapes, one PASS/FAIL line each.
// References are the fp64 dense oracle (CPU dense_attention, with a token mask where the check
// needs one), the rules of docs/semantics.md written out in lut.cpp, and, for cuda, the CPU backend.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>

#include "bench.h"
#include "commands.h"
#include "common.h"
#include "device.h"
#include "lut.h"
#include "sparge/half.h"

namespace sparge::tool {

namespace {

struct Ctx {
  Backend backend;
  DType dtype;
  int threads;
  std::uint64_t seed;
  Stream* stream;
};

struct Result {
  bool pass = true;
  std::string detail;
  void fail(const std::string& why) {
    if (pass) detail = why;
    pass = false;
  }
};

// ---- attention problems --------------------------------------------------------------------------
struct Problem {
  std::int64_t b, hq, hk, sq, sk, d;
  bool causal, hnd;
  DType dt;
  HostArray q, k, v;
  Tensor view(HostArray& a, std::int64_t s, std::int64_t h) const { return bshd_view(a.data(), dt, b, s, h, d, hnd); }
  std::string name() const {
    std::ostringstream os;
    os << "b=" << b << ",hq=" << hq << ",hk=" << hk << ",sq=" << sq << ",sk=" << sk << ",d=" << d
       << ",causal=" << causal << ",layout=" << (hnd ? "hnd" : "nhd");
    return os.str();
  }
};

Problem make_problem(const Ctx& c, std::int64_t b, std::int64_t hq, std::int64_t hk, std::int64_t sq, std::int64_t sk,
                     std::int64_t d, bool causal, bool hnd, std::uint64_t salt) {
  Problem p{b, hq, hk, sq, sk, d, causal, hnd, c.dtype, HostArray(c.dtype, b * sq * hq * d),
            HostArray(c.dtype, b * sk * hk * d), HostArray(c.dtype, b * sk * hk * d)};
  fill_normal(p.q, mix_seed(c.seed, salt * 3 + 0), 1);
  fill_normal(p.k, mix_seed(c.seed, salt * 3 + 1), 1);
  fill_normal(p.v, mix_seed(c.seed, salt * 3 + 2), 1);
  return p;
}

// fp64 oracle: o f32 NHD [B, Sq, Hq, D], lse [B, Hq, Sq]; mask u8 [B, Hq, Sq, Sk] or empty.
void oracle(Problem& p, const std::vector<std::uint8_t>& mask, bool causal, std::vector<float>& o, std::vector<float>& lse) {
  o.assign(static_cast<size_t>(p.b * p.sq * p.hq * p.d), 0.0f);
  lse.assign(static_cast<size_t>(p.b * p.hq * p.sq), 0.0f);
  DenseAttentionParams d;
  d.q = p.view(p.q, p.sq, p.hq);
  d.k = p.view(p.k, p.sk, p.hk);
  d.v = p.view(p.v, p.sk, p.hk);
  d.o = make_tensor(o.data(), DType::f32, {p.b, p.sq, p.hq, p.d});
  d.maybe_lse = make_tensor(lse.data(), DType::f32, {p.b, p.hq, p.sq});
  if (!mask.empty()) d.maybe_mask = make_tensor(const_cast<std::uint8_t*>(mask.data()), DType::u8, {p.b, p.hq, p.sq, p.sk});
  d.is_causal = causal;
  d.exec = {Backend::cpu, nullptr, 0};
  check(dense_attention(d), "cpu dense_attention (oracle)");
}

// Compares a backend output (o in dtype `odt` and the problem's layout, lse [B, Hq, Sq]) with the
// oracle, against the dtype's tolerance.
void compare(const Problem& p, const HostArray& o, const std::vector<float>& lse, const std::vector<float>& ref_o,
             const std::vector<float>& ref_lse, const std::string& what, Result& res) {
  const Tolerance tol = tolerance_for(p.dt);
  const Tensor ov = bshd_view(nullptr, o.dtype(), p.b, p.sq, p.hq, p.d, p.hnd);
  ErrorStats eo, el;
  for (std::int64_t b = 0; b < p.b; ++b)
    for (std::int64_t i = 0; i < p.sq; ++i)
      for (std::int64_t h = 0; h < p.hq; ++h)
        for (std::int64_t dd = 0; dd < p.d; ++dd)
          eo.add(o.get(ov.offset(b, i, h, dd)), ref_o[static_cast<size_t>(((b * p.sq + i) * p.hq + h) * p.d + dd)]);
  for (size_t i = 0; i < lse.size(); ++i) el.add(lse[i], ref_lse[i]);
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: O max_abs %.2e nmse %.2e, LSE max_abs %.2e, nonfinite mismatches %lld",
                what.c_str(), eo.max_abs, eo.nmse(), el.max_abs, (long long)(eo.nonfinite_mismatch + el.nonfinite_mismatch));
  const bool ok = eo.nonfinite_mismatch == 0 && el.nonfinite_mismatch == 0 && eo.max_abs <= tol.o_abs &&
                  eo.nmse() <= tol.o_nmse && el.max_abs <= tol.lse_abs;
  if (!ok) res.fail(buf);
  else if (res.pass) res.detail = buf;
}

// Runs block_sparse_attention on the backend; o in dtype odt with the problem's layout.
void run_sparse(const Ctx& c, Problem& p, const BlockGeom& g, const std::vector<std::int32_t>& lut,
                const std::vector<std::int32_t>& counts, DType odt, HostArray& o, std::vector<float>& lse) {
  const Backend be = c.backend;
  DeviceBuffer dq = DeviceBuffer::mirror(be, p.q.data(), p.q.bytes(), "q");
  DeviceBuffer dk = DeviceBuffer::mirror(be, p.k.data(), p.k.bytes(), "k");
  DeviceBuffer dv = DeviceBuffer::mirror(be, p.v.data(), p.v.bytes(), "v");
  DeviceBuffer dl = DeviceBuffer::mirror(be, const_cast<std::int32_t*>(lut.data()), lut.size() * 4, "lut");
  DeviceBuffer dc = DeviceBuffer::mirror(be, const_cast<std::int32_t*>(counts.data()), counts.size() * 4, "counts");
  o = HostArray(odt, p.b * p.sq * p.hq * p.d);
  lse.assign(static_cast<size_t>(p.b * p.hq * p.sq), 0.0f);
  DeviceBuffer dout(be, o.bytes(), "o"), dlse(be, lse.size() * 4, "lse");
  dout.fill_bytes(0xff);
  dlse.fill_bytes(0xff);
  BlockSparseAttentionParams a;
  a.q = bshd_view(dq.data(), p.dt, p.b, p.sq, p.hq, p.d, p.hnd);
  a.k = bshd_view(dk.data(), p.dt, p.b, p.sk, p.hk, p.d, p.hnd);
  a.v = bshd_view(dv.data(), p.dt, p.b, p.sk, p.hk, p.d, p.hnd);
  a.o = bshd_view(dout.data(), odt, p.b, p.sq, p.hq, p.d, p.hnd);
  a.maybe_lse = make_tensor(dlse.data(), DType::f32, {p.b, p.hq, p.sq});
  a.lut = make_tensor(dl.data(), DType::i32, {p.b, p.hq, g.nq(), g.nk()});
  a.counts = make_tensor(dc.data(), DType::i32, {p.b, p.hq, g.nq()});
  a.blkq = g.blkq;
  a.blkk = g.blkk;
  a.is_causal = p.causal;
  a.exec = {be, c.stream->handle(), c.threads};
  check(block_sparse_attention(a), "block_sparse_attention");
  c.stream->sync("block_sparse_attention");
  dout.download(o.data(), o.bytes());
  dlse.download(lse.data(), lse.size() * 4);
}

// Expands a LUT to the oracle's [B, Hq, Sq, Sk] mask (causality included).
std::vector<std::uint8_t> lut_mask(const Problem& p, const BlockGeom& g, const std::vector<std::int32_t>& lut,
                                   const std::vector<std::int32_t>& counts) {
  std::vector<std::uint8_t> mask(static_cast<size_t>(p.b * p.hq * p.sq * p.sk));
  for (std::int64_t r = 0; r < p.b * p.hq * g.nq(); ++r) {
    const std::int64_t qb = r % g.nq(), bh = r / g.nq();
    expand_row_mask(g, qb, lut.data() + r * g.nk(), counts[static_cast<size_t>(r)],
                    mask.data() + (bh * p.sq + qb * g.blkq) * p.sk);
  }
  return mask;
}

// A random LUT: each visible block kept with probability `keep` (rows may end up empty).
void random_lut(const BlockGeom& g, std::int64_t rows, double keep, std::mt19937_64& rng,
                std::vector<std::int32_t>& lut, std::vector<std::int32_t>& counts) {
  std::bernoulli_distribution on(keep);
  lut.assign(static_cast<size_t>(rows * g.nk()), -1);
  counts.assign(static_cast<size_t>(rows), 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int32_t c = 0;
    for (std::int64_t kb = 0; kb < g.visible(r % g.nq()); ++kb) {
      if (on(rng)) lut[static_cast<size_t>(r * g.nk() + c++)] = static_cast<std::int32_t>(kb);
    }
    counts[static_cast<size_t>(r)] = c;
  }
}

// ---- the checks -----------------------------------------------------------------------------------
struct Shape {
  std::int64_t b, hq, hk, sq, sk, d;
  bool causal, hnd;
  int blkq, blkk;
};
const Shape kShapes[] = {
    {2, 4, 2, 300, 437, 64, false, false, 64, 128},
    {1, 4, 4, 437, 300, 64, true, true, 128, 64},  // Sq > Sk causal: the first rows see nothing
    {1, 2, 1, 256, 256, 128, true, false, 64, 64},
};

std::string shape_name(const Shape& s) {
  std::ostringstream os;
  os << "b=" << s.b << ",hq=" << s.hq << ",hk=" << s.hk << ",sq=" << s.sq << ",sk=" << s.sk << ",d=" << s.d
     << ",causal=" << s.causal << ",layout=" << (s.hnd ? "hnd" : "nhd") << ",blkq=" << s.blkq << ",blkk=" << s.blkk;
  return os.str();
}

// Block map on the backend (and the CPU map with its scores, for cuda and for the rule check).
Result check_block_map(const Ctx& c, const Shape& s, std::uint64_t salt) {
  Result res;
  Problem p = make_problem(c, s.b, s.hq, s.hk, s.sq, s.sk, s.d, s.causal, s.hnd, salt);
  const BlockGeom g{s.sq, s.sk, s.blkq, s.blkk, s.causal};
  const std::int64_t rows = s.b * s.hq * g.nq(), nk = g.nk();
  BenchConfig cfg;
  cfg.b = s.b; cfg.hq = s.hq; cfg.hk = s.hk; cfg.sq = s.sq; cfg.sk = s.sk; cfg.d = s.d;
  cfg.dtype = c.dtype; cfg.backend = c.backend; cfg.hnd = s.hnd; cfg.causal = s.causal;
  cfg.blkq = s.blkq; cfg.blkk = s.blkk; cfg.threads = c.threads;
  DeviceBuffer dq = DeviceBuffer::mirror(c.backend, p.q.data(), p.q.bytes(), "q");
  DeviceBuffer dk = DeviceBuffer::mirror(c.backend, p.k.data(), p.k.bytes(), "k");
  DeviceBuffer dl(c.backend, static_cast<size_t>(rows * nk) * 4, "lut"), dc(c.backend, static_cast<size_t>(rows) * 4, "counts");
  auto run = [&](std::vector<float> topk, bool sink, std::vector<std::int32_t>& lut, std::vector<std::int32_t>& cnt) {
    cfg.topk = std::move(topk);
    cfg.sink = sink;
    dl.fill_bytes(0x7f);
    check(build_block_map(cfg.block_map_params(dq.data(), dk.data(), dl.data(), dc.data(), c.stream->handle())), "build_block_map");
    c.stream->sync("build_block_map");
    lut.resize(static_cast<size_t>(rows * nk));
    cnt.resize(static_cast<size_t>(rows));
    dl.download(lut.data(), lut.size() * 4);
    dc.download(cnt.data(), cnt.size() * 4);
  };
  std::vector<std::int32_t> l2, c2, l5, c5, l1, c1, ls, cs;
  run({0.2f}, false, l2, c2);
  run({0.5f}, false, l5, c5);
  run({1.0f}, false, l1, c1);
  run({0.2f}, true, ls, cs);
  std::string first;
  for (auto* lc : {&l2, &l5, &l1, &ls}) {
    const auto* cc = lc == &l2 ? &c2 : lc == &l5 ? &c5 : lc == &l1 ? &c1 : &cs;
    if (check_lut(g, lc->data(), cc->data(), rows, &first) != 0) res.fail("malformed LUT: " + first);
  }
  std::vector<std::int32_t> fl, fc;
  full_lut(g, rows, fl, fc);
  if (fl != l1 || fc != c1) res.fail("topk=1 does not select every visible block");
  for (std::int64_t r = 0; r < rows && res.pass; ++r) {
    // Top-k nests: the blocks of topk 0.2 are among those of topk 0.5; the sink adds block 0.
    const std::int32_t* a = l2.data() + r * nk;
    const std::int32_t* b = l5.data() + r * nk;
    if (!std::includes(b, b + c5[static_cast<size_t>(r)], a, a + c2[static_cast<size_t>(r)])) {
      res.fail("row " + std::to_string(r) + ": topk 0.2 selects a block that topk 0.5 does not");
    }
    if (g.visible(r % g.nq()) > 0 && (cs[static_cast<size_t>(r)] == 0 || ls[static_cast<size_t>(r * nk)] != 0)) {
      res.fail("row " + std::to_string(r) + ": attention_sink did not select key block 0");
    }
  }
  // The CPU map with its scores follows the rule; on cuda the backend equals it block for block.
  std::vector<std::int32_t> cl(l2.size()), cc(c2.size());
  std::vector<float> scores(l2.size());
  BenchConfig cpu = cfg;
  cpu.backend = Backend::cpu;
  cpu.topk = {0.2f};
  cpu.sink = false;
  BlockMapParams bp = cpu.block_map_params(p.q.data(), p.k.data(), cl.data(), cc.data(), nullptr);
  bp.maybe_scores = make_tensor(scores.data(), DType::f32, {s.b, s.hq, g.nq(), nk});
  check(build_block_map(bp), "cpu build_block_map (reference)");
  SelectRule rule;
  rule.topk = 0.2;
  std::int64_t rule_bad = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto want = select_from_scores(scores.data() + r * nk, g.visible(r % g.nq()), true, rule);
    if (cc[static_cast<size_t>(r)] != static_cast<std::int32_t>(want.size()) ||
        !std::equal(want.begin(), want.end(), cl.data() + r * nk)) {
      ++rule_bad;
    }
  }
  if (rule_bad) res.fail(std::to_string(rule_bad) + " cpu rows differ from the rule applied to the cpu scores");
  if (cl != l2 || cc != c2) res.fail(std::string(to_string(c.backend)) + " block map differs from the cpu one");
  if (res.pass) res.detail = "well-formed; topk=1 is the full LUT; topk nests; sink; rule on scores; equals cpu";
  return res;
}

Result check_sparse_vs_oracle(const Ctx& c, const Shape& s, std::uint64_t salt, bool full) {
  Result res;
  Problem p = make_problem(c, s.b, s.hq, s.hk, s.sq, s.sk, s.d, s.causal, s.hnd, salt);
  const BlockGeom g{s.sq, s.sk, s.blkq, s.blkk, s.causal};
  const std::int64_t rows = s.b * s.hq * g.nq();
  std::vector<std::int32_t> lut, counts;
  std::mt19937_64 rng(mix_seed(c.seed, salt));
  if (full) full_lut(g, rows, lut, counts);
  else random_lut(g, rows, 0.5, rng, lut, counts);
  HostArray o;
  std::vector<float> lse, ro, rl;
  run_sparse(c, p, g, lut, counts, c.dtype, o, lse);
  // Full LUT: the plain causal oracle, no mask. Random LUT: the oracle with the LUT as mask.
  if (full) oracle(p, {}, s.causal, ro, rl);
  else oracle(p, lut_mask(p, g, lut, counts), false, ro, rl);
  compare(p, o, lse, ro, rl, full ? "full LUT vs dense" : "random LUT vs masked oracle", res);
  return res;
}

// Varlen: packed sequences (one [1, total, H, D] tensor each for q, k, v, cu_seqlens in the backend's
// memory) through dense_attention on the backend; every sequence's rows and LSE against the fp64
// oracle run on that sequence alone. Lengths with Sq > Sk, Sk = 1, a single query row, equal lengths.
Result check_varlen(const Ctx& c, bool causal, std::uint64_t salt) {
  Result res;
  const std::vector<std::int64_t> lq = {100, 1, 257, 64}, lk = {130, 77, 257, 1};
  const std::int64_t hq = 4, hk = 2, d = 64, n = static_cast<std::int64_t>(lq.size());
  std::vector<Problem> seqs;
  std::vector<std::int32_t> cu_q = {0}, cu_k = {0};
  for (std::int64_t s = 0; s < n; ++s) {
    seqs.push_back(make_problem(c, 1, hq, hk, lq[s], lk[s], d, causal, false, salt + 7 * s));
    cu_q.push_back(cu_q.back() + static_cast<std::int32_t>(lq[s]));
    cu_k.push_back(cu_k.back() + static_cast<std::int32_t>(lk[s]));
  }
  const std::int64_t tq = cu_q.back(), tk = cu_k.back();
  const std::int64_t max_q = *std::max_element(lq.begin(), lq.end()), max_k = *std::max_element(lk.begin(), lk.end());
  // Packed NHD tensors: with b = 1 a sequence's [S, H, D] block is contiguous, so packing concatenates.
  HostArray q(c.dtype, tq * hq * d), k(c.dtype, tk * hk * d), v(c.dtype, tk * hk * d);
  for (std::int64_t s = 0; s < n; ++s) {
    auto* qb = static_cast<unsigned char*>(q.data()) + cu_q[s] * hq * d * dtype_size(c.dtype);
    auto* kb = static_cast<unsigned char*>(k.data()) + cu_k[s] * hk * d * dtype_size(c.dtype);
    auto* vb = static_cast<unsigned char*>(v.data()) + cu_k[s] * hk * d * dtype_size(c.dtype);
    std::memcpy(qb, seqs[s].q.data(), seqs[s].q.bytes());
    std::memcpy(kb, seqs[s].k.data(), seqs[s].k.bytes());
    std::memcpy(vb, seqs[s].v.data(), seqs[s].v.bytes());
  }
  const Backend be = c.backend;
  DeviceBuffer dq = DeviceBuffer::mirror(be, q.data(), q.bytes(), "q");
  DeviceBuffer dk = DeviceBuffer::mirror(be, k.data(), k.bytes(), "k");
  DeviceBuffer dv = DeviceBuffer::mirror(be, v.data(), v.bytes(), "v");
  DeviceBuffer dcq = DeviceBuffer::mirror(be, cu_q.data(), cu_q.size() * 4, "cu_seqlens_q");
  DeviceBuffer dck = DeviceBuffer::mirror(be, cu_k.data(), cu_k.size() * 4, "cu_seqlens_k");
  HostArray o(c.dtype, tq * hq * d);
  std::vector<float> lse(static_cast<size_t>(n * hq * max_q));
  DeviceBuffer dout(be, o.bytes(), "o"), dlse(be, lse.size() * 4, "lse");
  dout.fill_bytes(0xff);  // NaN: an unwritten row fails
  DenseAttentionParams a;
  a.q = make_tensor(dq.data(), c.dtype, {1, tq, hq, d});
  a.k = make_tensor(dk.data(), c.dtype, {1, tk, hk, d});
  a.v = make_tensor(dv.data(), c.dtype, {1, tk, hk, d});
  a.o = make_tensor(dout.data(), c.dtype, {1, tq, hq, d});
  a.maybe_lse = make_tensor(dlse.data(), DType::f32, {n, hq, max_q});
  a.varlen = {static_cast<const std::int32_t*>(dcq.data()), static_cast<const std::int32_t*>(dck.data()),
              static_cast<int>(n), static_cast<int>(max_q), static_cast<int>(max_k)};
  a.is_causal = causal;
  a.exec = {be, c.stream->handle(), c.threads};
  check(dense_attention(a), "dense_attention (varlen)");
  c.stream->sync("dense_attention (varlen)");
  dout.download(o.data(), o.bytes());
  dlse.download(lse.data(), lse.size() * 4);
  for (std::int64_t s = 0; s < n; ++s) {
    Problem& p = seqs[static_cast<size_t>(s)];
    std::vector<float> ro, rl;
    oracle(p, {}, causal, ro, rl);
    HostArray os(c.dtype, lq[s] * hq * d);
    std::memcpy(os.data(), static_cast<const unsigned char*>(o.data()) + cu_q[s] * hq * d * dtype_size(c.dtype), os.bytes());
    std::vector<float> ls(static_cast<size_t>(hq * lq[s]));
    for (std::int64_t h = 0; h < hq; ++h)
      for (std::int64_t i = 0; i < lq[s]; ++i) ls[static_cast<size_t>(h * lq[s] + i)] = lse[static_cast<size_t>((s * hq + h) * max_q + i)];
    compare(p, os, ls, ro, rl, "sequence " + std::to_string(s) + " vs its own oracle", res);
  }
  if (res.pass) res.detail = std::to_string(n) + " packed sequences, each within the dtype's tolerance of its own oracle";
  return res;
}

Result check_merge_halves(const Ctx& c, const Shape& s, std::uint64_t salt) {
  Result res;
  Problem p = make_problem(c, s.b, s.hq, s.hk, s.sq, s.sk, s.d, s.causal, s.hnd, salt);
  const BlockGeom g{s.sq, s.sk, s.blkq, s.blkk, s.causal};
  const std::int64_t rows = s.b * s.hq * g.nq(), nk = g.nk(), half = nk / 2;
  std::vector<std::int32_t> full, fc, la, ca, lb, cb;
  full_lut(g, rows, full, fc);
  la.assign(full.size(), -1);
  lb.assign(full.size(), -1);
  ca.assign(fc.size(), 0);
  cb.assign(fc.size(), 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int32_t e = 0; e < fc[static_cast<size_t>(r)]; ++e) {
      const std::int32_t kb = full[static_cast<size_t>(r * nk + e)];
      if (kb < half) la[static_cast<size_t>(r * nk + ca[static_cast<size_t>(r)]++)] = kb;
      else lb[static_cast<size_t>(r * nk + cb[static_cast<size_t>(r)]++)] = kb;
    }
  }
  HostArray oa, ob;
  std::vector<float> sa, sb;
  run_sparse(c, p, g, la, ca, DType::f32, oa, sa);
  run_sparse(c, p, g, lb, cb, DType::f32, ob, sb);
  const Backend be = c.backend;
  DeviceBuffer doa = DeviceBuffer::mirror(be, oa.data(), oa.bytes(), "o_a");
  DeviceBuffer dob = DeviceBuffer::mirror(be, ob.data(), ob.bytes(), "o_b");
  DeviceBuffer dsa = DeviceBuffer::mirror(be, sa.data(), sa.size() * 4, "lse_a");
  DeviceBuffer dsb = DeviceBuffer::mirror(be, sb.data(), sb.size() * 4, "lse_b");
  HostArray o(c.dtype, oa.size());
  std::vector<float> lse(sa.size());
  DeviceBuffer dout(be, o.bytes(), "o"), dlse(be, lse.size() * 4, "lse");
  MergeAttentionParams m;
  m.o_a = bshd_view(doa.data(), DType::f32, s.b, s.sq, s.hq, s.d, s.hnd);
  m.o_b = bshd_view(dob.data(), DType::f32, s.b, s.sq, s.hq, s.d, s.hnd);
  m.lse_a = make_tensor(dsa.data(), DType::f32, {s.b, s.hq, s.sq});
  m.lse_b = make_tensor(dsb.data(), DType::f32, {s.b, s.hq, s.sq});
  m.o = bshd_view(dout.data(), c.dtype, s.b, s.sq, s.hq, s.d, s.hnd);
  m.lse = make_tensor(dlse.data(), DType::f32, {s.b, s.hq, s.sq});
  m.exec = {be, c.stream->handle(), c.threads};
  check(merge_attention(m), "merge_attention");
  c.stream->sync("merge_attention");
  dout.download(o.data(), o.bytes());
  dlse.download(lse.data(), lse.size() * 4);
  std::vector<float> ro, rl;
  oracle(p, {}, s.causal, ro, rl);
  compare(p, o, lse, ro, rl, "merge of two key halves vs dense", res);
  return res;
}

Result check_topk_ties(const Ctx& c, DType dt, std::uint64_t salt) {
  Result res;
  const std::int64_t r = 48, n = 1000;
  std::mt19937_64 rng(mix_seed(c.seed, salt));
  std::uniform_int_distribution<int> val(0, 7), kind(0, 19);
  HostArray s(dt, r * n);
  for (std::int64_t i = 0; i < r; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      const int kd = kind(rng);
      float x = static_cast<float>(val(rng)) - 3.0f;  // few distinct values: many ties
      if (kd == 0) x = -INFINITY;
      if (kd == 1 && i % 3 == 0) x = INFINITY;
      if (i == r - 1 || (i == r - 2 && j % 50)) x = -INFINITY;  // empty row, row with 20 selectable
      s.set(i * n + j, x);
    }
  }
  for (int k : {1, 17, 300, 1000}) {
    DeviceBuffer ds = DeviceBuffer::mirror(c.backend, s.data(), s.bytes(), "scores");
    DeviceBuffer di(c.backend, static_cast<size_t>(r * k) * 4, "indices"), dc(c.backend, static_cast<size_t>(r) * 4, "counts");
    TopkSelectParams p;
    p.scores = make_tensor(ds.data(), dt, {r, n});
    p.k = k;
    p.indices = make_tensor(di.data(), DType::i32, {r, k});
    p.maybe_counts = make_tensor(dc.data(), DType::i32, {r});
    p.exec = {c.backend, c.stream->handle(), c.threads};
    check(topk_select(p), "topk_select");
    c.stream->sync("topk_select");
    std::vector<std::int32_t> idx(static_cast<size_t>(r * k)), cnt(static_cast<size_t>(r)), want(static_cast<size_t>(k));
    di.download(idx.data(), idx.size() * 4);
    dc.download(cnt.data(), cnt.size() * 4);
    std::vector<float> row(static_cast<size_t>(n));
    for (std::int64_t i = 0; i < r; ++i) {
      for (std::int64_t j = 0; j < n; ++j) row[static_cast<size_t>(j)] = s.get(i * n + j);
      const std::int32_t wc = topk_reference(row.data(), n, k, want.data());
      if (cnt[static_cast<size_t>(i)] != wc || !std::equal(want.begin(), want.end(), idx.begin() + i * k)) {
        res.fail("k=" + std::to_string(k) + " row " + std::to_string(i) + ": indices or count differ from the rule");
        break;
      }
    }
  }
  if (res.pass) res.detail = "ties ascending by index, +inf first, -inf never, -1 padding, k in {1,17,300,1000}";
  return res;
}

Result check_compact(const Ctx& c, std::uint64_t salt) {
  Result res;
  const std::int64_t r = 32, n = 500;
  std::mt19937_64 rng(mix_seed(c.seed, salt));
  std::bernoulli_distribution keep(0.1);
  HostArray m(c.dtype == DType::bf16 ? DType::f32 : c.dtype, r * n);
  std::vector<std::int32_t> want_cnt(static_cast<size_t>(r), 0);
  for (std::int64_t i = 0; i < r; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      const bool on = keep(rng);
      m.set(i * n + j, on ? (j % 7 == 0 ? -2.5f : 0.0f) : -INFINITY);
      want_cnt[static_cast<size_t>(i)] += on;
    }
  }
  const int most = *std::max_element(want_cnt.begin(), want_cnt.end());
  const int worst_row = static_cast<int>(std::max_element(want_cnt.begin(), want_cnt.end()) - want_cnt.begin());
  for (int n_max : {most, most - 1}) {
    DeviceBuffer dm = DeviceBuffer::mirror(c.backend, m.data(), m.bytes(), "mask");
    DeviceBuffer di(c.backend, static_cast<size_t>(r * n_max) * 4, "indices"), dc(c.backend, static_cast<size_t>(r) * 4, "counts");
    CompactMaskParams p;
    p.mask = make_tensor(dm.data(), m.dtype(), {r, n});
    p.n_max = n_max;
    p.indices = make_tensor(di.data(), DType::i32, {r, n_max});
    p.counts = make_tensor(dc.data(), DType::i32, {r});
    p.exec = {c.backend, c.stream->handle(), c.threads};
    const Status st = compact_mask(p);
    c.stream->sync("compact_mask");
    if (n_max < most) {
      if (st.code() != StatusCode::overflow) {
        res.fail("n_max=" + std::to_string(n_max) + " below row " + std::to_string(worst_row) + "'s " + std::to_string(most) +
                 " finite entries did not return overflow (got: " + (st.ok() ? "ok" : st.message()) + ")");
      } else if (st.message().find("row") == std::string::npos) {
        res.fail("overflow message does not name the row: " + st.message());
      } else if (res.pass) {
        res.detail = "overflow reported: " + st.message();
      }
      continue;
    }
    check(st, "compact_mask");
    std::vector<std::int32_t> idx(static_cast<size_t>(r * n_max)), cnt(static_cast<size_t>(r));
    di.download(idx.data(), idx.size() * 4);
    dc.download(cnt.data(), cnt.size() * 4);
    for (std::int64_t i = 0; i < r && res.pass; ++i) {
      std::vector<std::int32_t> want;
      for (std::int64_t j = 0; j < n; ++j) {
        if (std::isfinite(m.get(i * n + j))) want.push_back(static_cast<std::int32_t>(j));
      }
      want.resize(static_cast<size_t>(n_max), -1);
      if (cnt[static_cast<size_t>(i)] != want_cnt[static_cast<size_t>(i)] || !std::equal(want.begin(), want.end(), idx.begin() + i * n_max)) {
        res.fail("row " + std::to_string(i) + ": indices or count differ from the finite entries");
      }
    }
  }
  return res;
}

Result check_gather(const Ctx& c, const Shape& s, bool group_union, std::uint64_t salt) {
  Result res;
  Problem p = make_problem(c, s.b, s.hq, s.hk, s.sq, s.sk, s.d, s.causal, s.hnd, salt);
  const std::int64_t n_max = 48, rows = s.b * s.hq * s.sq;
  std::mt19937_64 rng(mix_seed(c.seed, salt));
  std::vector<std::int32_t> idx(static_cast<size_t>(rows * n_max), -1), cnt(static_cast<size_t>(rows));
  std::vector<std::uint8_t> mask(static_cast<size_t>(rows * s.sk), 0);
  std::vector<std::int32_t> keys(static_cast<size_t>(s.sk));
  std::uniform_int_distribution<int> count(0, static_cast<int>(n_max));
  const BlockGeom g{s.sq, s.sk, 64, 64, s.causal};
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = r % s.sq;
    for (std::int64_t j = 0; j < s.sk; ++j) keys[static_cast<size_t>(j)] = static_cast<std::int32_t>(j);
    std::shuffle(keys.begin(), keys.end(), rng);  // lists in random order, not sorted
    const int n = std::min<int>(count(rng), static_cast<int>(s.sk));
    cnt[static_cast<size_t>(r)] = n;
    for (int e = 0; e < n; ++e) {
      const std::int32_t j = keys[static_cast<size_t>(e)];
      idx[static_cast<size_t>(r * n_max + e)] = j;
      mask[static_cast<size_t>(r * s.sk + j)] = g.sees(i, j) ? 1 : 0;
    }
  }
  const Backend be = c.backend;
  DeviceBuffer dq = DeviceBuffer::mirror(be, p.q.data(), p.q.bytes(), "q");
  DeviceBuffer dk = DeviceBuffer::mirror(be, p.k.data(), p.k.bytes(), "k");
  DeviceBuffer dv = DeviceBuffer::mirror(be, p.v.data(), p.v.bytes(), "v");
  DeviceBuffer di = DeviceBuffer::mirror(be, idx.data(), idx.size() * 4, "indices");
  DeviceBuffer dc = DeviceBuffer::mirror(be, cnt.data(), cnt.size() * 4, "counts");
  HostArray o(c.dtype, p.q.size());
  std::vector<float> lse(static_cast<size_t>(s.b * s.hq * s.sq));
  DeviceBuffer dout(be, o.bytes(), "o"), dlse(be, lse.size() * 4, "lse");
  dout.fill_bytes(0xff);
  GatherAttentionParams a;
  a.q = bshd_view(dq.data(), c.dtype, s.b, s.sq, s.hq, s.d, s.hnd);
  a.k = bshd_view(dk.data(), c.dtype, s.b, s.sk, s.hk, s.d, s.hnd);
  a.v = bshd_view(dv.data(), c.dtype, s.b, s.sk, s.hk, s.d, s.hnd);
  a.o = bshd_view(dout.data(), c.dtype, s.b, s.sq, s.hq, s.d, s.hnd);
  a.maybe_lse = make_tensor(dlse.data(), DType::f32, {s.b, s.hq, s.sq});
  a.indices = make_tensor(di.data(), DType::i32, {s.b, s.hq, s.sq, n_max});
  a.counts = make_tensor(dc.data(), DType::i32, {s.b, s.hq, s.sq});
  a.is_causal = s.causal;
  a.group_union = group_union;
  a.exec = {be, c.stream->handle(), c.threads};
  check(gather_attention(a), "gather_attention");
  c.stream->sync("gather_attention");
  dout.download(o.data(), o.bytes());
  dlse.download(lse.data(), lse.size() * 4);
  std::vector<float> ro, rl;
  oracle(p, mask, false, ro, rl);
  compare(p, o, lse, ro, rl, "gather vs masked oracle", res);
  return res;
}

// Uses supported(), which runs the same host validation as the entries but launches nothing, so
// the dummy pointers are never dereferenced even if a check were missing.
Result check_rejects(const Ctx& c) {
  Result res;
  BenchConfig cfg;
  cfg.b = 1; cfg.hq = 2; cfg.hk = 2; cfg.sq = 128; cfg.sk = 128; cfg.d = 64;
  cfg.dtype = c.dtype; cfg.backend = c.backend; cfg.topk = {0.5f};
  std::vector<unsigned char> dummy(1 << 16);
  void* f = dummy.data();
  cfg.blkq = 96;
  const Status a = supported(cfg.block_map_params(f, f, f, f, c.stream->handle()));
  if (a.ok() || a.message().find("blkq") == std::string::npos || a.message().find("96") == std::string::npos) {
    res.fail("blkq = 96 not rejected by name and value (got: " + (a.ok() ? std::string("ok") : a.message()) + ")");
  }
  cfg.blkq = 64;
  cfg.topk = {1.5f};
  const Status b = supported(cfg.block_map_params(f, f, f, f, c.stream->handle()));
  if (b.ok() || b.message().find("topk") == std::string::npos) {
    res.fail("topk = 1.5 not rejected by name (got: " + (b.ok() ? std::string("ok") : b.message()) + ")");
  }
  TopkSelectParams t;
  t.scores = make_tensor(f, DType::f32, {4, 16});
  t.k = 0;
  t.indices = make_tensor(f, DType::i32, {4, 1});
  t.exec = {c.backend, c.stream->handle(), c.threads};
  const Status tk = supported(t);
  if (tk.ok() || tk.message().find("k") == std::string::npos) {
    res.fail("topk_select k = 0 not rejected (got: " + (tk.ok() ? std::string("ok") : tk.message()) + ")");
  }
  if (res.pass) res.detail = "e.g. " + a.message();
  return res;
}

}  // namespace

int run_validate(Args& a) {
  const std::string backend_s = a.get_choice("backend", cuda_available() ? "cuda" : "cpu", {"cpu", "cuda"});
  Ctx c;
  c.backend = backend_s == "cuda" ? Backend::cuda : Backend::cpu;
  c.dtype = parse_dtype(a.get_choice("dtype", "fp16", {"fp16", "bf16", "fp32"}));
  c.threads = static_cast<int>(a.get_int("threads", 0, 0, 4096));
  const bool seed_given = a.has("seed");
  c.seed = seed_given ? a.get_u64("seed", 0) : fresh_seed();
  const std::string filter = a.get_choice("filter", "all", {"all", "block_map", "sparse", "dense", "varlen", "merge", "topk", "compact", "gather", "errors"});
  a.finish();
  Stream stream(c.backend);
  c.stream = &stream;
  std::printf("sparge validate: backend=%s (%s) dtype=%s seed=%llu%s\n", to_string(c.backend),
              device_description(c.backend, c.threads).c_str(), dtype_flag(c.dtype), (unsigned long long)c.seed,
              seed_given ? "" : " (fresh; pass -seed to reproduce)");

  struct Check {
    std::string group, name;
    std::function<Result()> fn;
  };
  std::vector<Check> checks;
  std::uint64_t salt = 100;
  for (const Shape& s : kShapes) {
    const std::string n = shape_name(s);
    checks.push_back({"block_map", "block_map_properties(" + n + ")", [&c, s, salt] { return check_block_map(c, s, salt); }});
    checks.push_back({"sparse", "sparse_vs_dense_oracle(" + n + ")", [&c, s, salt] { return check_sparse_vs_oracle(c, s, salt + 1, false); }});
    checks.push_back({"dense", "full_lut_vs_dense(" + n + ")", [&c, s, salt] { return check_sparse_vs_oracle(c, s, salt + 2, true); }});
    checks.push_back({"merge", "merge_halves(" + n + ")", [&c, s, salt] { return check_merge_halves(c, s, salt + 3); }});
    for (bool u : {false, true}) {
      checks.push_back({"gather", "gather_vs_dense_mask(" + n + ",group_union=" + std::to_string(u) + ")",
                        [&c, s, salt, u] { return check_gather(c, s, u, salt + 4 + u); }});
    }
    salt += 10;
  }
  for (bool causal : {false, true}) {
    checks.push_back({"varlen", std::string("varlen_vs_each_sequence(lens=100:130/1:77/257:257/64:1,hq=4,hk=2,d=64,causal=") +
                                    (causal ? "1" : "0") + ")",
                      [&c, causal, salt] { return check_varlen(c, causal, salt); }});
    ++salt;
  }
  for (DType dt : {DType::f32, DType::f16}) {
    checks.push_back({"topk", std::string("topk_select_ties(r=48,n=1000,dtype=") + dtype_flag(dt) + ")",
                      [&c, dt, salt] { return check_topk_ties(c, dt, salt); }});
    ++salt;
  }
  checks.push_back({"compact", "compact_mask_overflow(r=32,n=500)", [&c, salt] { return check_compact(c, salt); }});
  checks.push_back({"errors", "bad_params_rejected(blkq=96,topk=1.5,k=0)", [&c] { return check_rejects(c); }});

  int pass = 0, fail = 0;
  for (const Check& ch : checks) {
    if (filter != "all" && ch.group != filter) continue;
    Result r;
    try {
      r = ch.fn();
    } catch (const ToolError& e) {
      r.fail(std::string("error: ") + e.what());
    }
    std::printf("%s  %s  %s\n", r.pass ? "PASS" : "FAIL", ch.name.c_str(), r.detail.c_str());
    std::fflush(stdout);
    (r.pass ? pass : fail)++;
  }
  std::printf("validate: %d passed, %d failed\n", pass, fail);
  return fail == 0 ? 0 : kExitFail;
}

}  // namespace sparge::tool
