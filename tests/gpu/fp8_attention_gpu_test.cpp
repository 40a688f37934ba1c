// The fp8 recipe on the Hopper kernel (docs/quantized.md) against its CPU specification.
//
// The CPU backend's recipe fp8 is attention in fp64 over the dequantized inputs; the kernel also
// rounds P to e4m3 (scaled by 2^8 against the running max of each 128-key tile) before PV, which
// the specification does not. Pass criterion (the FA3-style one of attention_gpu_test.cpp): the
// kernel's max error against the specification is at most 2x the max error of a host emulation of
// the kernel's arithmetic (same quantized inputs, online softmax over the same tiles in LUT order, P
// rounded to e4m3 exactly as the kernel does) plus a small absolute floor. A wrong V key order, a
// wrong scale or a wrong tile walk gives errors of the order of |V| on the peaked inputs used here.
// LSE: within 2e-3 of the specification (l sums the unrounded probabilities). Every case runs twice
// and must be bitwise identical, with poisoned outputs and intact guard regions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/quant.h"
#include "gpu/gpu_harness.h"
#include "quant/quant_rule.h"
#include "sparge/half.h"
#include "sparge/ops.h"

namespace sparge::test {
namespace {

struct Fp8Cfg {
  DType dt = DType::f16;
  int b = 1, hq = 2, hk = 2, sq = 256, sk = 256, blkk = 64;
  bool causal = false, hnd = true, smooth = true, o_f32 = true;
  double density = 0.5;
  float pv_thr = 0.0f;
  float q_mul = 2.0f;     // logit spread: peaked rows make P's order visible in O
  float k_bias = 3.0f;    // per-channel mean of K (what smoothing removes)
  int variant = -1;       // SPARGE_SM90_VARIANT for the GPU call (-1: as the environment has it)
  std::string name() const {
    Name n("FP8");
    n("dt", sparge::to_string(dt))("b", b)("hq", hq)("hk", hk)("sq", sq)("sk", sk)("blkk", blkk)("density", density);
    n("causal", causal)("layout", hnd ? "HND" : "NHD")("smooth", smooth)("o", o_f32 ? "f32" : sparge::to_string(dt));
    if (pv_thr > 0) n("pv", pv_thr);
    n("qmul", q_mul)("kbias", k_bias);
    if (variant >= 0) n("v", variant);
    return n.str();
  }
};

constexpr int kD = 128, kBlkq = 128;

std::int64_t nblocks(std::int64_t s, int blk) { return (s + blk - 1) / blk; }

// Storage index of logical [b, s, h, d] in NHD or HND.
std::int64_t idx(bool hnd, std::int64_t S, std::int64_t H, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  return hnd ? ((b * H + h) * S + s) * kD + d : ((b * S + s) * H + h) * kD + d;
}
Tensor view4(void* data, DType dt, std::int64_t B, std::int64_t S, std::int64_t H, bool hnd) {
  if (hnd) return make_tensor(data, dt, {B, S, H, kD}, {H * S * kD, kD, S * kD, 1});
  return make_tensor(data, dt, {B, S, H, kD}, {S * H * kD, H * kD, kD, 1});
}

// Last key visible to query row i (bottom-right causal), or sk - 1.
std::int64_t key_limit(const Fp8Cfg& c, std::int64_t i) {
  if (!c.causal) return c.sk - 1;
  return std::min<std::int64_t>(c.sk - 1, i + c.sk - c.sq);
}

// The LUT blocks of a query block in walk order (entries in [0, visible), as the kernel's iterators).
std::vector<int> walk_blocks(const Fp8Cfg& c, const std::int32_t* lut_row, int count, std::int64_t qb) {
  const std::int64_t last_row = std::min<std::int64_t>(c.sq, (qb + 1) * kBlkq) - 1;
  const std::int64_t vis_key = c.causal ? std::min<std::int64_t>(c.sk - 1, last_row + c.sk - c.sq) : c.sk - 1;
  const std::int64_t visible = vis_key < 0 ? 0 : vis_key / c.blkk + 1;
  std::vector<int> blocks;
  for (int e = 0; e < count; ++e) {
    if (lut_row[e] >= 0 && lut_row[e] < visible) blocks.push_back(lut_row[e]);
  }
  return blocks;
}

// Scaled logit (log2 units) of row i and key `key` over the dequantized inputs; -inf when masked.
float logit(const Fp8Cfg& c, const cpu::Dequantized& dq, std::int64_t b, std::int64_t h, std::int64_t i,
            std::int64_t key, float sl2) {
  if (key > key_limit(c, i)) return -INFINITY;
  const std::int64_t hk = h / (c.hq / c.hk);
  const float* q = &dq.q[((b * c.sq + i) * c.hq + h) * kD];
  const float* k = &dq.k[((b * c.sk + key) * c.hk + hk) * kD];
  double dot = 0;
  for (int d = 0; d < kD; ++d) dot += static_cast<double>(q[d]) * k[d];
  return static_cast<float>(dot) * sl2;
}

// pv_threshold's decisions of one query block by the definition (docs/semantics.md): block e of the
// walk is skipped when every row of the query block has (block max - running max) + thr <= 0.
std::vector<bool> pv_skips(const Fp8Cfg& c, const cpu::Dequantized& dq, const std::vector<int>& blocks, std::int64_t b,
                           std::int64_t h, std::int64_t qb, float sl2) {
  std::vector<bool> skip(blocks.size(), false);
  if (c.pv_thr <= 0) return skip;
  const std::int64_t r0 = qb * kBlkq, r1 = std::min<std::int64_t>(c.sq, r0 + kBlkq);
  std::vector<float> run(static_cast<size_t>(r1 - r0), -INFINITY);
  for (std::size_t e = 0; e < blocks.size(); ++e) {
    bool all = true;
    for (std::int64_t i = r0; i < r1; ++i) {
      float x = -INFINITY;
      for (int j = 0; j < c.blkk; ++j) x = std::max(x, logit(c, dq, b, h, i, static_cast<std::int64_t>(blocks[e]) * c.blkk + j, sl2));
      float& m = run[static_cast<size_t>(i - r0)];
      m = std::max(m, x);
      if ((x - m) + c.pv_thr > 0.0f) all = false;
    }
    skip[e] = all;
  }
  return skip;
}

// Host emulation of the kernel's arithmetic for one (b, h) row i over the dequantized inputs:
// tiles of the walk (two 64-key blocks, or one 128-key block), online softmax, P = 2^(s - m + 8)
// rounded to e4m3 for PV, skipped blocks counted in l only. Returns O (D values) and LSE.
void emulate_row(const Fp8Cfg& c, const cpu::Dequantized& dq, const std::vector<int>& blocks,
                 const std::vector<bool>& skip, std::int64_t b, std::int64_t h, std::int64_t i, float scale,
                 float* o_out, float* lse_out) {
  const std::int64_t hk = h / (c.hq / c.hk);
  const float sl2 = scale * 1.4426950408889634f;
  float m = -INFINITY, l = 0.0f;
  std::vector<float> o(kD, 0.0f);
  const int per_tile = c.blkk == 64 ? 2 : 1;
  for (std::size_t t0 = 0; t0 < blocks.size(); t0 += per_tile) {
    std::vector<std::int64_t> keys;
    std::vector<bool> key_skip;
    for (int u = 0; u < per_tile && t0 + u < blocks.size(); ++u) {
      for (int j = 0; j < c.blkk; ++j) {
        keys.push_back(static_cast<std::int64_t>(blocks[t0 + u]) * c.blkk + j);
        key_skip.push_back(skip[t0 + u]);
      }
    }
    std::vector<float> s(keys.size());
    float x = -INFINITY;
    for (std::size_t j = 0; j < keys.size(); ++j) {
      s[j] = logit(c, dq, b, h, i, keys[j], sl2);
      x = std::max(x, s[j]);
    }
    const float m_new = std::max(m, x);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    const float alpha = std::exp2(m - m_use);
    for (auto& v : o) v *= alpha;
    float sum = 0;
    for (std::size_t j = 0; j < keys.size(); ++j) {
      const float p = std::exp2(s[j] - m_use + 8.0f);
      sum += p;
      if (p == 0.0f || key_skip[j]) continue;
      const float pr = quant::e4m3_to_float(quant::e4m3_encode_soft(p));
      const float* v = &dq.v[((b * c.sk + keys[j]) * c.hk + hk) * kD];
      for (int d = 0; d < kD; ++d) o[d] += pr * v[d];
    }
    l = l * alpha + sum;
    m = m_new;
  }
  const bool empty = !(l > 0);
  for (int d = 0; d < kD; ++d) o_out[d] = empty ? 0.0f : o[d] / l;
  *lse_out = empty ? -INFINITY : (m + std::log2(l) - 8.0f) * 0.6931471805599453f;
}

void run_fp8_case(const Fp8Cfg& c) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  auto rng = rng_for(c.name());
  const std::int64_t nq = nblocks(c.sq, kBlkq), nk = nblocks(c.sk, c.blkk);
  // Inputs (logical NHD f32, rounded through the dtype), stored in the case's layout.
  std::vector<float> q(static_cast<size_t>(c.b) * c.sq * c.hq * kD), k(static_cast<size_t>(c.b) * c.sk * c.hk * kD),
      v(k.size());
  fill_normal(q, rng, 0.0f, c.q_mul);
  fill_normal(k, rng);
  fill_normal(v, rng);
  std::vector<float> bias(static_cast<size_t>(c.hk) * kD);
  fill_normal(bias, rng, 0.0f, c.k_bias);
  for (std::int64_t r = 0; r < c.b * c.sk; ++r)
    for (int h = 0; h < c.hk; ++h)
      for (int d = 0; d < kD; ++d) k[(r * c.hk + h) * kD + d] += bias[h * kD + d];
  q = round_through(q, c.dt);
  k = round_through(k, c.dt);
  v = round_through(v, c.dt);
  const auto store = [&](const std::vector<float>& x, std::int64_t S, std::int64_t H) {
    std::vector<float> out(x.size());
    for (std::int64_t b = 0; b < c.b; ++b)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < H; ++h)
          for (int d = 0; d < kD; ++d) out[idx(c.hnd, S, H, b, s, h, d)] = x[((b * S + s) * H + h) * kD + d];
    return out;
  };
  const std::vector<float> qs = store(q, c.sq, c.hq), ks = store(k, c.sk, c.hk), vs = store(v, c.sk, c.hk);
  // LUT: a random ascending subset of each query block's visible blocks (some rows empty).
  std::vector<std::int32_t> lut(static_cast<size_t>(c.b * c.hq * nq * nk), -1), counts(static_cast<size_t>(c.b * c.hq * nq));
  std::uniform_real_distribution<double> u01(0, 1);
  for (std::int64_t r = 0; r < c.b * c.hq * nq; ++r) {
    int n = 0;
    const bool empty_row = u01(rng) < 0.05;
    for (std::int64_t kb = 0; kb < nk && !empty_row; ++kb) {
      if (u01(rng) < c.density) lut[r * nk + n++] = static_cast<std::int32_t>(kb);
    }
    counts[r] = n;
  }

  // CPU specification.
  std::vector<float> o_ref(q.size()), lse_ref(static_cast<size_t>(c.b * c.hq * c.sq));
  BlockSparseAttentionParams p;
  p.q = view4(const_cast<float*>(qs.data()), DType::f32, c.b, c.sq, c.hq, c.hnd);
  p.k = view4(const_cast<float*>(ks.data()), DType::f32, c.b, c.sk, c.hk, c.hnd);
  p.v = view4(const_cast<float*>(vs.data()), DType::f32, c.b, c.sk, c.hk, c.hnd);
  p.o = view4(o_ref.data(), DType::f32, c.b, c.sq, c.hq, c.hnd);
  p.maybe_lse = make_tensor(lse_ref.data(), DType::f32, {c.b, c.hq, c.sq});
  p.lut = make_tensor(lut.data(), DType::i32, {c.b, c.hq, nq, nk});
  p.counts = make_tensor(counts.data(), DType::i32, {c.b, c.hq, nq});
  p.blkq = kBlkq;
  p.blkk = c.blkk;
  p.is_causal = c.causal;
  p.recipe = Recipe::fp8;
  p.smooth_k = c.smooth;
  std::vector<float> thr;
  if (c.pv_thr > 0) {
    thr.assign(1, c.pv_thr);
    p.pv_threshold = thr;
  }
  p.exec.backend = Backend::cpu;
  ASSERT_TRUE(block_sparse_attention(p).ok()) << block_sparse_attention(p).message();

  // Emulation of the kernel over the host-quantized inputs.
  const float scale = 1.0f / std::sqrt(static_cast<float>(kD));
  const std::vector<float> km = c.smooth ? cpu::k_mean_host(p.k, 0) : std::vector<float>(static_cast<size_t>(c.b * c.hk * kD), 0.0f);
  const cpu::QuantHost qh = cpu::quantize_host(p.q, p.k, p.v, c.blkk, c.smooth, scale, km, 0);
  const cpu::Dequantized dq = cpu::dequantize_host(qh, 0);
  double emu_err = 0;
  const float sl2 = scale * 1.4426950408889634f;
  for (std::int64_t b = 0; b < c.b; ++b)
    for (std::int64_t h = 0; h < c.hq; ++h)
      for (std::int64_t qb = 0; qb < nq; ++qb) {
        const std::int64_t r = (b * c.hq + h) * nq + qb;
        const std::vector<int> blocks = walk_blocks(c, &lut[r * nk], counts[r], qb);
        const std::vector<bool> skip = pv_skips(c, dq, blocks, b, h, qb, sl2);
        for (std::int64_t i = qb * kBlkq; i < std::min<std::int64_t>(c.sq, (qb + 1) * kBlkq); ++i) {
          float oe[kD], le;
          emulate_row(c, dq, blocks, skip, b, h, i, scale, oe, &le);
          for (int d = 0; d < kD; ++d) {
            emu_err = std::max(emu_err, std::fabs(static_cast<double>(oe[d]) - o_ref[idx(c.hnd, c.sq, c.hq, b, i, h, d)]));
          }
        }
      }

  // GPU, twice.
  DeviceGuarded<std::uint16_t> dq16(q.size()), dk16(k.size()), dv16(v.size());
  dq16.upload(to_storage16(qs, c.dt));
  dk16.upload(to_storage16(ks, c.dt));
  dv16.upload(to_storage16(vs, c.dt));
  DeviceGuarded<float> do32(c.o_f32 ? q.size() : 0), dlse(lse_ref.size());
  DeviceGuarded<std::uint16_t> do16(c.o_f32 ? 0 : q.size());
  DeviceGuarded<std::int32_t> dlut(lut.size()), dcnt(counts.size());
  dlut.upload(lut);
  dcnt.upload(counts);
  BlockSparseAttentionParams g = p;
  g.q = view4(dq16.data(), c.dt, c.b, c.sq, c.hq, c.hnd);
  g.k = view4(dk16.data(), c.dt, c.b, c.sk, c.hk, c.hnd);
  g.v = view4(dv16.data(), c.dt, c.b, c.sk, c.hk, c.hnd);
  g.o = c.o_f32 ? view4(do32.data(), DType::f32, c.b, c.sq, c.hq, c.hnd) : view4(do16.data(), c.dt, c.b, c.sq, c.hq, c.hnd);
  g.maybe_lse = make_tensor(dlse.data(), DType::f32, {c.b, c.hq, c.sq});
  g.lut = make_tensor(dlut.data(), DType::i32, {c.b, c.hq, nq, nk});
  g.counts = make_tensor(dcnt.data(), DType::i32, {c.b, c.hq, nq});
  g.exec.backend = Backend::cuda;
  std::vector<float> o_gpu[2], lse_gpu[2];
  std::optional<ScopedEnv> var;
  if (c.variant >= 0) var.emplace("SPARGE_SM90_VARIANT", std::to_string(c.variant).c_str());
  for (int rep = 0; rep < 2; ++rep) {
    if (c.o_f32) do32.poison(); else do16.poison();
    dlse.poison();
    const Status st = block_sparse_attention(g);
    ASSERT_TRUE(st.ok()) << st.message();
    SPARGE_CUDA_CHECK(cudaDeviceSynchronize());
    if (c.o_f32) {
      o_gpu[rep] = do32.download();
    } else {
      const std::vector<std::uint16_t> raw = do16.download();
      o_gpu[rep].resize(raw.size());
      for (size_t e = 0; e < raw.size(); ++e) o_gpu[rep][e] = c.dt == DType::f16 ? half_to_float(raw[e]) : bf16_to_float(raw[e]);
    }
    lse_gpu[rep] = dlse.download();
    ASSERT_TRUE(do32.guards_intact() && do16.guards_intact() && dlse.guards_intact()) << "guard region overwritten";
  }
  ASSERT_EQ(0, std::memcmp(o_gpu[0].data(), o_gpu[1].data(), o_gpu[0].size() * 4)) << "O differs between launches";
  ASSERT_EQ(0, std::memcmp(lse_gpu[0].data(), lse_gpu[1].data(), lse_gpu[0].size() * 4)) << "LSE differs between launches";

  double gpu_err = 0, lse_err = 0;
  std::int64_t worst = 0;
  for (size_t e = 0; e < o_ref.size(); ++e) {
    ASSERT_TRUE(std::isfinite(o_gpu[0][e])) << "non-finite O at " << e;
    const double d = std::fabs(static_cast<double>(o_gpu[0][e]) - o_ref[e]);
    if (d > gpu_err) {
      gpu_err = d;
      worst = static_cast<std::int64_t>(e);
    }
  }
  double lse_bound = 2e-3;
  for (size_t e = 0; e < lse_ref.size(); ++e) {
    if (std::isinf(lse_ref[e]) || std::isinf(lse_gpu[0][e])) {
      ASSERT_EQ(lse_ref[e], lse_gpu[0][e]) << "LSE row " << e;
      continue;
    }
    lse_err = std::max(lse_err, std::fabs(static_cast<double>(lse_gpu[0][e]) - lse_ref[e]));
    lse_bound = std::max(lse_bound, 1e-3 + 5e-4 * std::fabs(static_cast<double>(lse_ref[e])));
  }
  const double out_round = c.o_f32 ? 0.0 : (c.dt == DType::f16 ? 1.0 / 1024 : 1.0 / 128) * 4.0;
  const double bound = 2.0 * emu_err + 2e-3 + out_round;
  std::printf("[ fp8 ] %s: max |gpu - spec| %.3e (at %lld), emulation %.3e, bound %.3e; LSE %.3e (bound %.3e)\n",
              c.name().c_str(), gpu_err, static_cast<long long>(worst), emu_err, bound, lse_err, lse_bound);
  EXPECT_LE(gpu_err, bound);
  // The fp8 wgmma adds its exact e4m3 products with a narrower accumulator than fp32 (H200, 2026-11-30:
  // LSE within 1e-3 .. 4e-3 of the fp64 specification at |LSE| ~ 10), which the emulation does not
  // model; the bound is relative to the LSE's size. A missing 2^8 of P (5.5), a missing smoothing
  // shift or a wrong scale are far outside it.
  EXPECT_LE(lse_err, lse_bound);
}

// SPARGE_BENCH=1: the fp16 kernel and the fp8 recipe (prepass + kernel) on the same random LUT at
// the PERF.md shape, median of 10 after 3 warmups (CUDA events around each call).
void bench_fp8() {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const char* e = std::getenv("SPARGE_BENCH");
  if (e == nullptr || std::strcmp(e, "1") != 0) GTEST_SKIP() << "set SPARGE_BENCH=1";
  const std::int64_t B = 2, H = 32, S = 16384;
  std::mt19937_64 rng(12345);
  std::vector<float> x(static_cast<size_t>(B * H * S * kD));
  DeviceGuarded<std::uint16_t> dq(x.size()), dk(x.size()), dv(x.size()), dout(x.size());
  fill_normal(x, rng);
  dq.upload(to_storage16(x, DType::f16));
  fill_normal(x, rng);
  dk.upload(to_storage16(x, DType::f16));
  fill_normal(x, rng);
  dv.upload(to_storage16(x, DType::f16));
  cudaEvent_t e0, e1;
  SPARGE_CUDA_CHECK(cudaEventCreate(&e0));
  SPARGE_CUDA_CHECK(cudaEventCreate(&e1));
  for (int blkk : {64, 128}) {
    for (double density : {1.0, 0.4, 0.1}) {
      const std::int64_t nq = S / kBlkq, nk = S / blkk;
      std::vector<std::int32_t> lut(static_cast<size_t>(B * H * nq * nk), -1), counts(static_cast<size_t>(B * H * nq));
      std::uniform_real_distribution<double> u01(0, 1);
      std::int64_t blocks = 0;
      for (std::int64_t r = 0; r < B * H * nq; ++r) {
        int n = 0;
        for (std::int64_t kb = 0; kb < nk; ++kb) {
          if (density >= 1.0 || u01(rng) < density) lut[r * nk + n++] = static_cast<std::int32_t>(kb);
        }
        counts[r] = n;
        blocks += n;
      }
      DeviceGuarded<std::int32_t> dlut(lut.size()), dcnt(counts.size());
      dlut.upload(lut);
      dcnt.upload(counts);
      BlockSparseAttentionParams p;
      p.q = view4(dq.data(), DType::f16, B, S, H, true);
      p.k = view4(dk.data(), DType::f16, B, S, H, true);
      p.v = view4(dv.data(), DType::f16, B, S, H, true);
      p.o = view4(dout.data(), DType::f16, B, S, H, true);
      p.lut = make_tensor(dlut.data(), DType::i32, {B, H, nq, nk});
      p.counts = make_tensor(dcnt.data(), DType::i32, {B, H, nq});
      p.blkq = kBlkq;
      p.blkk = blkk;
      p.exec.backend = Backend::cuda;
      const double flops = 4.0 * static_cast<double>(blocks) * kBlkq * blkk * kD;
      for (Recipe rc : {Recipe::none, Recipe::fp8}) {
        p.recipe = rc;
        std::vector<float> ms;
        for (int it = 0; it < 13; ++it) {
          SPARGE_CUDA_CHECK(cudaEventRecord(e0));
          const Status st = block_sparse_attention(p);
          SPARGE_CUDA_CHECK(cudaEventRecord(e1));
          ASSERT_TRUE(st.ok()) << st.message();
          SPARGE_CUDA_CHECK(cudaEventSynchronize(e1));
          float t = 0;
          SPARGE_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
          if (it >= 3) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        const double med = (ms[4] + ms[5]) / 2;
        std::printf("[ bench ] fp8 b2 h32 s16384 d128 128x%d density %.2f recipe %s: median %.3f ms (min %.3f, max %.3f), "
                    "%.1f TFLOPS on computed blocks\n",
                    blkk, static_cast<double>(blocks) / (B * H * nq * nk), to_string(rc), med, ms.front(), ms.back(),
                    flops / med * 1e-9);
      }
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

SPARGE_CASES(Fp8AttentionGpu) {
  cases.push_back({"FP8_BENCH(b=2,h=32,s=16384,d=128)", [] { bench_fp8(); }});
  std::vector<Fp8Cfg> cfgs;
  for (DType dt : {DType::f16, DType::bf16})
    for (int blkk : {64, 128})
      for (bool causal : {false, true}) {
        Fp8Cfg c;
        c.dt = dt;
        c.blkk = blkk;
        c.causal = causal;
        c.hnd = (blkk == 64) == causal;
        cfgs.push_back(c);
      }
  {
    Fp8Cfg c;  // tails: Sk not a multiple of 32, Sq not of 128; sanitizer filter "sq=203"
    c.sq = 203;
    c.sk = 1000;
    c.causal = true;
    cfgs.push_back(c);
    c.blkk = 128;
    c.causal = false;
    c.sk = 333;
    cfgs.push_back(c);
  }
  {
    Fp8Cfg c;  // GQA, no smoothing, f16 output, two batches
    c.b = 2;
    c.hq = 8;
    c.hk = 2;
    c.smooth = false;
    c.k_bias = 0.5f;
    c.o_f32 = false;
    c.sq = 384;
    c.sk = 512;
    cfgs.push_back(c);
    c.dt = DType::bf16;
    c.blkk = 128;
    c.hnd = false;
    c.smooth = true;
    c.k_bias = 6.0f;
    cfgs.push_back(c);
  }
  {
    Fp8Cfg c;  // pv_threshold, dense-ish and sparse LUTs, long rows
    c.sq = 512;
    c.sk = 2048;
    c.pv_thr = 6.0f;
    c.q_mul = 3.0f;
    c.density = 0.9;
    cfgs.push_back(c);
    c.blkk = 128;
    c.density = 0.2;
    cfgs.push_back(c);
    c.pv_thr = 0.0f;
    c.density = 1.0;
    c.q_mul = 1.0f;
    cfgs.push_back(c);
  }
  {
    // Persistent CTAs walking many tiles (bit 32: a grid of 3 CTAs; bit 16: one CTA per SM slot), GQA, rows of
    // ~1600 keys: the Q reload, the K/V ring across tiles and the per-tile K scales; with and without the fp8
    // kernels' default bits 2048 | 1024 (two Q buffers alternating over the tiles, the next tile's prefetches).
    Fp8Cfg c;
    c.hq = 4;
    c.hk = 2;
    c.sq = 1024;
    c.sk = 4096;
    c.density = 0.4;
    c.q_mul = 1.5f;
    for (int blkk : {64, 128})
      for (int variant : {32, 16, 32 | 3072, 16 | 3072}) {
        c.blkk = blkk;
        c.variant = variant;
        cfgs.push_back(c);
      }
  }
  for (const Fp8Cfg& c : cfgs) cases.push_back({c.name(), [c] { run_fp8_case(c); }});

  // What the fp8 kernel does not take is `unsupported` with a message naming it, never a fp16 run.
  cases.push_back({"FP8_UNSUPPORTED(head_dim=64,blkq=64)", [] {
    if (!have_gpu()) GTEST_SKIP() << "no GPU";
    DeviceGuarded<std::uint16_t> buf(2 * 256 * 2 * 128);
    DeviceGuarded<std::int32_t> lut(2 * 4 * 4), cnt(2 * 4);
    BlockSparseAttentionParams p;
    p.q = make_tensor(buf.data(), DType::f16, {1, 256, 2, 64});
    p.k = p.q;
    p.v = p.q;
    p.o = p.q;
    p.lut = make_tensor(lut.data(), DType::i32, {1, 2, 2, 4});
    p.counts = make_tensor(cnt.data(), DType::i32, {1, 2, 2});
    p.blkq = 128;
    p.recipe = Recipe::fp8;
    p.exec.backend = Backend::cuda;
    Status st = supported(p);
    EXPECT_EQ(st.code(), StatusCode::unsupported);
    EXPECT_NE(st.message().find("head dim"), std::string::npos) << st.message();
    p.q = make_tensor(buf.data(), DType::f16, {1, 128, 2, 128});
    p.k = p.q;
    p.v = p.q;
    p.o = p.q;
    p.blkq = 64;
    p.lut = make_tensor(lut.data(), DType::i32, {1, 2, 2, 2});
    st = supported(p);
    EXPECT_EQ(st.code(), StatusCode::unsupported);
    EXPECT_NE(st.message().find("blkq"), std::string::npos) << st.message();
  }});
}

}  // namespace
}  // namespace sparge::test
