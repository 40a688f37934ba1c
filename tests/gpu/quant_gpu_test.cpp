// The fp8 prepass on the GPU (src/cuda/quant/) against the rule applied on the host
// (src/cpu/quant.h, the CPU specification's own quantizer):
//   QUANT_GPU_E4M3   - the device's cvt.rn.satfinite.e4m3x2.f32 equals the rule's software encoder
//                      on all 2^32 floats, both bytes of the pair (sm_89 and later);
//   QUANT_GPU(...)   - 48 generated cases: f16 / bf16; NHD, HND, a strided layout (no vector
//                      loads) and an unaligned one; Sk not a multiple of 32 / 64 / 128; GQA
//                      (Hq = 4 Hk); blkk 64 / 128; head dims 128 and 64; smooth_k on / off; rows
//                      of zeros, large-magnitude rows and tiny ones. k_mean within 1e-6 relative of
//                      the fp64 mean; every other buffer bitwise equal to the host rule applied
//                      with the GPU's k_mean (k8 and lse_shift depend on it); outputs poisoned,
//                      guard regions intact; the same bytes again on a second launch and under
//                      SPARGE_QUANT_GROUP=1 and =3 (kv heads processed in groups), with
//                      SPARGE_QUANT_VARIANT=fused (one persistent launch) at groups 2, 1, 3, and with
//                      SPARGE_QUANT_VARIANT=stream (the pipelined persistent launch) at groups 2, 1,
//                      3, all (1000) and SPARGE_QUANT_STAGES 2 and 4;
//   QUANT_GPU_SCHED32 - the stream variant's 32-bit ticket decoding equals schedule.h's decode
//                      (host arithmetic, no GPU needed);
//   QUANT_GPU_BENCH  - with SPARGE_BENCH=1, the prepass at b2 Hq=Hk=32 S=16384 D=128 f16: median of
//                      10 after warmups, bytes moved and GB/s, for each variant, group and stage count.
// Without a GPU every case skips.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/quant.h"
#include "cuda/quant/quant.h"
#include "cuda/quant/schedule.h"
#include "gpu/gpu_harness.h"
#include "quant/quant_rule.h"
#include "sparge/half.h"

namespace sparge::test {
namespace {

namespace cq = ::sparge::cuda::quant;

enum class Layout { nhd, hnd, strided, unaligned };
const char* layout_name(Layout l) {
  switch (l) {
    case Layout::nhd: return "nhd";
    case Layout::hnd: return "hnd";
    case Layout::strided: return "strided";
    case Layout::unaligned: return "unaligned";
  }
  return "?";
}

// A [B, S, H, D] tensor's storage: element strides and the number of elements to allocate.
struct Storage {
  std::int64_t st[4];
  std::int64_t offset;  // first element (1 for the unaligned layout)
  std::int64_t total;
};

Storage storage(Layout l, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  Storage r{};
  switch (l) {
    case Layout::nhd:
    case Layout::unaligned:
      r.st[3] = 1; r.st[2] = d; r.st[1] = h * d; r.st[0] = s * h * d;
      break;
    case Layout::hnd:
      r.st[3] = 1; r.st[1] = d; r.st[2] = s * d; r.st[0] = h * s * d;
      break;
    case Layout::strided:  // every other element, gaps between heads, rows and batches
      r.st[3] = 2; r.st[2] = 2 * d + 6; r.st[1] = h * r.st[2] + 2; r.st[0] = s * r.st[1] + 10;
      break;
  }
  r.offset = l == Layout::unaligned ? 1 : 0;
  r.total = r.offset + b * r.st[0];
  return r;
}

struct Cfg {
  int b = 1, hq = 2, hk = 2;
  std::int64_t sq = 100, sk = 150;
  int d = 128, blkk = 64;
  bool smooth = true;
  bool special = false;  // zero, large and tiny rows
  float scale = 0.0f;
  DType dtype = DType::f16;
  Layout layout = Layout::nhd;
};

std::string case_name(const Cfg& c) {
  return Name("QUANT_GPU")("b", c.b)("hq", c.hq)("hk", c.hk)("sq", c.sq)("sk", c.sk)("d", c.d)("blkk", c.blkk)(
      "smooth", c.smooth ? 1 : 0)("special", c.special ? 1 : 0)("dtype", to_string(c.dtype))(
      "layout", layout_name(c.layout));
}

// One input tensor: its host storage (the reference reads exactly these values) and the device copy.
struct Input {
  Storage s;
  std::vector<std::uint16_t> host;
  std::unique_ptr<DeviceGuarded<std::uint16_t>> dev;
  Tensor host_view(DType t, std::int64_t b, std::int64_t n, std::int64_t h, std::int64_t d) {
    return make_tensor(host.data() + s.offset, t, {b, n, h, d}, {s.st[0], s.st[1], s.st[2], s.st[3]});
  }
  Tensor dev_view(DType t, std::int64_t b, std::int64_t n, std::int64_t h, std::int64_t d) {
    return make_tensor(dev->data() + s.offset, t, {b, n, h, d}, {s.st[0], s.st[1], s.st[2], s.st[3]});
  }
};

std::uint16_t to16(float x, DType t) { return t == DType::f16 ? float_to_half(x) : float_to_bf16(x); }

// value(b, s, h, e) -> stored element.
template <class F>
Input make_input(const Cfg& c, std::int64_t n, std::int64_t h, F&& value) {
  Input in;
  in.s = storage(c.layout, c.b, n, h, c.d);
  in.host.assign(static_cast<size_t>(in.s.total), to16(-7.0f, c.dtype));  // gaps hold a value no row has
  for (std::int64_t b = 0; b < c.b; ++b)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t hh = 0; hh < h; ++hh)
        for (std::int64_t e = 0; e < c.d; ++e) {
          const std::int64_t off = in.s.offset + b * in.s.st[0] + j * in.s.st[1] + hh * in.s.st[2] + e * in.s.st[3];
          in.host[static_cast<size_t>(off)] = to16(value(b, j, hh, e), c.dtype);
        }
  in.dev = std::make_unique<DeviceGuarded<std::uint16_t>>(in.host.size());
  in.dev->upload(in.host);
  return in;
}

// The prepass outputs in guarded, poisoned device buffers.
struct Outputs {
  DeviceGuarded<std::uint8_t> q8, k8, v8t;
  DeviceGuarded<float> q_scale, k_scale, v_scale, k_mean, lse_shift;
  explicit Outputs(const cq::QuantShape& s)
      : q8(static_cast<size_t>(s.q8_bytes())), k8(static_cast<size_t>(s.k8_bytes())),
        v8t(static_cast<size_t>(s.v8t_bytes())), q_scale(static_cast<size_t>(s.b * s.hq * s.sq)),
        k_scale(static_cast<size_t>(s.b * s.hk * s.nkb())), v_scale(static_cast<size_t>(s.b * s.hk * s.d)),
        k_mean(static_cast<size_t>(s.b * s.hk * s.d)), lse_shift(static_cast<size_t>(s.b * s.hq * s.sq)) {}
  void poison() {
    q8.poison(); k8.poison(); v8t.poison();
    q_scale.poison(); k_scale.poison(); v_scale.poison(); k_mean.poison(); lse_shift.poison();
  }
  cq::QuantBuffers buffers() {
    return {q8.data(), k8.data(), v8t.data(), q_scale.data(), k_scale.data(), v_scale.data(), k_mean.data(),
            lse_shift.data()};
  }
  bool guards_intact() const {
    return q8.guards_intact() && k8.guards_intact() && v8t.guards_intact() && q_scale.guards_intact() &&
           k_scale.guards_intact() && v_scale.guards_intact() && k_mean.guards_intact() && lse_shift.guards_intact();
  }
};

// Downloaded outputs, for bitwise comparisons between runs.
struct Host {
  std::vector<std::uint8_t> q8, k8, v8t;
  std::vector<float> q_scale, k_scale, v_scale, k_mean, lse_shift;
};

Host download(const Outputs& o) {
  return {o.q8.download(), o.k8.download(), o.v8t.download(), o.q_scale.download(), o.k_scale.download(),
          o.v_scale.download(), o.k_mean.download(), o.lse_shift.download()};
}

template <class T>
std::string first_diff(const char* what, const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return std::string(what) + ": sizes differ";
  std::size_t n = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && n++ == 0) first = i;
  }
  if (n == 0) return "";
  char buf[200];
  if constexpr (sizeof(T) == 1) {
    std::snprintf(buf, sizeof buf, "%s: %zu of %zu bytes differ, first at %zu: gpu 0x%02x, host 0x%02x", what, n,
                  got.size(), first, static_cast<unsigned>(got[first]), static_cast<unsigned>(want[first]));
  } else {
    std::snprintf(buf, sizeof buf, "%s: %zu of %zu differ, first at %zu: gpu %.9g, host %.9g", what, n, got.size(),
                  first, static_cast<double>(got[first]), static_cast<double>(want[first]));
  }
  return buf;
}

std::string diff_all(const Host& a, const Host& b) {
  std::string r;
  for (const std::string& s : {first_diff("q8", a.q8, b.q8), first_diff("k8", a.k8, b.k8), first_diff("v8t", a.v8t, b.v8t),
                               first_diff("q_scale", a.q_scale, b.q_scale), first_diff("k_scale", a.k_scale, b.k_scale),
                               first_diff("v_scale", a.v_scale, b.v_scale), first_diff("k_mean", a.k_mean, b.k_mean),
                               first_diff("lse_shift", a.lse_shift, b.lse_shift)}) {
    if (!s.empty()) r += s + "; ";
  }
  return r;
}

void run_case(const Cfg& c) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::mt19937_64 rng = rng_for(case_name(c));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float big = c.dtype == DType::f16 ? 60000.0f : 1e30f;
  const float tiny = c.dtype == DType::f16 ? 6e-8f : 1e-30f;
  // Q: normal; with `special`, row 0 of every head zero, row 1 large, row 2 tiny.
  Input q = make_input(c, c.sq, c.hq, [&](std::int64_t, std::int64_t i, std::int64_t, std::int64_t e) {
    const float x = nd(rng);
    if (c.special && i == 0) return 0.0f;
    if (c.special && i == 1) return (e % 2 ? -big : big) * (0.3f + 0.7f * std::fabs(x) / (1.0f + std::fabs(x)));
    if (c.special && i == 2) return tiny * x;
    return x;
  });
  // K: normal plus a per-(head, channel) offset (what smoothing removes); with `special`, key 3
  // large and the last key block's first key zero.
  Input k = make_input(c, c.sk, c.hk, [&](std::int64_t, std::int64_t j, std::int64_t h, std::int64_t e) {
    const float x = nd(rng) + 3.0f * static_cast<float>(h + 1) * ((e % 5) - 2.0f);
    if (c.special && j == 3) return (e % 3 ? big : -big) * 0.5f;
    if (c.special && j == (c.sk - 1) / c.blkk * c.blkk) return 0.0f;
    return x;
  });
  // V: normal with per-channel magnitudes; with `special`, channel 0 zero and channel 1 large.
  Input v = make_input(c, c.sk, c.hk, [&](std::int64_t, std::int64_t, std::int64_t, std::int64_t e) {
    const float x = nd(rng) * std::ldexp(1.0f, static_cast<int>(e % 7) - 3);
    if (c.special && e == 0) return 0.0f;
    if (c.special && e == 1) return x * big / 8.0f;
    return x;
  });

  BlockSparseAttentionParams p;
  p.q = q.dev_view(c.dtype, c.b, c.sq, c.hq, c.d);
  p.k = k.dev_view(c.dtype, c.b, c.sk, c.hk, c.d);
  p.v = v.dev_view(c.dtype, c.b, c.sk, c.hk, c.d);
  p.blkk = c.blkk;
  p.scale = c.scale;
  p.smooth_k = c.smooth;
  p.recipe = Recipe::fp8;
  p.exec.backend = Backend::cuda;
  const cq::QuantShape sh = cq::quant_shape(p);
  Outputs out(sh);

  const auto run = [&](const char* group, const char* variant = nullptr, const char* stages = nullptr) {
    ScopedEnv env("SPARGE_QUANT_GROUP", group);
    ScopedEnv env_variant("SPARGE_QUANT_VARIANT", variant);
    ScopedEnv env_stages("SPARGE_QUANT_STAGES", stages);
    out.poison();
    const cudaError_t e = cq::quantize_qkv(p, out.buffers(), nullptr);
    EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
    SPARGE_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(out.guards_intact()) << "guard region overwritten (group " << (group ? group : "default") << ", variant "
                                     << (variant ? variant : "launches") << ", stages " << (stages ? stages : "default")
                                     << ")";
    return download(out);
  };
  const Host gpu = run(nullptr);

  // k_mean: within 1e-6 relative of the fp64 mean (exactly zero without smoothing).
  const Tensor qh = q.host_view(c.dtype, c.b, c.sq, c.hq, c.d);
  const Tensor kh = k.host_view(c.dtype, c.b, c.sk, c.hk, c.d);
  const Tensor vh = v.host_view(c.dtype, c.b, c.sk, c.hk, c.d);
  const std::vector<float> km_ref = cpu::k_mean_host(kh, 0);
  for (std::size_t i = 0; i < km_ref.size(); ++i) {
    const double want = c.smooth ? km_ref[i] : 0.0;
    ASSERT_LE(std::fabs(gpu.k_mean[i] - want), 1e-6 * std::fabs(want)) << "k_mean[" << i << "] = " << gpu.k_mean[i]
                                                                         << ", fp64 mean " << want;
  }
  // Everything else: the rule on the host with the GPU's k_mean, bitwise.
  const double scale = c.scale == 0.0f ? 1.0 / std::sqrt(static_cast<double>(c.d)) : static_cast<double>(c.scale);
  const cpu::QuantHost ref = cpu::quantize_host(qh, kh, vh, c.blkk, c.smooth, scale, gpu.k_mean, 0);
  Host want{ref.q8, ref.k8, ref.v8t, ref.q_scale, ref.k_scale, ref.v_scale, ref.k_mean, {}};
  for (double x : ref.lse_shift) want.lse_shift.push_back(static_cast<float>(x));
  EXPECT_EQ(diff_all(gpu, want), "");
  // No saturation (an independent check of the bytes): every Q and V element dequantizes to within
  // half an e4m3 step of its value (relative 2^-4, or 2^-10 * scale in the subnormal range); a
  // saturated code would be off by more.
  const auto near = [](float x, float deq, float sc) {
    return std::fabs(static_cast<double>(deq) - x) <= std::ldexp(std::fabs(static_cast<double>(x)), -4) + std::ldexp(static_cast<double>(sc), -10);
  };
  std::int64_t far_q = 0, far_v = 0;
  for (std::int64_t b = 0; b < c.b; ++b)
    for (std::int64_t h = 0; h < c.hq; ++h)
      for (std::int64_t i = 0; i < c.sq; ++i) {
        const std::int64_t r = (b * c.hq + h) * c.sq + i;
        for (std::int64_t e = 0; e < c.d; ++e)
          far_q += !near(load_as_float(qh.data, qh.dtype, qh.offset(b, i, h, e)),
                         ::sparge::quant::dequantize(gpu.q8[r * c.d + e], gpu.q_scale[r]), gpu.q_scale[r]);
      }
  for (std::int64_t b = 0; b < c.b; ++b)
    for (std::int64_t h = 0; h < c.hk; ++h)
      for (std::int64_t e = 0; e < c.d; ++e) {
        const std::int64_t r = (b * c.hk + h) * c.d + e;
        for (std::int64_t j = 0; j < c.sk; ++j) {
          const std::int64_t pos = j / 32 * 32 + ::sparge::quant::v_key_pos(static_cast<int>(j % 32));
          far_v += !near(load_as_float(vh.data, vh.dtype, vh.offset(b, j, h, e)),
                         ::sparge::quant::dequantize(gpu.v8t[r * sh.sk_pad() + pos], gpu.v_scale[r]), gpu.v_scale[r]);
        }
      }
  EXPECT_EQ(far_q, 0) << "q8 values off by more than half an e4m3 step";
  EXPECT_EQ(far_v, 0) << "v8t values off by more than half an e4m3 step";

  // Deterministic, and independent of the launch grouping.
  EXPECT_EQ(diff_all(run(nullptr), gpu), "") << "second launch";
  EXPECT_EQ(diff_all(run("1"), gpu), "") << "SPARGE_QUANT_GROUP=1";
  EXPECT_EQ(diff_all(run("3"), gpu), "") << "SPARGE_QUANT_GROUP=3";
  EXPECT_EQ(diff_all(run(nullptr, "fused"), gpu), "") << "SPARGE_QUANT_VARIANT=fused";
  EXPECT_EQ(diff_all(run("1", "fused"), gpu), "") << "SPARGE_QUANT_VARIANT=fused SPARGE_QUANT_GROUP=1";
  EXPECT_EQ(diff_all(run("3", "fused"), gpu), "") << "SPARGE_QUANT_VARIANT=fused SPARGE_QUANT_GROUP=3";
  EXPECT_EQ(diff_all(run(nullptr, "stream"), gpu), "") << "SPARGE_QUANT_VARIANT=stream";
  EXPECT_EQ(diff_all(run("1", "stream"), gpu), "") << "SPARGE_QUANT_VARIANT=stream SPARGE_QUANT_GROUP=1";
  EXPECT_EQ(diff_all(run("3", "stream"), gpu), "") << "SPARGE_QUANT_VARIANT=stream SPARGE_QUANT_GROUP=3";
  EXPECT_EQ(diff_all(run("1000", "stream"), gpu), "") << "SPARGE_QUANT_VARIANT=stream SPARGE_QUANT_GROUP=1000 (all)";
  EXPECT_EQ(diff_all(run(nullptr, "stream", "2"), gpu), "") << "SPARGE_QUANT_VARIANT=stream SPARGE_QUANT_STAGES=2";
  EXPECT_EQ(diff_all(run("1", "stream", "4"), gpu), "") << "SPARGE_QUANT_VARIANT=stream SPARGE_QUANT_GROUP=1 SPARGE_QUANT_STAGES=4";
}

// The stream variant's 32-bit ticket decoding (cuda/fast_div.h's FastDiv, Schedule32) against the 64-bit
// decode the CPU test QUANT_SCHED checks: host arithmetic, runs without a GPU.
void check_schedule32() {
  std::mt19937_64 rng(20261130);
  std::vector<std::uint32_t> divisors = {1, 2, 3, 5, 7, 64, 127, 128, 129, 255, 256, 257, 1000, 65535, 65536, 65537,
                                         (1u << 30) - 1, 1u << 30, (1u << 30) + 1, (1u << 31) - 1};
  for (int i = 0; i < 300; ++i) divisors.push_back(static_cast<std::uint32_t>(1 + rng() % ((1ull << 31) - 1)));
  for (int i = 0; i < 300; ++i) divisors.push_back(static_cast<std::uint32_t>(1 + rng() % 5000));
  for (const std::uint32_t d : divisors) {
    const cq::FastDiv f(d);
    std::vector<std::uint32_t> ns = {0, 1, d - 1, d, d + 1, (1u << 31) - 1, (1u << 31) - 2, 2 * d - 1, 2 * d};
    for (int i = 0; i < 1000; ++i) ns.push_back(static_cast<std::uint32_t>(rng() % (1ull << 31)));
    for (const std::uint32_t n : ns) {
      if (n >= (1u << 31)) continue;
      ASSERT_EQ(f.div(n), n / d) << "FastDiv(" << d << ").div(" << n << ")";
    }
  }
  for (const std::int64_t pairs : {1, 2, 3, 5, 16, 67})
    for (const std::int64_t group : {1, 2, 3, 8, 1000})
      for (const std::int64_t nch : {1, 2, 3, 129, 256})
        for (const std::int64_t qper : {1, 5, 384, 513}) {
          const cq::Schedule s{pairs, std::min(group, pairs), nch, qper};
          const cq::Schedule32 s32(s);
          for (std::int64_t t = 0; t < s.total(); ++t) {
            const cq::Item a = cq::decode(s, t), b = s32.decode(static_cast<std::uint32_t>(t));
            ASSERT_TRUE(a.stats == b.stats && a.pair == b.pair && a.index == b.index)
                << "pairs " << pairs << " group " << group << " nch " << nch << " qper " << qper << " ticket " << t;
          }
        }
}

SPARGE_CASES(QuantGpu) {
  cases.push_back({"QUANT_GPU_SCHED32(host)", [] { check_schedule32(); }});
  cases.push_back({"QUANT_GPU_E4M3(all 2^32 floats)", [] {
                     if (!have_gpu()) GTEST_SKIP() << "no GPU";
                     int dev = 0, major = 0, minor = 0;
                     SPARGE_CUDA_CHECK(cudaGetDevice(&dev));
                     SPARGE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
                     SPARGE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
                     if (major * 10 + minor < 89) GTEST_SKIP() << "no e4m3 conversion instruction before sm_89";
                     unsigned long long bad = 0;
                     std::uint32_t first = 0;
                     ASSERT_EQ(cq::e4m3_device_check(&bad, &first), cudaSuccess);
                     float fx;
                     std::memcpy(&fx, &first, 4);
                     EXPECT_EQ(bad, 0ull) << "first mismatch at bits 0x" << std::hex << first << " (" << fx << "): software 0x"
                                          << static_cast<unsigned>(::sparge::quant::e4m3_encode_soft(fx));
                   }});

  struct Shape {
    int b, hq, hk;
    std::int64_t sq, sk;
    int d, blkk;
    bool smooth, special;
    float scale;
  };
  const Shape shapes[] = {
      {1, 2, 2, 100, 150, 128, 64, true, false, 0.0f},   // Sk not a multiple of 32
      {2, 8, 2, 77, 300, 128, 128, true, true, 0.0f},    // GQA 4, Sk % 128 = 44
      {1, 4, 1, 130, 129, 64, 64, false, false, 0.0f},   // head dim 64, GQA 4, no smoothing
      {2, 4, 4, 1, 33, 128, 128, true, true, 0.125f},    // one query row, one partial tile
      {1, 8, 2, 256, 1000, 128, 64, true, true, 0.0f},   // several tiles and chunks
      {2, 16, 8, 300, 2100, 128, 128, true, false, 0.0f},  // 16 kv heads: many groups and tickets
  };
  for (const Shape& s : shapes)
    for (DType t : {DType::f16, DType::bf16})
      for (Layout l : {Layout::nhd, Layout::hnd, Layout::strided, Layout::unaligned}) {
        Cfg c;
        c.b = s.b; c.hq = s.hq; c.hk = s.hk; c.sq = s.sq; c.sk = s.sk; c.d = s.d; c.blkk = s.blkk;
        c.smooth = s.smooth; c.special = s.special; c.scale = s.scale; c.dtype = t; c.layout = l;
        cases.push_back({case_name(c), [c] { run_case(c); }});
      }

  cases.push_back({"QUANT_GPU_BENCH(b=2,hq=32,hk=32,s=16384,d=128,f16)", [] {
                     if (!have_gpu()) GTEST_SKIP() << "no GPU";
                     const char* on = std::getenv("SPARGE_BENCH");
                     if (on == nullptr || std::string(on) != "1") GTEST_SKIP() << "set SPARGE_BENCH=1";
                     const std::int64_t B = 2, H = 32, S = 16384, D = 128, n = B * S * H * D;
                     void *q = nullptr, *k = nullptr, *v = nullptr;
                     ASSERT_EQ(cudaMalloc(&q, n * 2), cudaSuccess);
                     ASSERT_EQ(cudaMalloc(&k, n * 2), cudaSuccess);
                     ASSERT_EQ(cudaMalloc(&v, n * 2), cudaSuccess);
                     {
                       std::vector<std::uint16_t> pat(std::size_t{1} << 22);
                       std::mt19937_64 rng(7);
                       std::normal_distribution<float> nd(0.0f, 1.0f);
                       for (auto& x : pat) x = float_to_half(nd(rng));
                       for (void* dst : {q, k, v})
                         for (std::int64_t off = 0; off < n; off += static_cast<std::int64_t>(pat.size()))
                           ASSERT_EQ(cudaMemcpy(static_cast<std::uint16_t*>(dst) + off, pat.data(),
                                                std::min<std::int64_t>(static_cast<std::int64_t>(pat.size()), n - off) * 2,
                                                cudaMemcpyHostToDevice),
                                     cudaSuccess);
                     }
                     BlockSparseAttentionParams p;
                     p.q = make_tensor(q, DType::f16, {B, S, H, D});
                     p.k = make_tensor(k, DType::f16, {B, S, H, D});
                     p.v = make_tensor(v, DType::f16, {B, S, H, D});
                     p.blkk = 64;
                     p.recipe = Recipe::fp8;
                     p.exec.backend = Backend::cuda;
                     const cq::QuantShape sh = cq::quant_shape(p);
                     Outputs out(sh);
                     cudaEvent_t e0 = nullptr, e1 = nullptr;
                     ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
                     ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
                     struct Variant {
                       const char* variant;
                       const char* group;
                       bool smooth;
                       const char* stages = nullptr;
                     };
                     for (const Variant var :
                          {Variant{nullptr, nullptr, true}, Variant{nullptr, "1", true}, Variant{nullptr, "2", true},
                           Variant{nullptr, "4", true}, Variant{nullptr, "8", true}, Variant{"fused", "1", true},
                           Variant{"fused", "2", true}, Variant{"fused", "4", true}, Variant{"fused", "8", true},
                           Variant{"stream", "1", true}, Variant{"stream", "2", true}, Variant{"stream", "4", true},
                           Variant{"stream", "8", true}, Variant{"stream", "1000", true}, Variant{"stream", "2", true, "2"},
                           Variant{"stream", "2", true, "4"}, Variant{nullptr, nullptr, false}, Variant{"fused", "2", false},
                           Variant{"stream", "2", false}, Variant{"stream", "1000", false}}) {
                       ScopedEnv env("SPARGE_QUANT_GROUP", var.group);
                       ScopedEnv env_variant("SPARGE_QUANT_VARIANT", var.variant);
                       ScopedEnv env_stages("SPARGE_QUANT_STAGES", var.stages);
                       p.smooth_k = var.smooth;
                       for (int i = 0; i < 3; ++i) ASSERT_EQ(cq::quantize_qkv(p, out.buffers(), nullptr), cudaSuccess);
                       ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                       std::vector<float> ms;
                       for (int i = 0; i < 10; ++i) {
                         ASSERT_EQ(cudaEventRecord(e0, nullptr), cudaSuccess);
                         ASSERT_EQ(cq::quantize_qkv(p, out.buffers(), nullptr), cudaSuccess);
                         ASSERT_EQ(cudaEventRecord(e1, nullptr), cudaSuccess);
                         ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
                         float t = 0.0f;
                         ASSERT_EQ(cudaEventElapsedTime(&t, e0, e1), cudaSuccess);
                         ms.push_back(t);
                       }
                       std::sort(ms.begin(), ms.end());
                       const double med = (ms[4] + ms[5]) / 2;
                       // Bytes the design moves: Q once, K (twice with smoothing) and V twice, the
                       // 8-bit copies, the scales, shifts and means (the fp64 partial sums aside).
                       const double in = 2.0 * n * (1 + (var.smooth ? 2 : 1) + 2);
                       const double outb = static_cast<double>(sh.q8_bytes() + sh.k8_bytes() + sh.v8t_bytes()) +
                                           4.0 * (2 * B * H * S + B * H * sh.nkb() + 2 * B * H * D);
                       std::printf("QUANT_GPU_BENCH variant=%s group=%s stages=%s smooth_k=%d: median %.4f ms (min %.4f, max %.4f), %.1f MB, %.0f GB/s\n",
                                   var.variant ? var.variant : "launches", var.group ? var.group : "all",
                                   var.stages ? var.stages : "-", var.smooth ? 1 : 0, med, ms.front(), ms.back(),
                                   (in + outb) / 1e6, (in + outb) / (med * 1e-3) / 1e9);
                     }
                     cudaEventDestroy(e0);
                     cudaEventDestroy(e1);
                     cudaFree(q);
                     cudaFree(k);
                     cudaFree(v);
                   }});
}

}  // namespace
}  // namespace sparge::test
