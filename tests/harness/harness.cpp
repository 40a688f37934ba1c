#include "harness/harness.h"

#include <cstdlib>
#include <map>

namespace sparge::test {

namespace {
std::vector<std::pair<std::string, Generator>>& generators() {
  static std::vector<std::pair<std::string, Generator>> g;
  return g;
}
}  // namespace

Register::Register(const char* suite, Generator gen) { generators().emplace_back(suite, std::move(gen)); }

std::vector<std::pair<std::string, Generator>>& all_generators() { return generators(); }

std::uint64_t base_seed() {
  static const std::uint64_t seed = [] {
    if (const char* s = std::getenv("SPARGE_SEED")) return static_cast<std::uint64_t>(std::strtoull(s, nullptr, 0));
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  }();
  return seed;
}

std::mt19937_64 rng_for(const std::string& salt) {
  std::uint64_t h = 1469598103934665603ull ^ base_seed();
  for (char c : salt) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return std::mt19937_64(h);
}

void fill_normal(std::vector<float>& v, std::mt19937_64& rng, float mean, float stddev) {
  std::normal_distribution<float> d(mean, stddev);
  for (auto& x : v) x = d(rng);
}

void fill_uniform(std::vector<float>& v, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  for (auto& x : v) x = d(rng);
}

std::vector<std::uint16_t> to_storage16(const std::vector<float>& v, DType t) {
  std::vector<std::uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = t == DType::f16 ? float_to_half(v[i]) : float_to_bf16(v[i]);
  return out;
}

std::vector<float> round_through(const std::vector<float>& v, DType t) {
  if (t == DType::f32) return v;
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = t == DType::f16 ? half_to_float(float_to_half(v[i])) : bf16_to_float(float_to_bf16(v[i]));
  }
  return out;
}

namespace {
template <class R>
Error compare_impl(const float* out, const R* ref, std::size_t n) {
  Error e;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double o = out[i];
    const double r = static_cast<double>(ref[i]);
    const bool of = std::isfinite(o), rf = std::isfinite(r);
    if (!of || !rf) {
      const bool same = (std::isnan(o) && std::isnan(r)) || (std::isinf(o) && std::isinf(r) && (o > 0) == (r > 0));
      if (!same) {
        ++e.nonfinite_mismatch;
        if (e.first_bad < 0) e.first_bad = static_cast<std::int64_t>(i);
      }
      continue;
    }
    const double d = std::abs(o - r);
    if (d > e.max_abs) e.max_abs = d;
    num += d * d;
    den += r * r;
  }
  e.nmse = den > 0 ? num / den : num;
  return e;
}
}  // namespace

Error compare(const float* out, const double* ref, std::size_t n) { return compare_impl(out, ref, n); }
Error compare(const float* out, const float* ref, std::size_t n) { return compare_impl(out, ref, n); }

std::string describe(const Error& e) {
  std::ostringstream os;
  os << "max_abs=" << e.max_abs << " nmse=" << e.nmse << " nonfinite_mismatch=" << e.nonfinite_mismatch;
  if (e.first_bad >= 0) os << " first_bad=" << e.first_bad;
  return os.str();
}

}  // namespace sparge::test
