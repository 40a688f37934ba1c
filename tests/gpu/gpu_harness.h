// GPU side of the test harness: device buffers with guard regions and poisoned payloads, mirrors of
// harness.h's Guarded<T>. Copy a host vector in, run, copy back, check guards.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "harness/harness.h"

#define SPARGE_CUDA_CHECK(expr)                                                              \
  do {                                                                                       \
    cudaError_t sparge_err_ = (expr);                                                        \
    if (sparge_err_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                   \
                   cudaGetErrorString(sparge_err_));                                         \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)

namespace sparge::test {

// n elements of T between two guard regions of kGuardBytes filled with kGuardByte.
template <class T>
class DeviceGuarded {
 public:
  explicit DeviceGuarded(std::size_t n = 0) { resize(n); }
  ~DeviceGuarded() {
    if (raw_) cudaFree(raw_);
  }
  DeviceGuarded(const DeviceGuarded&) = delete;
  DeviceGuarded& operator=(const DeviceGuarded&) = delete;

  void resize(std::size_t n) {
    if (raw_) SPARGE_CUDA_CHECK(cudaFree(raw_));
    n_ = n;
    bytes_ = kGuardBytes * 2 + n * sizeof(T);
    SPARGE_CUDA_CHECK(cudaMalloc(&raw_, bytes_));
    SPARGE_CUDA_CHECK(cudaMemset(raw_, kGuardByte, bytes_));
  }
  T* data() { return reinterpret_cast<T*>(static_cast<unsigned char*>(raw_) + kGuardBytes); }
  std::size_t size() const { return n_; }

  void upload(const std::vector<T>& host) {
    if (host.size() != n_) std::abort();
    SPARGE_CUDA_CHECK(cudaMemcpy(data(), host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> out(n_);
    SPARGE_CUDA_CHECK(cudaMemcpy(out.data(), const_cast<DeviceGuarded*>(this)->data(), n_ * sizeof(T),
                                 cudaMemcpyDeviceToHost));
    return out;
  }
  // Fills the payload with the poison pattern of harness.h (NaN for floats, 0x7fbadbad for i32).
  void poison() {
    Guarded<T> h(n_);
    h.poison();
    SPARGE_CUDA_CHECK(cudaMemcpy(data(), h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  bool guards_intact() const {
    std::vector<unsigned char> h(bytes_);
    SPARGE_CUDA_CHECK(cudaMemcpy(h.data(), raw_, bytes_, cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < kGuardBytes; ++i) {
      if (h[i] != kGuardByte || h[kGuardBytes + n_ * sizeof(T) + i] != kGuardByte) return false;
    }
    return true;
  }

 private:
  void* raw_ = nullptr;
  std::size_t n_ = 0;
  std::size_t bytes_ = 0;
};

// True when a GPU is present; GPU tests skip (GTEST_SKIP) without one.
inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Sets an environment variable for the scope (nullptr: unset), then restores its previous state:
// the run-time switches the GPU tests compare (read per call by the kernels' hosts).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr) ::setenv(name, value, 1); else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) ::setenv(name_, old_.c_str(), 1); else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace sparge::test
