// Host-side fp16 / bf16 conversions (round to nearest even), so the CPU backend and the tests need
// no CUDA headers. Bit-exact with the hardware conversions for finite values, inf and NaN.
#pragma once

#include <cstdint>
#include <cstring>

#include "sparge/types.h"

namespace sparge {

inline float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_to_float(sign);
    // Subnormal: value = mant * 2^-24.
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline std::uint16_t float_to_half(float f) {
  const std::uint32_t u = float_to_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    // Scale so that the half subnormal unit (2^-24) becomes 1, then round to nearest even.
    const float a = bits_to_float(abs) * 16777216.0f;
    auto m = static_cast<std::uint32_t>(a);
    const float rem = a - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<std::uint16_t>(sign | m);
  }
  std::uint32_t e = ((abs >> 23) - 112u) << 10;
  std::uint32_t m = (abs >> 13) & 0x3ffu;
  const std::uint32_t rest = abs & 0x1fffu;
  std::uint32_t h = e | m;
  if (rest > 0x1000u || (rest == 0x1000u && (m & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

inline float bf16_to_float(std::uint16_t b) { return bits_to_float(static_cast<std::uint32_t>(b) << 16); }

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

// Reads element `off` (in elements) of a float-typed buffer as float.
inline float load_as_float(const void* base, DType t, std::int64_t off) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[off];
    case DType::f16: return half_to_float(static_cast<const std::uint16_t*>(base)[off]);
    case DType::bf16: return bf16_to_float(static_cast<const std::uint16_t*>(base)[off]);
    default: return 0.0f;
  }
}

inline void store_from_float(void* base, DType t, std::int64_t off, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[off] = v; break;
    case DType::f16: static_cast<std::uint16_t*>(base)[off] = float_to_half(v); break;
    case DType::bf16: static_cast<std::uint16_t*>(base)[off] = float_to_bf16(v); break;
    default: break;
  }
}

}  // namespace sparge
