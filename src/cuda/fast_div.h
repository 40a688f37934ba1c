// Division of n < 2^31 by a fixed d in [1, 2^31) as a multiply-high and a shift, for index decoding
// in kernels whose counts fit in 31 bits (the quantization prepass's stream schedule, the block
// map's selection rows). Plain C++ (host and device), so the CPU tests check it.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPARGE_FAST_DIV_HD __host__ __device__ __forceinline__
#else
#define SPARGE_FAST_DIV_HD inline
#endif

namespace sparge::cuda {

// With l = ceil(log2 d) and m = ceil(2^(31 + l) / d) (< 2^32), floor(n / d) = floor(n m / 2^(31 + l)):
// the error n (m d - 2^(31 + l)) / (d 2^(31 + l)) is below n 2^l / (d 2^(31 + l)) < 1 / d, which
// never reaches the next integer.
struct FastDiv {
  std::uint32_t d = 1, m = 0, s = 0;
  FastDiv() = default;
  explicit FastDiv(std::uint32_t div) : d(div) {
    std::uint32_t l = 0;
    while ((std::uint64_t{1} << l) < div) ++l;
    if (l > 0) {
      m = static_cast<std::uint32_t>(((std::uint64_t{1} << (31 + l)) + div - 1) / div);
      s = l - 1;
    }
  }
  SPARGE_FAST_DIV_HD std::uint32_t div(std::uint32_t n) const {
    if (d == 1) return n;
#if defined(__CUDA_ARCH__)
    return __umulhi(n, m) >> s;
#else
    return static_cast<std::uint32_t>((static_cast<std::uint64_t>(n) * m) >> 32) >> s;
#endif
  }
};

}  // namespace sparge::cuda
