// Host-side checks of merge_attention: o_a, o_b and o share one shape [B, S, H, D] (each any float
// dtype the backend takes), lse_a, lse_b and lse are f32 [B, H, S]; outputs have positive strides.
// On the cpu backend the input LSE values are read too: NaN or +inf is an input error.
#include <cmath>

#include "validate/validate.h"

namespace sparge::detail {

namespace {
constexpr const char* kOp = "merge_attention";

Status check_o(const char* name, const Tensor& t, const Tensor* like, bool output) {
  SPARGE_RETURN_IF_ERROR(check_tensor(kOp, name, t, 4, {DType::f32, DType::f16, DType::bf16}));
  if (like != nullptr) {
    for (int i = 0; i < 4; ++i) {
      if (t.shape[i] != like->shape[i]) {
        return bad(kOp, name, ".shape[", i, "] = ", t.shape[i], " differs from o_a.shape[", i, "] = ", like->shape[i]);
      }
    }
  }
  return check_strides(kOp, name, t, !output);
}

Status check_lse(const char* name, const Tensor& t, const Tensor& o_a, bool output) {
  SPARGE_RETURN_IF_ERROR(check_tensor(kOp, name, t, 3, {DType::f32}));
  SPARGE_RETURN_IF_ERROR(check_dim(kOp, name, t, 0, o_a.shape[0], "o_a.shape[0] (B)"));
  SPARGE_RETURN_IF_ERROR(check_dim(kOp, name, t, 1, o_a.shape[2], "o_a.shape[2] (H)"));
  SPARGE_RETURN_IF_ERROR(check_dim(kOp, name, t, 2, o_a.shape[1], "o_a.shape[1] (S)"));
  return check_strides(kOp, name, t, !output);
}

Status check_lse_values(const char* name, const Tensor& t) {
  const float* v = t.ptr<const float>();
  for (std::int64_t b = 0; b < t.shape[0]; ++b) {
    for (std::int64_t h = 0; h < t.shape[1]; ++h) {
      for (std::int64_t s = 0; s < t.shape[2]; ++s) {
        const float x = v[t.offset(b, h, s)];
        if (std::isnan(x) || x == INFINITY) {
          return bad(kOp, name, "[b=", b, ", h=", h, ", s=", s, "] = ", x, " (expected a finite value or -inf)");
        }
      }
    }
  }
  return {};
}
}  // namespace

Status validate(const MergeAttentionParams& p) {
  SPARGE_RETURN_IF_ERROR(check_exec(kOp, p.exec));
  SPARGE_RETURN_IF_ERROR(check_o("o_a", p.o_a, nullptr, false));
  SPARGE_RETURN_IF_ERROR(check_o("o_b", p.o_b, &p.o_a, false));
  SPARGE_RETURN_IF_ERROR(check_o("o", p.o, &p.o_a, true));
  SPARGE_RETURN_IF_ERROR(check_lse("lse_a", p.lse_a, p.o_a, false));
  SPARGE_RETURN_IF_ERROR(check_lse("lse_b", p.lse_b, p.o_a, false));
  SPARGE_RETURN_IF_ERROR(check_lse("lse", p.lse, p.o_a, true));
  if (p.exec.backend == Backend::cpu) {
    SPARGE_RETURN_IF_ERROR(check_lse_values("lse_a", p.lse_a));
    SPARGE_RETURN_IF_ERROR(check_lse_values("lse_b", p.lse_b));
  }
  return {};
}

}  // namespace sparge::detail
