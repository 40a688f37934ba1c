// The fp8 recipe on the CPU backend (docs/quantized.md):
//   QuantE4m3  - the e4m3 encoder of src/quant/quant_rule.h against a slow reference written here
//                (nearest of the 127 finite non-negative codes, decoded independently; ties to the
//                even code; saturation; NaN; -0.0; subnormals), over every code, every midpoint and
//                its neighbours, specials, random floats and a sweep over the float bit patterns;
//                the decoder over all 256 codes;
//   QuantScale - the power-of-two scale rule at its boundaries (amax = 448 * 2^k, one ulp above,
//                2^k, tiny, zero, inf, NaN) and against frexp/ldexp on random amax values; the V
//                key permutation and its inverse;
//   QuantHost  - quantize_host: each group's values round-trip within e4m3's half step without
//                saturation (large and tiny rows, a zero row), tails of K blocks, V padding, GQA
//                lse_shift from the right kv head;
//   QuantSched - the fused GPU prepass's work order (src/cuda/quant/schedule.h, plain C++): every
//                item exactly once, and every quantization item after all stats items of its kv
//                head (what makes the persistent kernel's waits deadlock free);
//   QuantAttn  - block_sparse_attention with recipe fp8 == "quantize by hand (written here) +
//                recipe none on the dequantized tensors + the shift", bitwise for O; close to the
//                unquantized attention (loose); the LSE shift restores the original logits' LSE
//                when K has a large mean; GQA; thread-count independence; validation.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention_ref.h"
#include "cpu/quant.h"
#include "cuda/quant/schedule.h"
#include "harness/harness.h"
#include "quant/quant_rule.h"

namespace sparge::test {
namespace {
using namespace ref;

// ---- an independent e4m3 reference ---------------------------------------------------------------

// Decodes a code from its fields with ldexp (no bit tricks shared with the library).
double ref_decode(int c) {
  const int sign = (c >> 7) & 1, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return sign ? -mag : mag;
}

// The 127 finite non-negative code values, decoded by ref_decode.
const std::vector<double>& ref_table() {
  static const std::vector<double> t = [] {
    std::vector<double> v;
    for (int c = 0; c <= 0x7e; ++c) v.push_back(ref_decode(c));
    return v;
  }();
  return t;
}

// Round to nearest, ties to the even code, saturate above 448, NaN -> 0x7F, sign kept (also for
// results that round to zero).
std::uint8_t ref_encode(float x) {
  if (std::isnan(x)) return 0x7f;
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 448.0) return static_cast<std::uint8_t>(sign | 0x7e);
  const std::vector<double>& t = ref_table();
  const int lo = static_cast<int>(std::upper_bound(t.begin(), t.end(), a) - t.begin()) - 1;  // largest code <= a
  int best = lo;
  if (lo < 0x7e) {
    const double dl = a - t[lo], dh = t[lo + 1] - a;
    if (dh < dl || (dh == dl && ((lo + 1) & 1) == 0)) best = lo + 1;
  }
  return static_cast<std::uint8_t>(sign | best);
}

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Checks the encoder on xs, both signs; returns "" or the first mismatch.
std::string check_encoder(const std::vector<float>& xs) {
  for (float x : xs) {
    for (float y : {x, -x}) {
      const std::uint8_t got = quant::e4m3_encode_soft(y), want = ref_encode(y);
      if (got != want) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "x = %.9g (bits 0x%08x): encoder 0x%02x, reference 0x%02x", y, to_bits(y), got,
                      want);
        return buf;
      }
    }
  }
  return "";
}

SPARGE_CASES(QuantE4m3) {
  cases.push_back({"QUANT_E4M3(decode=all256)", [] {
                     for (int c = 0; c < 256; ++c) {
                       const float got = quant::e4m3_to_float(static_cast<std::uint8_t>(c));
                       const double want = ref_decode(c);
                       if (std::isnan(want)) {
                         EXPECT_TRUE(std::isnan(got)) << "code " << c;
                       } else {
                         EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
                         EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;
                       }
                     }
                     EXPECT_EQ(quant::e4m3_to_float(0x7e), 448.0f);
                     EXPECT_EQ(quant::e4m3_to_float(0x01), 0.001953125f);
                     EXPECT_EQ(quant::e4m3_to_float(0x08), 0.015625f);
                     EXPECT_TRUE(std::isnan(quant::e4m3_to_float(0x7f)) && std::isnan(quant::e4m3_to_float(0xff)));
                   }});
  cases.push_back({"QUANT_E4M3(encode=codes+midpoints)", [] {
                     // Every finite code, every midpoint between neighbours, and 3 ulps around each.
                     std::vector<float> xs;
                     for (int c = 0; c <= 0x7e; ++c) {
                       const double v = ref_decode(c);
                       std::vector<double> pts = {v};
                       if (c < 0x7e) pts.push_back((v + ref_decode(c + 1)) / 2);
                       for (double pt : pts) {
                         const float f = static_cast<float>(pt);
                         ASSERT_EQ(static_cast<double>(f), pt);  // midpoints are exact floats
                         for (int k = -3; k <= 3; ++k) {
                           const std::int64_t b = static_cast<std::int64_t>(to_bits(f)) + k;
                           if (b >= 0) xs.push_back(from_bits(static_cast<std::uint32_t>(b)));
                         }
                       }
                     }
                     // Saturation boundary: 448, 464 (the tie toward the NaN code), 480, beyond.
                     for (float f : {448.0f, 464.0f, 480.0f, 1e4f, 3.4e38f}) {
                       for (int k = -2; k <= 2; ++k) xs.push_back(from_bits(to_bits(f) + k));
                     }
                     EXPECT_EQ(check_encoder(xs), "");
                   }});
  cases.push_back({"QUANT_E4M3(encode=specials)", [] {
                     EXPECT_EQ(quant::e4m3_encode_soft(0.0f), 0x00);
                     EXPECT_EQ(quant::e4m3_encode_soft(-0.0f), 0x80);
                     EXPECT_EQ(quant::e4m3_encode_soft(std::numeric_limits<float>::infinity()), 0x7e);
                     EXPECT_EQ(quant::e4m3_encode_soft(-std::numeric_limits<float>::infinity()), 0xfe);
                     EXPECT_EQ(quant::e4m3_encode_soft(std::numeric_limits<float>::quiet_NaN()), 0x7f);
                     EXPECT_EQ(quant::e4m3_encode_soft(-std::numeric_limits<float>::quiet_NaN()), 0x7f);
                     EXPECT_EQ(quant::e4m3_encode_soft(from_bits(0x7f800001u)), 0x7f);  // signalling NaN
                     EXPECT_EQ(quant::e4m3_encode_soft(464.0f), 0x7e);
                     EXPECT_EQ(quant::e4m3_encode_soft(from_bits(to_bits(464.0f) + 1)), 0x7e);
                     EXPECT_EQ(quant::e4m3_encode_soft(std::ldexp(1.0f, -10)), 0x00);  // tie to even zero
                     EXPECT_EQ(quant::e4m3_encode_soft(-std::ldexp(1.0f, -10)), 0x80);
                     EXPECT_EQ(quant::e4m3_encode_soft(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
                     EXPECT_EQ(quant::e4m3_encode_soft(std::ldexp(3.0f, -10)), 0x02);  // 1.5 * 2^-9: tie to 2
                     EXPECT_EQ(quant::e4m3_encode_soft(std::ldexp(15.0f, -10)), 0x08);  // 7.5 * 2^-9 -> min normal
                     EXPECT_EQ(quant::e4m3_encode_soft(1.0625f), 0x38);  // tie between 1 and 1.125: even
                     EXPECT_EQ(quant::e4m3_encode_soft(1.1875f), 0x3a);  // tie between 1.125 and 1.25: even
                     EXPECT_EQ(quant::e4m3_encode_soft(from_bits(1)), 0x00);  // f32 subnormal
                     EXPECT_EQ(quant::e4m3_encode_soft(-from_bits(1)), 0x80);
                   }});
  cases.push_back({"QUANT_E4M3(encode=random+sweep)", [] {
                     std::mt19937_64 rng = rng_for("QUANT_E4M3(encode=random+sweep)");
                     std::vector<float> xs;
                     std::uniform_real_distribution<float> mant(1.0f, 2.0f);
                     std::uniform_int_distribution<int> ex(-20, 12);
                     for (int i = 0; i < 200000; ++i) xs.push_back(std::ldexp(mant(rng), ex(rng)));
                     // Every 4099th bit pattern below 512 (the interesting range and beyond), then
                     // every 65537th over all of them.
                     for (std::uint32_t b = 0; b < to_bits(512.0f); b += 4099) xs.push_back(from_bits(b));
                     for (std::uint64_t b = 0; b < (1ull << 32); b += 65537) xs.push_back(from_bits(static_cast<std::uint32_t>(b)));
                     EXPECT_EQ(check_encoder(xs), "");
                   }});
}

// ---- scales and the permutation ------------------------------------------------------------------

// The rule written with frexp/ldexp.
double ref_scale(double amax) {
  if (amax == 0.0 || !std::isfinite(amax)) return 1.0;
  int e;
  const double m = std::frexp(amax, &e);
  return std::ldexp(1.0, std::max(-126, e - 9 + (m > 0.875 ? 1 : 0)));
}

SPARGE_CASES(QuantScale) {
  cases.push_back({"QUANT_SCALE(boundaries)", [] {
                     for (int k = -120; k <= 119; ++k) {
                       const float a = std::ldexp(448.0f, k);
                       EXPECT_EQ(quant::pow2_scale(quant::abs_bits(a)).scale, std::ldexp(1.0f, k)) << "448*2^" << k;
                       // One ulp above 448 * 2^k: the next power of two, amax / scale just above 224.
                       const float above = std::nextafter(a, std::numeric_limits<float>::infinity());
                       EXPECT_EQ(quant::pow2_scale(quant::abs_bits(above)).scale, std::ldexp(1.0f, k + 1)) << k;
                       // 2^k: amax / scale = 256 (above the floor).
                       const float p = std::ldexp(1.0f, k);
                       if (k >= -118) EXPECT_EQ(static_cast<double>(p) / quant::pow2_scale(quant::abs_bits(p)).scale, 256.0) << k;
                     }
                     // The floor: tiny (also subnormal) amax gets 2^-126; 2^-117 is the last above it.
                     EXPECT_EQ(quant::pow2_scale(quant::abs_bits(std::ldexp(1.0f, -117))).scale, std::ldexp(1.0f, -125));
                     for (float a : {1e-37f, 1e-38f, from_bits(1), std::ldexp(1.0f, -118)}) {
                       EXPECT_EQ(quant::pow2_scale(quant::abs_bits(a)).scale, std::ldexp(1.0f, -126)) << a;
                     }
                     EXPECT_EQ(quant::pow2_scale(0).scale, 1.0f);
                     EXPECT_EQ(quant::pow2_scale(quant::abs_bits(std::numeric_limits<float>::infinity())).scale, 1.0f);
                     EXPECT_EQ(quant::pow2_scale(quant::abs_bits(std::numeric_limits<float>::quiet_NaN())).scale, 1.0f);
                     // The largest float: scale 2^120, inverse exact.
                     const quant::Pow2Scale big = quant::pow2_scale(quant::abs_bits(3.4028235e38f));
                     EXPECT_EQ(big.scale, std::ldexp(1.0f, 120));
                     EXPECT_EQ(big.inv, std::ldexp(1.0f, -120));
                   }});
  cases.push_back({"QUANT_SCALE(random)", [] {
                     std::mt19937_64 rng = rng_for("QUANT_SCALE(random)");
                     std::uniform_int_distribution<std::uint32_t> bits(1, 0x7f7fffffu);
                     for (int i = 0; i < 200000; ++i) {
                       const float a = from_bits(bits(rng));
                       const quant::Pow2Scale s = quant::pow2_scale(quant::abs_bits(a));
                       ASSERT_EQ(static_cast<double>(s.scale), ref_scale(a)) << a;
                       ASSERT_EQ(static_cast<double>(s.inv) * s.scale, 1.0) << a;
                       // No saturation: amax / scale <= 448, and (above the floor) >= 224.
                       const double r = static_cast<double>(a) / s.scale;
                       ASSERT_LE(r, 448.0) << a;
                       if (s.scale > std::ldexp(1.0f, -126)) ASSERT_GT(r, 224.0) << a;
                       ASSERT_NE(quant::quantize(a, s.inv) & 0x7f, 0x7f) << a;
                     }
                   }});
  cases.push_back({"QUANT_SCALE(lse_shift=order)", [] {
                     // The rule's order: chunks of 8 ascending, then a pairwise tree of the chunk sums.
                     // Values with cancellation, so that another order gives other bits.
                     std::mt19937_64 rng = rng_for("QUANT_SCALE(lse_shift=order)");
                     std::normal_distribution<float> nd(0.0f, 1.0f);
                     int differs_from_sequential = 0;
                     for (int d : {128, 64, 40}) {
                       for (int rep = 0; rep < 200; ++rep) {
                         std::vector<float> q(d), km(d);
                         for (int e = 0; e < d; ++e) {
                           q[e] = nd(rng) * (e % 8 == 0 ? 1e6f : 1.0f);
                           km[e] = nd(rng) * (e % 16 == 8 ? -1e6f : 1e-3f);
                         }
                         std::vector<double> c;
                         for (int c0 = 0; c0 < d; c0 += 8) {
                           double x = 0.0;
                           for (int e = c0; e < std::min(d, c0 + 8); ++e) x += static_cast<double>(q[e]) * km[e];
                           c.push_back(x);
                         }
                         while (c.size() & (c.size() - 1)) c.push_back(0.0);
                         for (size_t w = 1; w < c.size(); w *= 2)
                           for (size_t i = 0; i + w < c.size(); i += 2 * w) c[i] += c[i + w];
                         const double want = 0.125 * c[0];
                         ASSERT_EQ(quant::lse_shift(q.data(), km.data(), d, 0.125), want) << "d " << d;
                         double seq = 0.0;
                         for (int e = 0; e < d; ++e) seq += static_cast<double>(q[e]) * km[e];
                         differs_from_sequential += 0.125 * seq != want;
                       }
                     }
                     EXPECT_GT(differs_from_sequential, 0);  // the inputs do tell orders apart
                   }});
  cases.push_back({"QUANT_SCALE(v_key_perm)", [] {
                     std::vector<int> seen(32, 0);
                     for (int c = 0; c < 32; ++c) {
                       const int j = quant::v_key_perm(c);
                       ASSERT_TRUE(j >= 0 && j < 32);
                       ++seen[j];
                       EXPECT_EQ(quant::v_key_pos(j), c) << c;
                     }
                     for (int j = 0; j < 32; ++j) EXPECT_EQ(seen[j], 1) << j;
                     // The wgmma A-fragment order: bytes 0..3 hold keys 0, 1, 8, 9; 4..7 keys 2, 3, 10, 11.
                     const int want[8] = {0, 1, 8, 9, 2, 3, 10, 11};
                     for (int c = 0; c < 8; ++c) EXPECT_EQ(quant::v_key_perm(c), want[c]) << c;
                     EXPECT_EQ(quant::v_key_perm(16), 16);
                     EXPECT_EQ(quant::v_key_perm(31), 31);
                   }});
}

// ---- quantize_host ----------------------------------------------------------------------------------

struct QSpec {
  int b = 1, hq = 2, hk = 1;
  std::int64_t sq = 70, sk = 150;
  int d = 32, blkk = 64;
  DType dtype = DType::f16;
  Layout layout = Layout::nhd;
  bool smooth = true;
  float kmean = 0.0f;  // a per-kv-head offset added to K (head hk gets (hk + 1) * kmean)
};

std::string qspec_name(const char* op, const QSpec& s) {
  return Name(op)("b", s.b)("hq", s.hq)("hk", s.hk)("sq", s.sq)("sk", s.sk)("d", s.d)("blkk", s.blkk)(
      "dtype", to_string(s.dtype))("layout", layout_name(s.layout))("smooth", s.smooth ? 1 : 0)("kmean", s.kmean);
}

struct QInputs {
  Tensor4 q, k, v;
  std::vector<float> ql, kl, vl;  // stored values, logical NHD
};

std::unique_ptr<QInputs> make_inputs(const QSpec& s, std::mt19937_64& rng) {
  auto in = std::make_unique<QInputs>();
  in->q = Tensor4(s.dtype, s.b, s.sq, s.hq, s.d, s.layout);
  in->k = Tensor4(s.dtype, s.b, s.sk, s.hk, s.d, s.layout);
  in->v = Tensor4(s.dtype, s.b, s.sk, s.hk, s.d, s.layout);
  std::vector<float> q(static_cast<size_t>(s.b * s.sq * s.hq * s.d)), k(static_cast<size_t>(s.b * s.sk * s.hk * s.d)),
      v(k.size());
  fill_normal(q, rng);
  fill_normal(k, rng);
  fill_normal(v, rng);
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(k.size()); ++i) {
    const std::int64_t h = (i / s.d) % s.hk, e = i % s.d;
    k[i] += (h + 1) * s.kmean * (e % 3 == 0 ? 1.0f : -0.5f);
  }
  in->q.fill(q);
  in->k.fill(k);
  in->v.fill(v);
  in->ql = in->q.read();
  in->kl = in->k.read();
  in->vl = in->v.read();
  return in;
}

// |deq - x| within e4m3's half step at x's magnitude (relative 2^-4 for normals, 2^-10 * scale in
// the subnormal range): what a correct encoding with a non-saturating scale guarantees.
bool within_half_step(float x, float deq, float scale) {
  const double err = std::fabs(static_cast<double>(deq) - x);
  return err <= std::ldexp(std::fabs(static_cast<double>(x)), -4) + std::ldexp(static_cast<double>(scale), -10);
}

void check_roundtrip(const QSpec& s, const QInputs& in, const cpu::QuantHost& qh) {
  const cpu::Dequantized dq = cpu::dequantize_host(qh, 1);
  const std::int64_t g = s.hq / s.hk;
  std::int64_t bad = 0;
  for (std::int64_t b = 0; b < s.b; ++b)
    for (std::int64_t i = 0; i < s.sq; ++i)
      for (std::int64_t h = 0; h < s.hq; ++h)
        for (std::int64_t e = 0; e < s.d; ++e) {
          const size_t o = static_cast<size_t>(((b * s.sq + i) * s.hq + h) * s.d + e);
          bad += !within_half_step(in.ql[o], dq.q[o], qh.q_scale[static_cast<size_t>((b * s.hq + h) * s.sq + i)]);
        }
  EXPECT_EQ(bad, 0) << "q values off by more than half an e4m3 step";
  bad = 0;
  for (std::int64_t b = 0; b < s.b; ++b)
    for (std::int64_t j = 0; j < s.sk; ++j)
      for (std::int64_t h = 0; h < s.hk; ++h)
        for (std::int64_t e = 0; e < s.d; ++e) {
          const size_t o = static_cast<size_t>(((b * s.sk + j) * s.hk + h) * s.d + e);
          const float km = qh.k_mean[static_cast<size_t>((b * s.hk + h) * s.d + e)];
          const float ks = s.smooth ? in.kl[o] - km : in.kl[o];
          bad += !within_half_step(ks, dq.k[o], qh.k_scale[static_cast<size_t>((b * s.hk + h) * qh.nkb() + j / s.blkk)]);
          bad += !within_half_step(in.vl[o], dq.v[o], qh.v_scale[static_cast<size_t>((b * s.hk + h) * s.d + e)]) * 1000;
        }
  EXPECT_EQ(bad, 0) << "k (units) / v (thousands) values off by more than half an e4m3 step";
  (void)g;
}

cpu::QuantHost quantize(const QSpec& s, QInputs& in, int threads = 0) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  std::vector<float> km = s.smooth ? cpu::k_mean_host(in.k.view, threads)
                                   : std::vector<float>(static_cast<size_t>(s.b * s.hk * s.d), 0.0f);
  return cpu::quantize_host(in.q.view, in.k.view, in.v.view, s.blkk, s.smooth, scale, km, threads);
}

SPARGE_CASES(QuantHost) {
  std::vector<QSpec> specs;
  {
    QSpec s;
    specs.push_back(s);
    s.dtype = DType::bf16; s.layout = Layout::hnd; s.blkk = 128; s.sk = 300; specs.push_back(s);
    s.dtype = DType::f32; s.layout = Layout::pad; s.hq = 4; s.hk = 2; s.kmean = 3.0f; specs.push_back(s);
    s.smooth = false; s.sk = 33; specs.push_back(s);
    s = QSpec(); s.b = 2; s.hq = 8; s.hk = 2; s.sk = 129; s.kmean = 5.0f; specs.push_back(s);
  }
  for (const QSpec& s : specs) {
    const std::string name = qspec_name("QUANT_HOST", s);
    cases.push_back({name, [=] {
                       std::mt19937_64 rng = rng_for(name);
                       auto in = make_inputs(s, rng);
                       const cpu::QuantHost qh = quantize(s, *in);
                       check_roundtrip(s, *in, qh);
                       // V padding: the bytes of keys >= Sk are zero up to sk_pad (byte c of a group of
                       // 32 holds key v_key_perm(c), so inside the last group they are scattered).
                       std::int64_t nonzero_pad = 0, pad_bytes = 0;
                       for (std::int64_t r = 0; r < s.b * s.hk * s.d; ++r)
                         for (std::int64_t c = 0; c < qh.sk_pad(); ++c) {
                           const std::int64_t key = c / 32 * 32 + (c % 32 % 4 / 2) * 8 + (c % 16 / 4) * 2 + c % 2 + (c % 32 / 16) * 16;
                           if (key < s.sk) continue;
                           ++pad_bytes;
                           nonzero_pad += qh.v8t[r * qh.sk_pad() + c] != 0;
                         }
                       EXPECT_EQ(pad_bytes, s.b * s.hk * s.d * (qh.sk_pad() - s.sk));
                       EXPECT_EQ(nonzero_pad, 0);
                       // k_mean: the fp64 mean rounded once (zeros without smoothing).
                       for (std::int64_t b = 0; b < s.b; ++b)
                         for (std::int64_t h = 0; h < s.hk; ++h)
                           for (std::int64_t e = 0; e < s.d; ++e) {
                             double sum = 0.0;
                             for (std::int64_t j = 0; j < s.sk; ++j) sum += in->kl[((b * s.sk + j) * s.hk + h) * s.d + e];
                             const float want = s.smooth ? static_cast<float>(sum / s.sk) : 0.0f;
                             ASSERT_EQ(qh.k_mean[(b * s.hk + h) * s.d + e], want);
                           }
                       // lse_shift uses the mean of the kv head this query head reads (GQA).
                       const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
                       for (std::int64_t b = 0; b < s.b; ++b)
                         for (std::int64_t h = 0; h < s.hq; ++h)
                           for (std::int64_t i = 0; i < s.sq; ++i) {
                             double dot = 0.0;
                             for (std::int64_t e = 0; e < s.d; ++e)
                               dot += static_cast<double>(in->ql[((b * s.sq + i) * s.hq + h) * s.d + e]) *
                                      qh.k_mean[(b * s.hk + h / (s.hq / s.hk)) * s.d + e];
                             const double got = qh.lse_shift[(b * s.hq + h) * s.sq + i];
                             ASSERT_NEAR(got, scale * dot, 1e-12 * (1.0 + std::fabs(scale * dot))) << b << " " << h << " " << i;
                           }
                       // Thread count does not change a byte.
                       const cpu::QuantHost q1 = quantize(s, *in, 1), q3 = quantize(s, *in, 3);
                       EXPECT_TRUE(q1.q8 == q3.q8 && q1.k8 == q3.k8 && q1.v8t == q3.v8t && q1.q_scale == q3.q_scale &&
                                   q1.k_scale == q3.k_scale && q1.v_scale == q3.v_scale && q1.lse_shift == q3.lse_shift);
                     }});
  }
  cases.push_back({"QUANT_HOST(rows=zero+large+tiny)", [] {
                     QSpec s;
                     s.dtype = DType::f16;
                     s.sq = 4;
                     s.sk = 64;
                     std::mt19937_64 rng = rng_for("QUANT_HOST(rows=zero+large+tiny)");
                     auto in = make_inputs(s, rng);
                     // Row 0 of Q all zero, row 1 large (f16 near its max), row 2 tiny (f16 subnormals).
                     for (std::int64_t h = 0; h < s.hq; ++h)
                       for (std::int64_t e = 0; e < s.d; ++e) {
                         in->q.buf.set(in->q.view.offset(0, 0, h, e), 0.0f);
                         in->q.buf.set(in->q.view.offset(0, 1, h, e), (e % 2 ? -1.0f : 1.0f) * (60000.0f - 1000.0f * e));
                         in->q.buf.set(in->q.view.offset(0, 2, h, e), std::ldexp(static_cast<float>(e + 1), -24));
                       }
                     in->ql = in->q.read();
                     const cpu::QuantHost qh = quantize(s, *in);
                     check_roundtrip(s, *in, qh);
                     for (std::int64_t h = 0; h < s.hq; ++h) {
                       EXPECT_EQ(qh.q_scale[h * s.sq + 0], 1.0f);
                       for (std::int64_t e = 0; e < s.d; ++e) EXPECT_EQ(qh.q8[(h * s.sq + 0) * s.d + e], 0);
                       // No saturation: the largest element keeps its value to half a step.
                       for (std::int64_t e = 0; e < s.d; ++e) EXPECT_NE(qh.q8[(h * s.sq + 1) * s.d + e] & 0x7f, 0x7e);
                     }
                   }});
}

// ---- the fused prepass's schedule -------------------------------------------------------------------

SPARGE_CASES(QuantSched) {
  struct S {
    std::int64_t pairs, group, nch, qper;
  };
  for (const S sc : {S{1, 1, 1, 1}, S{1, 2, 3, 5}, S{2, 2, 128, 384}, S{5, 2, 3, 4}, S{7, 3, 2, 9}, S{64, 2, 128, 256},
                     S{64, 1, 3, 2}, S{9, 4, 1, 1}, S{10, 10, 4, 6}, S{3, 8, 5, 2}}) {
    const std::string name = Name("QUANT_SCHED")("pairs", sc.pairs)("group", sc.group)("nch", sc.nch)("qper", sc.qper);
    cases.push_back({name, [sc] {
                       const cuda::quant::Schedule s{sc.pairs, sc.group, sc.nch, sc.qper};
                       std::vector<std::int64_t> stats_at(static_cast<size_t>(sc.pairs * sc.nch), -1);
                       std::vector<std::int64_t> quant_at(static_cast<size_t>(sc.pairs * sc.qper), -1);
                       for (std::int64_t t = 0; t < s.total(); ++t) {
                         const cuda::quant::Item it = cuda::quant::decode(s, t);
                         ASSERT_TRUE(it.pair >= 0 && it.pair < sc.pairs) << "ticket " << t;
                         if (it.stats) {
                           ASSERT_TRUE(it.index >= 0 && it.index < sc.nch) << "ticket " << t;
                           std::int64_t& at = stats_at[static_cast<size_t>(it.pair * sc.nch + it.index)];
                           ASSERT_EQ(at, -1) << "stats item twice, ticket " << t;
                           at = t;
                         } else {
                           ASSERT_TRUE(it.index >= 0 && it.index < sc.qper) << "ticket " << t;
                           std::int64_t& at = quant_at[static_cast<size_t>(it.pair * sc.qper + it.index)];
                           ASSERT_EQ(at, -1) << "quantization item twice, ticket " << t;
                           at = t;
                         }
                       }
                       EXPECT_EQ(cuda::quant::decode(s, s.total()).pair, -1);
                       for (std::int64_t p = 0; p < sc.pairs; ++p) {
                         std::int64_t last_stats = -1, first_quant = s.total();
                         for (std::int64_t c = 0; c < sc.nch; ++c) {
                           ASSERT_NE(stats_at[p * sc.nch + c], -1);
                           last_stats = std::max(last_stats, stats_at[p * sc.nch + c]);
                         }
                         for (std::int64_t k = 0; k < sc.qper; ++k) {
                           ASSERT_NE(quant_at[p * sc.qper + k], -1);
                           first_quant = std::min(first_quant, quant_at[p * sc.qper + k]);
                         }
                         EXPECT_LT(last_stats, first_quant) << "kv head " << p;
                       }
                     }});
  }
}

// ---- block_sparse_attention, recipe fp8 ---------------------------------------------------------

struct ASpec {
  int b = 1, hq = 2, hk = 1;
  std::int64_t sq = 100, sk = 150;
  int d = 32, blkq = 64, blkk = 64;
  bool causal = false, smooth = true;
  DType dtype = DType::f16;
  Layout layout = Layout::nhd;
  float kmean = 0.0f;
  double density = 0.6;
  float pv = 0.0f;  // pv_threshold (0 = none)
};

std::string aspec_name(const char* op, const ASpec& s) {
  return Name(op)("b", s.b)("hq", s.hq)("hk", s.hk)("sq", s.sq)("sk", s.sk)("d", s.d)(
      "blk", std::to_string(s.blkq) + "x" + std::to_string(s.blkk))("causal", s.causal ? 1 : 0)(
      "smooth", s.smooth ? 1 : 0)("dtype", to_string(s.dtype))("layout", layout_name(s.layout))("kmean", s.kmean)(
      "density", s.density)("pv", s.pv);
}

struct AttnOut {
  Tensor4 o;
  Guarded<float> lse;
  std::vector<float> ol;
};

std::unique_ptr<AttnOut> run_attn(const ASpec& s, const Tensor& q, const Tensor& k, const Tensor& v, Lut& lut,
                                  Recipe recipe, bool smooth, int threads = 0) {
  auto out = std::make_unique<AttnOut>();
  out->o = Tensor4(DType::f32, s.b, s.sq, s.hq, s.d, Layout::nhd);
  out->lse.resize(static_cast<size_t>(s.b * s.hq * s.sq));
  out->lse.poison();
  BlockSparseAttentionParams p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = out->o.view;
  p.maybe_lse = make_tensor(out->lse.data(), DType::f32, {s.b, s.hq, s.sq});
  p.lut = lut.lut_view();
  p.counts = lut.counts_view();
  p.blkq = s.blkq;
  p.blkk = s.blkk;
  p.is_causal = s.causal;
  p.recipe = recipe;
  p.smooth_k = smooth;
  if (s.pv > 0.0f) p.pv_threshold = PerHead(&s.pv, 1);
  p.exec.cpu_threads = threads;
  const Status st = block_sparse_attention(p);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(out->o.buf.guards_intact());
  EXPECT_TRUE(out->lse.guards_intact());
  out->ol = out->o.read();
  return out;
}

// The recipe by hand: plain loops over the logical values with the rule's scalar functions (no
// quantize_host), producing dequantized NHD tensors and the fp64 shifts.
struct ByHand {
  std::vector<float> q, k, v;
  std::vector<double> shift;
};

ByHand by_hand(const ASpec& s, const QInputs& in) {
  ByHand r;
  r.q.resize(in.ql.size());
  r.k.resize(in.kl.size());
  r.v.resize(in.vl.size());
  r.shift.assign(static_cast<size_t>(s.b * s.hq * s.sq), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  const auto qi = [&](std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t e) {
    return static_cast<size_t>(((b * s.sq + i) * s.hq + h) * s.d + e);
  };
  const auto ki = [&](std::int64_t b, std::int64_t j, std::int64_t h, std::int64_t e) {
    return static_cast<size_t>(((b * s.sk + j) * s.hk + h) * s.d + e);
  };
  for (std::int64_t b = 0; b < s.b; ++b) {
    for (std::int64_t h = 0; h < s.hk; ++h) {
      std::vector<float> km(static_cast<size_t>(s.d), 0.0f);
      if (s.smooth) {
        for (std::int64_t e = 0; e < s.d; ++e) {
          double sum = 0.0;
          for (std::int64_t j = 0; j < s.sk; ++j) sum += in.kl[ki(b, j, h, e)];
          km[e] = static_cast<float>(sum / s.sk);
        }
      }
      for (std::int64_t j0 = 0; j0 < s.sk; j0 += s.blkk) {
        const std::int64_t j1 = std::min<std::int64_t>(j0 + s.blkk, s.sk);
        double amax = 0.0;
        for (std::int64_t j = j0; j < j1; ++j)
          for (std::int64_t e = 0; e < s.d; ++e) amax = std::max(amax, std::fabs(static_cast<double>(in.kl[ki(b, j, h, e)] - km[e])));
        const float sc = static_cast<float>(ref_scale(amax));
        for (std::int64_t j = j0; j < j1; ++j)
          for (std::int64_t e = 0; e < s.d; ++e)
            r.k[ki(b, j, h, e)] = quant::e4m3_to_float(ref_encode((in.kl[ki(b, j, h, e)] - km[e]) / sc)) * sc;
      }
      for (std::int64_t e = 0; e < s.d; ++e) {
        double amax = 0.0;
        for (std::int64_t j = 0; j < s.sk; ++j) amax = std::max(amax, std::fabs(static_cast<double>(in.vl[ki(b, j, h, e)])));
        const float sc = static_cast<float>(ref_scale(amax));
        for (std::int64_t j = 0; j < s.sk; ++j) r.v[ki(b, j, h, e)] = quant::e4m3_to_float(ref_encode(in.vl[ki(b, j, h, e)] / sc)) * sc;
      }
      for (std::int64_t hq = h * (s.hq / s.hk); hq < (h + 1) * (s.hq / s.hk); ++hq)
        for (std::int64_t i = 0; i < s.sq; ++i) {
          double dot = 0.0;
          for (std::int64_t e = 0; e < s.d; ++e) dot += static_cast<double>(in.ql[qi(b, i, hq, e)]) * km[e];
          r.shift[(b * s.hq + hq) * s.sq + i] = scale * dot;
        }
    }
    for (std::int64_t h = 0; h < s.hq; ++h)
      for (std::int64_t i = 0; i < s.sq; ++i) {
        double amax = 0.0;
        for (std::int64_t e = 0; e < s.d; ++e) amax = std::max(amax, std::fabs(static_cast<double>(in.ql[qi(b, i, h, e)])));
        const float sc = static_cast<float>(ref_scale(amax));
        for (std::int64_t e = 0; e < s.d; ++e) r.q[qi(b, i, h, e)] = quant::e4m3_to_float(ref_encode(in.ql[qi(b, i, h, e)] / sc)) * sc;
      }
  }
  return r;
}

SPARGE_CASES(QuantAttn) {
  std::vector<ASpec> specs;
  {
    ASpec s;
    specs.push_back(s);
    s.hq = 4; s.hk = 2; s.kmean = 4.0f; s.causal = true; s.sq = 130; s.sk = 203; specs.push_back(s);
    s.hq = 8; s.hk = 2; s.dtype = DType::bf16; s.layout = Layout::hnd; s.blkq = 128; s.blkk = 128; s.causal = false;
    specs.push_back(s);
    s.smooth = false; s.kmean = 0.0f; s.dtype = DType::f32; s.layout = Layout::pad; s.blkk = 64; s.density = 1.0;
    specs.push_back(s);
    s = ASpec(); s.b = 2; s.hq = 4; s.hk = 1; s.d = 64; s.sq = 64; s.sk = 64; s.kmean = 8.0f; s.causal = true; specs.push_back(s);
    // The fp8 kernel's head dim, with pv_threshold (the same skip decisions on the dequantized logits).
    s = ASpec(); s.hq = 2; s.hk = 1; s.d = 128; s.sq = 200; s.sk = 333; s.blkq = 128; s.kmean = 2.0f; s.causal = true;
    s.density = 0.8; s.pv = 4.0f; specs.push_back(s);
  }
  for (const ASpec& s : specs) {
    const std::string name = aspec_name("QUANT_ATTN", s);
    cases.push_back({name, [=] {
                       std::mt19937_64 rng = rng_for(name);
                       QSpec qs;
                       qs.b = s.b; qs.hq = s.hq; qs.hk = s.hk; qs.sq = s.sq; qs.sk = s.sk; qs.d = s.d; qs.blkk = s.blkk;
                       qs.dtype = s.dtype; qs.layout = s.layout; qs.smooth = s.smooth; qs.kmean = s.kmean;
                       auto in = make_inputs(qs, rng);
                       const std::int64_t nq = num_blocks(s.sq, s.blkq), nk = num_blocks(s.sk, s.blkk);
                       Lut lut = random_lut(rng, s.b, s.hq, nq, nk, std::vector<std::int64_t>(s.b, nk), s.density);
                       auto fp8 = run_attn(s, in->q.view, in->k.view, in->v.view, lut, Recipe::fp8, s.smooth);

                       // 1. Equal to the recipe by hand: the same walk over the hand-dequantized tensors.
                       ByHand hand = by_hand(s, *in);
                       const Tensor hq_ = make_tensor(hand.q.data(), DType::f32, {s.b, s.sq, s.hq, s.d});
                       const Tensor hk_ = make_tensor(hand.k.data(), DType::f32, {s.b, s.sk, s.hk, s.d});
                       const Tensor hv_ = make_tensor(hand.v.data(), DType::f32, {s.b, s.sk, s.hk, s.d});
                       auto ref = run_attn(s, hq_, hk_, hv_, lut, Recipe::none, false);
                       EXPECT_EQ(check_bitwise(fp8->ol.data(), ref->ol.data(), fp8->ol.size()), "");
                       std::vector<double> lse_ref(hand.shift.size());
                       for (size_t i = 0; i < lse_ref.size(); ++i) lse_ref[i] = ref->lse[i] + hand.shift[i];
                       EXPECT_EQ(check_close(fp8->lse.data(), lse_ref.data(), lse_ref.size(), 1e-6, 1e-5), "");

                       // 2. Close to the unquantized attention (a sanity bound: e4m3 keeps 3 mantissa
                       // bits). With the shift, the LSE is that of the original logits.
                       auto none = run_attn(s, in->q.view, in->k.view, in->v.view, lut, Recipe::none, false);
                       std::vector<double> o_none(none->ol.begin(), none->ol.end());
                       const Error err = compare(fp8->ol.data(), o_none.data(), o_none.size());
                       EXPECT_EQ(err.nonfinite_mismatch, 0);
                       EXPECT_LT(err.nmse, 4e-3) << describe(err);
                       std::vector<double> lse_none(none->lse.data(), none->lse.data() + none->lse.size());
                       EXPECT_EQ(check_close(fp8->lse.data(), lse_none.data(), lse_none.size(), 0.0, 0.15), "");

                       // 3. Thread count does not change a bit.
                       auto one = run_attn(s, in->q.view, in->k.view, in->v.view, lut, Recipe::fp8, s.smooth, 1);
                       EXPECT_EQ(check_bitwise(fp8->ol.data(), one->ol.data(), fp8->ol.size()), "");
                       EXPECT_EQ(check_bitwise(fp8->lse.data(), one->lse.data(), fp8->lse.size()), "");
                     }});
  }
  // With a large K mean the shift is large; without adding it back the LSE would be off by it.
  cases.push_back({"QUANT_ATTN(lse_shift=large,gqa)", [] {
                     ASpec s;
                     s.hq = 4;
                     s.hk = 2;
                     s.kmean = 6.0f;
                     s.density = 1.0;
                     std::mt19937_64 rng = rng_for("QUANT_ATTN(lse_shift=large,gqa)");
                     QSpec qs;
                     qs.hq = s.hq; qs.hk = s.hk; qs.sq = s.sq; qs.sk = s.sk; qs.d = s.d; qs.kmean = s.kmean;
                     auto in = make_inputs(qs, rng);
                     const std::int64_t nq = num_blocks(s.sq, s.blkq), nk = num_blocks(s.sk, s.blkk);
                     Lut lut = random_lut(rng, 1, s.hq, nq, nk, {nk}, 1.0);
                     auto fp8 = run_attn(s, in->q.view, in->k.view, in->v.view, lut, Recipe::fp8, true);
                     auto none = run_attn(s, in->q.view, in->k.view, in->v.view, lut, Recipe::none, false);
                     const ByHand hand = by_hand(s, *in);
                     double max_shift = 0.0, max_err = 0.0;
                     for (size_t i = 0; i < hand.shift.size(); ++i) {
                       max_shift = std::max(max_shift, std::fabs(hand.shift[i]));
                       max_err = std::max(max_err, std::fabs(static_cast<double>(fp8->lse[i]) - none->lse[i]));
                     }
                     EXPECT_GT(max_shift, 1.0);
                     EXPECT_LT(max_err, 0.1);
                     // Smoothing also keeps the K scales small: the output error with smoothing is
                     // below the error without it.
                     auto raw = run_attn(s, in->q.view, in->k.view, in->v.view, lut, Recipe::fp8, false);
                     std::vector<double> o_none(none->ol.begin(), none->ol.end());
                     const Error e_smooth = compare(fp8->ol.data(), o_none.data(), o_none.size());
                     const Error e_raw = compare(raw->ol.data(), o_none.data(), o_none.size());
                     EXPECT_LT(e_smooth.nmse, e_raw.nmse) << describe(e_smooth) << " vs " << describe(e_raw);
                   }});
  cases.push_back({"QUANT_ATTN(bad=recipe,varlen)", [] {
                     std::mt19937_64 rng = rng_for("QUANT_ATTN(bad)");
                     QSpec qs;
                     auto in = make_inputs(qs, rng);
                     const std::int64_t nk = num_blocks(qs.sk, 64);
                     Lut lut = random_lut(rng, 1, qs.hq, num_blocks(qs.sq, 64), nk, {nk}, 1.0);
                     Tensor4 o(DType::f32, 1, qs.sq, qs.hq, qs.d, Layout::nhd);
                     BlockSparseAttentionParams p;
                     p.q = in->q.view;
                     p.k = in->k.view;
                     p.v = in->v.view;
                     p.o = o.view;
                     p.lut = make_tensor(lut.lut.data(), DType::i32, {1, qs.hq, num_blocks(qs.sq, 64), num_blocks(qs.sk, 64)});
                     p.counts = make_tensor(lut.counts.data(), DType::i32, {1, qs.hq, num_blocks(qs.sq, 64)});
                     p.recipe = static_cast<Recipe>(7);
                     Status st = block_sparse_attention(p);
                     EXPECT_EQ(static_cast<int>(st.code()), static_cast<int>(StatusCode::invalid_argument));
                     EXPECT_NE(st.message().find("recipe = 7"), std::string::npos) << st.message();
                     // fp8 with varlen: unsupported (q/k/v as one packed sequence).
                     std::vector<std::int32_t> cu_q = {0, static_cast<std::int32_t>(qs.sq)}, cu_k = {0, static_cast<std::int32_t>(qs.sk)};
                     p.recipe = Recipe::fp8;
                     p.varlen.cu_seqlens_q = cu_q.data();
                     p.varlen.cu_seqlens_k = cu_k.data();
                     p.varlen.num_seqs = 1;
                     p.varlen.max_seqlen_q = static_cast<int>(qs.sq);
                     p.varlen.max_seqlen_k = static_cast<int>(qs.sk);
                     st = block_sparse_attention(p);
                     EXPECT_EQ(static_cast<int>(st.code()), static_cast<int>(StatusCode::unsupported));
                     EXPECT_EQ(st.message(), "block_sparse_attention: recipe = fp8 with varlen is not supported");
                   }});
}

}  // namespace
}  // namespace sparge::test
