// The fp8 recipe's quantization rule (docs/quantized.md), written once for the host (the CPU
// specification, the tests) and the device (the GPU prepass, src/cuda/quant/). Every function here
// is exact integer or IEEE arithmetic with a single defined result, so the host and the device
// produce the same bytes from the same inputs:
//   - e4m3 encoding: round to nearest even, saturating to +-448 (inf too), NaN -> 0x7F; bit-exact
//     with PTX cvt.rn.satfinite.e4m3x2.f32 (the device uses that instruction from sm_89 on; the GPU
//     test compares the two over all 2^32 floats);
//   - scales are powers of two, so x * (1 / scale) and e4m3 * scale are exact (no rounding besides
//     the e4m3 encoding itself);
//   - amax is a maximum over the bit patterns of |x| (NaN bits are above inf's), which needs no
//     fmax NaN convention and is order independent (atomicMax on the bits is the same maximum);
//   - the LSE shift is summed in fp64 in a fixed order (products of two floats are exact in fp64).
#pragma once

#include <cstdint>
#include <vector>
#if !defined(__CUDA_ARCH__)
#include <cstring>
#endif

#if defined(__CUDACC__)
#define SPARGE_QUANT_HD __host__ __device__ __forceinline__
#else
#define SPARGE_QUANT_HD inline
#endif

namespace sparge::quant {

constexpr float kE4m3Max = 448.0f;
constexpr std::uint8_t kE4m3NaN = 0x7f;
// The scale exponent's floor: 2^-126 is the smallest normal float, so scale and 1/scale stay normal.
constexpr int kMinScaleExp = -126;
// V keys are permuted within groups of this many (v_key_perm).
constexpr int kVPermGroup = 32;

SPARGE_QUANT_HD std::uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

SPARGE_QUANT_HD float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// |x| as bits: the quantity every amax is a maximum of.
SPARGE_QUANT_HD std::uint32_t abs_bits(float x) { return float_bits(x) & 0x7fffffffu; }

// ---- e4m3 -------------------------------------------------------------------------------------
// 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; 0x7F / 0xFF are NaN (no inf); max finite
// 448 = 0x7E; subnormals n * 2^-9, n = 1..7.

// The encoder in integer arithmetic (the host's, and the device's below sm_89).
SPARGE_QUANT_HD std::uint8_t e4m3_encode_soft(float x) {
  const std::uint32_t u = float_bits(x);
  const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return kE4m3NaN;  // NaN of either sign -> the canonical 0x7F
  // Above 448 (inf included): satfinite. 464, the midpoint to the next (NaN) code, also rounds
  // to 448 (even mantissa), so "> 448" is the whole saturating range.
  if (a > 0x43e00000u) return static_cast<std::uint8_t>(sign | 0x7eu);
  // At or below 2^-10, half the smallest subnormal: the tie goes to the even zero.
  if (a <= 0x3a800000u) return sign;
  const int e = static_cast<int>(a >> 23) - 127;
  std::uint32_t code, rem, half;
  if (e >= -6) {  // normal e4m3: keep 3 of the 23 mantissa bits
    code = (static_cast<std::uint32_t>(e + 7) << 3) | ((a >> 20) & 7u);
    rem = a & 0xfffffu;
    half = 0x80000u;
  } else {  // subnormal e4m3 (e in -10..-7): n = |x| * 2^9 = sig * 2^(e - 14)
    const std::uint32_t sig = (a & 0x7fffffu) | 0x800000u;
    const int shift = 14 - e;  // 21..24
    code = sig >> shift;
    rem = sig & ((1u << shift) - 1u);
    half = 1u << (shift - 1);
  }
  // Round to nearest even; a carry out of the mantissa correctly bumps the exponent (and n = 8
  // is the smallest normal, 0x08).
  if (rem > half || (rem == half && (code & 1u))) ++code;
  return static_cast<std::uint8_t>(sign | code);
}

SPARGE_QUANT_HD float e4m3_to_float(std::uint8_t c) {
  const std::uint32_t sign = static_cast<std::uint32_t>(c & 0x80u) << 24;
  const std::uint32_t e = (c >> 3) & 15u, m = c & 7u;
  if (e == 15u && m == 7u) return bits_float(0x7fc00000u | sign);
  if (e == 0u) {
    // n * 2^-9 is exact in float: n is three bits.
    const float v = static_cast<float>(m) * 0.001953125f;
    return bits_float(float_bits(v) | sign);
  }
  return bits_float(sign | ((e + 120u) << 23) | (m << 20));
}

#if defined(__CUDACC__)
// Two values into two e4m3 bytes, lo at the lower address (little endian: the low byte). PTX
// `cvt.rn.satfinite.e4m3x2.f32 d, a, b` puts a in the upper byte, so hi goes first.
__device__ __forceinline__ std::uint16_t e4m3x2_device(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  std::uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<std::uint16_t>(e4m3_encode_soft(lo) | (e4m3_encode_soft(hi) << 8));
#endif
}
#endif

// ---- power-of-two scales ------------------------------------------------------------------------
// A group with max |x| = amax = m * 2^e (m in [0.5, 1)) gets scale = 2^max(-126, e - 9 + (m > 0.875)):
// amax / scale = m * 2^9 <= 448 when m <= 0.875, else m * 2^8 < 256. An all-zero group, or one
// whose amax is inf or NaN, gets scale 1 (the data then holds inf/NaN and the encoding gives what
// it gives: NaN -> NaN, inf -> 448).
struct Pow2Scale {
  float scale;  // the dequantization factor
  float inv;    // 1 / scale, exact
};

SPARGE_QUANT_HD int scale_exponent(std::uint32_t amax_bits) {
  if (amax_bits == 0u || amax_bits >= 0x7f800000u) return 0;
  // A subnormal amax has e <= -125, far below the floor.
  if (amax_bits < 0x00800000u) return kMinScaleExp;
  const int e = static_cast<int>(amax_bits >> 23) - 126;  // frexp's exponent
  // m > 0.875 <=> the float's significand 1.f > 1.75 <=> f > 0x600000.
  const int up = (amax_bits & 0x7fffffu) > 0x600000u ? 1 : 0;
  const int k = e - 9 + up;
  return k < kMinScaleExp ? kMinScaleExp : k;
}

// 2^k for k in [-126, 127] (normal floats only; scale_exponent stays in [-126, 120]).
SPARGE_QUANT_HD float pow2(int k) { return bits_float(static_cast<std::uint32_t>(k + 127) << 23); }

SPARGE_QUANT_HD Pow2Scale pow2_scale(std::uint32_t amax_bits) {
  const int k = scale_exponent(amax_bits);
  return {pow2(k), pow2(-k)};
}

// The quantized byte of x in a group of inverse scale inv. The multiply is exact (inv is a power
// of two; results below 2^-126 are far below e4m3's smallest subnormal and encode to +-0 either way).
SPARGE_QUANT_HD std::uint8_t quantize(float x, float inv) { return e4m3_encode_soft(x * inv); }

SPARGE_QUANT_HD float dequantize(std::uint8_t c, float scale) { return e4m3_to_float(c) * scale; }

// ---- K smoothing --------------------------------------------------------------------------------
// The smoothed key value that is quantized: one fp32 subtraction of the fp32 mean.
SPARGE_QUANT_HD float smooth(float k, float k_mean) { return k - k_mean; }

// ---- V key permutation ----------------------------------------------------------------------------
// Within each group of 32 keys, byte c of v8t's row holds key v_key_perm(c): the order in which
// the Hopper kernel's P registers (the fp8 wgmma A fragment) meet V, so the kernel needs no
// register shuffles. c = 16h + 4a + 2b + e  ->  key 16h + 8b + 2a + e.
SPARGE_QUANT_HD int v_key_perm(int c) { return 16 * (c / 16) + 8 * ((c % 4) / 2) + 2 * ((c % 16) / 4) + (c % 2); }

// The inverse: the byte position of key j within its group. j = 16h + 8b + 2a + e  ->  16h + 4a + 2b + e.
SPARGE_QUANT_HD int v_key_pos(int j) { return 16 * (j / 16) + 4 * ((j % 8) / 2) + 2 * ((j % 16) / 8) + (j % 2); }

// ---- LSE shift ----------------------------------------------------------------------------------
// lse_shift = scale * sum_d q[d] * k_mean[d] in fp64 (each product of two floats is exact there),
// summed in a fixed order: channels in chunks of 8 (one 16-byte vector of a GPU thread), each
// chunk ascending from 0.0; then the chunk sums by a pairwise tree (neighbours first: ((c0 + c1) +
// (c2 + c3)) + ..., zero chunks padding the count to a power of two), which is what a butterfly of
// xor shuffles over the row's lanes computes (a + b == b + a exactly); finally times scale (fp64).
// A chunk sum is never -0.0 (it starts at +0.0), so the zero padding changes no bit.
constexpr int kShiftChunk = 8;

// n <= kShiftChunk channels (only the last chunk of a head dim that is not a multiple of 8 is short).
SPARGE_QUANT_HD double dot_chunk(const float* q, const float* km, int n = kShiftChunk) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += static_cast<double>(q[i]) * static_cast<double>(km[i]);
  return s;
}

// Host form of the whole sum; the device forms the same tree with xor shuffles over the lanes
// that hold a row's chunks.
inline double lse_shift(const float* q, const float* km, int d, double scale) {
  const int n = (d + kShiftChunk - 1) / kShiftChunk;
  int p = 1;
  while (p < n) p *= 2;
  std::vector<double> c(static_cast<std::size_t>(p), 0.0);
  for (int i = 0; i < n; ++i) c[i] = dot_chunk(q + i * kShiftChunk, km + i * kShiftChunk, d - i * kShiftChunk < kShiftChunk ? d - i * kShiftChunk : kShiftChunk);
  for (int w = 1; w < p; w *= 2) {
    for (int i = 0; i + w < p; i += 2 * w) c[i] = c[i] + c[i + w];
  }
  return scale * c[0];
}

}  // namespace sparge::quant
