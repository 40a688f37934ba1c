// From torch to sparge and back: tensor views (no copies), execution context and status -> Python
// exception. Every op in ops.cpp goes through these, so the error types are the same everywhere:
//   invalid_argument, overflow -> ValueError      unsupported   -> NotImplementedError
//   runtime_error              -> RuntimeError
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "sparge/ops.h"
#include "validate/validate.h"  // detail::cat / detail::append: message text without iostreams

namespace sparge::py {

// Every message of this extension is built here, never by c10::str's `ostream <<` inside this
// .so: on the H200 image the extension, linked by a g++ wrapper with -Wl,-Bsymbolic-functions,
// bound `ostream << long` to a private libstdc++ copy whose locale was never set up, and the
// first message with a number in it crashed the process (SIGSEGV, 2026-11-30). TORCH_CHECK_* with
// one std::string argument hands the string through without formatting.
inline std::string text(const c10::Device& d) { return d.str(); }
inline const char* text(at::ScalarType t) { return c10::toString(t); }
inline std::string text(c10::IntArrayRef a) {
  std::string s = "[";
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (i > 0) s += ", ";
    detail::append(s, a[i]);
  }
  return s + "]";
}
template <class T>
const T& text(const T& v) {
  return v;
}
template <class... Args>
std::string msg(const Args&... args) {
  return detail::cat(text(args)...);
}

#define SPARGE_PY_CHECK(cond, ...) TORCH_CHECK(cond, ::sparge::py::msg(__VA_ARGS__))
#define SPARGE_PY_CHECK_VALUE(cond, ...) TORCH_CHECK_VALUE(cond, ::sparge::py::msg(__VA_ARGS__))
#define SPARGE_PY_CHECK_NOT_IMPLEMENTED(cond, ...) TORCH_CHECK_NOT_IMPLEMENTED(cond, ::sparge::py::msg(__VA_ARGS__))

// Throws the Python exception that matches the status code, with the library's message.
inline void throw_if_error(const Status& st) {
  if (st.ok()) return;
  switch (st.code()) {
    case StatusCode::invalid_argument:
    case StatusCode::overflow:
      SPARGE_PY_CHECK_VALUE(false, st.message());
    case StatusCode::unsupported:
      SPARGE_PY_CHECK_NOT_IMPLEMENTED(false, st.message());
    default:
      SPARGE_PY_CHECK(false, st.message());
  }
}

inline std::optional<DType> to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::f32;
    case at::kHalf: return DType::f16;
    case at::kBFloat16: return DType::bf16;
    case at::kInt: return DType::i32;
    case at::kByte:
    case at::kBool: return DType::u8;
    default: return std::nullopt;
  }
}

// A strided view of t (same storage, element strides). `op` and `name` go into error messages.
inline Tensor view(const at::Tensor& t, const char* op, const char* name) {
  SPARGE_PY_CHECK_VALUE(t.dim() >= 1 && t.dim() <= 4, op, ": ", name, " has ", t.dim(),
                    " dimensions (sparge views hold 1 to 4)");
  const auto dt = to_dtype(t.scalar_type());
  SPARGE_PY_CHECK_VALUE(dt.has_value(), op, ": ", name, ".dtype = ", t.scalar_type(),
                    " is not supported by sparge (float16, bfloat16, float32 or int32)");
  SPARGE_PY_CHECK_VALUE(t.numel() > 0, op, ": ", name, " is empty (shape ", t.sizes(), ")");
  Tensor v;
  v.data = t.data_ptr();
  v.dtype = *dt;
  v.ndim = static_cast<int>(t.dim());
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = t.size(i);
    v.stride[i] = t.stride(i);
  }
  return v;
}

// Tensor layout strings of the Python API. HND = [B, H, S, D], NHD = [B, S, H, D]; the library's
// logical order is NHD, so an HND tensor is passed as its transpose(1, 2) view.
inline bool is_hnd(std::string_view layout, const char* op) {
  SPARGE_PY_CHECK_VALUE(layout == "HND" || layout == "NHD", op, ": tensor_layout = '", std::string(layout),
                    "' (expected 'HND' = [B, H, S, D] or 'NHD' = [B, S, H, D])");
  return layout == "HND";
}

// The logical [B, S, H, D] view of a 4-D attention tensor given in `layout`.
inline at::Tensor logical(const at::Tensor& t, bool hnd, const char* op, const char* name) {
  SPARGE_PY_CHECK_VALUE(t.dim() == 4, op, ": ", name, " has ", t.dim(), " dimensions (expected 4: ",
                    hnd ? "[B, H, S, D]" : "[B, S, H, D]", ")");
  return hnd ? t.transpose(1, 2) : t;
}

// Every tensor on one device; returns it.
inline c10::Device common_device(const char* op, std::initializer_list<std::pair<const char*, const at::Tensor*>> ts) {
  const auto& first = *ts.begin();
  const c10::Device dev = first.second->device();
  for (const auto& [name, t] : ts) {
    SPARGE_PY_CHECK_VALUE(t->device() == dev, op, ": ", name, " is on ", t->device(), " but ", first.first,
                      " is on ", dev, " (all tensors must be on one device)");
  }
  SPARGE_PY_CHECK_VALUE(dev.is_cpu() || dev.is_cuda(), op, ": tensors on ", dev,
                    " are not supported (expected cpu or cuda)");
  return dev;
}

// The q / k / v of an attention binding as the library's logical [B, S, H, D] views, and the
// outputs every attention binding allocates and hands to its params struct.
struct AttentionArgs {
  AttentionArgs(const char* op_name, std::string_view layout, const at::Tensor& q_user_, const at::Tensor& k_user,
                const at::Tensor& v_user)
      : op(op_name),
        hnd(is_hnd(layout, op_name)),
        q_user(q_user_),
        q(logical(q_user_, hnd, op_name, "q")),
        k(logical(k_user, hnd, op_name, "k")),
        v(logical(v_user, hnd, op_name, "v")) {}

  // Allocates o (q's shape, layout and dtype) and lse ([B, H, S] f32, an empty [0] tensor unless
  // asked for), sets p's q / k / v / o / maybe_lse views, and returns (o, lse).
  template <class Params>
  std::tuple<at::Tensor, at::Tensor> outputs(Params& p, bool return_lse) const {
    at::Tensor o = at::empty(q_user.sizes(), q_user.options());
    at::Tensor lse = return_lse ? at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat))
                                : at::empty({0}, q.options().dtype(at::kFloat));
    p.q = view(q, op, "q");
    p.k = view(k, op, "k");
    p.v = view(v, op, "v");
    p.o = view(logical(o, hnd, op, "o"), op, "o");
    if (return_lse) p.maybe_lse = view(lse, op, "lse");
    return {o, lse};
  }

  const char* op;
  bool hnd;
  at::Tensor q_user;  // as the caller passed it (o takes its layout)
  at::Tensor q, k, v;
};

// A per-head parameter (`float[]?` in the schema) as floats that outlive the call.
struct PerHeadValues {
  std::vector<float> values;
  PerHead span() const { return {values.data(), values.size()}; }
};
inline PerHeadValues per_head(std::optional<c10::ArrayRef<double>> v) {
  PerHeadValues out;
  if (v.has_value()) {
    for (double x : *v) out.values.push_back(static_cast<float>(x));
  }
  return out;
}

}  // namespace sparge::py
