#include <cmath>
#include <vector>

#include "validate/validate.h"

namespace sparge::detail {

namespace {
std::string dtype_list(std::initializer_list<DType> allowed) {
  std::string s;
  for (DType t : allowed) {
    if (!s.empty()) s += ", ";
    s += to_string(t);
  }
  return s;
}
}  // namespace

Status check_tensor(const char* op, const char* name, const Tensor& t, int ndim,
                    std::initializer_list<DType> allowed) {
  if (t.data == nullptr) return bad(op, name, " is missing (data = nullptr)");
  if (t.ndim != ndim) return bad(op, name, ".ndim = ", t.ndim, " (expected ", ndim, ")");
  bool ok = false;
  for (DType a : allowed) ok = ok || a == t.dtype;
  if (!ok) return bad(op, name, ".dtype = ", to_string(t.dtype), " (expected one of ", dtype_list(allowed), ")");
  for (int i = 0; i < ndim; ++i) {
    if (t.shape[i] < 0) return bad(op, name, ".shape[", i, "] = ", t.shape[i], " is negative");
  }
  return {};
}

Status check_dim(const char* op, const char* name, const Tensor& t, int dim, std::int64_t expected,
                 const char* what) {
  if (t.shape[dim] != expected) {
    return bad(op, name, ".shape[", dim, "] = ", t.shape[dim], " (expected ", expected, " = ", what, ")");
  }
  return {};
}

Status check_strides(const char* op, const char* name, const Tensor& t, bool allow_zero) {
  // A tensor without elements has no two elements to alias (make_tensor gives it zero strides).
  if (t.numel() == 0) allow_zero = true;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.stride[i] < 0 || (!allow_zero && t.stride[i] == 0 && t.shape[i] > 1)) {
      return bad(op, name, ".stride[", i, "] = ", t.stride[i],
                 allow_zero ? " is negative" : " (must be positive for an output)");
    }
  }
  return {};
}

Status check_per_head(const char* op, const char* name, PerHead v, int hq, float lo, float hi,
                      bool lo_open) {
  if (v.empty()) return {};
  if (v.size() != 1 && v.size() != static_cast<size_t>(hq)) {
    return bad(op, name, " has ", v.size(), " values (expected 1 or Hq = ", hq, ")");
  }
  for (size_t h = 0; h < v.size(); ++h) {
    const float x = v[h];
    const bool below = lo_open ? !(x > lo) : !(x >= lo);
    if (!std::isfinite(x) || below || x > hi) {
      return bad(op, name, "[", h, "] = ", x, " is out of range (expected ", lo_open ? "(" : "[", lo, ", ", hi, "])");
    }
  }
  return {};
}

Status check_exec(const char* op, const Exec& e) {
  if (e.backend != Backend::cpu && e.backend != Backend::cuda) {
    return bad(op, "exec.backend = ", static_cast<int>(e.backend), " is not a backend");
  }
  if (e.cpu_threads < 0) return bad(op, "exec.cpu_threads = ", e.cpu_threads, " is negative");
  return {};
}

Dims attention_dims(const Tensor& q, const Tensor& k, const Varlen& varlen) {
  Dims d{q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]};
  if (varlen.enabled()) {
    d.batch = varlen.num_seqs;
    d.sq = varlen.max_seqlen_q;
    d.sk = varlen.max_seqlen_k;
  }
  return d;
}

Status check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor* v, const Tensor* o,
                 const Varlen& varlen, Backend backend) {
  // (Not a named std::initializer_list variable: its backing array would die with the full
  // expression that built it.)
  auto check_float = [&](const char* name, const Tensor& t) {
    return backend == Backend::cpu ? check_tensor(op, name, t, 4, {DType::f32, DType::f16, DType::bf16})
                                   : check_tensor(op, name, t, 4, {DType::f16, DType::bf16});
  };
  SPARGE_RETURN_IF_ERROR(check_float("q", q));
  SPARGE_RETURN_IF_ERROR(check_float("k", k));
  SPARGE_RETURN_IF_ERROR(check_strides(op, "q", q, true));
  SPARGE_RETURN_IF_ERROR(check_strides(op, "k", k, true));
  if (k.dtype != q.dtype) return bad(op, "k.dtype = ", to_string(k.dtype), " differs from q.dtype = ", to_string(q.dtype));
  if (q.shape[3] <= 0) return bad(op, "q.shape[3] (head dim) = ", q.shape[3], " must be positive");
  if (q.shape[2] <= 0) return bad(op, "q.shape[2] (Hq) = ", q.shape[2], " must be positive");
  if (k.shape[2] <= 0) return bad(op, "k.shape[2] (Hk) = ", k.shape[2], " must be positive");
  SPARGE_RETURN_IF_ERROR(check_dim(op, "k", k, 0, q.shape[0], "q.shape[0] (batch)"));
  SPARGE_RETURN_IF_ERROR(check_dim(op, "k", k, 3, q.shape[3], "q.shape[3] (head dim)"));
  if (q.shape[2] % k.shape[2] != 0) {
    return bad(op, "q.shape[2] (Hq) = ", q.shape[2], " is not a multiple of k.shape[2] (Hk) = ", k.shape[2]);
  }
  if (v != nullptr) {
    SPARGE_RETURN_IF_ERROR(check_float("v", *v));
    SPARGE_RETURN_IF_ERROR(check_strides(op, "v", *v, true));
    if (v->dtype != q.dtype) return bad(op, "v.dtype = ", to_string(v->dtype), " differs from q.dtype = ", to_string(q.dtype));
    for (int i = 0; i < 4; ++i) {
      if (v->shape[i] != k.shape[i]) return bad(op, "v.shape[", i, "] = ", v->shape[i], " differs from k.shape[", i, "] = ", k.shape[i]);
    }
  }
  if (o != nullptr) {
    SPARGE_RETURN_IF_ERROR(check_tensor(op, "o", *o, 4, {q.dtype, DType::f32}));
    SPARGE_RETURN_IF_ERROR(check_strides(op, "o", *o, false));
    for (int i = 0; i < 4; ++i) {
      if (o->shape[i] != q.shape[i]) return bad(op, "o.shape[", i, "] = ", o->shape[i], " differs from q.shape[", i, "] = ", q.shape[i]);
    }
  }
  if (varlen.enabled()) {
    if (varlen.cu_seqlens_q == nullptr) return bad(op, "varlen.cu_seqlens_q is missing while varlen.cu_seqlens_k is given");
    if (varlen.cu_seqlens_k == nullptr) return bad(op, "varlen.cu_seqlens_k is missing while varlen.cu_seqlens_q is given");
    if (q.shape[0] != 1) return bad(op, "q.shape[0] = ", q.shape[0], " (expected 1 with varlen: tokens of all sequences along dimension 1)");
    if (varlen.num_seqs <= 0) return bad(op, "varlen.num_seqs = ", varlen.num_seqs, " (must be positive)");
    if (varlen.max_seqlen_q < 0 || varlen.max_seqlen_q > q.shape[1]) {
      return bad(op, "varlen.max_seqlen_q = ", varlen.max_seqlen_q, " (expected 0..", q.shape[1], ")");
    }
    if (varlen.max_seqlen_k < 0 || varlen.max_seqlen_k > k.shape[1]) {
      return bad(op, "varlen.max_seqlen_k = ", varlen.max_seqlen_k, " (expected 0..", k.shape[1], ")");
    }
    if (backend == Backend::cpu) {
      SPARGE_RETURN_IF_ERROR(check_varlen_host(op, varlen, q.shape[1], k.shape[1]));
    }
  }
  return {};
}

Status check_varlen_host(const char* op, const Varlen& varlen, std::int64_t total_q,
                         std::int64_t total_k) {
  const std::int32_t* cu[2] = {varlen.cu_seqlens_q, varlen.cu_seqlens_k};
  const char* names[2] = {"varlen.cu_seqlens_q", "varlen.cu_seqlens_k"};
  const std::int64_t totals[2] = {total_q, total_k};
  const int maxes[2] = {varlen.max_seqlen_q, varlen.max_seqlen_k};
  for (int w = 0; w < 2; ++w) {
    if (cu[w][0] != 0) return bad(op, names[w], "[0] = ", cu[w][0], " (expected 0)");
    int longest = 0;
    for (int s = 0; s < varlen.num_seqs; ++s) {
      const int len = cu[w][s + 1] - cu[w][s];
      if (len < 0) return bad(op, names[w], "[", s + 1, "] = ", cu[w][s + 1], " is below ", names[w], "[", s, "] = ", cu[w][s]);
      longest = len > longest ? len : longest;
    }
    if (cu[w][varlen.num_seqs] > totals[w]) {
      return bad(op, names[w], "[", varlen.num_seqs, "] = ", cu[w][varlen.num_seqs], " exceeds the ", totals[w], " rows of the tensor");
    }
    if (longest > maxes[w]) {
      return bad(op, w == 0 ? "varlen.max_seqlen_q = " : "varlen.max_seqlen_k = ", maxes[w], " is below the longest sequence (", longest, ")");
    }
  }
  return {};
}

Status check_quantized_qk(const char* op, const char* name, const QuantizedQK& qk, const Dims& d, int blkk,
                          bool smooth_k, const Varlen& varlen) {
  if (varlen.enabled()) return unsupported(cat(op, ": ", name, " with varlen is not supported (the fp8 recipe has no varlen)"));
  if (qk.blkk != blkk) return bad(op, name, ".blkk = ", qk.blkk, " differs from blkk = ", blkk);
  if (qk.smooth_k != smooth_k) return bad(op, name, ".smooth_k = ", qk.smooth_k, " differs from smooth_k = ", smooth_k);
  const std::int64_t nk = num_blocks(d.sk, blkk);
  struct Part {
    const char* field;
    const Tensor* t;
    DType dtype;
    int ndim;
    std::int64_t shape[4];
    const char* what[4];
  };
  const Part parts[] = {
      {"q8", &qk.q8, DType::u8, 4, {d.batch, d.hq, d.sq, d.d}, {"q.shape[0] (B)", "q.shape[2] (Hq)", "q.shape[1] (Sq)", "q.shape[3] (D)"}},
      {"q_scale", &qk.q_scale, DType::f32, 3, {d.batch, d.hq, d.sq, 0}, {"q.shape[0] (B)", "q.shape[2] (Hq)", "q.shape[1] (Sq)", ""}},
      {"k8", &qk.k8, DType::u8, 4, {d.batch, d.hk, d.sk, d.d}, {"k.shape[0] (B)", "k.shape[2] (Hk)", "k.shape[1] (Sk)", "k.shape[3] (D)"}},
      {"k_scale", &qk.k_scale, DType::f32, 3, {d.batch, d.hk, nk, 0}, {"k.shape[0] (B)", "k.shape[2] (Hk)", "NK = ceil(Sk / blkk)", ""}},
      {"k_mean", &qk.k_mean, DType::f32, 3, {d.batch, d.hk, d.d, 0}, {"k.shape[0] (B)", "k.shape[2] (Hk)", "k.shape[3] (D)", ""}},
  };
  for (const Part& part : parts) {
    const std::string full = cat(name, ".", part.field);
    const Tensor& t = *part.t;
    SPARGE_RETURN_IF_ERROR(check_tensor(op, full.c_str(), t, part.ndim, {part.dtype}));
    for (int i = 0; i < part.ndim; ++i) {
      SPARGE_RETURN_IF_ERROR(check_dim(op, full.c_str(), t, i, part.shape[i], part.what[i]));
    }
    // Contiguous row-major (the fp8 kernel loads q8 / k8 with TMA maps of that layout).
    std::int64_t want = 1;
    for (int j = t.ndim - 1; j >= 0; --j) {
      if (t.shape[j] > 1 && t.stride[j] != want) {
        return bad(op, full, ".stride[", j, "] = ", t.stride[j], " (expected ", want,
                   ": the buffer must be contiguous row-major)");
      }
      want *= t.shape[j];
    }
  }
  return {};
}

}  // namespace sparge::detail
