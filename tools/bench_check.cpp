// Validation of a bench run (-v=1): the block map against the CPU backend and against the selection
// rule applied to the CPU's own scores, the LUT's form, and O / LSE against the fp64 dense oracle
// (dense_attention with the LUT expanded into a token mask). Shapes too large for a full oracle are
// checked on a random subset of query blocks that fits the -oracle_gflop budget; the output says so.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>

#include "bench.h"
#include "common.h"
#include "lut.h"
#include "sparge/half.h"

namespace sparge::tool {

namespace {

constexpr double kSelectionMarginTol = 1e-4;  // relative score gap (and cdf distance) called a near-tie
constexpr double kSimTol = 1e-5;              // |sim - threshold| called a near-tie

struct Geometry {
  const BenchConfig& cfg;
  BlockGeom g;
  std::int64_t nq, nk, rows;
  explicit Geometry(const BenchConfig& c)
      : cfg(c), g{c.sq, c.sk, c.blkq, c.blkk, c.causal}, nq(g.nq()), nk(g.nk()), rows(c.b * c.hq * g.nq()) {}
};

Tensor sub_view(const Tensor& full, std::int64_t b, std::int64_t s0, std::int64_t rows, std::int64_t h) {
  Tensor t = full;
  t.data = static_cast<char*>(full.data) + full.offset(b, s0, h, 0) * static_cast<std::int64_t>(dtype_size(full.dtype));
  t.shape[0] = 1;
  t.shape[1] = rows;
  t.shape[2] = 1;
  return t;
}

// ---- block map -----------------------------------------------------------------------------------
bool check_block_map(const Geometry& G, const BenchHostData& h) {
  const BenchConfig& c = G.cfg;
  std::vector<std::int32_t> lut(static_cast<size_t>(G.rows * G.nk)), counts(static_cast<size_t>(G.rows));
  std::vector<float> scores(lut.size()), q_sim(counts.size()), k_sim(static_cast<size_t>(c.b * c.hk * G.nk));
  BenchConfig cpu_cfg = c;
  cpu_cfg.backend = Backend::cpu;
  BlockMapParams p = cpu_cfg.block_map_params(const_cast<void*>(h.q), const_cast<void*>(h.k), lut.data(),
                                              counts.data(), nullptr);
  p.maybe_scores = make_tensor(scores.data(), DType::f32, {c.b, c.hq, G.nq, G.nk});
  p.maybe_q_sim = make_tensor(q_sim.data(), DType::f32, {c.b, c.hq, G.nq});
  p.maybe_k_sim = make_tensor(k_sim.data(), DType::f32, {c.b, c.hk, G.nk});
  {
    Heartbeat hb("cpu block map", 1);
    check(build_block_map(p), "cpu build_block_map (reference)");
  }

  SelectRule rule;
  if (!c.topk.empty()) rule.topk = c.topk[0];
  else rule.cdf = c.cdf[0];
  rule.sink = c.sink;
  const bool sim_on = !c.simthreshd1.empty();
  const double thr = sim_on ? c.simthreshd1[0] : 0.0;

  std::int64_t rule_bad = 0, differ = 0, near_tie = 0;
  std::string first_rule, first_diff;
  for (std::int64_t r = 0; r < G.rows; ++r) {
    const std::int64_t qb = r % G.nq, bh = r / G.nq, b = bh / c.hq, hh = bh % c.hq;
    const std::int64_t hk = hh / (c.hq / c.hk), nv = G.g.visible(qb);
    const float* s = scores.data() + r * G.nk;
    const std::int32_t* cpu_row = lut.data() + r * G.nk;
    const bool q_ss = !sim_on || q_sim[static_cast<size_t>(r)] > thr;
    // (1) the CPU map follows the rule on its own scores.
    const auto want = select_from_scores(s, nv, q_ss, rule);
    const bool rule_ok = counts[static_cast<size_t>(r)] == static_cast<std::int32_t>(want.size()) &&
                         std::equal(want.begin(), want.end(), cpu_row);
    if (!rule_ok && rule_bad++ == 0) {
      std::ostringstream os;
      os << "row (b " << b << ", h " << hh << ", qb " << qb << "): cpu count " << counts[static_cast<size_t>(r)]
         << ", the rule on its scores gives " << want.size();
      first_rule = os.str();
    }
    // (2) the backend's map equals the CPU's, block for block.
    const std::int32_t* be_row = h.lut + r * G.nk;
    const bool same = h.counts[r] == counts[static_cast<size_t>(r)] && std::equal(cpu_row, cpu_row + G.nk, be_row);
    if (same) continue;
    ++differ;
    bool tie = c.backend == Backend::cuda && q_ss && selection_margin(s, nv, rule) < kSelectionMarginTol;
    if (c.backend == Backend::cuda && sim_on) {
      tie = tie || std::fabs(q_sim[static_cast<size_t>(r)] - thr) < kSimTol;
      for (std::int64_t kb = 0; kb < nv && !tie; ++kb) tie = std::fabs(k_sim[static_cast<size_t>((b * c.hk + hk) * G.nk + kb)] - thr) < kSimTol;
    }
    if (tie) {
      ++near_tie;
    } else if (first_diff.empty()) {
      std::ostringstream os;
      os << "row (b " << b << ", h " << hh << ", qb " << qb << "): " << to_string(c.backend) << " count "
         << h.counts[r] << " vs cpu " << counts[static_cast<size_t>(r)];
      first_diff = os.str();
    }
  }
  const bool pass = rule_bad == 0 && differ == near_tie;
  std::printf("%-10s %s  %s vs cpu: %lld of %lld rows differ (%lld at near-ties, tolerated%s); cpu selection vs the rule on its scores: %lld rows differ\n",
              "block map:", pass ? "PASS" : "FAIL", to_string(c.backend), (long long)differ, (long long)G.rows,
              (long long)near_tie, c.backend == Backend::cpu ? " only on cuda: cpu must be deterministic" : "",
              (long long)rule_bad);
  if (!first_diff.empty()) std::printf("           first mismatching row: %s\n", first_diff.c_str());
  if (!first_rule.empty()) std::printf("           first rule mismatch: %s\n", first_rule.c_str());
  return pass;
}

bool check_lut_form(const Geometry& G, const BenchHostData& h) {
  std::string first;
  const std::int64_t bad = check_lut(G.g, h.lut, h.counts, G.rows, &first);
  std::printf("%-10s %s  %lld of %lld rows malformed (ascending visible blocks, -1 padding, 1 <= count <= visible)\n",
              "LUT:", bad == 0 ? "PASS" : "FAIL", (long long)bad, (long long)G.rows);
  if (bad) std::printf("           first: %s\n", first.c_str());
  return bad == 0;
}

// ---- output and LSE ------------------------------------------------------------------------------
// Picks `want` of `total` chunk indices at random (always the first and the last), ascending.
std::vector<std::int64_t> sample(std::int64_t total, std::int64_t want, std::uint64_t seed) {
  std::vector<std::int64_t> all(static_cast<size_t>(total));
  std::iota(all.begin(), all.end(), 0);
  if (want >= total) return all;
  std::mt19937_64 rng(seed);
  std::vector<std::int64_t> picked = {0, total - 1};
  for (std::int64_t i = 1; i + 1 < total && static_cast<std::int64_t>(picked.size()) < want; ++i) {
    // Fisher-Yates over the middle indices [1, total - 1).
    std::uniform_int_distribution<std::int64_t> pick(i, total - 2);
    std::swap(all[static_cast<size_t>(i)], all[static_cast<size_t>(pick(rng))]);
    picked.push_back(all[static_cast<size_t>(i)]);
  }
  std::sort(picked.begin(), picked.end());
  return picked;
}

struct OutputCheck {
  ErrorStats o, lse;
  std::mutex mu;
  void merge(const ErrorStats& eo, const ErrorStats& el) {
    std::lock_guard<std::mutex> lock(mu);
    o.merge(eo);
    lse.merge(el);
  }
};

// Compares backend rows [r0, r0 + n) of head (b, hh) with reference o (f32 [n, D]) and lse [n].
void compare_rows(const Geometry& G, const BenchHostData& h, std::int64_t b, std::int64_t hh, std::int64_t r0,
                  std::int64_t n, const float* ref_o, const float* ref_lse, OutputCheck& out) {
  const BenchConfig& c = G.cfg;
  const Tensor ov = bshd_view(nullptr, c.dtype, c.b, c.sq, c.hq, c.d, c.hnd);
  ErrorStats eo, el;
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t dd = 0; dd < c.d; ++dd) {
      eo.add(load_as_float(h.o, c.dtype, ov.offset(b, r0 + i, hh, dd)), ref_o[i * c.d + dd]);
    }
    el.add(h.lse[(b * c.hq + hh) * c.sq + r0 + i], ref_lse[i]);
  }
  out.merge(eo, el);
}

bool check_output(const Geometry& G, const BenchHostData& h) {
  const BenchConfig& c = G.cfg;
  // The fp8 recipe is checked against its CPU specification (quantized inputs, fp64 attention): the
  // kernel adds P's e4m3 rounding and a narrower fp8 accumulation (docs/quantized.md, accuracy), so
  // its bounds are those of that error, not of the fp16 kernel's.
  const Tolerance tol = c.recipe == Recipe::fp8 ? Tolerance{1e-1, 1e-2, 2e-2} : tolerance_for(c.dtype);
  Tensor qv = bshd_view(const_cast<void*>(h.q), c.dtype, c.b, c.sq, c.hq, c.d, c.hnd);
  Tensor kv = bshd_view(const_cast<void*>(h.k), c.dtype, c.b, c.sk, c.hk, c.d, c.hnd);
  Tensor vv = bshd_view(const_cast<void*>(h.v), c.dtype, c.b, c.sk, c.hk, c.d, c.hnd);
  const std::int64_t group = c.hq / c.hk;
  const double budget = c.oracle_gflop * 1e9;
  OutputCheck out;
  std::string reference;
  std::int64_t done = 0, total = 0;
  const bool oracle = c.pv_threshold.empty() && c.recipe == Recipe::none;
  const std::string unit = oracle ? "query blocks" : "(b, h) heads";

  if (oracle) {
    // Reference: the fp64 dense oracle over the LUT expanded to a token mask, one query block per
    // call (rows sliced out of Q; causality lives in the mask, so slicing keeps it exact).
    reference = "fp64 dense oracle with the LUT as mask";
    total = G.rows;
    const double per_chunk = 4.0 * c.blkq * static_cast<double>(c.sk) * static_cast<double>(c.d);
    const auto chunks = sample(total, std::max<std::int64_t>(1, static_cast<std::int64_t>(budget / per_chunk)), c.seed ^ 0x5eed);
    done = static_cast<std::int64_t>(chunks.size());
    Heartbeat hb("oracle", done);
    parallel_for(done, c.threads, [&](std::int64_t ci) {
      const std::int64_t r = chunks[static_cast<size_t>(ci)];
      const std::int64_t qb = r % G.nq, bh = r / G.nq, b = bh / c.hq, hh = bh % c.hq;
      const std::int64_t r0 = qb * c.blkq, n = std::min<std::int64_t>(c.blkq, c.sq - r0);
      std::vector<std::uint8_t> mask(static_cast<size_t>(n * c.sk));
      std::vector<float> o(static_cast<size_t>(n * c.d)), lse(static_cast<size_t>(n));
      expand_row_mask(G.g, qb, h.lut + r * G.nk, h.counts[r], mask.data());
      DenseAttentionParams p;
      p.q = sub_view(qv, b, r0, n, hh);
      p.k = sub_view(kv, b, 0, c.sk, hh / group);
      p.v = sub_view(vv, b, 0, c.sk, hh / group);
      p.o = make_tensor(o.data(), DType::f32, {1, n, 1, c.d});
      p.maybe_lse = make_tensor(lse.data(), DType::f32, {1, 1, n});
      p.maybe_mask = make_tensor(mask.data(), DType::u8, {1, 1, n, c.sk});
      p.scale = c.scale;
      p.exec = {Backend::cpu, nullptr, 1};
      check(dense_attention(p), "cpu dense_attention (oracle)");
      compare_rows(G, h, b, hh, r0, n, o.data(), lse.data(), out);
      hb.add();
    });
  } else {
    if (c.backend == Backend::cpu) {
      std::printf("%-10s SKIP  -pvthreshd / -recipe on the cpu backend: the cpu backend is the reference for them "
                  "(run without them to check against the oracle)\n%-10s SKIP  (as output)\n", "output:", "LSE:");
      return true;
    }
    // Reference: the CPU backend with the same pv_threshold (the oracle knows nothing of skipped
    // PV products) and recipe (the fp8 specification), one (b, h) head per call.
    reference = c.recipe == Recipe::fp8 ? "cpu block_sparse_attention, recipe fp8 (the specification)"
                                        : "cpu block_sparse_attention with the same pv_threshold";
    total = c.b * c.hq;
    const double per_head = 4.0 * static_cast<double>(c.sq) * static_cast<double>(c.sk) * static_cast<double>(c.d);
    const auto heads = sample(total, std::max<std::int64_t>(1, static_cast<std::int64_t>(budget / per_head)), c.seed ^ 0x5eed);
    done = static_cast<std::int64_t>(heads.size());
    Heartbeat hb("cpu reference", done);
    parallel_for(done, c.threads, [&](std::int64_t ci) {
      const std::int64_t bh = heads[static_cast<size_t>(ci)], b = bh / c.hq, hh = bh % c.hq;
      std::vector<float> o(static_cast<size_t>(c.sq * c.d)), lse(static_cast<size_t>(c.sq));
      BenchConfig one = c;
      one.backend = Backend::cpu;
      one.threads = 1;
      const std::int32_t* lut = h.lut + bh * G.nq * G.nk;
      const std::int32_t* cnt = h.counts + bh * G.nq;
      BlockSparseAttentionParams p = one.attention_params(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
      p.q = sub_view(qv, b, 0, c.sq, hh);
      p.k = sub_view(kv, b, 0, c.sk, hh / group);
      p.v = sub_view(vv, b, 0, c.sk, hh / group);
      p.o = make_tensor(o.data(), DType::f32, {1, c.sq, 1, c.d});
      p.maybe_lse = make_tensor(lse.data(), DType::f32, {1, 1, c.sq});
      p.lut = make_tensor(const_cast<std::int32_t*>(lut), DType::i32, {1, 1, G.nq, G.nk});
      p.counts = make_tensor(const_cast<std::int32_t*>(cnt), DType::i32, {1, 1, G.nq});
      check(block_sparse_attention(p), "cpu block_sparse_attention (reference)");
      compare_rows(G, h, b, hh, 0, c.sq, o.data(), lse.data(), out);
      hb.add();
    });
  }
  std::ostringstream note;
  note << "vs " << reference << "; ";
  if (done == total) note << "all " << total << " " << unit;
  else note << "SUBSET: " << done << " of " << total << " " << unit << " sampled at random (first and last included) to fit -oracle_gflop=" << c.oracle_gflop;
  const bool o_ok = report_error("output", out.o, tol.o_abs, tol.o_nmse, note.str());
  const bool l_ok = report_error("LSE", out.lse, tol.lse_abs, tol.lse_abs * tol.lse_abs, note.str());
  return o_ok && l_ok;
}

}  // namespace

bool validate_bench(const BenchConfig& cfg, const BenchHostData& h) {
  const Geometry G(cfg);
  std::printf("validation (-v=1):\n");
  bool ok = true;
  const std::pair<const char*, std::function<bool()>> parts[] = {
      {"block map:", [&] { return check_block_map(G, h); }},
      {"LUT:", [&] { return check_lut_form(G, h); }},
      {"output:", [&] { return check_output(G, h); }},
  };
  for (const auto& [name, fn] : parts) {
    try {
      ok = fn() && ok;
    } catch (const ToolError& e) {
      std::printf("%-10s FAIL  (error: %s)\n", name, e.what());
      ok = false;
    }
    std::fflush(stdout);
  }
  std::printf("validation: %s\n", ok ? "PASS" : "FAIL");
  return ok;
}

}  // namespace sparge::tool
