// Host-side validation shared by every backend: each operation's params are checked here, before
// any backend sees them, and every error names the operation, the parameter and the bad value.
#pragma once

#include <cmath>
#include <initializer_list>
#include <sstream>
#include <string>

#include "sparge/ops.h"

#define SPARGE_RETURN_IF_ERROR(expr)      \
  do {                                    \
    ::sparge::Status sparge_st_ = (expr); \
    if (!sparge_st_.ok()) return sparge_st_; \
  } while (0)

namespace sparge::detail {

template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
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

Status validate(const BlockMapParams& p);
Status validate(const BlockSparseAttentionParams& p);
Status validate(const DenseAttentionParams& p);
Status validate(const TopkSelectParams& p);
Status validate(const CompactMaskParams& p);
Status validate(const GatherAttentionParams& p);
Status validate(const MergeAttentionParams& p);

}  // namespace sparge::detail
