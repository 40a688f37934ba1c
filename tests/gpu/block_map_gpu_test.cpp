// The CUDA block map against the CPU backend (the specification), block for block.
//
// Every case draws fp16 / bf16 inputs, runs the CPU backend on exactly the stored values with the
// diagnostic outputs (scores, q_sim, k_sim), and checks that the selection has no near-tie the two
// precisions (fp64 on the CPU, fp32 on the GPU) could resolve differently: a sim within 1e-4 of
// its threshold, two ranked scores at the selection boundary within 1e-4 of the row's largest
// |score|, or a cumulative probability within 1e-4 of cdfthreshd. Such an input is redrawn with
// another seed (the redraws are counted and printed); a case fails if 20 draws are not clean.
// Only the boundary of the kept prefix matters for the selected set (a swap inside the kept or
// the dropped part changes nothing), so that is where the gap is checked; long rows could never
// avoid close pairs elsewhere. Cases with exact ties by construction (duplicated K blocks,
// identical rows) allow exactly equal scores: both backends must break them toward the lower index.
//
// Outputs are poisoned device buffers with guard regions; lut and counts must equal the CPU's
// exactly (padding included, when the output strides leave gaps), the diagnostics to rounding.
//
// Without a GPU every case skips. SPARGE_BLOCKMAP_CPU_ONLY=1 still runs the input generation, the
// CPU backend and the near-tie screening (a check of this file on a machine without a GPU).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/gpu_harness.h"
#include "sparge/half.h"
#include "sparge/ops.h"

namespace sparge::test {
namespace {

enum class Layout { nhd, hnd, strided, unaligned };
enum class Pattern { random, dup, same, ramp, negramp };

const char* to_string(Layout l) {
  switch (l) {
    case Layout::nhd: return "nhd";
    case Layout::hnd: return "hnd";
    case Layout::strided: return "strided";
    case Layout::unaligned: return "unaligned";
  }
  return "?";
}

struct Cfg {
  int b = 1, hq = 1, hk = 1;
  std::int64_t sq = 64, sk = 64;
  int d = 64, blkq = 64, blkk = 64;
  bool causal = false, use_topk = true, sink = false, smooth = true;
  std::vector<float> sel;  // topk or cdfthreshd: 1 or hq values
  std::vector<float> sim;  // simthreshd1: empty, 1 or hq values
  DType dtype = DType::f16;
  Layout layout = Layout::nhd;
  Pattern pattern = Pattern::random;
  std::vector<int> lens_q, lens_k;  // varlen when non-empty (then b is the number of sequences)
  int slack_q = 0, slack_k = 0;     // max_seqlen beyond the longest sequence
  float scale = 0.0f;
  bool diag = true;         // ask the GPU for the diagnostic outputs too
  bool outpad = false;      // lut / counts with gaps between rows
  bool determinism = false;  // run the GPU twice, compare bitwise
  bool own_stream = false;
  bool switches = false;     // rerun under the run-time switches (pooling, K mean, scores + selection), compare bitwise
  bool varlen() const { return !lens_q.empty(); }
};

std::string join(const std::vector<float>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "/" : "") << v[i];
  return os.str();
}

std::string case_name(const Cfg& c) {
  Name n("BLOCKMAP_GPU");
  n("b", c.b)("hq", c.hq)("hk", c.hk)("sq", c.sq)("sk", c.sk)("d", c.d)("blkq", c.blkq)("blkk", c.blkk);
  n("causal", c.causal ? 1 : 0)(c.use_topk ? "topk" : "cdf", join(c.sel));
  if (!c.sim.empty()) n("sim", join(c.sim));
  if (c.sink) n("sink", 1);
  if (!c.smooth) n("smooth", 0);
  n("dtype", c.dtype == DType::f16 ? "f16" : "bf16")("layout", to_string(c.layout));
  if (c.varlen()) {
    std::ostringstream os;
    for (size_t i = 0; i < c.lens_q.size(); ++i) os << (i ? "/" : "") << c.lens_q[i] << ":" << c.lens_k[i];
    n("varlen", os.str());
    if (c.slack_q || c.slack_k) n("slack", std::to_string(c.slack_q) + ":" + std::to_string(c.slack_k));
  }
  if (c.pattern == Pattern::dup) n("ties", "dup");
  if (c.pattern == Pattern::same) n("ties", "same");
  if (c.pattern == Pattern::ramp) n("data", "ramp");
  if (c.pattern == Pattern::negramp) n("data", "negramp");
  if (c.scale != 0.0f) n("scale", c.scale);
  if (!c.diag) n("diag", 0);
  if (c.outpad) n("outpad", 1);
  if (c.determinism) n("det", 1);
  if (c.own_stream) n("stream", 1);
  if (c.switches) n("switches", "all");
  return n.str();
}

// ---- inputs -------------------------------------------------------------------------------------

// 16-bit storage of a logical [B, S, H, D] tensor in the given layout; unused elements hold NaN.
struct Storage {
  std::vector<std::uint16_t> data;
  std::int64_t offset = 0;
  std::int64_t shape[4] = {0, 0, 0, 0};
  std::int64_t stride[4] = {0, 0, 0, 0};
  std::int64_t at(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
    return offset + b * stride[0] + s * stride[1] + h * stride[2] + d * stride[3];
  }
};

Storage make_storage(Layout l, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D) {
  Storage st;
  const std::int64_t sh[4] = {B, S, H, D};
  std::copy(sh, sh + 4, st.shape);
  std::int64_t n = B * S * H * D;
  switch (l) {
    case Layout::nhd:
    case Layout::unaligned: {
      const std::int64_t s[4] = {S * H * D, H * D, D, 1};
      std::copy(s, s + 4, st.stride);
      if (l == Layout::unaligned) st.offset = 1;  // 2 bytes off every 16-byte boundary
      break;
    }
    case Layout::hnd: {
      const std::int64_t s[4] = {H * S * D, D, S * D, 1};
      std::copy(s, s + 4, st.stride);
      break;
    }
    case Layout::strided: {
      const std::int64_t s[4] = {S * H * 2 * D, H * 2 * D, 2 * D, 2};
      std::copy(s, s + 4, st.stride);
      n *= 2;
      break;
    }
  }
  // At least a few elements, so that an empty tensor still has a data pointer.
  st.data.assign(static_cast<size_t>(std::max<std::int64_t>(n + st.offset, 8)), 0x7e5a);
  return st;
}

// Logical values [B][S][H][D]: per head an offset (so smoothing matters) plus segments of 8..200
// rows around random centers with random spread, so block similarities and scores vary widely.
std::vector<float> gen_values(std::mt19937_64& rng, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D,
                              float offset_sd) {
  std::vector<float> x(static_cast<size_t>(B * S * H * D));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  std::vector<float> mu(static_cast<size_t>(D)), c(static_cast<size_t>(D));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      for (auto& m : mu) m = offset_sd * nd(rng);
      std::int64_t row = 0;
      while (row < S) {
        const std::int64_t len = 8 + static_cast<std::int64_t>(rng() % 193);
        const float a = 1.5f * ud(rng), sigma = 0.2f + 0.8f * ud(rng);
        for (auto& v : c) v = a * nd(rng);
        for (std::int64_t r = row; r < std::min(row + len, S); ++r) {
          const bool zero = rng() % 100 == 0;  // a zero row adds nothing to the similarity sum
          for (std::int64_t j = 0; j < D; ++j) {
            x[static_cast<size_t>(((b * S + r) * H + h) * D + j)] =
                zero ? 0.0f : mu[static_cast<size_t>(j)] + c[static_cast<size_t>(j)] + sigma * nd(rng);
          }
        }
        row += len;
      }
    }
  }
  return x;
}

void store(const std::vector<float>& x, DType t, Storage& st) {
  const std::int64_t B = st.shape[0], S = st.shape[1], H = st.shape[2], D = st.shape[3];
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t j = 0; j < D; ++j) {
          const float v = x[static_cast<size_t>(((b * S + s) * H + h) * D + j)];
          st.data[static_cast<size_t>(st.at(b, s, h, j))] = t == DType::f16 ? float_to_half(v) : float_to_bf16(v);
        }
}

// Exact ties by construction in K (not varlen): `dup` copies random earlier full blocks over
// about half of the full blocks; `same` makes every row of a head the same vector.
void make_ties(std::vector<float>& x, Pattern p, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D,
               int blkk, std::mt19937_64& rng) {
  const auto at = [&](std::int64_t b, std::int64_t s, std::int64_t h) {
    return x.begin() + ((b * S + s) * H + h) * D;
  };
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      if (p == Pattern::same) {
        for (std::int64_t s = 1; s < S; ++s) std::copy(at(b, 0, h), at(b, 0, h) + D, at(b, s, h));
        continue;
      }
      const std::int64_t full = S / blkk;
      for (std::int64_t kb = 1; kb < full; ++kb) {
        if (rng() % 2) continue;
        const std::int64_t src = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(kb));
        for (std::int64_t r = 0; r < blkk; ++r) std::copy(at(b, src * blkk + r, h), at(b, src * blkk + r, h) + D, at(b, kb * blkk + r, h));
      }
    }
  }
}

// `ramp`: K block kb of kv head h is about (kb + 1) * u_h and every Q row of its query heads about
// u_h, so the scores of a row are about scale * (kb + 1 - mean) * |u_h|^2: far apart on every row
// (random scores would always have near-ties somewhere among 100k rows).
// `negramp`: the same with every Q row about -u_h, so that without smoothing every score of a row
// is negative (the scores' sign bits all equal).
void make_ramp(std::vector<float>& q, std::vector<float>& k, std::int64_t B, std::int64_t SQ, std::int64_t SK,
               std::int64_t HQ, std::int64_t HK, std::int64_t D, int blkk, std::mt19937_64& rng, float q_sign = 1.0f) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> u(static_cast<size_t>(D));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t hk = 0; hk < HK; ++hk) {
      for (auto& v : u) v = nd(rng);
      for (std::int64_t s = 0; s < SK; ++s) {
        const auto step = static_cast<float>(s / blkk + 1);
        for (std::int64_t j = 0; j < D; ++j) {
          k[static_cast<size_t>(((b * SK + s) * HK + hk) * D + j)] = step * u[static_cast<size_t>(j)] + 0.01f * nd(rng);
        }
      }
      for (std::int64_t h = hk * (HQ / HK); h < (hk + 1) * (HQ / HK); ++h) {
        for (std::int64_t s = 0; s < SQ; ++s) {
          for (std::int64_t j = 0; j < D; ++j) {
            q[static_cast<size_t>(((b * SQ + s) * HQ + h) * D + j)] = q_sign * u[static_cast<size_t>(j)] + 0.01f * nd(rng);
          }
        }
      }
    }
  }
}

// ---- the problem as both backends see it --------------------------------------------------------

struct Problem {
  Cfg c;
  std::int64_t nseq = 0, sq_eff = 0, sk_eff = 0, nq = 0, nk = 0;
  std::int64_t rows_q = 0, rows_k = 0;  // dimension 1 of q / k
  Storage q, k;
  std::vector<std::int32_t> cu_q, cu_k;
  std::int64_t lut_pitch = 0, counts_pitch = 1;
  std::int64_t lut_size() const { return nseq * c.hq * nq * lut_pitch; }
  std::int64_t counts_size() const { return nseq * c.hq * nq * counts_pitch; }
  std::int64_t q_len(std::int64_t s) const { return c.varlen() ? c.lens_q[static_cast<size_t>(s)] : c.sq; }
  std::int64_t k_len(std::int64_t s) const { return c.varlen() ? c.lens_k[static_cast<size_t>(s)] : c.sk; }
  // docs/semantics.md: key blocks [0, NV) are visible; causal bottom-right aligned.
  std::int64_t visible(std::int64_t s, std::int64_t qb) const {
    const std::int64_t ql = q_len(s), kl = k_len(s), q0 = qb * c.blkq;
    if (q0 >= ql) return 0;
    const std::int64_t nkb = num_blocks(kl, c.blkk);
    if (!c.causal) return nkb;
    const std::int64_t last = std::min(q0 + c.blkq, ql) - 1 + kl - ql;
    return last < 0 ? 0 : std::min(nkb, last / c.blkk + 1);
  }
};

Problem make_problem(const Cfg& c, std::mt19937_64& rng) {
  Problem p;
  p.c = c;
  if (c.varlen()) {
    p.nseq = static_cast<std::int64_t>(c.lens_q.size());
    p.cu_q.assign(1, 0);
    p.cu_k.assign(1, 0);
    for (size_t i = 0; i < c.lens_q.size(); ++i) {
      p.cu_q.push_back(p.cu_q.back() + c.lens_q[i]);
      p.cu_k.push_back(p.cu_k.back() + c.lens_k[i]);
    }
    p.sq_eff = *std::max_element(c.lens_q.begin(), c.lens_q.end()) + c.slack_q;
    p.sk_eff = *std::max_element(c.lens_k.begin(), c.lens_k.end()) + c.slack_k;
    p.rows_q = p.cu_q.back() + 5;  // a few rows past the last sequence, never read
    p.rows_k = p.cu_k.back() + 3;
    p.rows_q = std::max(p.rows_q, p.sq_eff);
    p.rows_k = std::max(p.rows_k, p.sk_eff);
  } else {
    p.nseq = c.b;
    p.sq_eff = p.rows_q = c.sq;
    p.sk_eff = p.rows_k = c.sk;
  }
  p.nq = num_blocks(p.sq_eff, c.blkq);
  p.nk = num_blocks(p.sk_eff, c.blkk);
  p.lut_pitch = c.outpad ? p.nk + 3 : p.nk;
  p.counts_pitch = c.outpad ? 2 : 1;
  const std::int64_t B = c.varlen() ? 1 : c.b;
  p.q = make_storage(c.layout, B, p.rows_q, c.hq, c.d);
  p.k = make_storage(c.layout, B, p.rows_k, c.hk, c.d);
  std::vector<float> qv = gen_values(rng, B, p.rows_q, c.hq, c.d, 0.3f);
  std::vector<float> kv = gen_values(rng, B, p.rows_k, c.hk, c.d, 0.7f);
  if (c.pattern == Pattern::dup || c.pattern == Pattern::same) make_ties(kv, c.pattern, B, p.rows_k, c.hk, c.d, c.blkk, rng);
  if (c.pattern == Pattern::ramp) make_ramp(qv, kv, B, p.rows_q, p.rows_k, c.hq, c.hk, c.d, c.blkk, rng);
  if (c.pattern == Pattern::negramp) make_ramp(qv, kv, B, p.rows_q, p.rows_k, c.hq, c.hk, c.d, c.blkk, rng, -1.0f);
  store(qv, c.dtype, p.q);
  store(kv, c.dtype, p.k);
  return p;
}

// Host or device buffers of one run's outputs, as tensors.
struct OutputTensors {
  Tensor lut, counts, scores, q_sim, k_sim;
};

OutputTensors output_tensors(const Problem& p, std::int32_t* lut, std::int32_t* counts, float* scores, float* q_sim,
                             float* k_sim) {
  const Cfg& c = p.c;
  const std::int64_t H = c.hq, NQ = p.nq, NK = p.nk, P = p.lut_pitch, CP = p.counts_pitch;
  OutputTensors o;
  o.lut = make_tensor(lut, DType::i32, {p.nseq, H, NQ, NK}, {H * NQ * P, NQ * P, P, 1});
  o.counts = make_tensor(counts, DType::i32, {p.nseq, H, NQ}, {H * NQ * CP, NQ * CP, CP});
  if (scores) o.scores = make_tensor(scores, DType::f32, {p.nseq, H, NQ, NK});
  if (q_sim) o.q_sim = make_tensor(q_sim, DType::f32, {p.nseq, H, NQ});
  if (k_sim) o.k_sim = make_tensor(k_sim, DType::f32, {p.nseq, static_cast<std::int64_t>(c.hk), NK});
  return o;
}

BlockMapParams params(const Problem& p, const void* q, const void* k, const std::int32_t* cu_q,
                      const std::int32_t* cu_k, const OutputTensors& o) {
  const Cfg& c = p.c;
  BlockMapParams bp;
  const std::int64_t B = c.varlen() ? 1 : c.b;
  bp.q = make_tensor(const_cast<void*>(q), c.dtype, {B, p.rows_q, c.hq, c.d},
                     {p.q.stride[0], p.q.stride[1], p.q.stride[2], p.q.stride[3]});
  bp.k = make_tensor(const_cast<void*>(k), c.dtype, {B, p.rows_k, c.hk, c.d},
                     {p.k.stride[0], p.k.stride[1], p.k.stride[2], p.k.stride[3]});
  if (c.varlen()) {
    bp.varlen.cu_seqlens_q = cu_q;
    bp.varlen.cu_seqlens_k = cu_k;
    bp.varlen.num_seqs = static_cast<int>(p.nseq);
    bp.varlen.max_seqlen_q = static_cast<int>(p.sq_eff);
    bp.varlen.max_seqlen_k = static_cast<int>(p.sk_eff);
  }
  bp.blkq = c.blkq;
  bp.blkk = c.blkk;
  bp.scale = c.scale;
  (c.use_topk ? bp.topk : bp.cdfthreshd) = PerHead(c.sel);
  bp.simthreshd1 = PerHead(c.sim);
  bp.is_causal = c.causal;
  bp.attention_sink = c.sink;
  bp.smooth_k = c.smooth;
  bp.lut = o.lut;
  bp.counts = o.counts;
  bp.maybe_scores = o.scores;
  bp.maybe_q_sim = o.q_sim;
  bp.maybe_k_sim = o.k_sim;
  return bp;
}

struct CpuResult {
  Guarded<std::int32_t> lut, counts;
  Guarded<float> scores, q_sim, k_sim;
};

Status run_cpu(const Problem& p, CpuResult& r) {
  const Cfg& c = p.c;
  r.lut.resize(static_cast<size_t>(p.lut_size()));
  r.counts.resize(static_cast<size_t>(p.counts_size()));
  r.scores.resize(static_cast<size_t>(p.nseq * c.hq * p.nq * p.nk));
  r.q_sim.resize(static_cast<size_t>(p.nseq * c.hq * p.nq));
  r.k_sim.resize(static_cast<size_t>(p.nseq * c.hk * p.nk));
  for (auto* g : {&r.lut, &r.counts}) g->poison();
  for (auto* g : {&r.scores, &r.q_sim, &r.k_sim}) g->poison();
  const OutputTensors o = output_tensors(p, r.lut.data(), r.counts.data(), r.scores.data(), r.q_sim.data(), r.k_sim.data());
  BlockMapParams bp = params(p, p.q.data.data() + p.q.offset, p.k.data.data() + p.k.offset, p.cu_q.data(),
                             p.cu_k.data(), o);
  bp.exec.backend = Backend::cpu;
  return build_block_map(bp);
}

float per_head(const std::vector<float>& v, std::int64_t h) { return v.size() == 1 ? v[0] : v[static_cast<size_t>(h)]; }

// The GPU's fp32 rounding of a row's scores, bounded from the magnitudes it works with. A score is
// scale * pq . (pk - m) (pq, pk: pooled Q and K blocks; m: the K mean, 0 without smoothing), each
// pooled value and the mean a serial fp32 sum of up to 256 rows. So every dimension carries a
// relative error of up to ~n eps (n the rows of a sum; ~sqrt(n) eps typically) of |pq_j| and of
// |pk_j - m_j| + |m_j|, and the dot product weights them by the other side: with a large per-head
// offset or a row of scores that cancel, the error is far above 5e-5 of the row's largest score.
// Per row: 64 eps * scale * sqrt(sum_j (|pq_j| * A_j)^2), A_j = max over the row's key blocks of
// |pk_j - m_j|, plus |m_j| (the dimensions' errors have independent signs). The H200 showed up to
// 3.9e-5 where this gives ~2.5e-4 (seeds 0x2, 0x16, 0x45, 0x8c, 0xd7 of d=256, scale 2, 2026-11-30,
// session 9: a 1.25e-5 .. 2.5e-5 tolerance without it). Used by the near-tie screening (a ranking
// gap at the selection boundary must exceed twice it) and by the diagnostics' tolerance.
std::vector<double> score_rounding(const Problem& p) {
  const Cfg& c = p.c;
  std::vector<double> out(static_cast<size_t>(p.nseq * c.hq * p.nq), 0.0);
  const double scale = c.scale == 0.0f ? 1.0 / std::sqrt(static_cast<double>(c.d)) : std::abs(static_cast<double>(c.scale));
  const auto val = [&](const Storage& st, std::int64_t b, std::int64_t r, std::int64_t h, std::int64_t j) {
    const std::uint16_t u = st.data[static_cast<size_t>(st.at(b, r, h, j))];
    return static_cast<double>(c.dtype == DType::f16 ? half_to_float(u) : bf16_to_float(u));
  };
  const auto D = static_cast<size_t>(c.d);
  const std::int64_t group = c.hq / c.hk;
  std::vector<double> m(D), amp(D), blk(D), pq(D);
  for (std::int64_t s = 0; s < p.nseq; ++s) {
    const std::int64_t b = c.varlen() ? 0 : s;
    const std::int64_t q0 = c.varlen() ? p.cu_q[static_cast<size_t>(s)] : 0;
    const std::int64_t k0 = c.varlen() ? p.cu_k[static_cast<size_t>(s)] : 0;
    const std::int64_t ql = p.q_len(s), kl = p.k_len(s);
    for (std::int64_t hk = 0; hk < c.hk; ++hk) {
      // m, then A_j = max_kb |pk_j - m_j| + |m_j|
      std::fill(m.begin(), m.end(), 0.0);
      if (c.smooth && kl > 0) {
        for (std::int64_t r = 0; r < kl; ++r)
          for (size_t j = 0; j < D; ++j) m[j] += val(p.k, b, k0 + r, hk, static_cast<std::int64_t>(j));
        for (auto& x : m) x /= static_cast<double>(kl);
      }
      std::fill(amp.begin(), amp.end(), 0.0);
      for (std::int64_t r0 = 0; r0 < kl; r0 += c.blkk) {
        const std::int64_t r1 = std::min(r0 + c.blkk, kl);
        std::fill(blk.begin(), blk.end(), 0.0);
        for (std::int64_t r = r0; r < r1; ++r)
          for (size_t j = 0; j < D; ++j) blk[j] += val(p.k, b, k0 + r, hk, static_cast<std::int64_t>(j));
        for (size_t j = 0; j < D; ++j) amp[j] = std::max(amp[j], std::abs(blk[j] / static_cast<double>(r1 - r0) - m[j]));
      }
      for (size_t j = 0; j < D; ++j) amp[j] += std::abs(m[j]);
      for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (std::int64_t qb = 0; qb < p.nq; ++qb) {
          const std::int64_t r0 = qb * c.blkq, r1 = std::min(r0 + c.blkq, ql);
          if (r0 >= r1) continue;
          std::fill(pq.begin(), pq.end(), 0.0);
          for (std::int64_t r = r0; r < r1; ++r)
            for (size_t j = 0; j < D; ++j) pq[j] += val(p.q, b, q0 + r, h, static_cast<std::int64_t>(j));
          double ss = 0.0;
          for (size_t j = 0; j < D; ++j) {
            const double t = pq[j] / static_cast<double>(r1 - r0) * amp[j];
            ss += t * t;
          }
          out[static_cast<size_t>((s * c.hq + h) * p.nq + qb)] = 64.0 * std::ldexp(1.0, -24) * scale * std::sqrt(ss);
        }
      }
    }
  }
  return out;
}

// Empty when the CPU's selection has no near-tie (see the top of the file), else why not.
// rounding: score_rounding(p).
std::string near_tie(const Problem& p, const CpuResult& r, const std::vector<double>& rounding) {
  const Cfg& c = p.c;
  const double kTol = 1e-4;
  const bool exact_ties_ok = c.pattern == Pattern::dup || c.pattern == Pattern::same;
  const std::int64_t group = c.hq / c.hk;
  std::vector<std::pair<float, std::int64_t>> ranked;
  for (std::int64_t s = 0; s < p.nseq; ++s) {
    for (std::int64_t h = 0; h < c.hq; ++h) {
      const bool has_thr = !c.sim.empty();
      const double thr = has_thr ? per_head(c.sim, h) : 0.0;
      if (has_thr) {
        const std::int64_t nkb = num_blocks(p.k_len(s), c.blkk);
        for (std::int64_t kb = 0; kb < nkb; ++kb) {
          const double v = r.k_sim[static_cast<size_t>((s * c.hk + h / group) * p.nk + kb)];
          if (std::abs(v - thr) <= kTol) return "k_sim " + std::to_string(v) + " near its threshold";
        }
      }
      for (std::int64_t qb = 0; qb < p.nq; ++qb) {
        const std::int64_t nv = p.visible(s, qb);
        if (nv == 0) continue;
        const std::int64_t row = (s * c.hq + h) * p.nq + qb;
        if (has_thr) {
          const double qs = r.q_sim[static_cast<size_t>(row)];
          if (std::abs(qs - thr) <= kTol) return "q_sim " + std::to_string(qs) + " near its threshold";
          if (!(qs > thr)) continue;  // forced row: no ranking
        }
        ranked.clear();
        double big = 0.0;
        for (std::int64_t kb = 0; kb < nv; ++kb) {
          const float v = r.scores[static_cast<size_t>(row * p.nk + kb)];
          if (std::isfinite(v)) {
            ranked.push_back({v, kb});
            big = std::max(big, std::abs(static_cast<double>(v)));
          }
        }
        const auto R = static_cast<std::int64_t>(ranked.size());
        if (R == 0) continue;
        std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
          return a.first > b.first || (a.first == b.first && a.second < b.second);
        });
        const double gap_tol = std::max(kTol * big, 2.0 * rounding[static_cast<size_t>(row)]);
        const auto close = [&](std::int64_t i) {  // ranks i-1 and i
          const double gap = static_cast<double>(ranked[static_cast<size_t>(i - 1)].first) - ranked[static_cast<size_t>(i)].first;
          if (gap == 0.0) return !exact_ties_ok;
          return gap <= gap_tol;
        };
        const double sel = per_head(c.sel, h);
        if (c.use_topk) {
          const auto want = static_cast<std::int64_t>(std::floor(static_cast<double>(static_cast<float>(sel)) * nv));
          const std::int64_t n = std::min(R, std::max<std::int64_t>(1, want));
          if (n < R && close(n)) return "scores at the top-k boundary of row " + std::to_string(row) + " are close";
        } else {
          const double m = ranked[0].first;
          double z = 0.0;
          for (const auto& e : ranked) z += std::exp(static_cast<double>(e.first) - m);
          double cum = 0.0;
          std::int64_t n = R;
          for (std::int64_t i = 0; i < R; ++i) {
            cum += std::exp(static_cast<double>(ranked[static_cast<size_t>(i)].first) - m) / z;
            if (std::abs(cum - sel) <= kTol) return "a cumulative sum of row " + std::to_string(row) + " is near cdfthreshd";
            if (cum >= sel && n == R) n = i + 1;
          }
          if (n < R && close(n)) return "scores at the cdf boundary of row " + std::to_string(row) + " are close";
        }
      }
    }
  }
  return {};
}

// ---- the GPU run ----------------------------------------------------------------------------------

struct GpuResult {
  std::vector<std::int32_t> lut, counts;
  std::vector<float> scores, q_sim, k_sim;
};

void run_gpu(const Problem& p, GpuResult& out) {
  const Cfg& c = p.c;
  DeviceGuarded<std::uint16_t> q(p.q.data.size()), k(p.k.data.size());
  q.upload(p.q.data);
  k.upload(p.k.data);
  DeviceGuarded<std::int32_t> cu_q(p.cu_q.size()), cu_k(p.cu_k.size());
  if (c.varlen()) {
    cu_q.upload(p.cu_q);
    cu_k.upload(p.cu_k);
  }
  DeviceGuarded<std::int32_t> lut(static_cast<size_t>(p.lut_size())), counts(static_cast<size_t>(p.counts_size()));
  DeviceGuarded<float> scores(c.diag ? static_cast<size_t>(p.nseq * c.hq * p.nq * p.nk) : 0);
  DeviceGuarded<float> q_sim(c.diag ? static_cast<size_t>(p.nseq * c.hq * p.nq) : 0);
  DeviceGuarded<float> k_sim(c.diag ? static_cast<size_t>(p.nseq * c.hk * p.nk) : 0);
  lut.poison();
  counts.poison();
  scores.poison();
  q_sim.poison();
  k_sim.poison();
  const OutputTensors o = output_tensors(p, lut.data(), counts.data(), c.diag ? scores.data() : nullptr,
                                         c.diag ? q_sim.data() : nullptr, c.diag ? k_sim.data() : nullptr);
  BlockMapParams bp = params(p, q.data() + p.q.offset, k.data() + p.k.offset, cu_q.data(), cu_k.data(), o);
  bp.exec.backend = Backend::cuda;
  cudaStream_t stream = nullptr;
  if (c.own_stream) SPARGE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  bp.exec.stream = stream;
  const Status st = build_block_map(bp);
  ASSERT_TRUE(st.ok()) << st.message();
  SPARGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  SPARGE_CUDA_CHECK(cudaGetLastError());
  if (stream) SPARGE_CUDA_CHECK(cudaStreamDestroy(stream));
  EXPECT_TRUE(lut.guards_intact()) << "lut guard region overwritten";
  EXPECT_TRUE(counts.guards_intact()) << "counts guard region overwritten";
  EXPECT_TRUE(scores.guards_intact() && q_sim.guards_intact() && k_sim.guards_intact())
      << "diagnostic output guard region overwritten";
  out.lut = lut.download();
  out.counts = counts.download();
  out.scores = scores.download();
  out.q_sim = q_sim.download();
  out.k_sim = k_sim.download();
}

std::string row_text(const std::int32_t* v, std::int64_t n, std::int64_t stride) {
  std::ostringstream os;
  for (std::int64_t i = 0; i < std::min<std::int64_t>(n, 24); ++i) os << (i ? "," : "") << v[i * stride];
  if (n > 24) os << ",...";
  return os.str();
}

// rounding: score_rounding(p).
void compare(const Problem& p, const CpuResult& cpu, const GpuResult& gpu, const std::vector<double>& rounding) {
  const Cfg& c = p.c;
  // lut / counts: exactly, padding included (both sides keep the poison there).
  int reported = 0;
  for (std::int64_t s = 0; s < p.nseq; ++s) {
    for (std::int64_t h = 0; h < c.hq; ++h) {
      for (std::int64_t qb = 0; qb < p.nq; ++qb) {
        const std::int64_t row = (s * c.hq + h) * p.nq + qb;
        const std::int64_t ci = row * p.counts_pitch;
        const std::int32_t* cl = cpu.lut.data() + row * p.lut_pitch;
        const std::int32_t* gl = gpu.lut.data() + row * p.lut_pitch;
        const bool same = cpu.counts[static_cast<size_t>(ci)] == gpu.counts[static_cast<size_t>(ci)] &&
                          std::equal(cl, cl + p.lut_pitch, gl);
        if (!same && reported++ < 3) {
          std::ostringstream os;
          os << "row (seq " << s << ", head " << h << ", qblock " << qb << ") nv=" << p.visible(s, qb)
             << "\n  cpu count " << cpu.counts[static_cast<size_t>(ci)] << " lut " << row_text(cl, p.lut_pitch, 1)
             << "\n  gpu count " << gpu.counts[static_cast<size_t>(ci)] << " lut " << row_text(gl, p.lut_pitch, 1);
          if (!c.sim.empty()) os << "\n  cpu q_sim " << cpu.q_sim[static_cast<size_t>(row)];
          ADD_FAILURE() << os.str();
        }
      }
    }
  }
  for (std::int64_t i = 0; i < p.counts_size(); ++i) {
    if (i % p.counts_pitch != 0 && cpu.counts[static_cast<size_t>(i)] != gpu.counts[static_cast<size_t>(i)]) {
      ADD_FAILURE() << "counts padding element " << i << " was written";
      break;
    }
  }
  EXPECT_EQ(reported, 0) << reported << " lut/counts rows differ";
  if (!c.diag) return;

  // Diagnostics: to rounding (fp32 against fp64); -inf exactly where the CPU has it.
  const auto close = [](float g, float r, double tol) {
    if (!std::isfinite(r) || !std::isfinite(g)) return g == r;
    return std::abs(static_cast<double>(g) - r) <= tol;
  };
  for (size_t i = 0; i < cpu.q_sim.size(); ++i) {
    if (!close(gpu.q_sim[i], cpu.q_sim[i], 1e-5 + 1e-5 * std::abs(cpu.q_sim[i]))) {
      ADD_FAILURE() << "q_sim[" << i << "] gpu " << gpu.q_sim[i] << " cpu " << cpu.q_sim[i];
      break;
    }
  }
  for (size_t i = 0; i < cpu.k_sim.size(); ++i) {
    if (!close(gpu.k_sim[i], cpu.k_sim[i], 1e-5 + 1e-5 * std::abs(cpu.k_sim[i]))) {
      ADD_FAILURE() << "k_sim[" << i << "] gpu " << gpu.k_sim[i] << " cpu " << cpu.k_sim[i];
      break;
    }
  }
  for (std::int64_t row = 0; row < p.nseq * c.hq * p.nq; ++row) {
    double big = 0.0;
    for (std::int64_t kb = 0; kb < p.nk; ++kb) {
      const float v = cpu.scores[static_cast<size_t>(row * p.nk + kb)];
      if (std::isfinite(v)) big = std::max(big, std::abs(static_cast<double>(v)));
    }
    for (std::int64_t kb = 0; kb < p.nk; ++kb) {
      const size_t i = static_cast<size_t>(row * p.nk + kb);
      // Floor: with one K block per sequence, smoothing cancels the pooled K exactly in fp64
      // (scores ~1e-15) while fp32 leaves a residue (two 65-term sums in different orders, a
      // 256-term dot product, scale 2): 1.04e-5 was seen on the H200 (2026-11-30, d=256,
      // sq=1024, sk=65, blkk=128), over the former floor of 1e-5. A row whose scores are all below
      // 1e-3 holds only such residues, so its floor is 2e-4; other rows keep 1e-5.
      const double floor_abs = big < 1e-3 ? 2e-4 : 1e-5;
      if (!close(gpu.scores[i], cpu.scores[i], floor_abs + 5e-5 * big + rounding[static_cast<size_t>(row)])) {
        ADD_FAILURE() << "scores[row " << row << ", kb " << kb << "] gpu " << gpu.scores[i] << " cpu " << cpu.scores[i];
        return;
      }
    }
  }
}

// The run-time switches (docs/block_map_gpu.md) give the same bits as the default run: the K mean
// folded into pass 1, K sums first in pass 1, the pooling kernel variants, resident-only pooling
// grids, ticket-ordered items, the scores and the selection launched without PDL
// (SPARGE_BLOCKMAP_PDL=0), the pooling launches in a PDL chain too (SPARGE_BLOCKMAP_PDL=2), the
// bit search of the warp top-k (SPARGE_BLOCKMAP_SELECT=bits), the pooling launches in the order before
// session 10 (SPARGE_BLOCKMAP_ORDER=mixed: Q items and K sums in pass 1, K items in pass 2; the fold,
// KFIRST, TICKET and PDL=2 settings take that order too), alone and combined.
void check_switches(const Problem& p, const GpuResult& first) {
  struct Setting {
    const char* kmean = nullptr;
    const char* kfirst = nullptr;
    const char* pool = nullptr;
    const char* persist = nullptr;
    const char* pdl = nullptr;
    const char* select = nullptr;
    const char* ticket = nullptr;
    const char* order = nullptr;
  };
  const char* const o = nullptr;  // unset
  // The default pooling is the ring loaded by TMA (where it applies); async3 the cp.async ring; base3
  // the register path. PDL "2": the pooling launches in a PDL chain too. (SCORES=fma gives other bits
  // and is not here.)
  const Setting settings[] = {
      {"fold", o, o, o, o, o},          {o, "1", o, o, o, o},             {o, o, "base3", o, o, o},
      {"fold", "1", "base3", o, o, o},  {o, o, o, "1", o, o},             {o, "1", "base3", "1", o, o},
      {o, o, o, o, "0", o},             {o, o, o, o, o, "bits"},          {o, o, o, o, "0", "bits"},
      {"fold", o, o, "1", "0", "bits"}, {o, "1", o, o, o, o, "1"},        {"fold", o, "base3", o, o, o, "1"},
      {"fold", "1", o, "1", o, o, "1"}, {o, o, o, o, "2", o},             {"fold", "1", o, o, "2", o, "1"},
      {o, o, "base3", o, "2", "bits"},  {"fold", o, o, "1", "2", o},      {o, o, "async3", o, o, o},
      {"fold", "1", "async3", "1", "2", o, "1"}, {o, o, o, o, o, o, o, "mixed"}, {o, o, "async3", o, o, "bits", o, "mixed"},
      {o, o, "base3", o, "0", o, o, "mixed"}};
  const auto bits_equal = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (const Setting& st : settings) {
    ScopedEnv kmean("SPARGE_BLOCKMAP_KMEAN", st.kmean), kfirst("SPARGE_BLOCKMAP_KFIRST", st.kfirst),
        pool("SPARGE_BLOCKMAP_POOL", st.pool), persist("SPARGE_BLOCKMAP_PERSIST", st.persist),
        pdl("SPARGE_BLOCKMAP_PDL", st.pdl), select("SPARGE_BLOCKMAP_SELECT", st.select),
        ticket("SPARGE_BLOCKMAP_TICKET", st.ticket), order("SPARGE_BLOCKMAP_ORDER", st.order);
    GpuResult again;
    run_gpu(p, again);
    if (testing::Test::HasFatalFailure()) return;
    const auto show = [](const char* v) { return std::string(v != nullptr ? v : "-"); };
    const std::string what = "KMEAN=" + show(st.kmean) + " KFIRST=" + show(st.kfirst) + " POOL=" + show(st.pool) +
                             " PERSIST=" + show(st.persist) + " PDL=" + show(st.pdl) +
                             " SELECT=" + show(st.select) + " TICKET=" + show(st.ticket) + " ORDER=" + show(st.order);
    EXPECT_TRUE(again.lut == first.lut && again.counts == first.counts) << "lut/counts differ under " << what;
    EXPECT_TRUE(bits_equal(again.scores, first.scores) && bits_equal(again.q_sim, first.q_sim) &&
                bits_equal(again.k_sim, first.k_sim))
        << "diagnostic outputs differ bitwise under " << what;
  }
}

void run_case(const Cfg& c, const std::string& name) {
  const bool gpu = have_gpu();
  const char* cpu_only = std::getenv("SPARGE_BLOCKMAP_CPU_ONLY");
  if (!gpu && !(cpu_only && *cpu_only == '1')) GTEST_SKIP() << "no GPU";

  constexpr int kTries = 20;
  Problem p;
  CpuResult cpu;
  std::vector<double> rounding;  // score_rounding of the drawn problem
  std::string why;
  int redraws = 0;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    std::mt19937_64 rng = rng_for(name + "#" + std::to_string(attempt));
    p = make_problem(c, rng);
    const Status st = run_cpu(p, cpu);
    ASSERT_TRUE(st.ok()) << "cpu backend: " << st.message();
    rounding = score_rounding(p);
    why = near_tie(p, cpu, rounding);
    if (why.empty()) break;
    ++redraws;
  }
  ASSERT_TRUE(why.empty()) << "no input without near-ties in " << kTries << " draws (last: " << why << ")";
  if (redraws > 0) std::printf("[ near-tie ] %s: %d input(s) redrawn\n", name.c_str(), redraws);
  if (!gpu) GTEST_SKIP() << "no GPU (the CPU side ran: generation, CPU backend, near-tie screening)";

  GpuResult first;
  run_gpu(p, first);
  if (testing::Test::HasFatalFailure()) return;
  compare(p, cpu, first, rounding);
  if (c.switches) check_switches(p, first);
  if (c.determinism) {
    for (int rep = 0; rep < 3; ++rep) {
      GpuResult again;
      run_gpu(p, again);
      if (testing::Test::HasFatalFailure()) return;
      EXPECT_TRUE(again.lut == first.lut && again.counts == first.counts) << "lut/counts differ between runs";
      const auto bits_equal = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
      };
      EXPECT_TRUE(bits_equal(again.scores, first.scores) && bits_equal(again.q_sim, first.q_sim) &&
                  bits_equal(again.k_sim, first.k_sim))
          << "diagnostic outputs differ bitwise between runs";
    }
  }
}

// ---- the cases ------------------------------------------------------------------------------------

void add(std::vector<Case>& cases, const Cfg& c) {
  const std::string name = case_name(c);
  cases.push_back({name, [c, name] { run_case(c, name); }});
}

std::vector<float> per_head_values(std::mt19937_64& rng, int hq, const std::vector<float>& pool) {
  std::vector<float> v(static_cast<size_t>(hq));
  for (auto& x : v) x = pool[rng() % pool.size()];
  return v;
}

// A fixed-seed sweep (names are stable run to run; the data comes from rng_for(name)).
void add_sweep(std::vector<Case>& cases, int count) {
  std::mt19937_64 rng(0x5eed0b10c4a9ULL);
  const std::vector<float> topks = {0.05f, 0.1f, 0.25f, 0.4f, 0.5f, 0.75f, 1.0f};
  const std::vector<float> cdfs = {0.3f, 0.5f, 0.8f, 0.9f, 0.95f};
  const std::vector<float> sims = {0.05f, 0.1f, 0.2f, 0.3f, 0.5f, -0.1f};
  const std::vector<std::int64_t> lens = {1, 17, 63, 64, 65, 113, 128, 129, 203, 257, 500, 799, 1024, 1500};
  const int dims[] = {64, 128, 64, 128, 64, 128, 8, 16, 72, 96, 256};
  const auto pick = [&](auto& v) { return v[rng() % v.size()]; };
  for (int i = 0; i < count; ++i) {
    Cfg c;
    c.dtype = i % 2 ? DType::bf16 : DType::f16;
    c.layout = (i / 2) % 2 ? Layout::hnd : Layout::nhd;
    if (rng() % 10 == 0) c.layout = rng() % 2 ? Layout::strided : Layout::unaligned;
    c.blkq = (i / 4) % 2 ? 128 : 64;
    c.blkk = (i / 8) % 2 ? 128 : 64;
    c.causal = (i / 16) % 2 == 1;
    c.use_topk = rng() % 5 < 3;
    c.hk = 1 + static_cast<int>(rng() % 2);
    c.hq = c.hk * (1 << (rng() % 3));
    c.b = 1 + static_cast<int>(rng() % 3);
    c.d = dims[rng() % (sizeof(dims) / sizeof(dims[0]))];
    c.sq = pick(lens);
    c.sk = pick(lens);
    const bool per_head = rng() % 10 < 3;
    const auto& pool = c.use_topk ? topks : cdfs;
    c.sel = per_head ? per_head_values(rng, c.hq, pool) : std::vector<float>{pick(pool)};
    const int sim_mode = static_cast<int>(rng() % 10);  // 0-4 none, 5-7 one value, 8-9 per head
    if (sim_mode >= 8) {
      c.sim = per_head_values(rng, c.hq, sims);
    } else if (sim_mode >= 5) {
      c.sim = {pick(sims)};
    }
    c.sink = rng() % 10 < 3;
    c.smooth = rng() % 10 < 8;
    if (rng() % 10 < 2) c.scale = rng() % 2 ? 0.5f : 2.0f;
    if (rng() % 5 == 0) {  // varlen
      const int n = 1 + static_cast<int>(rng() % 4);
      c.b = n;
      for (int s = 0; s < n; ++s) {
        c.lens_q.push_back(static_cast<int>(rng() % 700));
        c.lens_k.push_back(static_cast<int>(rng() % 700));
      }
      if (rng() % 3 == 0) {
        c.slack_q = static_cast<int>(rng() % 100);
        c.slack_k = static_cast<int>(rng() % 150);
      }
      c.sq = c.sk = 0;
    }
    c.diag = rng() % 10 < 8;
    c.outpad = rng() % 8 == 0;
    c.own_stream = rng() % 6 == 0;
    add(cases, c);
  }
}

SPARGE_CASES(BlockMapGpu) {
  add_sweep(cases, 224);

  // Every block-size pair, layout and dtype with the reference shape of the issue.
  for (int blkq : {64, 128}) {
    for (int blkk : {64, 128}) {
      for (Layout l : {Layout::nhd, Layout::hnd}) {
        Cfg c;
        c.b = 2, c.hq = 8, c.hk = 2, c.sq = 799, c.sk = 203, c.d = 128, c.blkq = blkq, c.blkk = blkk;
        c.causal = true, c.sel = {0.4f}, c.dtype = l == Layout::hnd ? DType::bf16 : DType::f16, c.layout = l;
        add(cases, c);
      }
    }
  }
  // Causal with Sq > Sk (early query blocks see nothing) and Sq < Sk; cdf with sims and sink.
  for (std::int64_t sq : {1000, 130}) {
    Cfg c;
    c.b = 2, c.hq = 4, c.hk = 4, c.sq = sq, c.sk = 1130 - sq, c.d = 64, c.causal = true, c.use_topk = false;
    c.sel = {0.9f}, c.sim = {0.2f}, c.sink = true;
    add(cases, c);
  }
  // Per-head everything.
  for (bool topk : {true, false}) {
    Cfg c;
    c.b = 2, c.hq = 8, c.hk = 2, c.sq = 900, c.sk = 1100, c.d = 128, c.causal = !topk, c.use_topk = topk;
    c.sel = topk ? std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.8f, 1.0f}
                 : std::vector<float>{0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f, 0.95f};
    c.sim = {-0.1f, 0.05f, 0.1f, 0.15f, 0.2f, 0.3f, 0.4f, 0.6f};
    c.dtype = DType::bf16;
    add(cases, c);
  }
  // Forced rows and columns everywhere: a threshold above every similarity of random data.
  for (bool topk : {true, false}) {
    Cfg c;
    c.b = 1, c.hq = 2, c.hk = 1, c.sq = 700, c.sk = 900, c.d = 64, c.causal = topk, c.use_topk = topk;
    c.sel = {topk ? 0.3f : 0.6f}, c.sim = {0.97f}, c.sink = true;
    add(cases, c);
  }
  // Exact ties: duplicated K blocks and identical rows; both must break toward the lower index.
  for (Pattern pat : {Pattern::dup, Pattern::same}) {
    for (bool topk : {true, false}) {
      for (bool smooth : {true, false}) {
        Cfg c;
        c.b = 2, c.hq = 4, c.hk = 2, c.sq = 640, c.sk = pat == Pattern::dup ? 1280 : 1000, c.d = 64;
        c.blkk = smooth ? 64 : 128, c.causal = !smooth, c.use_topk = topk, c.smooth = smooth;
        c.sel = {topk ? 0.3f : 0.7f}, c.pattern = pat, c.dtype = smooth ? DType::f16 : DType::bf16;
        add(cases, c);
      }
    }
  }
  // Varlen with empty sequences and max_seqlen slack, GQA, both layouts.
  {
    Cfg c;
    c.hq = 6, c.hk = 2, c.d = 128, c.causal = true, c.sel = {0.5f}, c.sim = {0.1f}, c.sink = true;
    c.lens_q = {300, 0, 129, 640}, c.lens_k = {500, 64, 0, 640}, c.slack_q = 70, c.slack_k = 10;
    c.b = 4;
    add(cases, c);
    c.layout = Layout::hnd, c.use_topk = false, c.sel = {0.8f}, c.dtype = DType::bf16, c.blkq = 128;
    add(cases, c);
  }
  // Strides the vector path cannot take (scalar loads), and padded outputs.
  for (Layout l : {Layout::strided, Layout::unaligned}) {
    Cfg c;
    c.b = 2, c.hq = 4, c.hk = 2, c.sq = 333, c.sk = 555, c.d = 96, c.causal = true, c.sel = {0.25f};
    c.sim = {0.1f}, c.layout = l, c.outpad = true;
    add(cases, c);
  }
  // Long rows: 1024 and 4096 key blocks (selection tiers 256x4 and 512x8) and 9375 (1024x16).
  // Few query blocks and a small top-k (boundary in the sparse tail of the scores), so that a
  // clean draw is likely although a row has thousands of scores.
  for (std::int64_t sk : {65536, 262144}) {
    for (bool topk : {true, false}) {
      Cfg c;
      c.b = 1, c.hq = 1, c.hk = 1, c.sq = sk == 65536 ? 256 : 64, c.sk = sk, c.d = 64, c.use_topk = topk;
      c.sel = {topk ? (sk == 65536 ? 0.1f : 0.02f) : 0.5f}, c.scale = topk ? 0.0f : 1.0f, c.causal = topk;
      add(cases, c);
    }
  }
  {
    Cfg c;
    c.b = 1, c.hq = 1, c.hk = 1, c.sq = 64, c.sk = 600000, c.d = 8, c.sel = {0.01f}, c.diag = false;
    add(cases, c);
  }
  // Every selection tier: one warp per row for <= 128 and <= 256 key blocks (141, 256), CUB tiers
  // 256x8 (2048) and 1024x8 (8192) beside the ones above.
  for (std::int64_t sk : {9000, 16384}) {
    for (bool topk : {true, false}) {
      Cfg c;
      c.b = 1, c.hq = 2, c.hk = 1, c.sq = 2048, c.sk = sk, c.d = 64, c.use_topk = topk, c.causal = sk == 9000;
      c.sel = {topk ? 0.1f : 0.5f}, c.scale = topk ? 0.0f : 1.0f, c.sim = {0.1f}, c.sink = !topk;
      add(cases, c);
    }
  }
  for (std::int64_t sk : {131072, 524288}) {
    Cfg c;
    c.b = 1, c.hq = 1, c.hk = 1, c.sq = 64, c.sk = sk, c.d = 16, c.sel = {0.02f}, c.causal = sk == 131072;
    add(cases, c);
  }
  // The 128 x 128 scores tile (NQ and NK >= 128): partial tiles with NK % 4 != 0 (scalar stores)
  // and full ones (float4 stores), both layouts, cdf with causal skipping of tiles. Ramp data keeps
  // the thousands of rows free of near-ties; the diagnostic scores check every computed score.
  {
    Cfg c;
    c.b = 1, c.hq = 2, c.hk = 1, c.sq = 8256, c.sk = 8320, c.d = 64, c.sel = {0.3f}, c.pattern = Pattern::ramp;
    add(cases, c);
    c.hk = 2, c.sq = 16384, c.sk = 16384, c.d = 128, c.causal = true, c.use_topk = false, c.sel = {0.9f};
    c.scale = 0.01f, c.layout = Layout::hnd, c.dtype = DType::bf16;
    add(cases, c);
    c.hk = 1, c.sq = 16484, c.sk = 8200, c.blkq = 128, c.causal = false, c.use_topk = true, c.sel = {0.5f, 0.2f};
    c.scale = 0.0f, c.sim = {0.1f}, c.sink = true, c.layout = Layout::nhd, c.dtype = DType::f16;
    add(cases, c);
  }
  // Exact ties in rows longer than 256 key blocks (the CTA top-k search breaks them in block order).
  for (bool causal : {false, true}) {
    Cfg c;
    c.b = 1, c.hq = 2, c.hk = 1, c.sq = 128, c.sk = 20000, c.d = 64, c.causal = causal, c.sel = {causal ? 0.3f : 0.6f};
    c.pattern = Pattern::dup;
    add(cases, c);
  }
  // batch * heads > 65535 (1-D grids), and more heads than the kernel parameters carry inline.
  {
    Cfg c;
    c.b = 1100, c.hq = 64, c.hk = 8, c.sq = 65, c.sk = 130, c.d = 8, c.sel = {0.5f}, c.diag = false;
    c.pattern = Pattern::ramp;
    add(cases, c);
    // sim = -0.1 runs the threshold path; a sim never comes near it (sims are >= 0).
    c.causal = true, c.sel = {0.34f}, c.sim = {-0.1f}, c.sink = true, c.diag = true;
    add(cases, c);
  }
  {
    Cfg c;
    c.b = 2, c.hq = 160, c.hk = 32, c.sq = 200, c.sk = 300, c.d = 16;
    std::mt19937_64 rng(7);
    c.sel = per_head_values(rng, c.hq, {0.1f, 0.3f, 0.5f, 0.9f});
    c.sim = per_head_values(rng, c.hq, {0.05f, 0.2f, 0.4f});
    add(cases, c);
  }
  // Empty sequences (Sq = 0, Sk = 0) and a single row.
  for (auto [sq, sk] : {std::pair<std::int64_t, std::int64_t>{0, 100}, {100, 0}, {1, 1}}) {
    Cfg c;
    c.b = 2, c.hq = 2, c.hk = 1, c.sq = sq, c.sk = sk, c.d = 64, c.causal = true, c.sel = {0.5f}, c.sim = {0.1f};
    c.sink = true;
    add(cases, c);
  }
  // The run-time switches give the same bits as the default: GQA with many K chunks per unit, varlen
  // with empty sequences and slack, small and large head dims, HND bf16, rows of up to 128 and of
  // up to 256 key blocks (both register tiles of the warp selection: 4 and 8 key blocks per lane),
  // partial tiles of query blocks (NQ not a multiple of 32 or 64), NQ and NK of at least 128 (the
  // large scores tiles, partial both ways).
  {
    Cfg c;
    c.b = 3, c.hq = 8, c.hk = 2, c.sq = 1000, c.sk = 5000, c.d = 128, c.causal = true, c.sel = {0.3f};
    c.sim = {0.1f}, c.switches = true, c.pattern = Pattern::ramp;
    add(cases, c);
    c.pattern = Pattern::random;
    c.b = 2, c.hq = 4, c.hk = 4, c.sq = 700, c.sk = 2100, c.d = 256, c.causal = false, c.use_topk = false;
    c.sel = {0.9f}, c.dtype = DType::bf16, c.layout = Layout::hnd;
    add(cases, c);
    c.b = 4, c.hq = 6, c.hk = 3, c.d = 8, c.dtype = DType::f16, c.layout = Layout::nhd, c.use_topk = true;
    c.sel = {0.5f}, c.sim = {}, c.lens_q = {300, 0, 513, 64}, c.lens_k = {0, 1200, 257, 700}, c.slack_q = 20;
    c.slack_k = 300, c.sq = c.sk = 0;
    add(cases, c);
    c.b = 1, c.hq = 1, c.hk = 1, c.d = 64, c.lens_q.clear(), c.lens_k.clear(), c.slack_q = c.slack_k = 0;
    c.sq = 300, c.sk = 3000, c.causal = true, c.sink = true;  // one unit
    add(cases, c);
    c.b = 2, c.hq = 4, c.hk = 2, c.sq = 2500, c.sk = 12000, c.d = 64, c.causal = false, c.sink = false;
    c.sel = {0.25f}, c.sim = {0.1f}, c.pattern = Pattern::ramp;  // NQ 40, NK 188: the 8-key tile
    add(cases, c);
    c.sq = 9000, c.sk = 16000, c.causal = true, c.use_topk = false, c.sel = {0.9f}, c.sim = {}, c.scale = 0.01f;
    c.dtype = DType::bf16, c.layout = Layout::hnd, c.blkq = 128;  // NQ 71, NK 250, cdf
    add(cases, c);
    // Many K chunks per unit (157) with 128-row K blocks (two per chunk), NK 313 (the CTA selection
    // kernel).
    c.b = 2, c.hq = 4, c.hk = 2, c.sq = 512, c.sk = 40000, c.d = 128, c.causal = false, c.use_topk = true;
    c.sel = {0.3f}, c.sim = {0.1f}, c.scale = 0.0f, c.dtype = DType::f16, c.layout = Layout::nhd, c.blkq = 64;
    c.blkk = 128, c.pattern = Pattern::ramp;
    add(cases, c);
    // NQ = NK = 141 (causal top-k) and NQ 133, NK 188 (cdf, bf16 HND): the 128 x 128 scores tiles
    // are partial both ways, causal ones skipped.
    c.b = 2, c.hq = 4, c.hk = 2, c.sq = 9000, c.sk = 9000, c.d = 64, c.causal = true, c.use_topk = true;
    c.sel = {0.2f}, c.sim = {0.1f}, c.blkk = 64, c.pattern = Pattern::ramp;  // random draws near-ties at this size
    add(cases, c);
    c.sq = 8500, c.sk = 12000, c.d = 128, c.causal = false, c.use_topk = false, c.sel = {0.8f}, c.sim = {};
    c.dtype = DType::bf16, c.layout = Layout::hnd;
    add(cases, c);
  }
  // The narrowed warp top-k search (select_row_kernel): every score of a row negative, magnitudes
  // about 0.64 .. 10 (the search starts at bit 30 with the unrankable blocks inside its interval),
  // and 0.64 .. 164 at NK 256 (the 8-key tile); ramp keeps the scores far apart. With switches:
  // the search of 2026-11-30 must keep the same blocks.
  for (std::int64_t sk : {1000, 16384}) {
    Cfg c;
    c.b = 1, c.hq = 2, c.hk = 1, c.sq = 300, c.sk = sk, c.d = 64, c.smooth = false, c.sel = {0.3f};
    c.scale = 0.01f, c.pattern = Pattern::negramp, c.switches = true, c.causal = sk == 16384;
    add(cases, c);
  }
  // The staged 128 x 128 scores kernel with head dims that leave a partial 32-column chunk (72) and
  // that take eight chunks through its two buffers (256); NQ and NK >= 128, ramp data.
  for (int d : {72, 256}) {
    Cfg c;
    c.b = 1, c.hq = 2, c.hk = 1, c.sq = 8256, c.sk = d == 72 ? 8320 : 16384, c.d = d, c.sel = {0.3f};
    c.causal = d == 256, c.pattern = Pattern::ramp, c.switches = true;
    add(cases, c);
  }
  // Exact ties in warp rows under every switch (the pivot search of the warp top-k must stop on a
  // tied value and keep the CPU's ties in block order): duplicated K blocks over
  // 256 key blocks (8 per lane), identical rows over 125 (4 per lane: every score of a row equal).
  for (Pattern pat : {Pattern::dup, Pattern::same}) {
    Cfg c;
    c.b = 1, c.hq = 2, c.hk = 1, c.sq = 640, c.sk = pat == Pattern::dup ? 16384 : 8000, c.d = 64;
    c.sel = {pat == Pattern::dup ? 0.4f : 0.3f}, c.pattern = pat, c.switches = true, c.causal = pat == Pattern::same;
    add(cases, c);
  }
  // Determinism: the same inputs give bitwise the same outputs (run four times).
  {
    Cfg c;
    c.b = 2, c.hq = 8, c.hk = 2, c.sq = 1000, c.sk = 1000, c.d = 128, c.causal = true, c.use_topk = false;
    c.sel = {0.9f}, c.sim = {0.1f}, c.determinism = true, c.own_stream = true;
    add(cases, c);
  }
}

// ---- what the CUDA backend refuses, with messages naming the parameter ------------------------------

SPARGE_CASES(BlockMapGpuSupport) {
  static std::uint16_t dummy[64];
  static std::int32_t dummy_i[64];
  const auto base = [](std::int64_t d, std::int64_t sk) {
    BlockMapParams p;
    p.q = make_tensor(dummy, DType::f16, {1, 64, 1, d}, {0, 0, 0, 1});
    p.k = make_tensor(dummy, DType::f16, {1, sk, 1, d}, {0, 0, 0, 1});
    static const float topk = 0.5f;
    p.topk = PerHead(&topk, 1);
    const std::int64_t nk = num_blocks(sk, 64);
    p.lut = make_tensor(dummy_i, DType::i32, {1, 1, 1, nk}, {nk, nk, nk, 1});
    p.counts = make_tensor(dummy_i, DType::i32, {1, 1, 1});
    p.exec.backend = Backend::cuda;
    return p;
  };
  cases.push_back({"BLOCKMAP_GPU_SUPPORT(d=12)", [=] {
                     const Status st = supported(base(12, 64));
                     EXPECT_EQ(st.code(), StatusCode::unsupported) << st.message();
                     EXPECT_NE(st.message().find("q.shape[3] (head dim) = 12"), std::string::npos) << st.message();
                   }});
  cases.push_back({"BLOCKMAP_GPU_SUPPORT(d=264)", [=] {
                     const Status st = build_block_map(base(264, 64));
                     EXPECT_EQ(st.code(), StatusCode::unsupported) << st.message();
                     EXPECT_NE(st.message().find("264"), std::string::npos) << st.message();
                   }});
  cases.push_back({"BLOCKMAP_GPU_SUPPORT(nk=16385)", [=] {
                     const Status st = supported(base(64, 16385 * 64));
                     EXPECT_EQ(st.code(), StatusCode::unsupported) << st.message();
                     EXPECT_NE(st.message().find("NK = 16385"), std::string::npos) << st.message();
                   }});
  cases.push_back({"BLOCKMAP_GPU_SUPPORT(nk=16384)", [=] {
                     if (!have_gpu()) GTEST_SKIP() << "no GPU";
                     const Status st = supported(base(64, 16384 * 64));
                     EXPECT_TRUE(st.ok()) << st.message();
                   }});
}

// ---- timing (SPARGE_BENCH=1): build_block_map at the issue's shapes -------------------------------

void bench_block_map() {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const char* on = std::getenv("SPARGE_BENCH");
  if (on == nullptr || std::string(on) != "1") GTEST_SKIP() << "set SPARGE_BENCH=1";
  // The issue's shape (b2 h32 s16384) at the Python default blocks (64 x 64), 128 x 64, 64 x 128,
  // both layouts, d128 and d64; then fixed b*h*s = 1M rows up to s = 262144 (time may grow at most
  // linearly in s there). smooth_k on (the API default) except where a row says off.
  struct Shape {
    int b, h;
    std::int64_t s;
    int d, blkq, blkk;
    bool hnd, smooth;
  };
  const Shape shapes[] = {
      {2, 32, 16384, 128, 64, 64, false, true},   {2, 32, 16384, 128, 64, 64, true, true},
      {2, 32, 16384, 128, 128, 64, false, true},  {2, 32, 16384, 128, 128, 64, true, true},
      {2, 32, 16384, 128, 64, 128, false, true},  {2, 32, 16384, 128, 64, 128, false, false},
      {2, 32, 16384, 128, 64, 64, false, false},  {2, 32, 16384, 64, 64, 64, true, true},
      {1, 64, 16384, 128, 64, 64, false, true},   {1, 16, 65536, 128, 64, 64, false, true},
      {1, 4, 262144, 128, 64, 64, false, true},   {1, 16, 65536, 128, 128, 64, false, true},
      {1, 4, 262144, 128, 128, 64, false, true},
  };
  // SPARGE_BLOCKMAP_BENCH_QUICK=1: only the issue's shape in NHD at 64 x 64, 128 x 64 and 64 x 128
  // (one run per switch value stays short).
  const char* quick_env = std::getenv("SPARGE_BLOCKMAP_BENCH_QUICK");
  const bool quick = quick_env != nullptr && std::string(quick_env) == "1";
  const auto skip = [&](const Shape& sh) { return quick && (sh.b != 2 || sh.d != 128 || sh.hnd || !sh.smooth); };
  std::size_t max_el = 0, max_lut = 0, max_rows = 0;
  for (const Shape& sh : shapes) {
    if (skip(sh)) continue;
    const std::int64_t rows = sh.b * sh.h * num_blocks(sh.s, sh.blkq);
    max_el = std::max(max_el, static_cast<std::size_t>(sh.b * sh.s * sh.h * sh.d));
    max_lut = std::max(max_lut, static_cast<std::size_t>(rows * num_blocks(sh.s, sh.blkk)));
    max_rows = std::max(max_rows, static_cast<std::size_t>(rows));
  }
  void *q = nullptr, *k = nullptr, *lut = nullptr, *counts = nullptr;
  ASSERT_EQ(cudaMalloc(&q, max_el * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&k, max_el * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&lut, max_lut * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&counts, max_rows * 4), cudaSuccess);
  {
    // Normal-ish fp16 values (sum of 4 uniforms), a 16 MB pattern repeated over the tensors.
    std::vector<std::uint16_t> pat(std::size_t{1} << 23);
    std::mt19937_64 rng(12345);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& x : pat) x = float_to_half(0.87f * (u(rng) + u(rng) + u(rng) + u(rng)));
    for (void* dst : {q, k}) {
      for (std::size_t off = 0; off < max_el; off += pat.size()) {
        const std::size_t n = std::min(pat.size(), max_el - off);
        ASSERT_EQ(cudaMemcpy(static_cast<std::uint16_t*>(dst) + off, pat.data(), n * 2, cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
    }
  }
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
  static const float topk = 0.4f, sim = 0.001f;
  for (const Shape& sh : shapes) {
    if (skip(sh)) continue;
    const std::int64_t nq = num_blocks(sh.s, sh.blkq), nk = num_blocks(sh.s, sh.blkk);
    const std::int64_t B = sh.b, S = sh.s, H = sh.h, D = sh.d;
    BlockMapParams p;
    if (sh.hnd) {
      p.q = make_tensor(q, DType::f16, {B, S, H, D}, {H * S * D, D, S * D, 1});
      p.k = make_tensor(k, DType::f16, {B, S, H, D}, {H * S * D, D, S * D, 1});
    } else {
      p.q = make_tensor(q, DType::f16, {B, S, H, D});
      p.k = make_tensor(k, DType::f16, {B, S, H, D});
    }
    p.blkq = sh.blkq;
    p.blkk = sh.blkk;
    p.topk = PerHead(&topk, 1);
    p.simthreshd1 = PerHead(&sim, 1);
    p.smooth_k = sh.smooth;
    p.lut = make_tensor(lut, DType::i32, {B, H, nq, nk});
    p.counts = make_tensor(counts, DType::i32, {B, H, nq});
    p.exec.backend = Backend::cuda;
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(build_block_map(p).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> ms;
    for (int rep = 0; rep < 10; ++rep) {
      ASSERT_EQ(cudaEventRecord(e0, nullptr), cudaSuccess);
      const Status st = build_block_map(p);
      ASSERT_EQ(cudaEventRecord(e1, nullptr), cudaSuccess);
      ASSERT_TRUE(st.ok()) << st.message();
      ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
      float t = 0.0f;
      ASSERT_EQ(cudaEventElapsedTime(&t, e0, e1), cudaSuccess);
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double med = 0.5 * (ms[4] + ms[5]);
    const double qk_bytes = 2.0 * static_cast<double>(B * S * H * D) * 2.0;
    std::printf("[ bench ] block map b%d h%d s%lld d%d blkq%d blkk%d %s f16 topk0.4 smooth_k=%d: median %.4f ms "
                "(min %.4f, max %.4f); one Q+K read %.0f MB -> %.0f GB/s; %.1fM row-key pairs\n",
                sh.b, sh.h, static_cast<long long>(sh.s), sh.d, sh.blkq, sh.blkk, sh.hnd ? "hnd" : "nhd",
                sh.smooth ? 1 : 0, med, ms.front(), ms.back(), qk_bytes / 1e6, qk_bytes / (med * 1e-3) / 1e9,
                static_cast<double>(B * H * nq * nk) / 1e6);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(q);
  cudaFree(k);
  cudaFree(lut);
  cudaFree(counts);
}

SPARGE_CASES(BlockMapGpuBench) { cases.push_back({"BLOCKMAP_GPU_BENCH", [] { bench_block_map(); }}); }

}  // namespace
}  // namespace sparge::test
