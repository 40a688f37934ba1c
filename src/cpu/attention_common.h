// Pieces shared by the CPU attention paths (the dense fp64 oracle and block-sparse attention; the
// token-level gather path may reuse them): where a sequence lives (varlen-aware), one kv head
// converted once to contiguous fp64, query rows in fp64, and the two inner loops (a tile of scores
// and a tile of P.V) written so that the compiler keeps the accumulators in registers.
//
// Every logit is `scale * sum_d q[d] k[d]` summed in ascending d, and every P.V element is summed
// in ascending key order within a tile, so the dense and the sparse path compute bitwise the same
// logits and results never depend on the thread count.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/parallel.h"
#include "sparge/half.h"
#include "sparge/ops.h"
#include "validate/validate.h"

namespace sparge::cpu::attn {

constexpr double kLog2e = 1.4426950408889634074;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
// Keys are stored in chunks of this many (zero padded), the width of one score tile.
constexpr std::int64_t kChunk = 64;

inline double effective_scale(float scale, std::int64_t head_dim) {
  return scale == 0.0f ? 1.0 / std::sqrt(static_cast<double>(head_dim)) : static_cast<double>(scale);
}

// Sequence `b` as the lut/lse/mask index it: which batch entry of q/k holds it, its first row in
// q and k, and its lengths. Without varlen: batch entry b, rows from 0, the tensors' lengths.
struct Seq {
  std::int64_t tensor_b, q0, k0, sq, sk;
};

inline Seq sequence(const Varlen& v, std::int64_t b, std::int64_t sq, std::int64_t sk) {
  if (!v.enabled()) return {b, 0, 0, sq, sk};
  return {0, v.cu_seqlens_q[b], v.cu_seqlens_k[b], v.cu_seqlens_q[b + 1] - v.cu_seqlens_q[b],
          v.cu_seqlens_k[b + 1] - v.cu_seqlens_k[b]};
}

// Number of keys query row i may see: all of them, or (causal, bottom-right aligned) the keys
// j <= i + sk - sq, clamped to [0, sk].
inline std::int64_t key_limit(bool causal, std::int64_t i, std::int64_t sq, std::int64_t sk) {
  if (!causal) return sk;
  const std::int64_t lim = i + sk - sq + 1;
  return lim < 0 ? 0 : (lim > sk ? sk : lim);
}

// One kv head of one sequence in fp64. K is stored transposed per chunk of kChunk keys
// ([chunk][d][kChunk], zero padded), so a score tile reads kChunk consecutive doubles per d and
// chunks are contiguous (a plain [d][Sk] layout with Sk a power of two maps every d of a tile to
// the same cache set). V is [Sk][D].
struct KvHead {
  std::int64_t sk = 0, d = 0;
  std::vector<double> kt, v;
  const double* k_chunk(std::int64_t c) const { return kt.data() + c * d * kChunk; }
  const double* v_row(std::int64_t j) const { return v.data() + j * d; }
};

inline void load_kv_head(const Tensor& k, const Tensor& v, const Seq& s, std::int64_t hk, int threads,
                         KvHead& out) {
  const std::int64_t d = k.shape[3];
  const std::int64_t chunks = (s.sk + kChunk - 1) / kChunk;
  out.sk = s.sk;
  out.d = d;
  out.kt.assign(static_cast<size_t>(chunks * d * kChunk), 0.0);
  out.v.assign(static_cast<size_t>(s.sk * d), 0.0);
  parallel_for(chunks, threads, [&](std::int64_t c) {
    double* kt = out.kt.data() + c * d * kChunk;
    const std::int64_t j_end = std::min(s.sk, (c + 1) * kChunk);
    for (std::int64_t j = c * kChunk; j < j_end; ++j) {
      const std::int64_t row = s.k0 + j;
      for (std::int64_t e = 0; e < d; ++e) {
        kt[e * kChunk + (j - c * kChunk)] = load_as_float(k.data, k.dtype, k.offset(s.tensor_b, row, hk, e));
        out.v[static_cast<size_t>(j * d + e)] = load_as_float(v.data, v.dtype, v.offset(s.tensor_b, row, hk, e));
      }
    }
  });
}

// Query rows [i0, i0 + n) of head h of sequence s into q ([n][D], fp64).
inline void load_q_rows(const Tensor& q, const Seq& s, std::int64_t h, std::int64_t i0, std::int64_t n,
                        std::vector<double>& out) {
  const std::int64_t d = q.shape[3];
  out.resize(static_cast<size_t>(n * d));
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t e = 0; e < d; ++e) {
      out[static_cast<size_t>(r * d + e)] = load_as_float(q.data, q.dtype, q.offset(s.tensor_b, s.q0 + i0 + r, h, e));
    }
  }
}

// s[r * lds + jj] = scale * q_r . k_(chunk c, jj) for r < n and all kChunk keys of the chunk
// (padding keys give 0; callers mask them). Two rows by eight keys per step keep sixteen
// accumulators in registers; d is summed in ascending order for every element.
inline void score_chunk(const double* q, std::int64_t n, const KvHead& kv, std::int64_t c, double scale,
                        double* s, std::int64_t lds) {
  const std::int64_t d = kv.d;
  const double* kt = kv.k_chunk(c);
  std::int64_t r = 0;
  for (; r + 2 <= n; r += 2) {
    const double* q0 = q + r * d;
    const double* q1 = q0 + d;
    for (std::int64_t j = 0; j < kChunk; j += 8) {
      double a0[8] = {}, a1[8] = {};
      for (std::int64_t e = 0; e < d; ++e) {
        const double* kd = kt + e * kChunk + j;
        const double x0 = q0[e], x1 = q1[e];
        for (int u = 0; u < 8; ++u) {
          a0[u] += x0 * kd[u];
          a1[u] += x1 * kd[u];
        }
      }
      for (int u = 0; u < 8; ++u) {
        s[r * lds + j + u] = scale * a0[u];
        s[(r + 1) * lds + j + u] = scale * a1[u];
      }
    }
  }
  for (; r < n; ++r) {
    const double* q0 = q + r * d;
    for (std::int64_t j = 0; j < kChunk; j += 8) {
      double a0[8] = {};
      for (std::int64_t e = 0; e < d; ++e) {
        const double* kd = kt + e * kChunk + j;
        for (int u = 0; u < 8; ++u) a0[u] += q0[e] * kd[u];
      }
      for (int u = 0; u < 8; ++u) s[r * lds + j + u] = scale * a0[u];
    }
  }
}

// acc[r * D + e] += sum_{jj < nj} p[r * ldp + jj] * v[j0 + jj][e], keys in ascending order, for r < n.
// Two rows by eight dims per step stay in registers across the key loop.
inline void pv_accumulate(const double* p, std::int64_t ldp, std::int64_t n, const KvHead& kv, std::int64_t j0,
                          std::int64_t nj, double* acc) {
  const std::int64_t d = kv.d;
  const std::int64_t d8 = d - d % 8;
  std::int64_t r = 0;
  for (; r + 2 <= n; r += 2) {
    const double* p0 = p + r * ldp;
    const double* p1 = p0 + ldp;
    double* c0 = acc + r * d;
    double* c1 = c0 + d;
    for (std::int64_t e = 0; e < d8; e += 8) {
      double a0[8], a1[8];
      for (int u = 0; u < 8; ++u) {
        a0[u] = c0[e + u];
        a1[u] = c1[e + u];
      }
      for (std::int64_t jj = 0; jj < nj; ++jj) {
        const double* vr = kv.v_row(j0 + jj) + e;
        const double w0 = p0[jj], w1 = p1[jj];
        for (int u = 0; u < 8; ++u) {
          a0[u] += w0 * vr[u];
          a1[u] += w1 * vr[u];
        }
      }
      for (int u = 0; u < 8; ++u) {
        c0[e + u] = a0[u];
        c1[e + u] = a1[u];
      }
    }
    for (std::int64_t e = d8; e < d; ++e) {
      double a0 = c0[e], a1 = c1[e];
      for (std::int64_t jj = 0; jj < nj; ++jj) {
        const double x = kv.v_row(j0 + jj)[e];
        a0 += p0[jj] * x;
        a1 += p1[jj] * x;
      }
      c0[e] = a0;
      c1[e] = a1;
    }
  }
  for (; r < n; ++r) {
    const double* p0 = p + r * ldp;
    double* c0 = acc + r * d;
    for (std::int64_t e = 0; e < d; ++e) {
      double a0 = c0[e];
      for (std::int64_t jj = 0; jj < nj; ++jj) a0 += p0[jj] * kv.v_row(j0 + jj)[e];
      c0[e] = a0;
    }
  }
}

// Writes row r of the result: O = acc / l and LSE = m + log(l), or O = 0 and LSE = -inf for a row
// that attended nothing (l == 0, also -0.0, or m == -inf).
inline void store_row(const Tensor& o, const Tensor& lse, const Seq& s, std::int64_t seq_index, std::int64_t h,
                      std::int64_t i, const double* acc, double m, double l) {
  const std::int64_t d = o.shape[3];
  const bool empty = !(l > 0.0) || m == kNegInf;
  for (std::int64_t e = 0; e < d; ++e) {
    const double val = empty ? 0.0 : acc[e] / l;
    store_from_float(o.data, o.dtype, o.offset(s.tensor_b, s.q0 + i, h, e), static_cast<float>(val));
  }
  if (lse.present()) {
    const double val = empty ? kNegInf : m + std::log(l);
    lse.ptr<float>()[lse.offset(seq_index, h, i)] = static_cast<float>(val);
  }
}

// The driver both attention entries share: for each sequence and kv head, convert that head's K/V
// once, then run fn(seq, seq_index, query_head, tile, kv) in parallel over the tiles of `tile_rows`
// query rows of every query head reading this kv head. Each (head, tile) writes only its own rows.
template <class Fn>
void for_each_query_tile(const Tensor& q, const Tensor& k, const Tensor& v, const Varlen& varlen,
                         std::int64_t tile_rows, int threads, Fn&& fn) {
  const detail::Dims dims = detail::attention_dims(q, k, varlen);
  const std::int64_t group = dims.hq / dims.hk;
  KvHead kv;
  for (std::int64_t b = 0; b < dims.batch; ++b) {
    const Seq s = sequence(varlen, b, q.shape[1], k.shape[1]);
    // Tiles past this sequence's end hold no rows: nothing to compute or write.
    const std::int64_t tiles = (s.sq + tile_rows - 1) / tile_rows;
    if (tiles == 0) continue;
    for (std::int64_t hk = 0; hk < dims.hk; ++hk) {
      load_kv_head(k, v, s, hk, threads, kv);
      parallel_for(group * tiles, threads, [&](std::int64_t t) {
        fn(s, b, hk * group + t / tiles, t % tiles, static_cast<const KvHead&>(kv));
      });
    }
  }
}

}  // namespace sparge::cpu::attn
