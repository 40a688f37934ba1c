// The fp8 recipe's Q / K quantization folded into the CUDA block map (docs/quantized.md, "The
// prepass folded into the block map"):
//   FOLD_GPU(...)   build_block_map with maybe_fp8_qk on the GPU: the LUT and counts are those of the
//                   call without it (bitwise); q8 / q_scale are the CPU specification's bytes;
//                   k_mean is within rounding of the fp64 mean; k8 / k_scale are the specification's
//                   bytes for the GPU's mean (cpu::quantize_qk_host); guards intact. Tails, GQA,
//                   HND / NHD, blkk 64 / 128, d 64 / 128 / 72, bf16, smooth_k off, the base3
//                   pooling and strided (misaligned) inputs. With d 64 / 128 also the V-only prepass
//                   (quant::quantize_v) and the LSE shift kernel (quant::lse_shift) against
//                   quantize_qkv's bytes; on sm_90 (head dim 128), block_sparse_attention with
//                   quantize_qkv's own Q / K buffers given through maybe_fp8_qk gives the O and LSE
//                   bits of the call that quantizes them itself, and the block map's buffers give O
//                   close to it (O bits independent of whether LSE is returned).
//   FOLD_GPU_ERRORS misaligned q8 / k8 on the CUDA backend: invalid_argument naming them.
//   FOLD_BENCH      (SPARGE_BENCH=1) b2 h32 s16384 d128, 128x64 and 128x128, topk 1.0 / 0.4 / 0.1:
//                   the block map with and without the fp8 outputs, the V prepass, the LSE shift,
//                   the attention given Q / K and quantizing them, and both pipelines end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/fold_inputs.h"
#include "cpu/quant.h"
#include "cuda/quant/quant.h"
#include "gpu/gpu_harness.h"
#include "quant/quant_rule.h"
#include "sparge/half.h"
#include "sparge/ops.h"

namespace sparge::test {
namespace {

namespace cq = ::sparge::cuda::quant;

struct GCfg {
  DType dt = DType::f16;
  int b = 1, hq = 2, hk = 2, sq = 256, sk = 256, d = 128, blkq = 128, blkk = 64;
  bool hnd = true, smooth = true, causal = false, misaligned = false;
  const char* pool = nullptr;  // SPARGE_BLOCKMAP_POOL for the GPU calls (nullptr: the default)
  float k_bias = 3.0f;
  std::string name() const {
    Name n("FOLD_GPU");
    n("dt", to_string(dt))("b", b)("hq", hq)("hk", hk)("sq", sq)("sk", sk)("d", d)("blkq", blkq)("blkk", blkk);
    n("layout", hnd ? "HND" : "NHD")("smooth", smooth)("causal", causal);
    if (misaligned) n("misaligned", 1);
    if (pool != nullptr) n("pool", pool);
    return n.str();
  }
};

// Device inputs in the case's layout (16-bit), and their logical f32 NHD values.
struct GInputs {
  std::vector<float> q, k, v;  // logical [B, S, H, D], rounded through dt
  std::unique_ptr<DeviceGuarded<std::uint16_t>> dq, dk, dv;
  Tensor tq, tk, tv;
};

void make_inputs(const GCfg& c, std::mt19937_64& rng, GInputs& in) {
  FoldQkv x = random_fold_qkv(c.b, c.hq, c.hk, c.sq, c.sk, c.d, c.k_bias, c.dt, rng);
  in.q = std::move(x.q), in.k = std::move(x.k), in.v = std::move(x.v);
  const std::int64_t off = c.misaligned ? 1 : 0;  // one element: rows off 16-byte boundaries
  const auto put = [&](const std::vector<float>& x, std::int64_t S, std::int64_t H,
                       std::unique_ptr<DeviceGuarded<std::uint16_t>>& dev, Tensor& t) {
    const std::vector<float> st = fold_store(x, c.b, S, H, c.d, c.hnd, off);
    dev = std::make_unique<DeviceGuarded<std::uint16_t>>(st.size());
    dev->upload(to_storage16(st, c.dt));
    t = fold_view(dev->data() + off, c.dt, c.b, S, H, c.d, c.hnd);
  };
  put(in.q, c.sq, c.hq, in.dq, in.tq);
  put(in.k, c.sk, c.hk, in.dk, in.tk);
  put(in.v, c.sk, c.hk, in.dv, in.tv);
}

// The fp8 outputs of the block map in guarded, poisoned device buffers.
struct DevQk {
  DeviceGuarded<std::uint8_t> q8, k8;
  DeviceGuarded<float> q_scale, k_scale, k_mean;
  QuantizedQK qk;
  DevQk(const GCfg& c)
      : q8(static_cast<size_t>(c.b) * c.hq * c.sq * c.d), k8(static_cast<size_t>(c.b) * c.hk * c.sk * c.d),
        q_scale(static_cast<size_t>(c.b) * c.hq * c.sq), k_scale(static_cast<size_t>(c.b) * c.hk * num_blocks(c.sk, c.blkk)),
        k_mean(static_cast<size_t>(c.b) * c.hk * c.d) {
    q8.poison(), k8.poison(), q_scale.poison(), k_scale.poison(), k_mean.poison();
    qk = fold_qk(q8.data(), q_scale.data(), k8.data(), k_scale.data(), k_mean.data(), c.b, c.hq, c.hk, c.sq, c.sk,
                 c.d, c.blkk, c.smooth);
  }
  bool guards_intact() const {
    return q8.guards_intact() && k8.guards_intact() && q_scale.guards_intact() && k_scale.guards_intact() &&
           k_mean.guards_intact();
  }
};

const float kTopk = 0.5f;

struct DevMap {
  std::unique_ptr<DeviceGuarded<std::int32_t>> lut, counts;
  Tensor tlut, tcounts;
};

Status run_map(const GCfg& c, const GInputs& in, DevMap& m, const QuantizedQK* fp8, float topk = kTopk) {
  const std::int64_t nq = num_blocks(c.sq, c.blkq), nk = num_blocks(c.sk, c.blkk);
  if (!m.lut) {
    m.lut = std::make_unique<DeviceGuarded<std::int32_t>>(static_cast<size_t>(c.b * c.hq * nq * nk));
    m.counts = std::make_unique<DeviceGuarded<std::int32_t>>(static_cast<size_t>(c.b * c.hq * nq));
    m.lut->poison();
    m.counts->poison();
    m.tlut = make_tensor(m.lut->data(), DType::i32, {c.b, c.hq, nq, nk});
    m.tcounts = make_tensor(m.counts->data(), DType::i32, {c.b, c.hq, nq});
  }
  BlockMapParams p = fold_map_params(in.tq, in.tk, c.blkq, c.blkk, &topk, c.causal, c.smooth, m.tlut, m.tcounts, fp8);
  p.exec.backend = Backend::cuda;
  return build_block_map(p);
}

BlockSparseAttentionParams attn_params(const GCfg& c, const GInputs& in, const DevMap& m, DeviceGuarded<float>& o,
                                       DeviceGuarded<float>* lse) {
  BlockSparseAttentionParams p;
  p.q = in.tq;
  p.k = in.tk;
  p.v = in.tv;
  p.o = make_tensor(o.data(), DType::f32, {c.b, c.sq, c.hq, c.d});
  if (lse != nullptr) p.maybe_lse = make_tensor(lse->data(), DType::f32, {c.b, c.hq, c.sq});
  p.lut = m.tlut;
  p.counts = m.tcounts;
  p.blkq = c.blkq;
  p.blkk = c.blkk;
  p.is_causal = c.causal;
  p.recipe = Recipe::fp8;
  p.smooth_k = c.smooth;
  p.exec.backend = Backend::cuda;
  return p;
}

template <class T>
std::string first_diff(const char* what, const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return std::string(what) + ": sizes differ";
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      std::size_t n = 0;
      for (std::size_t j = i; j < got.size(); ++j) n += std::memcmp(&got[j], &want[j], sizeof(T)) != 0;
      return std::string(what) + ": " + std::to_string(n) + " of " + std::to_string(got.size()) +
             " elements differ, first at " + std::to_string(i) + " (got " + std::to_string(double(got[i])) +
             ", want " + std::to_string(double(want[i])) + ")";
    }
  }
  return "";
}

void run_gpu_case(const GCfg& c) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  ScopedEnv pool("SPARGE_BLOCKMAP_POOL", c.pool);
  std::mt19937_64 rng = rng_for(c.name());
  GInputs in;
  make_inputs(c, rng, in);

  // 1. The block map with and without the fp8 outputs: the same LUT.
  DevMap plain, folded;
  Status st = run_map(c, in, plain, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  DevQk qk(c);
  st = run_map(c, in, folded, &qk.qk);
  ASSERT_TRUE(st.ok()) << st.message();
  SPARGE_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(first_diff("lut", folded.lut->download(), plain.lut->download()), "");
  EXPECT_EQ(first_diff("counts", folded.counts->download(), plain.counts->download()), "");
  EXPECT_TRUE(qk.guards_intact()) << "a guard region of the fp8 outputs was written";

  // 2. The bytes against the CPU specification with the GPU's mean.
  const Tensor lq = make_tensor(in.q.data(), DType::f32, {c.b, c.sq, c.hq, c.d});
  const Tensor lk = make_tensor(in.k.data(), DType::f32, {c.b, c.sk, c.hk, c.d});
  const std::vector<float> km = qk.k_mean.download();
  const std::vector<float> km_ref = c.smooth ? cpu::k_mean_host(lk, 0) : std::vector<float>(km.size(), 0.0f);
  for (size_t i = 0; i < km.size(); ++i) {
    if (!c.smooth) {
      ASSERT_TRUE(km[i] == 0.0f && !std::signbit(km[i])) << "k_mean[" << i << "] = " << km[i] << " without smooth_k";
    } else {
      ASSERT_LE(std::fabs(km[i] - km_ref[i]), 2e-6f * (1.0f + std::fabs(km_ref[i])))
          << "k_mean[" << i << "] gpu " << km[i] << " fp64 " << km_ref[i];
    }
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  const cpu::QuantHost ref = cpu::quantize_qk_host(lq, lk, c.blkk, c.smooth, scale, km, 0, false);
  EXPECT_EQ(first_diff("q8", qk.q8.download(), ref.q8), "");
  EXPECT_EQ(first_diff("q_scale", qk.q_scale.download(), ref.q_scale), "");
  EXPECT_EQ(first_diff("k8", qk.k8.download(), ref.k8), "");
  EXPECT_EQ(first_diff("k_scale", qk.k_scale.download(), ref.k_scale), "");

  // 3. The V-only prepass and the LSE shift kernel against quantize_qkv (head dims 64 / 128).
  if (c.d != 64 && c.d != 128) return;
  DeviceGuarded<float> o(static_cast<size_t>(c.b) * c.sq * c.hq * c.d), lse(static_cast<size_t>(c.b) * c.hq * c.sq);
  BlockSparseAttentionParams p = attn_params(c, in, folded, o, &lse);
  const cq::QuantShape sh = cq::quant_shape(p);
  DeviceGuarded<std::uint8_t> q8(sh.q8_bytes()), k8(sh.k8_bytes()), v8t(sh.v8t_bytes()), v8t_only(sh.v8t_bytes());
  DeviceGuarded<float> q_scale(sh.b * sh.hq * sh.sq), k_scale(sh.b * sh.hk * sh.nkb()), v_scale(sh.b * sh.hk * sh.d),
      v_scale_only(sh.b * sh.hk * sh.d), k_mean(sh.b * sh.hk * sh.d), shift(sh.b * sh.hq * sh.sq),
      shift_only(sh.b * sh.hq * sh.sq);
  v8t_only.poison(), v_scale_only.poison(), shift_only.poison();
  const cq::QuantBuffers all{q8.data(), k8.data(), v8t.data(), q_scale.data(), k_scale.data(), v_scale.data(),
                             k_mean.data(), shift.data()};
  ASSERT_EQ(cq::quantize_qkv(p, all, nullptr), cudaSuccess);
  cq::QuantBuffers vonly;
  vonly.v8t = v8t_only.data();
  vonly.v_scale = v_scale_only.data();
  for (const char* variant : {static_cast<const char*>(nullptr), "launches", "stream"}) {  // SPARGE_QUANT_VONLY
    ScopedEnv env("SPARGE_QUANT_VONLY", variant);
    v8t_only.poison(), v_scale_only.poison();
    ASSERT_EQ(cq::quantize_v(p, vonly, nullptr), cudaSuccess);
    SPARGE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::string tag = std::string(" (V-only prepass, ") + (variant != nullptr ? variant : "split") + ")";
    EXPECT_EQ(first_diff(("v8t" + tag).c_str(), v8t_only.download(), v8t.download()), "");
    EXPECT_EQ(first_diff(("v_scale" + tag).c_str(), v_scale_only.download(), v_scale.download()), "");
  }
  for (const char* occ : {static_cast<const char*>(nullptr), "2", "4"}) {  // SPARGE_QUANT_SHIFT_OCC
    if (!c.smooth) break;
    ScopedEnv env("SPARGE_QUANT_SHIFT_OCC", occ);
    shift_only.poison();
    ASSERT_EQ(cq::lse_shift(p, k_mean.data(), shift_only.data(), nullptr), cudaSuccess);
    SPARGE_CUDA_CHECK(cudaDeviceSynchronize());
    const std::string what = std::string("lse_shift (shift kernel, occ ") + (occ != nullptr ? occ : "3") + ")";
    EXPECT_EQ(first_diff(what.c_str(), shift_only.download(), shift.download()), "");
  }
  EXPECT_TRUE(v8t_only.guards_intact() && v_scale_only.guards_intact() && shift_only.guards_intact());

  // 4. The attention (sm_90, head dim 128): quantize_qkv's own Q / K given == quantizing them.
  if (!supported(p).ok()) return;  // not an sm_90 device / not the fp8 kernel's shape
  ASSERT_EQ(c.d, 128);
  const auto run = [&](const QuantizedQK* given, bool with_lse, std::vector<float>& o_out, std::vector<float>& lse_out) {
    o.poison();
    lse.poison();
    BlockSparseAttentionParams pa = attn_params(c, in, folded, o, with_lse ? &lse : nullptr);
    if (given != nullptr) pa.maybe_fp8_qk = *given;
    const Status s = block_sparse_attention(pa);
    ASSERT_TRUE(s.ok()) << s.message();
    SPARGE_CUDA_CHECK(cudaDeviceSynchronize());
    o_out = o.download();
    if (with_lse) lse_out = lse.download();
  };
  std::vector<float> o_self, lse_self, o_given, lse_given, o_pipe, lse_pipe, o_pipe2, unused;
  run(nullptr, true, o_self, lse_self);
  QuantizedQK theirs = qk.qk;
  theirs.q8.data = q8.data(), theirs.k8.data = k8.data(), theirs.q_scale.data = q_scale.data();
  theirs.k_scale.data = k_scale.data(), theirs.k_mean.data = k_mean.data();
  run(&theirs, true, o_given, lse_given);
  EXPECT_EQ(first_diff("O (prepass Q / K given vs quantized in the call)", o_given, o_self), "");
  EXPECT_EQ(first_diff("LSE (prepass Q / K given vs quantized in the call)", lse_given, lse_self), "");
  run(&qk.qk, true, o_pipe, lse_pipe);
  run(&qk.qk, false, o_pipe2, unused);
  EXPECT_EQ(first_diff("O with vs without LSE (folded)", o_pipe2, o_pipe), "");
  double omax = 0, dmax = 0, lmax = 0;
  for (size_t i = 0; i < o_self.size(); ++i) {
    omax = std::max(omax, std::fabs(double(o_self[i])));
    dmax = std::max(dmax, std::fabs(double(o_self[i]) - o_pipe[i]));
  }
  for (size_t i = 0; i < lse_self.size(); ++i) {
    if (std::isinf(lse_self[i]) || std::isinf(lse_pipe[i])) {
      EXPECT_EQ(lse_self[i], lse_pipe[i]) << "lse[" << i << "]";
      continue;
    }
    lmax = std::max(lmax, std::fabs(double(lse_self[i]) - lse_pipe[i]));
  }
  EXPECT_LE(dmax, 0.05 * omax + 1e-3) << "max |O_fold - O| = " << dmax << ", max |O| = " << omax;
  EXPECT_LE(lmax, 1e-2) << "max |LSE_fold - LSE|";
}

SPARGE_CASES(FoldGpu) {
  std::vector<GCfg> cfgs;
  GCfg c;
  cfgs.push_back(c);  // f16 HND 128 x 64, d 128
  c.blkk = 128, c.hnd = false, c.sq = 203, c.sk = 333, c.causal = true;
  cfgs.push_back(c);  // tails, NHD, blkk 128
  c = GCfg();
  c.dt = DType::bf16, c.hq = 8, c.hk = 2, c.sq = 384, c.sk = 1000;
  cfgs.push_back(c);  // bf16, GQA, a partial K block
  c.smooth = false, c.blkk = 128;
  cfgs.push_back(c);  // no smoothing: K pooled (and quantized) in pass 1
  c = GCfg();
  c.d = 64, c.blkq = 64, c.sq = 130, c.sk = 200, c.b = 2;
  cfgs.push_back(c);  // d 64, 2 batches
  c = GCfg();
  c.d = 72, c.sq = 100, c.sk = 150;
  cfgs.push_back(c);  // d 72: lanes past D / 8
  c = GCfg();
  c.misaligned = true, c.sk = 333;
  cfgs.push_back(c);  // strided loads (the non-vector kernel)
  c = GCfg();
  c.pool = "base3", c.sk = 333, c.sq = 200;
  cfgs.push_back(c);  // the register pooling path
  c.smooth = false;
  cfgs.push_back(c);
  for (const GCfg& f : cfgs) cases.push_back({f.name(), [f] { run_gpu_case(f); }});

  cases.push_back({"FOLD_GPU_ERRORS(misaligned)", [] {
    if (!have_gpu()) GTEST_SKIP() << "no GPU";
    GCfg c;
    std::mt19937_64 rng = rng_for("FOLD_GPU_ERRORS");
    GInputs in;
    make_inputs(c, rng, in);
    DevMap m;
    ASSERT_TRUE(run_map(c, in, m, nullptr).ok());
    DevQk qk(c);
    DeviceGuarded<std::uint8_t> shifted(qk.q8.size() + 16);
    for (const char* field : {"q8", "k8"}) {
      QuantizedQK bad = qk.qk;
      (field[0] == 'q' ? bad.q8 : bad.k8).data = shifted.data() + 1;
      DevMap m2;
      const Status sm = run_map(c, in, m2, &bad);
      EXPECT_EQ(sm.code(), StatusCode::invalid_argument) << sm.message();
      EXPECT_NE(sm.message().find(std::string("maybe_fp8_qk.") + field), std::string::npos) << sm.message();
      DeviceGuarded<float> o(static_cast<size_t>(c.b) * c.sq * c.hq * c.d);
      BlockSparseAttentionParams p = attn_params(c, in, m, o, nullptr);
      p.maybe_fp8_qk = bad;
      const Status sa = block_sparse_attention(p);
      if (sa.code() == StatusCode::unsupported && sa.message().find("sm_90") != std::string::npos) continue;
      EXPECT_EQ(sa.code(), StatusCode::invalid_argument) << sa.message();
      EXPECT_NE(sa.message().find(std::string("maybe_fp8_qk.") + field), std::string::npos) << sa.message();
    }
  }});

  cases.push_back({"FOLD_BENCH(b=2,h=32,s=16384,d=128)", [] {
    if (!have_gpu()) GTEST_SKIP() << "no GPU";
    const char* e = std::getenv("SPARGE_BENCH");
    if (e == nullptr || std::strcmp(e, "1") != 0) GTEST_SKIP() << "set SPARGE_BENCH=1";
    cudaEvent_t e0, e1;
    SPARGE_CUDA_CHECK(cudaEventCreate(&e0));
    SPARGE_CUDA_CHECK(cudaEventCreate(&e1));
    // One call of fn between the two events (a failed call is a test failure); its milliseconds.
    const auto time_call = [&](const std::function<Status()>& fn) {
      SPARGE_CUDA_CHECK(cudaEventRecord(e0));
      const Status st = fn();
      SPARGE_CUDA_CHECK(cudaEventRecord(e1));
      EXPECT_TRUE(st.ok()) << st.message();
      SPARGE_CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      SPARGE_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      return t;
    };
    // Two variants timed in alternation (A B, then B A, ...), so that clock and thermal drift
    // during the run falls on both alike; medians of 16 after 4 warmups each.
    const auto median_pair = [&](const std::function<Status()>& fa, const std::function<Status()>& fb) {
      std::vector<float> ma, mb;
      for (int it = 0; it < 20; ++it) {
        for (int k = 0; k < 2; ++k) {
          const bool a_turn = (k == 0) == (it % 2 == 0);
          const float t = time_call(a_turn ? fa : fb);
          if (it >= 4) (a_turn ? ma : mb).push_back(t);
        }
      }
      std::sort(ma.begin(), ma.end());
      std::sort(mb.begin(), mb.end());
      return std::pair<double, double>((ma[7] + ma[8]) / 2.0, (mb[7] + mb[8]) / 2.0);
    };
    const auto median_ms = [&](const std::function<Status()>& fn) {
      std::vector<float> ms;
      for (int it = 0; it < 13; ++it) {
        const float t = time_call(fn);
        if (it >= 3) ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      return (ms[4] + ms[5]) / 2.0;
    };
    GCfg c;
    c.b = 2, c.hq = 32, c.hk = 32, c.sq = 16384, c.sk = 16384, c.d = 128, c.hnd = true;
    // Inputs straight into HND f16 storage with a cheap generator (a sum of four uniforms, about
    // N(0, 1/3)), K with a per-channel mean: 3 x 134M values, where fill_normal would take a while.
    GInputs in;
    const std::int64_t n = std::int64_t{c.b} * c.sq * c.hq * c.d;
    std::uint64_t state = 0x9e3779b97f4a7c15ull;
    const auto next = [&state]() {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      return static_cast<float>(state >> 40) * (1.0f / 16777216.0f);
    };
    const auto gen = [&](float mean_amp, std::unique_ptr<DeviceGuarded<std::uint16_t>>& dev, Tensor& t) {
      std::vector<std::uint16_t> h(static_cast<size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) {
        const float x = next() + next() + next() + next() - 2.0f + mean_amp * static_cast<float>((i % c.d) % 7 - 3);
        h[static_cast<size_t>(i)] = float_to_half(x);
      }
      dev = std::make_unique<DeviceGuarded<std::uint16_t>>(h.size());
      dev->upload(h);
      t = make_tensor(dev->data(), DType::f16, {c.b, c.sq, c.hq, c.d},
                      {c.hq * c.sq * c.d, c.d, std::int64_t{c.sq} * c.d, 1});
    };
    gen(0.0f, in.dq, in.tq);
    gen(0.5f, in.dk, in.tk);
    gen(0.0f, in.dv, in.tv);
    const double bytes_v = 2.0 * 2 * c.b * c.sk * c.hk * c.d + 1.0 * c.b * c.sk * c.hk * c.d;  // V read twice, v8t written
    const double bytes_q = 2.0 * c.b * c.sq * c.hq * c.d + 4.0 * c.b * c.hq * c.sq;           // Q read, shift written
    for (int blkk : {64, 128}) {
      c.blkk = blkk;
      DevQk qk(c);
      DeviceGuarded<float> o(static_cast<size_t>(c.b) * c.sq * c.hq * c.d), lse(static_cast<size_t>(c.b) * c.hq * c.sq);
      for (float topk : {1.0f, 0.4f, 0.1f}) {
        DevMap m;
        const auto [map_plain, map_fp8] = median_pair([&] { return run_map(c, in, m, nullptr, topk); },
                                                      [&] { return run_map(c, in, m, &qk.qk, topk); });
        BlockSparseAttentionParams p = attn_params(c, in, m, o, nullptr);
        BlockSparseAttentionParams pf = p;
        pf.maybe_fp8_qk = qk.qk;
        const auto [attn_self, attn_given] = median_pair([&] { return block_sparse_attention(p); },
                                                         [&] { return block_sparse_attention(pf); });
        const auto [pipe_self, pipe_fold] = median_pair(
            [&] {
              const Status s = run_map(c, in, m, nullptr, topk);
              return s.ok() ? block_sparse_attention(p) : s;
            },
            [&] {
              const Status s = run_map(c, in, m, &qk.qk, topk);
              return s.ok() ? block_sparse_attention(pf) : s;
            });
        // SPARGE_FOLD_BENCH_PROFILE=1: at topk 0.4, one profiled call of the block map without, then with
        // the fp8 outputs (SPARGE_BLOCKMAP_PROFILE's stage line on stderr).
        if (std::getenv("SPARGE_FOLD_BENCH_PROFILE") != nullptr && topk == 0.4f) {
          ScopedEnv prof("SPARGE_BLOCKMAP_PROFILE", "1");
          EXPECT_TRUE(run_map(c, in, m, nullptr, topk).ok());
          EXPECT_TRUE(run_map(c, in, m, &qk.qk, topk).ok());
          SPARGE_CUDA_CHECK(cudaDeviceSynchronize());
        }
        std::printf("[ bench ] fold b2 h32 s16384 d128 128x%d topk %.1f: block map %.4f ms, with fp8 outputs %.4f ms "
                    "(+%.4f); attention quantizing Q/K/V %.3f ms, given Q/K (V prepass) %.3f ms; "
                    "pipeline unfolded %.3f ms, folded %.3f ms\n",
                    blkk, topk, map_plain, map_fp8, map_fp8 - map_plain, attn_self, attn_given, pipe_self, pipe_fold);
        if (topk == 1.0f && blkk == 64) {
          cq::QuantBuffers vb;
          DeviceGuarded<std::uint8_t> v8t(cq::quant_shape(p).v8t_bytes());
          DeviceGuarded<float> v_scale(static_cast<size_t>(c.b) * c.hk * c.d), shift(static_cast<size_t>(c.b) * c.hq * c.sq);
          vb.v8t = v8t.data();
          vb.v_scale = v_scale.data();
          // The V-only prepass per SPARGE_QUANT_VONLY and SPARGE_QUANT_GROUP (launches: kv heads per
          // pair of launches, unset = all; stream: kv heads per schedule group, unset = 2).
          struct VCfg {
            const char* variant;
            const char* group;
          };
          for (const VCfg& vc : {VCfg{nullptr, nullptr}, VCfg{"launches", nullptr}, VCfg{"stream", nullptr}}) {
            ScopedEnv env_v("SPARGE_QUANT_VONLY", vc.variant);
            ScopedEnv env("SPARGE_QUANT_GROUP", vc.group);
            const char* group = vc.group;
            const double v_ms = median_ms([&] {
              return cq::quantize_v(p, vb, nullptr) == cudaSuccess ? Status{} : runtime_error("quantize_v");
            });
            std::printf("[ bench ] fold V-only prepass %s group %s: %.4f ms (%.0f MB: V read twice + v8t, %.0f GB/s)\n",
                        vc.variant != nullptr ? vc.variant : "split", group != nullptr ? group : "default", v_ms,
                        bytes_v * 1e-6, bytes_v / v_ms * 1e-6);
          }
          for (const char* occ : {"2", "3", "4"}) {  // SPARGE_QUANT_SHIFT_OCC
            ScopedEnv env("SPARGE_QUANT_SHIFT_OCC", occ);
            const double s_ms = median_ms([&] {
              return cq::lse_shift(p, qk.k_mean.data(), shift.data(), nullptr) == cudaSuccess ? Status{}
                                                                                               : runtime_error("lse_shift");
            });
            std::printf("[ bench ] fold LSE shift occ %s: %.4f ms (%.0f MB, %.0f GB/s)\n", occ, s_ms, bytes_q * 1e-6,
                        bytes_q / s_ms * 1e-6);
          }
        }
      }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }});
}

}  // namespace
}  // namespace sparge::test
