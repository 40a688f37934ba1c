// Host-side validation shared by every backend: each operation's params are checked here, before
// any backend sees them, and every error names the operation, the parameter and the bad value.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>

#include "sparge/ops.h"

#define SPARGE_RETURN_IF_ERROR(expr)      \
  do {                                    \
    ::sparge::Status sparge_st_ = (expr); \
    if (!sparge_st_.ok()) return sparge_st_; \
  } while (0)

namespace sparge::detail {

// Appends one value as `std::ostream <<` would print it with default flags (integers in decimal,
// floating point as "%g", bool as 0/1, pointers as %p).
//
// No iostreams on purpose: a host compiler that links parts of libstdc++ statically (as the
// H200 image's /opt/gcc wrapper did for the Python extension), together with
// -Wl,-Bsymbolic-functions, bound our `ostream <<` calls to a private copy of the stream code
// whose locale facets were never initialised: the first error message with a number in it
// crashed the process (SIGSEGV in std::ostream::_M_insert<long>). to_chars and snprintf carry
// no such state.
template <class T>
void append(std::string& out, const T& v) {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bool>) {
    out.push_back(v ? '1' : '0');
  } else if constexpr (std::is_same_v<U, char> || std::is_same_v<U, signed char> || std::is_same_v<U, unsigned char>) {
    out.push_back(static_cast<char>(v));
  } else if constexpr (std::is_integral_v<U>) {
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
  } else if constexpr (std::is_enum_v<U>) {
    append(out, static_cast<std::underlying_type_t<U>>(v));
  } else if constexpr (std::is_floating_point_v<U>) {
    char buf[32];
    const int n = std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
    out.append(buf, static_cast<std::size_t>(n > 0 ? n : 0));
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    if constexpr (std::is_pointer_v<U>) {
      if (v == nullptr) {
        out.append("(null)");
        return;
      }
    }
    out.append(std::string_view(v));
  } else if constexpr (std::is_pointer_v<U>) {
    char buf[32];
    const int n = std::snprintf(buf, sizeof buf, "%p", static_cast<const void*>(v));
    out.append(buf, static_cast<std::size_t>(n > 0 ? n : 0));
  } else {
    static_assert(std::is_convertible_v<const T&, std::string_view>, "detail::cat: no conversion for this type");
  }
}

template <class... Args>
std::string cat(const Args&... args) {
  std::string out;
  (append(out, args), ...);
  return out;
}

template <class... Args>
Status bad(const char* op, const Args&... args) {
  return invalid_argument(cat(op, ": ", args...));
}

// Checks presence, rank and dtype; `name` is the parameter name used in messages.
Status check_tensor(const char* op, const char* name, const Tensor& t, int ndim,
                    std::initializer_list<DType> allowed);
// Checks t.shape[dim] == expected, naming both.
Status check_dim(const char* op, const char* name, const Tensor& t, int dim, std::int64_t expected,
                 const char* what);
// Non-negative strides only; stride 0 allowed only where broadcast makes sense (inputs).
Status check_strides(const char* op, const char* name, const Tensor& t, bool allow_zero);
// A PerHead span: empty, 1 value, or hq values, each in [lo, hi] (lo excluded when lo_open),
// finite.
Status check_per_head(const char* op, const char* name, PerHead v, int hq, float lo, float hi,
                      bool lo_open);
Status check_exec(const char* op, const Exec& e);
// Attention-style q/k/v (/o) shapes: [B,Sq,Hq,D], [B,Sk,Hk,D]; Hq % Hk == 0; varlen rules.
Status check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor* v, const Tensor* o,
                 const Varlen& varlen, Backend backend);
// Host-side checks of cu_seqlens on the CPU backend (monotone, totals, max_seqlen).
Status check_varlen_host(const char* op, const Varlen& varlen, std::int64_t total_q,
                         std::int64_t total_k);

inline float per_head(PerHead v, int h) { return v.size() == 1 ? v[0] : v[static_cast<size_t>(h)]; }

// Batch count, query length and key length as the lut/lse see them (varlen-aware).
struct Dims {
  std::int64_t batch, sq, sk, hq, hk, d;
};
Dims attention_dims(const Tensor& q, const Tensor& k, const Varlen& varlen);

// The fp8 recipe's quantized Q and K (`name`, e.g. "maybe_fp8_qk") for a problem of dims `d`: the
// dtypes, exact contiguous shapes, and qk.blkk / qk.smooth_k equal to the operation's own; varlen
// is unsupported.
Status check_quantized_qk(const char* op, const char* name, const QuantizedQK& qk, const Dims& d, int blkk,
                          bool smooth_k, const Varlen& varlen);

Status validate(const BlockMapParams& p);
Status validate(const BlockSparseAttentionParams& p);
Status validate(const DenseAttentionParams& p);
Status validate(const TopkSelectParams& p);
Status validate(const CompactMaskParams& p);
Status validate(const GatherAttentionParams& p);
Status validate(const MergeAttentionParams& p);

}  // namespace sparge::detail
