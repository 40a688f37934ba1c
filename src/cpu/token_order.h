// The total order in which topk_select ranks scores, shared by the CPU backend and (by including
// this header) the CUDA radix select, so the two pick the same indices bit for bit.
//
// A score is mapped to an unsigned 32-bit key whose unsigned order is the order of the values:
//   - -0.0 is canonicalised to +0.0 first, so the two zeros are equal values (a tie, broken by
//     index like every other tie) and never ranked against each other;
//   - positive values get the sign bit set, negative values are bit-inverted, so larger floats give
//     larger keys; +inf gets the largest key of any non-NaN value, -inf the smallest.
// f16 scores are widened to f32 first (exact), so both dtypes share one key space.
// NaN has no place in the order; callers reject it before asking for a key.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPARGE_TOKEN_HD __host__ __device__
#else
#define SPARGE_TOKEN_HD
#endif

namespace sparge::token {

// The key of -inf. Scores with this key are never selected.
inline constexpr std::uint32_t kNegInfKey = ~0xff800000u;  // 0x007fffff

SPARGE_TOKEN_HD inline std::uint32_t order_key(std::uint32_t float_bits) {
  if (float_bits == 0x80000000u) float_bits = 0u;  // -0.0 ranks as +0.0
  return (float_bits & 0x80000000u) ? ~float_bits : (float_bits | 0x80000000u);
}

SPARGE_TOKEN_HD inline bool is_nan_bits(std::uint32_t float_bits) {
  return (float_bits & 0x7fffffffu) > 0x7f800000u;
}

}  // namespace sparge::token
