// Shared pieces of the sparge tool: errors and exit codes, host arrays of any float dtype, random
// inputs, tensor views for NHD/HND storage, timing statistics, error metrics and tolerances, and a
// heartbeat that reports progress of long CPU work on stderr.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "sparge/ops.h"

namespace sparge::tool {

// Exit codes: 0 success, 1 a validation FAIL, 2 bad command line, 3 an error from the library,
// CUDA or the environment (printed with its message).
constexpr int kExitFail = 1;
constexpr int kExitUsage = 2;
constexpr int kExitError = 3;

struct ToolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws ToolError("what: <library message>") when st is not ok.
void check(const Status& st, const std::string& what);

// "fp16" / "bf16" / "fp32" <-> DType.
DType parse_dtype(const std::string& s);
const char* dtype_flag(DType t);

// A host array of n elements of a float dtype (f32, f16, bf16) or i32 / u8.
class HostArray {
 public:
  HostArray() = default;
  HostArray(DType t, std::int64_t n) : dtype_(t), n_(n), bytes_(static_cast<size_t>(n) * dtype_size(t)) {}
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  std::size_t bytes() const { return bytes_.size(); }
  std::int64_t size() const { return n_; }
  DType dtype() const { return dtype_; }
  float get(std::int64_t i) const;
  void set(std::int64_t i, float v);
  template <class T>
  T* as() { return reinterpret_cast<T*>(bytes_.data()); }
  template <class T>
  const T* as() const { return reinterpret_cast<const T*>(bytes_.data()); }

 private:
  DType dtype_ = DType::f32;
  std::int64_t n_ = 0;
  std::vector<unsigned char> bytes_;
};

// Fills with N(0, 1) values rounded to the array's dtype. The values depend on the seed only (the
// work is split into fixed chunks, each with its own generator), not on the thread count.
void fill_normal(HostArray& a, std::uint64_t seed, int threads);
// A fresh seed from std::random_device.
std::uint64_t fresh_seed();
// splitmix64: mixes a seed with a salt into an independent seed.
std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t salt);

// Runs fn(i) for i in [0, n) on `threads` threads (0 = all), indices claimed one at a time.
void parallel_for(std::int64_t n, int threads, const std::function<void(std::int64_t)>& fn);
int resolve_threads(int threads);

// Logical [B, S, H, D] view of storage in NHD ([B, S, H, D]) or HND ([B, H, S, D]) order.
Tensor bshd_view(void* data, DType t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d, bool hnd);

// Median, min and max of a list of times (ms).
struct Timing {
  double median = 0, min = 0, max = 0;
};
Timing summarize(std::vector<double> ms);

// Error of an output against a reference. NaN/Inf must match exactly (same class, same position);
// finite pairs feed max |err| and the normalized error sum (out - ref)^2 / sum ref^2.
struct ErrorStats {
  double max_abs = 0;
  double sum_sq_err = 0;
  double sum_sq_ref = 0;
  std::int64_t nonfinite_mismatch = 0;
  std::int64_t count = 0;
  void add(double out, double ref);
  void merge(const ErrorStats& o);
  double nmse() const { return sum_sq_ref > 0 ? sum_sq_err / sum_sq_ref : sum_sq_err; }
};

// Tolerances of one dtype: on O of unit-normal inputs and on LSE (nats).
struct Tolerance {
  double o_abs, o_nmse, lse_abs;
};
Tolerance tolerance_for(DType t);
// "PASS"/"FAIL" line for one part: "<name>: PASS  max_abs=... nmse=... (tol abs ... nmse ...)".
bool report_error(const std::string& name, const ErrorStats& e, double abs_tol, double nmse_tol,
                  const std::string& note = "");

// Progress of long CPU work, printed to stderr every 2 s ("[oracle] 40%") once the work has
// taken more than 2 s. add() is thread-safe.
class Heartbeat {
 public:
  Heartbeat(std::string label, std::int64_t total);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;
  void add(std::int64_t n = 1) { done_.fetch_add(n, std::memory_order_relaxed); }

 private:
  std::string label_;
  std::int64_t total_;
  std::atomic<std::int64_t> done_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace sparge::tool
