// One test harness for every operation (modelled on ggml's test-backend-ops): named cases
// ("ATTN(b=2,hq=8,hk=2,sq=113,...)"), a regex filter (--filter=REGEX or SPARGE_FILTER), guard
// regions around every output buffer, output buffers poisoned before each run, fresh random inputs
// (seed printed, SPARGE_SEED to reproduce), and per-case error judgement.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "sparge/half.h"
#include "sparge/ops.h"

namespace sparge::test {

// ---- named cases -------------------------------------------------------------------------------
struct Case {
  std::string name;            // e.g. ATTN(b=2,hq=8,hk=2,sq=113,sk=203,d=128,causal=1)
  std::function<void()> run;   // uses gtest assertions
};

// A generator adds cases to a suite; generators register themselves at static-init time and main()
// (harness/main.cpp) turns the cases that pass the filter into gtest tests.
using Generator = std::function<void(std::vector<Case>&)>;
struct Register {
  Register(const char* suite, Generator gen);
};
#define SPARGE_CASES_CAT2(a, b) a##b
#define SPARGE_CASES_CAT(a, b) SPARGE_CASES_CAT2(a, b)
// Usage: SPARGE_CASES(BlockMap) { cases.push_back({name, [=] { ... }}); }
#define SPARGE_CASES(suite)                                                              \
  static void SPARGE_CASES_CAT(sparge_gen_, suite)(std::vector<::sparge::test::Case>&); \
  static ::sparge::test::Register SPARGE_CASES_CAT(sparge_reg_, suite)(                  \
      #suite, SPARGE_CASES_CAT(sparge_gen_, suite));                                     \
  static void SPARGE_CASES_CAT(sparge_gen_, suite)(std::vector<::sparge::test::Case> & cases)

// Builds "NAME(k=v,k=v,...)".
class Name {
 public:
  explicit Name(std::string op) : s_(std::move(op)) { s_ += '('; }
  template <class T>
  Name& operator()(const char* key, const T& value) {
    if (s_.back() != '(') s_ += ',';
    std::ostringstream os;
    os << key << '=' << value;
    s_ += os.str();
    return *this;
  }
  std::string str() const { return s_ + ')'; }
  operator std::string() const { return str(); }

 private:
  std::string s_;
};

// ---- randomness --------------------------------------------------------------------------------
// The run's base seed: SPARGE_SEED if set, else fresh from std::random_device (printed by main).
std::uint64_t base_seed();
// A generator for one case: base seed mixed with the case's own salt.
std::mt19937_64 rng_for(const std::string& salt);

void fill_normal(std::vector<float>& v, std::mt19937_64& rng, float mean = 0.0f, float stddev = 1.0f);
void fill_uniform(std::vector<float>& v, std::mt19937_64& rng, float lo, float hi);

// ---- guarded buffers ---------------------------------------------------------------------------
// A host buffer of n payload elements between two guard regions filled with a sentinel byte
// pattern. poison() fills the payload with a pattern that no correct output contains (NaN with a
// payload for floats, 0x7fbadbad for ints), so an element the operation forgot to write shows up.
constexpr std::size_t kGuardBytes = 256;
constexpr unsigned char kGuardByte = 0xa5;

template <class T>
class Guarded {
 public:
  explicit Guarded(std::size_t n = 0) { resize(n); }
  void resize(std::size_t n) {
    n_ = n;
    raw_.assign(kGuardBytes * 2 + n * sizeof(T), kGuardByte);
  }
  T* data() { return reinterpret_cast<T*>(raw_.data() + kGuardBytes); }
  const T* data() const { return reinterpret_cast<const T*>(raw_.data() + kGuardBytes); }
  std::size_t size() const { return n_; }
  T& operator[](std::size_t i) { return data()[i]; }
  const T& operator[](std::size_t i) const { return data()[i]; }
  void poison() {
    if constexpr (sizeof(T) == 4) {
      const std::uint32_t pat = 0x7fbadbadu;  // a NaN as f32, a large positive value as i32
      for (std::size_t i = 0; i < n_; ++i) std::memcpy(&data()[i], &pat, 4);
    } else if constexpr (sizeof(T) == 2) {
      const std::uint16_t pat = 0x7e5a;  // NaN as f16 and bf16
      for (std::size_t i = 0; i < n_; ++i) std::memcpy(&data()[i], &pat, 2);
    } else {
      std::memset(data(), 0xcd, n_ * sizeof(T));
    }
  }
  // True when both guard regions still hold the sentinel.
  bool guards_intact() const {
    for (std::size_t i = 0; i < kGuardBytes; ++i) {
      if (raw_[i] != kGuardByte || raw_[kGuardBytes + n_ * sizeof(T) + i] != kGuardByte) return false;
    }
    return true;
  }
  std::vector<unsigned char>& raw() { return raw_; }

 private:
  std::size_t n_ = 0;
  std::vector<unsigned char> raw_;
};

// Converts f32 values to storage of dtype t (f32, f16, bf16), and back (with the rounding the
// storage applies, so references can use exactly the values the kernel sees).
std::vector<std::uint16_t> to_storage16(const std::vector<float>& v, DType t);
std::vector<float> round_through(const std::vector<float>& v, DType t);

// ---- comparison --------------------------------------------------------------------------------
struct Error {
  double max_abs = 0;     // max |out - ref| over finite pairs
  double nmse = 0;        // sum (out-ref)^2 / sum ref^2
  std::int64_t nonfinite_mismatch = 0;  // positions where NaN/Inf status differs
  std::int64_t first_bad = -1;
};
// NaN/Inf must match exactly (same class at the same position); finite pairs feed the metrics.
Error compare(const float* out, const double* ref, std::size_t n);
Error compare(const float* out, const float* ref, std::size_t n);

std::string describe(const Error& e);

}  // namespace sparge::test
