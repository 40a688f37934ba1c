// The fp8 recipe's Q / K quantization folded into the block map (docs/quantized.md, "The prepass
// folded into the block map"), on the CPU backend (the specification):
//   FoldMap   - build_block_map with maybe_fp8_qk writes exactly quantize_qk_host's bytes for the
//               block map's own K mean: q8 / q_scale equal the prepass's (quantize_host), k_mean
//               is within rounding of k_mean_host, k8 / k_scale equal quantize_host's with that
//               mean; zeros as k_mean without smooth_k; the LUT does not change; tails, GQA, HND,
//               blkk 64 / 128, bf16 / f16 / f32;
//   FoldAttn  - block_sparse_attention (recipe fp8) given the prepass's own Q / K buffers through
//               maybe_fp8_qk gives bitwise the O and LSE of the call that quantizes them itself;
//               the block map's buffers give O close to it; without LSE the O bits are the same;
//   FoldCheck - validation: every field's dtype, shape, contiguity, blkk / smooth_k consistency,
//               recipe none with maybe_fp8_qk, varlen; messages name the parameter and value.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/fold_inputs.h"
#include "cpu/quant.h"
#include "harness/harness.h"
#include "quant/quant_rule.h"

namespace sparge::test {
namespace {

struct FCfg {
  DType dt = DType::f16;
  int b = 1, hq = 2, hk = 2, sq = 200, sk = 333, d = 64, blkq = 64, blkk = 64;
  bool hnd = false, smooth = true, causal = false;
  float k_bias = 3.0f;
  std::string name(const char* op) const {
    Name n(op);
    n("dt", to_string(dt))("b", b)("hq", hq)("hk", hk)("sq", sq)("sk", sk)("d", d)("blkq", blkq)("blkk", blkk);
    n("layout", hnd ? "HND" : "NHD")("smooth", smooth)("causal", causal);
    return n.str();
  }
};

// Inputs in the case's dtype and layout (host storage), and their logical f32 NHD copies.
struct Inputs {
  std::vector<float> q, k, v;                 // logical [B, S, H, D], rounded through dt
  std::vector<std::uint16_t> q16, k16, v16;   // storage (dt f16 / bf16)
  std::vector<float> q32, k32, v32;           // storage (dt f32)
  Tensor tq, tk, tv;                          // views of the storage
};

void make_inputs(const FCfg& c, std::mt19937_64& rng, Inputs& in) {
  FoldQkv x = random_fold_qkv(c.b, c.hq, c.hk, c.sq, c.sk, c.d, c.k_bias, c.dt, rng);
  in.q = std::move(x.q), in.k = std::move(x.k), in.v = std::move(x.v);
  const auto store = [&](const std::vector<float>& x, std::int64_t S, std::int64_t H) {
    return fold_store(x, c.b, S, H, c.d, c.hnd);
  };
  const auto view = [&](void* data, std::int64_t S, std::int64_t H) { return fold_view(data, c.dt, c.b, S, H, c.d, c.hnd); };
  std::vector<float> qs = store(in.q, c.sq, c.hq), ks = store(in.k, c.sk, c.hk), vs = store(in.v, c.sk, c.hk);
  if (c.dt == DType::f32) {
    in.q32 = qs, in.k32 = ks, in.v32 = vs;
    in.tq = view(in.q32.data(), c.sq, c.hq), in.tk = view(in.k32.data(), c.sk, c.hk), in.tv = view(in.v32.data(), c.sk, c.hk);
  } else {
    in.q16 = to_storage16(qs, c.dt), in.k16 = to_storage16(ks, c.dt), in.v16 = to_storage16(vs, c.dt);
    in.tq = view(in.q16.data(), c.sq, c.hq), in.tk = view(in.k16.data(), c.sk, c.hk), in.tv = view(in.v16.data(), c.sk, c.hk);
  }
}

// Host buffers of a QuantizedQK.
struct QkBuffers {
  std::vector<std::uint8_t> q8, k8;
  std::vector<float> q_scale, k_scale, k_mean;
  QuantizedQK qk;
  QkBuffers(std::int64_t b, std::int64_t hq, std::int64_t hk, std::int64_t sq, std::int64_t sk, std::int64_t d,
            int blkk, bool smooth) {
    const std::int64_t nk = num_blocks(sk, blkk);
    q8.assign(static_cast<size_t>(b * hq * sq * d), 0xcd);
    k8.assign(static_cast<size_t>(b * hk * sk * d), 0xcd);
    q_scale.assign(static_cast<size_t>(b * hq * sq), -1.0f);
    k_scale.assign(static_cast<size_t>(b * hk * nk), -1.0f);
    k_mean.assign(static_cast<size_t>(b * hk * d), -1.0f);
    qk = fold_qk(q8.data(), q_scale.data(), k8.data(), k_scale.data(), k_mean.data(), b, hq, hk, sq, sk, d, blkk, smooth);
  }
};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

const float kTopk = 0.5f;

struct MapOut {
  std::vector<std::int32_t> lut, counts;
};

Status run_map(const FCfg& c, const Inputs& in, MapOut& m, const QuantizedQK* fp8, int threads = 0) {
  const std::int64_t nq = num_blocks(c.sq, c.blkq), nk = num_blocks(c.sk, c.blkk);
  m.lut.assign(static_cast<size_t>(c.b * c.hq * nq * nk), -7);
  m.counts.assign(static_cast<size_t>(c.b * c.hq * nq), -7);
  BlockMapParams p = fold_map_params(in.tq, in.tk, c.blkq, c.blkk, &kTopk, c.causal, c.smooth,
                                     make_tensor(m.lut.data(), DType::i32, {c.b, c.hq, nq, nk}),
                                     make_tensor(m.counts.data(), DType::i32, {c.b, c.hq, nq}), fp8);
  p.exec.cpu_threads = threads;
  return build_block_map(p);
}

void run_fold_map(const FCfg& c, const std::string& name) {
  std::mt19937_64 rng = rng_for(name);
  Inputs in;
  make_inputs(c, rng, in);
  MapOut plain, folded;
  ASSERT_TRUE(run_map(c, in, plain, nullptr).ok());
  QkBuffers buf(c.b, c.hq, c.hk, c.sq, c.sk, c.d, c.blkk, c.smooth);
  const Status st = run_map(c, in, folded, &buf.qk, 3);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(plain.lut == folded.lut && plain.counts == folded.counts) << "the fold changed the block map";

  const Tensor lq = make_tensor(const_cast<float*>(in.q.data()), DType::f32, {c.b, c.sq, c.hq, c.d});
  const Tensor lk = make_tensor(const_cast<float*>(in.k.data()), DType::f32, {c.b, c.sk, c.hk, c.d});
  const Tensor lv = make_tensor(const_cast<float*>(in.v.data()), DType::f32, {c.b, c.sk, c.hk, c.d});
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  // k_mean: the block map's own mean, within rounding of the prepass's (fp64, ascending keys).
  const std::vector<float> km_host = c.smooth ? cpu::k_mean_host(lk, 0) : std::vector<float>(buf.k_mean.size(), 0.0f);
  for (size_t i = 0; i < km_host.size(); ++i) {
    const float a = buf.k_mean[i], r = km_host[i];
    if (!c.smooth) {
      ASSERT_TRUE(a == 0.0f && !std::signbit(a)) << "k_mean[" << i << "] = " << a << " without smooth_k";
    } else {
      ASSERT_LE(std::fabs(a - r), 1e-6f * (1.0f + std::fabs(r))) << "k_mean[" << i << "] " << a << " vs " << r;
    }
  }
  // Q: the prepass's bytes (they do not depend on the mean). K: the prepass's bytes for this mean.
  const cpu::QuantHost ref = cpu::quantize_host(lq, lk, lv, c.blkk, c.smooth, scale, buf.k_mean, 0);
  EXPECT_TRUE(same_bits(buf.q8, ref.q8)) << "q8";
  EXPECT_TRUE(same_bits(buf.q_scale, ref.q_scale)) << "q_scale";
  EXPECT_TRUE(same_bits(buf.k8, ref.k8)) << "k8";
  EXPECT_TRUE(same_bits(buf.k_scale, ref.k_scale)) << "k_scale";
  // And a value check independent of quantize_host: each group round-trips within half an e4m3
  // step of its largest element, and its scale puts the maximum in (224, 448].
  const std::int64_t nk = num_blocks(c.sk, c.blkk);
  for (std::int64_t bh = 0; bh < std::int64_t{c.b} * c.hk; ++bh) {
    const std::int64_t b = bh / c.hk, h = bh % c.hk;
    for (std::int64_t kb = 0; kb < nk; ++kb) {
      const float s = buf.k_scale[static_cast<size_t>(bh * nk + kb)];
      double amax = 0;
      for (std::int64_t j = kb * c.blkk; j < std::min<std::int64_t>(c.sk, (kb + 1) * c.blkk); ++j)
        for (int e = 0; e < c.d; ++e) {
          const double x = in.k[((b * c.sk + j) * c.hk + h) * c.d + e] - buf.k_mean[bh * c.d + e];
          amax = std::max(amax, std::fabs(x));
          const double back = quant::dequantize(buf.k8[(bh * c.sk + j) * c.d + e], s);
          ASSERT_LE(std::fabs(back - x), std::fabs(x) / 16 + s * 0.002) << "k block " << kb << " key " << j;
        }
      if (amax > 0) {
        ASSERT_GT(amax / s, 224.0 * (1 - 1e-6));
        ASSERT_LE(amax / s, 448.0 * (1 + 1e-6));
      }
    }
  }
}

// O / LSE of block_sparse_attention recipe fp8 on the CPU, optionally with given Q / K.
struct AttnOut {
  std::vector<float> o, lse;
};
Status run_attn(const FCfg& c, const Inputs& in, const MapOut& m, const QuantizedQK* fp8, bool with_lse, AttnOut& out,
                float scale = 0.0f) {
  const std::int64_t nq = num_blocks(c.sq, c.blkq), nk = num_blocks(c.sk, c.blkk);
  out.o.assign(static_cast<size_t>(c.b) * c.sq * c.hq * c.d, NAN);
  out.lse.assign(static_cast<size_t>(c.b) * c.hq * c.sq, NAN);
  BlockSparseAttentionParams p;
  p.q = in.tq;
  p.k = in.tk;
  p.v = in.tv;
  p.o = make_tensor(out.o.data(), DType::f32, {c.b, c.sq, c.hq, c.d});
  if (with_lse) p.maybe_lse = make_tensor(out.lse.data(), DType::f32, {c.b, c.hq, c.sq});
  p.lut = make_tensor(const_cast<std::int32_t*>(m.lut.data()), DType::i32, {c.b, c.hq, nq, nk});
  p.counts = make_tensor(const_cast<std::int32_t*>(m.counts.data()), DType::i32, {c.b, c.hq, nq});
  p.blkq = c.blkq;
  p.blkk = c.blkk;
  p.is_causal = c.causal;
  p.scale = scale;
  p.recipe = Recipe::fp8;
  p.smooth_k = c.smooth;
  if (fp8 != nullptr) p.maybe_fp8_qk = *fp8;
  return block_sparse_attention(p);
}

void run_fold_attn(const FCfg& c, const std::string& name) {
  std::mt19937_64 rng = rng_for(name);
  Inputs in;
  make_inputs(c, rng, in);
  MapOut m;
  QkBuffers mine(c.b, c.hq, c.hk, c.sq, c.sk, c.d, c.blkk, c.smooth);
  ASSERT_TRUE(run_map(c, in, m, &mine.qk).ok());
  AttnOut self, given, pipe, pipe_nolse;
  ASSERT_TRUE(run_attn(c, in, m, nullptr, true, self).ok());

  // The prepass's own buffers through maybe_fp8_qk: the same O and LSE bits.
  const Tensor lq = make_tensor(const_cast<float*>(in.q.data()), DType::f32, {c.b, c.sq, c.hq, c.d});
  const Tensor lk = make_tensor(const_cast<float*>(in.k.data()), DType::f32, {c.b, c.sk, c.hk, c.d});
  const Tensor lv = make_tensor(const_cast<float*>(in.v.data()), DType::f32, {c.b, c.sk, c.hk, c.d});
  const std::vector<float> km = c.smooth ? cpu::k_mean_host(lk, 0) : std::vector<float>(mine.k_mean.size(), 0.0f);
  const cpu::QuantHost ref = cpu::quantize_host(lq, lk, lv, c.blkk, c.smooth, 1.0 / std::sqrt(double(c.d)), km, 0);
  QkBuffers theirs(c.b, c.hq, c.hk, c.sq, c.sk, c.d, c.blkk, c.smooth);
  theirs.q8 = ref.q8, theirs.q_scale = ref.q_scale, theirs.k8 = ref.k8, theirs.k_scale = ref.k_scale, theirs.k_mean = ref.k_mean;
  theirs.qk.q8.data = theirs.q8.data(), theirs.qk.q_scale.data = theirs.q_scale.data();
  theirs.qk.k8.data = theirs.k8.data(), theirs.qk.k_scale.data = theirs.k_scale.data();
  theirs.qk.k_mean.data = theirs.k_mean.data();
  const Status st = run_attn(c, in, m, &theirs.qk, true, given);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(same_bits(self.o, given.o)) << "O differs with the prepass's own buffers given";
  EXPECT_TRUE(same_bits(self.lse, given.lse)) << "LSE differs with the prepass's own buffers given";

  // The given bytes are what the call uses: q_scale doubled (exact) gives the logits of the
  // self-quantizing call at twice the scale (both products exact in the fp64 walk).
  const float s0 = static_cast<float>(1.0 / std::sqrt(double(c.d)));
  AttnOut plain0, doubled, self2;
  ASSERT_TRUE(run_attn(c, in, m, &theirs.qk, false, plain0, s0).ok());
  for (float& x : theirs.q_scale) x *= 2.0f;
  ASSERT_TRUE(run_attn(c, in, m, &theirs.qk, false, doubled, s0).ok());
  ASSERT_TRUE(run_attn(c, in, m, nullptr, false, self2, 2.0f * s0).ok());
  EXPECT_TRUE(same_bits(doubled.o, self2.o)) << "the given q_scale is not the one used";
  EXPECT_FALSE(same_bits(doubled.o, plain0.o)) << "doubling the given q_scale changed nothing";

  // The block map's buffers: close to the self-quantized call (the means differ in the last bits).
  ASSERT_TRUE(run_attn(c, in, m, &mine.qk, true, pipe).ok());
  ASSERT_TRUE(run_attn(c, in, m, &mine.qk, false, pipe_nolse).ok());
  EXPECT_TRUE(same_bits(pipe.o, pipe_nolse.o)) << "O depends on whether LSE is returned";
  double omax = 0, dmax = 0, lmax = 0;
  for (size_t i = 0; i < self.o.size(); ++i) {
    omax = std::max(omax, std::fabs(double(self.o[i])));
    dmax = std::max(dmax, std::fabs(double(self.o[i]) - pipe.o[i]));
  }
  for (size_t i = 0; i < self.lse.size(); ++i) {
    if (std::isinf(self.lse[i])) {
      EXPECT_EQ(self.lse[i], pipe.lse[i]);
      continue;
    }
    lmax = std::max(lmax, std::fabs(double(self.lse[i]) - pipe.lse[i]));
  }
  EXPECT_LE(dmax, 0.05 * omax + 1e-3) << "max |O_fold - O| = " << dmax << ", max |O| = " << omax;
  EXPECT_LE(lmax, 1e-2) << "max |LSE_fold - LSE|";
}

SPARGE_CASES(FoldMap) {
  std::vector<FCfg> cfgs;
  FCfg c;
  cfgs.push_back(c);
  c.hq = 4, c.hk = 2, c.hnd = true, c.blkk = 128, c.causal = true;
  cfgs.push_back(c);
  c.dt = DType::bf16, c.smooth = false, c.blkq = 128, c.blkk = 64, c.sq = 64, c.sk = 64;
  cfgs.push_back(c);
  c = FCfg();
  c.dt = DType::f32, c.d = 72, c.b = 2, c.sk = 129;
  cfgs.push_back(c);
  c = FCfg();
  c.d = 128, c.blkq = 128, c.blkk = 128, c.sq = 256, c.sk = 300, c.hq = 8, c.hk = 1;
  cfgs.push_back(c);
  for (const FCfg& f : cfgs) {
    const std::string name = f.name("FOLD_MAP");
    cases.push_back({name, [f, name] { run_fold_map(f, name); }});
  }
}

SPARGE_CASES(FoldAttn) {
  std::vector<FCfg> cfgs;
  FCfg c;
  c.d = 128, c.blkq = 128;
  cfgs.push_back(c);
  c.hq = 4, c.hk = 2, c.hnd = true, c.blkk = 128, c.causal = true, c.dt = DType::bf16;
  cfgs.push_back(c);
  c.smooth = false;
  cfgs.push_back(c);
  for (const FCfg& f : cfgs) {
    const std::string name = f.name("FOLD_ATTN");
    cases.push_back({name, [f, name] { run_fold_attn(f, name); }});
  }
}

// Validation: each bad field gives invalid_argument (or unsupported) naming it, on either entry.
SPARGE_CASES(FoldCheck) {
  cases.push_back({"FOLD_CHECK(fields)", [] {
    FCfg c;
    std::mt19937_64 rng = rng_for("FOLD_CHECK");
    Inputs in;
    make_inputs(c, rng, in);
    MapOut m;
    ASSERT_TRUE(run_map(c, in, m, nullptr).ok());
    struct Bad {
      const char* what;  // expected in the message
      void (*edit)(QuantizedQK&);
      StatusCode code = StatusCode::invalid_argument;
    };
    const Bad bads[] = {
        {"maybe_fp8_qk.q8.dtype", [](QuantizedQK& q) { q.q8.dtype = DType::f16; }},
        {"maybe_fp8_qk.q8.shape[2]", [](QuantizedQK& q) { q.q8.shape[2] -= 1; }},
        {"maybe_fp8_qk.q_scale", [](QuantizedQK& q) { q.q_scale.data = nullptr; }},
        {"maybe_fp8_qk.k8.shape[1]", [](QuantizedQK& q) { q.k8.shape[1] = 3; }},
        {"maybe_fp8_qk.k_scale.shape[2]", [](QuantizedQK& q) { q.k_scale.shape[2] += 1; }},
        {"maybe_fp8_qk.k_mean.dtype", [](QuantizedQK& q) { q.k_mean.dtype = DType::i32; }},
        {"maybe_fp8_qk.k8.stride[2]", [](QuantizedQK& q) { q.k8.stride[2] *= 2; q.k8.stride[1] *= 2; q.k8.stride[0] *= 2; }},
        {"maybe_fp8_qk.q_scale.stride[2]", [](QuantizedQK& q) { q.q_scale.stride[2] = 2; }},
        {"maybe_fp8_qk.blkk = 128", [](QuantizedQK& q) { q.blkk = 128; }},
        {"maybe_fp8_qk.smooth_k = 0", [](QuantizedQK& q) { q.smooth_k = false; }},
    };
    for (const Bad& bad : bads) {
      QkBuffers buf(c.b, c.hq, c.hk, c.sq, c.sk, c.d, c.blkk, c.smooth);
      bad.edit(buf.qk);
      MapOut m2;
      const Status sm = run_map(c, in, m2, &buf.qk);
      EXPECT_EQ(sm.code(), bad.code) << bad.what << ": " << sm.message();
      EXPECT_NE(sm.message().find(bad.what), std::string::npos) << sm.message();
      EXPECT_NE(sm.message().find("build_block_map"), std::string::npos) << sm.message();
      AttnOut a;
      const Status sa = run_attn(c, in, m, &buf.qk, false, a);
      EXPECT_EQ(sa.code(), bad.code) << bad.what << ": " << sa.message();
      EXPECT_NE(sa.message().find(bad.what), std::string::npos) << sa.message();
      EXPECT_NE(sa.message().find("block_sparse_attention"), std::string::npos) << sa.message();
    }
    // recipe none with maybe_fp8_qk.
    QkBuffers buf(c.b, c.hq, c.hk, c.sq, c.sk, c.d, c.blkk, c.smooth);
    const std::int64_t nq = num_blocks(c.sq, c.blkq), nk = num_blocks(c.sk, c.blkk);
    std::vector<float> o(static_cast<size_t>(c.b) * c.sq * c.hq * c.d);
    BlockSparseAttentionParams p;
    p.q = in.tq, p.k = in.tk, p.v = in.tv;
    p.o = make_tensor(o.data(), DType::f32, {c.b, c.sq, c.hq, c.d});
    p.lut = make_tensor(m.lut.data(), DType::i32, {c.b, c.hq, nq, nk});
    p.counts = make_tensor(m.counts.data(), DType::i32, {c.b, c.hq, nq});
    p.maybe_fp8_qk = buf.qk;
    const Status sn = block_sparse_attention(p);
    EXPECT_EQ(sn.code(), StatusCode::invalid_argument) << sn.message();
    EXPECT_NE(sn.message().find("maybe_fp8_qk is given with recipe = none"), std::string::npos) << sn.message();
  }});
  cases.push_back({"FOLD_CHECK(varlen)", [] {
    // Varlen: q / k of one "batch" row, two sequences.
    const std::int64_t total = 128, h = 2, d = 64;
    std::vector<float> q(static_cast<size_t>(total * h * d), 0.5f), k(q.size(), 0.25f);
    const std::int32_t cu[] = {0, 64, 128};
    QkBuffers buf(1, h, h, total, total, d, 64, true);
    std::vector<std::int32_t> lut(2 * h * 1 * 1), counts(2 * h * 1);
    BlockMapParams p;
    p.q = make_tensor(q.data(), DType::f32, {1, total, h, d});
    p.k = make_tensor(k.data(), DType::f32, {1, total, h, d});
    p.varlen.cu_seqlens_q = cu, p.varlen.cu_seqlens_k = cu, p.varlen.num_seqs = 2;
    p.varlen.max_seqlen_q = 64, p.varlen.max_seqlen_k = 64;
    p.topk = PerHead(&kTopk, 1);
    p.lut = make_tensor(lut.data(), DType::i32, {2, h, 1, 1});
    p.counts = make_tensor(counts.data(), DType::i32, {2, h, 1});
    p.maybe_fp8_qk = buf.qk;
    const Status st = build_block_map(p);
    EXPECT_EQ(st.code(), StatusCode::unsupported) << st.message();
    EXPECT_NE(st.message().find("maybe_fp8_qk with varlen"), std::string::npos) << st.message();
  }});
}

}  // namespace
}  // namespace sparge::test
