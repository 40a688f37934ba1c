#include "sparge/types.h"
#include "sparge/ops.h"

#include <stdexcept>

namespace sparge {

const char* to_string(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
  }
  return "?";
}

const char* to_string(Backend b) { return b == Backend::cpu ? "cpu" : "cuda"; }
const char* to_string(Recipe r) { return r == Recipe::fp8 ? "fp8" : "none"; }

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
    case DType::i32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::u8: return 1;
  }
  return 0;
}

std::int64_t Tensor::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

Tensor make_tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape) {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int>(shape.size());
  if (t.ndim > 4) throw std::invalid_argument("make_tensor: at most 4 dimensions");
  int i = 0;
  for (auto s : shape) t.shape[i++] = s;
  std::int64_t st = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.stride[d] = st;
    st *= t.shape[d];
  }
  return t;
}

Tensor make_tensor(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                   std::initializer_list<std::int64_t> stride) {
  Tensor t = make_tensor(data, dtype, shape);
  if (stride.size() != shape.size()) throw std::invalid_argument("make_tensor: shape/stride rank differ");
  int i = 0;
  for (auto s : stride) t.stride[i++] = s;
  return t;
}

Status invalid_argument(std::string message) { return {StatusCode::invalid_argument, std::move(message)}; }
Status unsupported(std::string message) { return {StatusCode::unsupported, std::move(message)}; }
Status runtime_error(std::string message) { return {StatusCode::runtime_error, std::move(message)}; }

}  // namespace sparge
