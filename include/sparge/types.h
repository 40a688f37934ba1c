// sparge: tensors, dtypes, backends and the status type shared by every operation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

namespace sparge {

enum class DType : std::uint8_t { f32, f16, bf16, i32, u8 };
enum class Backend : std::uint8_t { cpu, cuda };

const char* to_string(DType t);
const char* to_string(Backend b);
std::size_t dtype_size(DType t);

// A strided view of up to 4 dimensions. Strides are in elements (not bytes) and 64-bit, so both
// NHD ([B, S, H, D]) and HND ([B, H, S, D]) storage are described without copies: the logical order
// of the dimensions is fixed by each operation, the strides say where the elements live.
// A stride of 0 broadcasts. `data == nullptr` means "absent" for the optional tensors (maybe_*).
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  std::int64_t shape[4] = {0, 0, 0, 0};
  std::int64_t stride[4] = {0, 0, 0, 0};

  bool present() const { return data != nullptr; }
  std::int64_t numel() const;
  // Offset in elements of the element at idx (idx has ndim entries).
  std::int64_t offset(std::int64_t i0, std::int64_t i1 = 0, std::int64_t i2 = 0,
                      std::int64_t i3 = 0) const {
    return i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3];
  }
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

// Row-major contiguous view of the given shape.
Tensor make_tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape);
// View with explicit element strides.
Tensor make_tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                   std::initializer_list<std::int64_t> stride);

enum class StatusCode : std::uint8_t { ok, invalid_argument, unsupported, runtime_error, overflow };

// The result of every operation. The message names the operation, the parameter and the bad value,
// e.g. "build_block_map: blkq = 96 is not supported (expected 64 or 128)".
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok_status() { return {}; }
  bool ok() const { return code_ == StatusCode::ok; }
  explicit operator bool() const { return ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

Status invalid_argument(std::string message);
Status unsupported(std::string message);
Status runtime_error(std::string message);

// Where and how an operation runs. Every params struct carries one.
// backend == cuda: every tensor and cu_seqlens pointer is device memory; `stream` is a cudaStream_t.
// backend == cpu:  everything is host memory; `cpu_threads` = 0 uses all hardware threads.
struct Exec {
  Backend backend = Backend::cpu;
  void* stream = nullptr;
  int cpu_threads = 0;
};

// A per-head parameter: empty = not given, one value = the same for every head, Hq values = per
// query head. Always host memory, also for the CUDA backend.
using PerHead = std::span<const float>;

}  // namespace sparge
