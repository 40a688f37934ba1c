// Memory and timing on the backend the tool runs: a buffer that is plain host memory for the CPU
// backend and cudaMalloc'd memory for CUDA (with checked copies), a stream, and a timer that uses
// CUDA events around GPU work and steady_clock around CPU work. This header needs no CUDA headers.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "sparge/types.h"

namespace sparge::tool {

class Stream;

// Memory of one backend. For the CPU backend a buffer may wrap existing host memory (no copy).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates `bytes` on `backend`; `what` names the buffer in error messages.
  DeviceBuffer(Backend backend, std::size_t bytes, const std::string& what);
  // CPU: wraps host memory; CUDA: allocates and uploads a copy.
  static DeviceBuffer mirror(Backend backend, void* host, std::size_t bytes, const std::string& what);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  void upload(const void* host, std::size_t bytes);
  void download(void* host, std::size_t bytes) const;
  // Fills every byte with `value` (used to poison outputs before a run).
  void fill_bytes(unsigned char value);
  // Copies the first `bytes` of `src` (same backend) into this buffer, queued on `stream` (CUDA:
  // device to device, asynchronous; CPU: memcpy). The bench times it as the device's copy rate.
  Status copy_from(const DeviceBuffer& src, std::size_t bytes, const Stream& stream);
  // Reads the first `bytes` (a multiple of 16) once with a plain streaming kernel, queued on `stream`
  // (CUDA only; `sink` holds at least 4 bytes). The bench times it as the device's read rate.
  Status read_once(std::size_t bytes, DeviceBuffer& sink, const Stream& stream) const;

 private:
  Backend backend_ = Backend::cpu;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  bool owned_ = false;
  std::string what_;
};

// A stream for the CUDA backend (nullptr on the CPU backend), destroyed with the object.
class Stream {
 public:
  explicit Stream(Backend backend);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void* handle() const { return stream_; }
  // Waits for the stream and turns a pending CUDA error into a ToolError naming `what`.
  void sync(const std::string& what) const;

 private:
  Backend backend_;
  void* stream_ = nullptr;
};

// Times one call in milliseconds: CUDA events recorded on the stream around the call (then a
// synchronize), or steady_clock around a CPU call. The call's Status is checked (ToolError).
class Timer {
 public:
  Timer(Backend backend, const Stream& stream);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  double time_ms(const std::function<Status()>& call, const std::string& what);

 private:
  Backend backend_;
  const Stream& stream_;
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

// Name of the GPU (or "cpu, N threads"), for the report header.
std::string device_description(Backend backend, int cpu_threads);

}  // namespace sparge::tool
