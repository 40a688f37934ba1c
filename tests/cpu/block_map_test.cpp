// Stage 1 (the block map) on the CPU backend, against docs/semantics.md:
//   BlockMap       - the library against a deliberately naive reference written here (pairwise
//                    O(n^2) cosine similarity, brute-force visibility per token pair, a stable full
//                    sort), block for block, over random shapes, layouts, dtypes and parameters;
//   BlockMapProp   - selection properties (topk count, cdf mass, ties, sink, forced rows/columns,
//                    causal), equivalences (varlen = per-sequence runs, GQA = repeated K heads,
//                    NHD = HND = padded, any thread count), and a long-sequence run;
//   BlockMapBad    - one bad input per parameter: !ok, a message naming it, outputs untouched.
// Every run poisons its outputs and checks that every logical element was written, that padding
// between strided elements was not, and that the guard regions are intact.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "harness/harness.h"

namespace sparge::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::uint32_t kPoison = 0x7fbadbadu;  // Guarded<T>::poison() pattern for 4-byte T

enum class Layout { nhd, hnd, pad };
const char* layout_name(Layout l) { return l == Layout::nhd ? "nhd" : l == Layout::hnd ? "hnd" : "pad"; }

// One block-map problem. PerHead vectors hold 0 (absent), 1 or Hq values.
struct Spec {
  int b = 1, hq = 1, hk = 1;
  std::int64_t sq = 64, sk = 64;  // ignored with varlen (lens_q / lens_k decide)
  int d = 32, blkq = 64, blkk = 64;
  bool causal = false, sink = false, smooth = true;
  std::vector<float> topk, cdf, sim;
  float scale = 0.0f;
  DType dtype = DType::f32;
  Layout layout = Layout::nhd;
  bool out_strided = false;        // lut/scores stored [B, NQ, Hq, NK+1], counts/q_sim [B, NQ, Hq]
  std::vector<int> lens_q, lens_k;  // varlen when non-empty
  int pad_max = 0;                  // varlen: max_seqlen_* beyond the longest sequence
  int threads = 0;
  float k_offset = 2.0f;  // a common K offset per head that smoothing removes
  bool dup_k = false;     // K block 1 := K block 0 in every sequence and head: genuine score ties

  bool varlen() const { return !lens_q.empty(); }
  std::int64_t seqs() const { return varlen() ? static_cast<std::int64_t>(lens_q.size()) : b; }
  std::int64_t max_q() const {
    return varlen() ? *std::max_element(lens_q.begin(), lens_q.end()) + pad_max : sq;
  }
  std::int64_t max_k() const {
    return varlen() ? *std::max_element(lens_k.begin(), lens_k.end()) + pad_max : sk;
  }
  std::int64_t nq() const { return num_blocks(max_q(), blkq); }
  std::int64_t nk() const { return num_blocks(max_k(), blkk); }
};

std::string vec_str(const std::vector<float>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ":" : "") << v[i];
  return os.str();
}
std::string ivec_str(const std::vector<int>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ":" : "") << v[i];
  return os.str();
}

std::string case_name(const char* op, const Spec& s) {
  Name n(op);
  if (s.varlen()) {
    n("seqs", s.seqs())("hq", s.hq)("hk", s.hk)("lq", ivec_str(s.lens_q))("lk", ivec_str(s.lens_k));
    if (s.pad_max) n("pad_max", s.pad_max);
  } else {
    n("b", s.b)("hq", s.hq)("hk", s.hk)("sq", s.sq)("sk", s.sk);
  }
  n("d", s.d)("blkq", s.blkq)("blkk", s.blkk)("causal", s.causal ? 1 : 0);
  if (!s.topk.empty()) n("topk", vec_str(s.topk));
  if (!s.cdf.empty()) n("cdf", vec_str(s.cdf));
  if (!s.sim.empty()) n("sim", vec_str(s.sim));
  if (s.sink) n("sink", 1);
  if (!s.smooth) n("smooth", 0);
  if (s.scale != 0.0f) n("scale", s.scale);
  if (s.dup_k) n("dup_k", 1);
  n("dtype", to_string(s.dtype));
  if (s.layout != Layout::nhd) n("layout", layout_name(s.layout));
  if (s.out_strided) n("out", "strided");
  if (s.threads) n("threads", s.threads);
  return n.str();
}

// ---- inputs ------------------------------------------------------------------------------------
// Logical values as the kernel sees them (already rounded to the dtype), [B, rows, H, D]; with
// varlen B = 1 and the sequences are row ranges given by cu_q / cu_k.
struct Inputs {
  std::int64_t batch = 1, rows_q = 0, rows_k = 0;
  int hq = 1, hk = 1, d = 1;
  std::vector<float> q, k;
  std::vector<std::int32_t> cu_q, cu_k;
  float& qv(std::int64_t b, std::int64_t r, int h, int i) { return q[((b * rows_q + r) * hq + h) * d + i]; }
  float& kv(std::int64_t b, std::int64_t r, int h, int i) { return k[((b * rows_k + r) * hk + h) * d + i]; }
  double qv(std::int64_t b, std::int64_t r, int h, int i) const { return q[((b * rows_q + r) * hq + h) * d + i]; }
  double kv(std::int64_t b, std::int64_t r, int h, int i) const { return k[((b * rows_k + r) * hk + h) * d + i]; }
};

// Rows come in groups of 64 sharing a random direction with a random weight (pairwise cosine
// about 0, 0.2, 0.7 or 0.94 within a group), so the block similarities spread over [0, 1] and a
// threshold splits blocks into self-similar and not.
void fill_coherent(std::vector<float>& x, std::int64_t batch, std::int64_t rows, int heads, int d,
                   std::mt19937_64& rng, float offset) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 3);
  const float weights[4] = {0.0f, 0.5f, 1.5f, 4.0f};
  x.assign(static_cast<size_t>(batch * rows * heads * d), 0.0f);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      std::vector<float> off(static_cast<size_t>(d)), dir(static_cast<size_t>(d));
      for (auto& v : off) v = offset * nd(rng);
      float w = 0.0f;
      for (std::int64_t r = 0; r < rows; ++r) {
        if (r % 64 == 0) {
          for (auto& v : dir) v = nd(rng);
          w = weights[pick(rng)];
        }
        for (int i = 0; i < d; ++i) {
          x[static_cast<size_t>(((b * rows + r) * heads + h) * d + i)] = w * dir[i] + nd(rng) + off[i];
        }
      }
    }
  }
}

Inputs make_inputs(const Spec& s, std::mt19937_64& rng) {
  Inputs in;
  in.hq = s.hq;
  in.hk = s.hk;
  in.d = s.d;
  if (s.varlen()) {
    in.cu_q.assign(1, 0);
    in.cu_k.assign(1, 0);
    for (size_t i = 0; i < s.lens_q.size(); ++i) {
      in.cu_q.push_back(in.cu_q.back() + s.lens_q[i]);
      in.cu_k.push_back(in.cu_k.back() + s.lens_k[i]);
    }
    in.batch = 1;
    // Rows past the last sequence belong to no sequence; max_seqlen may not exceed the rows.
    in.rows_q = in.cu_q.back() + 3 + s.pad_max;
    in.rows_k = in.cu_k.back() + 3 + s.pad_max;
  } else {
    in.batch = s.b;
    in.rows_q = s.sq;
    in.rows_k = s.sk;
  }
  fill_coherent(in.q, in.batch, in.rows_q, s.hq, s.d, rng, 0.0f);
  fill_coherent(in.k, in.batch, in.rows_k, s.hk, s.d, rng, s.k_offset);
  if (s.dup_k) {
    for (std::int64_t seq = 0; seq < s.seqs(); ++seq) {
      const std::int64_t b = s.varlen() ? 0 : seq;
      const std::int64_t k0 = s.varlen() ? in.cu_k[seq] : 0;
      const std::int64_t len = s.varlen() ? s.lens_k[seq] : s.sk;
      if (len < 2 * s.blkk) continue;
      for (int h = 0; h < s.hk; ++h) {
        for (int r = 0; r < s.blkk; ++r) {
          for (int i = 0; i < s.d; ++i) in.kv(b, k0 + s.blkk + r, h, i) = in.kv(b, k0 + r, h, i);
        }
      }
    }
  }
  in.q = round_through(in.q, s.dtype);
  in.k = round_through(in.k, s.dtype);
  return in;
}

// Storage of a logical [B, S, H, D] tensor in a layout; padding elements hold NaN, so reading one
// would show in the scores.
struct Stored {
  std::vector<float> f32;
  std::vector<std::uint16_t> h16;
  Tensor t;
};

Stored store(const std::vector<float>& x, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D, DType dt,
             Layout layout) {
  Stored st;
  std::array<std::int64_t, 4> stride{};
  std::int64_t size = 0;
  switch (layout) {
    case Layout::nhd: stride = {S * H * D, H * D, D, 1}; size = B * S * H * D; break;
    case Layout::hnd: stride = {H * S * D, D, S * D, 1}; size = B * H * S * D; break;
    case Layout::pad: stride = {S * H * (D + 3), H * (D + 3), D + 3, 1}; size = B * S * H * (D + 3); break;
  }
  // At least one element: an empty tensor still needs a non-null pointer to count as present.
  std::vector<float> buf(static_cast<size_t>(std::max<std::int64_t>(size, 1)), std::numeric_limits<float>::quiet_NaN());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < D; ++i)
          buf[static_cast<size_t>(b * stride[0] + s * stride[1] + h * stride[2] + i * stride[3])] =
              x[static_cast<size_t>(((b * S + s) * H + h) * D + i)];
  void* data = nullptr;
  if (dt == DType::f32) {
    st.f32 = std::move(buf);
    data = st.f32.data();
  } else {
    st.h16 = to_storage16(buf, dt);
    data = st.h16.data();
  }
  st.t = make_tensor(data, dt, {B, S, H, D}, {stride[0], stride[1], stride[2], stride[3]});
  return st;
}

// ---- outputs -----------------------------------------------------------------------------------
// Canonical (contiguous, logical order) copies of every output; sims and scores as doubles so the
// reference can use the same type.
struct Result {
  bool ok = false;
  std::int64_t B = 0, Hq = 0, Hk = 0, NQ = 0, NK = 0;
  std::vector<std::int32_t> lut, counts;  // [B, Hq, NQ, NK], [B, Hq, NQ]
  std::vector<double> scores, q_sim, k_sim;  // [B, Hq, NQ, NK], [B, Hq, NQ], [B, Hk, NK]
  std::int32_t lut_at(std::int64_t b, std::int64_t h, std::int64_t qb, std::int64_t j) const {
    return lut[static_cast<size_t>(((b * Hq + h) * NQ + qb) * NK + j)];
  }
  std::int32_t count_at(std::int64_t b, std::int64_t h, std::int64_t qb) const {
    return counts[static_cast<size_t>((b * Hq + h) * NQ + qb)];
  }
  double score_at(std::int64_t b, std::int64_t h, std::int64_t qb, std::int64_t kb) const {
    return scores[static_cast<size_t>(((b * Hq + h) * NQ + qb) * NK + kb)];
  }
};

template <class T>
struct GuardedOut {
  Guarded<T> buf;
  Tensor t;
  std::int64_t logical = 0;
};

template <class T>
GuardedOut<T> make_out(DType dt, std::initializer_list<std::int64_t> shape, bool strided) {
  GuardedOut<T> o;
  std::vector<std::int64_t> s(shape);
  std::vector<std::int64_t> stride(s.size());
  std::int64_t size = 1;
  o.logical = 1;
  for (auto x : s) o.logical *= x;
  if (!strided) {
    for (int i = static_cast<int>(s.size()) - 1; i >= 0; --i) {
      stride[i] = size;
      size *= std::max<std::int64_t>(s[i], 1);  // an empty dimension still gets positive strides
    }
    size = o.logical;
  } else if (s.size() == 4) {  // storage [B, NQ, Hq, NK + 1]
    stride = {s[2] * s[1] * (s[3] + 1), s[3] + 1, s[1] * (s[3] + 1), 1};
    size = s[0] * s[2] * s[1] * (s[3] + 1);
  } else {  // storage [B, N, H] for logical [B, H, N]
    stride = {s[1] * s[2], 1, s[1]};
    size = s[0] * s[1] * s[2];
  }
  o.buf.resize(static_cast<size_t>(size));
  o.buf.poison();
  o.t.data = o.buf.data();
  o.t.dtype = dt;
  o.t.ndim = static_cast<int>(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    o.t.shape[i] = s[i];
    o.t.stride[i] = stride[i];
  }
  return o;
}

bool is_poison(const void* p) {
  std::uint32_t u;
  std::memcpy(&u, p, 4);
  return u == kPoison;
}

// Copies the logical elements out; fails the test when one was not written, when an element
// between strided rows was written, or when a guard region was touched.
template <class T, class U>
void extract(const GuardedOut<T>& o, const char* what, std::vector<U>& dst) {
  dst.assign(static_cast<size_t>(o.logical), U{});
  std::int64_t unwritten = 0, idx = 0;
  const std::int64_t n0 = o.t.shape[0], n1 = o.t.shape[1], n2 = o.t.shape[2];
  const std::int64_t n3 = o.t.ndim == 4 ? o.t.shape[3] : 1;
  for (std::int64_t a = 0; a < n0; ++a)
    for (std::int64_t b = 0; b < n1; ++b)
      for (std::int64_t c = 0; c < n2; ++c)
        for (std::int64_t e = 0; e < n3; ++e, ++idx) {
          const T& v = o.buf[static_cast<size_t>(o.t.offset(a, b, c, o.t.ndim == 4 ? e : 0))];
          if (is_poison(&v)) ++unwritten;
          dst[static_cast<size_t>(idx)] = static_cast<U>(v);
        }
  std::int64_t poisoned_total = 0;
  for (size_t i = 0; i < o.buf.size(); ++i) poisoned_total += is_poison(&o.buf[i]);
  EXPECT_EQ(unwritten, 0) << what << ": elements left unwritten";
  EXPECT_EQ(poisoned_total - unwritten, static_cast<std::int64_t>(o.buf.size()) - o.logical)
      << what << ": padding between strided elements was written";
  EXPECT_TRUE(o.buf.guards_intact()) << what << ": guard region overwritten";
}

// Runs the library on the spec's inputs. `layout` / `threads` override the spec when given.
Result run_map(const Spec& s, const Inputs& in, bool diag = true) {
  const Stored q = store(in.q, in.batch, in.rows_q, in.hq, in.d, s.dtype, s.layout);
  const Stored k = store(in.k, in.batch, in.rows_k, in.hk, in.d, s.dtype, s.layout);
  Result r;
  r.B = s.seqs();
  r.Hq = s.hq;
  r.Hk = s.hk;
  r.NQ = s.nq();
  r.NK = s.nk();
  auto lut = make_out<std::int32_t>(DType::i32, {r.B, r.Hq, r.NQ, r.NK}, s.out_strided);
  auto counts = make_out<std::int32_t>(DType::i32, {r.B, r.Hq, r.NQ}, s.out_strided);
  auto scores = make_out<float>(DType::f32, {r.B, r.Hq, r.NQ, r.NK}, s.out_strided);
  auto q_sim = make_out<float>(DType::f32, {r.B, r.Hq, r.NQ}, s.out_strided);
  auto k_sim = make_out<float>(DType::f32, {r.B, r.Hk, r.NK}, s.out_strided);

  BlockMapParams p;
  p.q = q.t;
  p.k = k.t;
  if (s.varlen()) {
    p.varlen.cu_seqlens_q = in.cu_q.data();
    p.varlen.cu_seqlens_k = in.cu_k.data();
    p.varlen.num_seqs = static_cast<int>(s.seqs());
    p.varlen.max_seqlen_q = static_cast<int>(s.max_q());
    p.varlen.max_seqlen_k = static_cast<int>(s.max_k());
  }
  p.blkq = s.blkq;
  p.blkk = s.blkk;
  p.scale = s.scale;
  p.topk = PerHead(s.topk);
  p.cdfthreshd = PerHead(s.cdf);
  p.simthreshd1 = PerHead(s.sim);
  p.is_causal = s.causal;
  p.attention_sink = s.sink;
  p.smooth_k = s.smooth;
  p.lut = lut.t;
  p.counts = counts.t;
  if (diag) {
    p.maybe_scores = scores.t;
    p.maybe_q_sim = q_sim.t;
    p.maybe_k_sim = k_sim.t;
  }
  p.exec.cpu_threads = s.threads;
  const Status st = build_block_map(p);
  EXPECT_TRUE(st.ok()) << st.message();
  if (!st.ok()) return r;
  r.ok = true;
  extract(lut, "lut", r.lut);
  extract(counts, "counts", r.counts);
  if (diag) {
    extract(scores, "maybe_scores", r.scores);
    extract(q_sim, "maybe_q_sim", r.q_sim);
    extract(k_sim, "maybe_k_sim", r.k_sim);
  } else {
    for (auto* g : {&scores.buf, &q_sim.buf, &k_sim.buf}) EXPECT_TRUE(g->guards_intact());
  }
  return r;
}

// ---- the naive reference -----------------------------------------------------------------------
struct Seq {
  std::int64_t b, q0, lq, k0, lk;
};
Seq seq_of(const Spec& s, const Inputs& in, std::int64_t i) {
  if (!s.varlen()) return {i, 0, s.sq, 0, s.sk};
  return {0, in.cu_q[i], in.cu_q[i + 1] - in.cu_q[i], in.cu_k[i], in.cu_k[i + 1] - in.cu_k[i]};
}

// Mean pairwise cosine similarity over all n^2 ordered pairs, a zero row's cosines being 0.
double pairwise_sim(const std::vector<std::vector<double>>& rows) {
  const size_t n = rows.size();
  std::vector<double> norm(n);
  for (size_t i = 0; i < n; ++i) {
    double s = 0;
    for (double x : rows[i]) s += x * x;
    norm[i] = std::sqrt(s);
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (norm[i] == 0 || norm[j] == 0) continue;
      double dot = 0;
      for (size_t c = 0; c < rows[i].size(); ++c) dot += rows[i][c] * rows[j][c];
      total += dot / (norm[i] * norm[j]);
    }
  }
  return total / (static_cast<double>(n) * static_cast<double>(n));
}

std::vector<double> column_mean(const std::vector<std::vector<double>>& rows, int d) {
  std::vector<double> m(static_cast<size_t>(d), 0.0);
  for (const auto& r : rows)
    for (int i = 0; i < d; ++i) m[i] += r[i];
  for (auto& x : m) x /= static_cast<double>(rows.size());
  return m;
}

// Token-pair brute force: some query row of the block sees some key of the key block.
bool block_visible(const Seq& q, int blkq, int blkk, std::int64_t qb, std::int64_t kb, bool causal) {
  for (std::int64_t i = qb * blkq; i < std::min<std::int64_t>((qb + 1) * blkq, q.lq); ++i) {
    for (std::int64_t j = kb * blkk; j < std::min<std::int64_t>((kb + 1) * blkk, q.lk); ++j) {
      if (!causal || j <= i + q.lk - q.lq) return true;
    }
  }
  return false;
}

float head_value(const std::vector<float>& v, int h) { return v.size() == 1 ? v[0] : v[static_cast<size_t>(h)]; }

Result reference(const Spec& s, const Inputs& in) {
  Result r;
  r.ok = true;
  r.B = s.seqs();
  r.Hq = s.hq;
  r.Hk = s.hk;
  r.NQ = s.nq();
  r.NK = s.nk();
  r.lut.assign(static_cast<size_t>(r.B * r.Hq * r.NQ * r.NK), -1);
  r.counts.assign(static_cast<size_t>(r.B * r.Hq * r.NQ), 0);
  r.scores.assign(r.lut.size(), -kInf);
  r.q_sim.assign(r.counts.size(), 0.0);
  r.k_sim.assign(static_cast<size_t>(r.B * r.Hk * r.NK), 0.0);
  const double scale = s.scale == 0.0f ? 1.0 / std::sqrt(static_cast<double>(s.d)) : s.scale;

  for (std::int64_t si = 0; si < r.B; ++si) {
    const Seq sq = seq_of(s, in, si);
    // Pooled smoothed K blocks per kv head.
    std::vector<std::vector<std::vector<double>>> pk(static_cast<size_t>(s.hk));
    for (int h = 0; h < s.hk; ++h) {
      std::vector<std::vector<double>> all;
      for (std::int64_t j = 0; j < sq.lk; ++j) {
        std::vector<double> row(static_cast<size_t>(s.d));
        for (int c = 0; c < s.d; ++c) row[c] = in.kv(sq.b, sq.k0 + j, h, c);
        all.push_back(row);
      }
      std::vector<double> km(static_cast<size_t>(s.d), 0.0);
      if (s.smooth && sq.lk > 0) km = column_mean(all, s.d);
      for (auto& row : all)
        for (int c = 0; c < s.d; ++c) row[c] -= km[c];
      for (std::int64_t kb = 0; kb * s.blkk < sq.lk; ++kb) {
        std::vector<std::vector<double>> blk(all.begin() + kb * s.blkk,
                                             all.begin() + std::min<std::int64_t>((kb + 1) * s.blkk, sq.lk));
        pk[h].push_back(column_mean(blk, s.d));
        r.k_sim[static_cast<size_t>((si * s.hk + h) * r.NK + kb)] = pairwise_sim(blk);
      }
    }
    for (int h = 0; h < s.hq; ++h) {
      const int kvh = h / (s.hq / s.hk);
      const bool has_sim = !s.sim.empty();
      const double thr = has_sim ? head_value(s.sim, h) : 0.0;
      for (std::int64_t qb = 0; qb * s.blkq < sq.lq; ++qb) {
        std::vector<std::vector<double>> blk;
        for (std::int64_t i = qb * s.blkq; i < std::min<std::int64_t>((qb + 1) * s.blkq, sq.lq); ++i) {
          std::vector<double> row(static_cast<size_t>(s.d));
          for (int c = 0; c < s.d; ++c) row[c] = in.qv(sq.b, sq.q0 + i, h, c);
          blk.push_back(row);
        }
        const std::vector<double> pq = column_mean(blk, s.d);
        const double qs = pairwise_sim(blk);
        const size_t row_index = static_cast<size_t>((si * s.hq + h) * r.NQ + qb);
        r.q_sim[row_index] = qs;

        std::vector<std::int64_t> visible, rankable;
        std::vector<double> S(static_cast<size_t>(r.NK), -kInf);
        std::set<std::int64_t> keep;
        for (std::int64_t kb = 0; kb < static_cast<std::int64_t>(pk[kvh].size()); ++kb) {
          if (!block_visible(sq, s.blkq, s.blkk, qb, kb, s.causal)) continue;
          visible.push_back(kb);
          const double ks = r.k_sim[static_cast<size_t>((si * s.hk + kvh) * r.NK + kb)];
          if (has_sim && ks <= thr) {
            keep.insert(kb);  // forced column
            continue;
          }
          double dot = 0;
          for (int c = 0; c < s.d; ++c) dot += pq[c] * pk[kvh][kb][c];
          S[kb] = scale * dot;
          rankable.push_back(kb);
        }
        // Stable sort of the ascending block list: equal scores stay in ascending index order.
        std::stable_sort(rankable.begin(), rankable.end(), [&](std::int64_t a, std::int64_t b) { return S[a] > S[b]; });
        const auto nv = static_cast<std::int64_t>(visible.size());
        const auto R = static_cast<std::int64_t>(rankable.size());
        std::int64_t n = 0;
        if (!s.topk.empty()) {
          const double f = std::floor(static_cast<double>(head_value(s.topk, h)) * static_cast<double>(nv));
          n = std::min<std::int64_t>(R, std::max<std::int64_t>(1, static_cast<std::int64_t>(f)));
        } else if (R > 0) {
          double mx = -kInf, z = 0;
          for (auto kb : rankable) mx = std::max(mx, S[kb]);
          for (std::int64_t kb = 0; kb < r.NK; ++kb) {
            if (std::isfinite(S[kb])) z += std::exp(S[kb] - mx);
          }
          double cum = 0;
          n = R;
          for (std::int64_t i = 0; i < R; ++i) {
            cum += std::exp(S[rankable[i]] - mx) / z;
            if (cum >= head_value(s.cdf, h)) {
              n = i + 1;
              break;
            }
          }
        }
        for (std::int64_t i = 0; i < n; ++i) keep.insert(rankable[i]);
        if (has_sim && qs <= thr) keep.insert(visible.begin(), visible.end());
        if (s.sink && !visible.empty() && visible[0] == 0) keep.insert(0);
        std::int64_t j = 0;
        for (auto kb : keep) r.lut[row_index * r.NK + j++] = static_cast<std::int32_t>(kb);
        r.counts[row_index] = static_cast<std::int32_t>(keep.size());
        for (std::int64_t kb = 0; kb < r.NK; ++kb) r.scores[row_index * r.NK + kb] = S[kb];
      }
    }
  }
  return r;
}

// ---- comparisons -------------------------------------------------------------------------------
bool close(double out, double ref, double tol) {
  if (std::isinf(ref) || std::isinf(out)) return out == ref;
  return std::abs(out - ref) <= tol * (1.0 + std::abs(ref));
}

std::string row_str(const Result& r, std::int64_t b, std::int64_t h, std::int64_t qb) {
  std::ostringstream os;
  os << "[";
  for (std::int64_t j = 0; j < r.NK; ++j) {
    const auto v = r.lut_at(b, h, qb, j);
    if (v < 0) break;
    os << (j ? " " : "") << v;
  }
  os << "] count " << r.count_at(b, h, qb);
  return os.str();
}

// Block for block; scores and sims within f32 rounding of the fp64 values.
void expect_same_map(const Result& out, const Result& ref, const char* what, double tol = 2e-6) {
  ASSERT_TRUE(out.ok && ref.ok);
  ASSERT_EQ(out.lut.size(), ref.lut.size());
  int reported = 0;
  for (std::int64_t b = 0; b < out.B; ++b)
    for (std::int64_t h = 0; h < out.Hq; ++h)
      for (std::int64_t qb = 0; qb < out.NQ; ++qb) {
        bool same = out.count_at(b, h, qb) == ref.count_at(b, h, qb);
        for (std::int64_t j = 0; j < out.NK; ++j) same = same && out.lut_at(b, h, qb, j) == ref.lut_at(b, h, qb, j);
        if (!same && reported++ < 5) {
          ADD_FAILURE() << what << ": row (b=" << b << ", h=" << h << ", qb=" << qb << ") is " << row_str(out, b, h, qb)
                        << ", expected " << row_str(ref, b, h, qb);
        }
      }
  if (out.scores.empty() || ref.scores.empty()) return;
  auto check = [&](const std::vector<double>& o, const std::vector<double>& e, const char* name) {
    ASSERT_EQ(o.size(), e.size());
    for (size_t i = 0; i < o.size(); ++i) {
      if (!close(o[i], e[i], tol)) {
        ADD_FAILURE() << what << ": " << name << "[" << i << "] = " << o[i] << ", expected " << e[i];
        return;
      }
    }
  };
  check(out.scores, ref.scores, "maybe_scores");
  check(out.q_sim, ref.q_sim, "maybe_q_sim");
  check(out.k_sim, ref.k_sim, "maybe_k_sim");
}

void expect_identical(const Result& a, const Result& b, const char* what) {
  ASSERT_TRUE(a.ok && b.ok);
  EXPECT_EQ(a.lut, b.lut) << what;
  EXPECT_EQ(a.counts, b.counts) << what;
  // Bitwise, NaN-free outputs: compare as doubles exactly (-inf == -inf).
  EXPECT_EQ(a.scores, b.scores) << what;
  EXPECT_EQ(a.q_sim, b.q_sim) << what;
  EXPECT_EQ(a.k_sim, b.k_sim) << what;
}

// Number of visible key blocks of every row, by brute force.
std::vector<std::int64_t> visible_counts(const Spec& s, const Inputs& in) {
  std::vector<std::int64_t> nv;
  for (std::int64_t si = 0; si < s.seqs(); ++si) {
    const Seq sq = seq_of(s, in, si);
    for (int h = 0; h < s.hq; ++h)
      for (std::int64_t qb = 0; qb < s.nq(); ++qb) {
        std::int64_t n = 0;
        for (std::int64_t kb = 0; kb < s.nk(); ++kb) n += block_visible(sq, s.blkq, s.blkk, qb, kb, s.causal);
        nv.push_back(n);
      }
  }
  return nv;
}

void check_against_reference(const Spec& s, const std::string& name) {
  auto rng = rng_for(name);
  const Inputs in = make_inputs(s, rng);
  const Result out = run_map(s, in);
  const Result ref = reference(s, in);
  expect_same_map(out, ref, "vs naive reference");
}

// ---- BlockMap: against the reference -----------------------------------------------------------
SPARGE_CASES(BlockMap) {
  const DType dtypes[3] = {DType::f32, DType::f16, DType::bf16};
  const Layout layouts[3] = {Layout::nhd, Layout::hnd, Layout::pad};
  const std::array<std::int64_t, 2> lens[] = {{1, 1},     {113, 203}, {203, 113}, {799, 3},  {3, 799},
                                              {128, 128}, {799, 799}, {64, 1000}, {255, 257}, {1, 500}};
  const std::array<int, 2> blks[] = {{64, 64}, {128, 128}, {64, 128}, {128, 64}};
  const std::array<int, 2> heads[] = {{1, 1}, {4, 2}, {8, 2}, {3, 3}, {6, 1}};
  int idx = 0;
  for (const auto& len : lens) {
    for (const auto& blk : blks) {
      for (int causal = 0; causal < 2; ++causal) {
        Spec s;
        s.b = 1 + idx % 2;
        s.hq = heads[idx % 5][0];
        s.hk = heads[idx % 5][1];
        s.sq = len[0];
        s.sk = len[1];
        s.d = idx % 3 == 0 ? 64 : idx % 3 == 1 ? 32 : 128;
        if (len[0] * len[1] > 200000) s.d = 32;  // keep the naive reference quick
        s.blkq = blk[0];
        s.blkk = blk[1];
        s.causal = causal != 0;
        s.dtype = dtypes[(idx / 2) % 3];
        s.layout = layouts[(idx / 3) % 3];
        s.sink = idx % 4 == 1;
        s.smooth = idx % 7 != 3;
        s.out_strided = idx % 5 == 2;
        s.dup_k = idx % 6 == 4;
        s.threads = idx % 3 == 0 ? 1 : 0;
        if (idx % 5 == 3) s.scale = 0.7f;
        const int sel = idx % 4;
        if (sel == 0) s.topk = {0.4f};
        if (sel == 1) s.cdf = {0.9f};
        if (sel == 2) {  // per-head values
          for (int h = 0; h < s.hq; ++h) s.topk.push_back(0.1f + 0.23f * static_cast<float>(h % 4));
        }
        if (sel == 3) {
          for (int h = 0; h < s.hq; ++h) s.cdf.push_back(0.3f + 0.2f * static_cast<float>(h % 3));
        }
        if (idx % 3 == 1) s.sim = {0.3f};
        if (idx % 3 == 2) {
          for (int h = 0; h < s.hq; ++h) s.sim.push_back(-0.1f + 0.15f * static_cast<float>(h % 5));
        }
        ++idx;
        const std::string name = case_name("BLOCKMAP", s);
        cases.push_back({name, [s, name] { check_against_reference(s, name); }});
      }
    }
  }
  // Every tail size of a 64 block on both sides, and a spread of 128-block tails.
  for (int t = 1; t <= 64; ++t) {
    Spec s;
    s.hq = 2;
    s.hk = 1;
    s.d = 8;
    s.sq = 128 + t;
    s.sk = 192 + (t * 37) % 64;
    s.causal = t % 2 == 0;
    if (t % 3 == 0) std::swap(s.sq, s.sk);
    s.topk = {t % 2 ? 0.5f : 0.25f};
    if (t % 4 == 3) {
      s.topk.clear();
      s.cdf = {0.8f};
    }
    s.sim = {0.2f};
    s.sink = t % 5 == 0;
    s.dtype = dtypes[t % 3];
    const std::string name = case_name("BLOCKMAP", s);
    cases.push_back({name, [s, name] { check_against_reference(s, name); }});
  }
  for (int t = 1; t <= 128; t += 9) {
    Spec s;
    s.hq = 2;
    s.hk = 2;
    s.d = 8;
    s.blkq = 128;
    s.blkk = 128;
    s.sq = 256 + t;
    s.sk = 384 + (t * 53) % 128;
    s.causal = true;
    if (t % 2) std::swap(s.sq, s.sk);
    s.cdf = {0.7f};
    s.sim = {0.25f};
    const std::string name = case_name("BLOCKMAP", s);
    cases.push_back({name, [s, name] { check_against_reference(s, name); }});
  }
  // Varlen: empty sequences, sequences shorter than a block, Sq > Sk and Sq < Sk within a batch,
  // max_seqlen beyond the longest sequence (query blocks past every end).
  const std::vector<std::array<std::vector<int>, 2>> varlens = {
      {{{100, 1, 300, 64}, {200, 50, 130, 64}}},
      {{{0, 129, 77}, {40, 0, 300}}},
      {{{513}, {257}}},
      {{{65, 65, 65, 65, 65}, {1, 64, 65, 128, 200}}},
  };
  idx = 0;
  for (const auto& vl : varlens) {
    for (int causal = 0; causal < 2; ++causal) {
      for (int sel = 0; sel < 2; ++sel) {
        Spec s;
        s.lens_q = vl[0];
        s.lens_k = vl[1];
        s.hq = idx % 2 ? 4 : 2;
        s.hk = 2;
        s.d = 32;
        s.blkq = idx % 3 == 2 ? 128 : 64;
        s.blkk = idx % 4 == 1 ? 128 : 64;
        s.causal = causal != 0;
        s.pad_max = idx % 3 == 0 ? 70 : 0;
        if (sel == 0) s.topk = {0.3f};
        if (sel == 1) s.cdf = {0.85f};
        s.sim = idx % 2 ? std::vector<float>{0.35f} : std::vector<float>{};
        s.sink = idx % 4 == 2;
        s.dtype = dtypes[idx % 3];
        s.layout = layouts[idx % 3];
        s.out_strided = idx % 2 == 1;
        s.dup_k = idx % 5 == 1;
        ++idx;
        const std::string name = case_name("BLOCKMAP", s);
        cases.push_back({name, [s, name] { check_against_reference(s, name); }});
      }
    }
  }
}

// ---- BlockMapProp: properties and equivalences -------------------------------------------------
Spec prop_spec(std::int64_t sq, std::int64_t sk, bool causal) {
  Spec s;
  s.b = 2;
  s.hq = 4;
  s.hk = 2;
  s.sq = sq;
  s.sk = sk;
  s.d = 32;
  s.causal = causal;
  return s;
}

const std::array<std::int64_t, 2> kPropLens[] = {{700, 700}, {300, 900}, {900, 300}, {65, 1000}};

SPARGE_CASES(BlockMapProp) {
  // topk keeps exactly n = min(NV, max(1, floor(topk * NV))) when every block is self-similar,
  // and never an invisible block.
  for (float topk : {0.01f, 0.1f, 0.33f, 0.5f, 0.99f, 1.0f}) {
    for (const auto& len : kPropLens) {
      for (int causal = 0; causal < 2; ++causal) {
        if (topk != 0.33f && len[0] != 300) continue;
        Spec s = prop_spec(len[0], len[1], causal != 0);
        s.topk = {topk};
        const std::string name = case_name("BLOCKMAP_TOPK_COUNT", s);
        cases.push_back({name, [s, name, topk] {
                           auto rng = rng_for(name);
                           const Inputs in = make_inputs(s, rng);
                           const Result out = run_map(s, in);
                           ASSERT_TRUE(out.ok);
                           const auto nv = visible_counts(s, in);
                           for (size_t row = 0; row < nv.size(); ++row) {
                             const auto want = std::min<std::int64_t>(
                                 nv[row], std::max<std::int64_t>(1, static_cast<std::int64_t>(std::floor(
                                                                        static_cast<double>(topk) * nv[row]))));
                             ASSERT_EQ(out.counts[row], want) << "row " << row << " NV " << nv[row];
                             for (std::int64_t j = 0; j < out.NK; ++j) {
                               const auto v = out.lut[row * out.NK + j];
                               if (j < want) {
                                 ASSERT_TRUE(v >= 0 && v < nv[row]) << "row " << row << " selects invisible " << v;
                                 if (j > 0) ASSERT_LT(out.lut[row * out.NK + j - 1], v) << "not ascending";
                               } else {
                                 ASSERT_EQ(v, -1) << "row " << row << " not -1 padded";
                               }
                             }
                           }
                         }});
      }
    }
  }

  // cdf: the kept blocks are a prefix of the ranking, their mass reaches the threshold and
  // dropping the last (smallest) kept block falls below it.
  for (float cdf : {0.05f, 0.3f, 0.6f, 0.9f, 0.99f}) {
    for (const auto& len : kPropLens) {
      for (int causal = 0; causal < 2; ++causal) {
        if (cdf != 0.6f && len[0] != 700) continue;
        Spec s = prop_spec(len[0], len[1], causal != 0);
        s.cdf = {cdf};
        s.scale = 4.0f;  // sharper softmax: prefixes of every length occur
        const std::string name = case_name("BLOCKMAP_CDF_MASS", s);
        cases.push_back({name, [s, name, cdf] {
                           auto rng = rng_for(name);
                           const Inputs in = make_inputs(s, rng);
                           const Result out = run_map(s, in);
                           ASSERT_TRUE(out.ok);
                           const auto nv = visible_counts(s, in);
                           for (size_t row = 0; row < nv.size(); ++row) {
                             if (nv[row] == 0) {
                               ASSERT_EQ(out.counts[row], 0);
                               continue;
                             }
                             const double* S = &out.scores[row * out.NK];
                             double mx = -kInf, z = 0;
                             for (std::int64_t kb = 0; kb < nv[row]; ++kb) mx = std::max(mx, S[kb]);
                             for (std::int64_t kb = 0; kb < nv[row]; ++kb) z += std::exp(S[kb] - mx);
                             double mass = 0, smallest = 1, min_kept = kInf, max_dropped = -kInf;
                             std::vector<char> kept(static_cast<size_t>(out.NK), 0);
                             for (std::int64_t j = 0; j < out.counts[row]; ++j) kept[out.lut[row * out.NK + j]] = 1;
                             for (std::int64_t kb = 0; kb < nv[row]; ++kb) {
                               const double pr = std::exp(S[kb] - mx) / z;
                               if (kept[kb]) {
                                 mass += pr;
                                 smallest = std::min(smallest, pr);
                                 min_kept = std::min(min_kept, S[kb]);
                               } else {
                                 max_dropped = std::max(max_dropped, S[kb]);
                               }
                             }
                             ASSERT_GE(min_kept, max_dropped) << "row " << row << ": kept set is not a ranking prefix";
                             ASSERT_GE(mass, cdf - 1e-5) << "row " << row;
                             ASSERT_LT(mass - smallest, cdf + 1e-5) << "row " << row << ": the prefix is not the smallest";
                           }
                         }});
      }
    }
  }

  // cdfthreshd = 1 keeps every visible block on a flat softmax, also on the rows where rounding
  // leaves the accumulated mass a few ulps below 1 (then every rankable block is kept).
  for (int causal = 0; causal < 2; ++causal) {
    Spec s = prop_spec(1000, 1500, causal != 0);
    s.cdf = {1.0f};
    s.scale = 0.05f;
    const std::string name = case_name("BLOCKMAP_CDF_ONE", s);
    cases.push_back({name, [s, name] {
                       auto rng = rng_for(name);
                       const Inputs in = make_inputs(s, rng);
                       const Result out = run_map(s, in);
                       ASSERT_TRUE(out.ok);
                       const auto nv = visible_counts(s, in);
                       for (size_t row = 0; row < nv.size(); ++row) ASSERT_EQ(out.counts[row], nv[row]) << "row " << row;
                     }});
  }

  // Genuine ties: K blocks 2 and 5 are identical and score highest; one kept block must be 2.
  for (int mode = 0; mode < 4; ++mode) {
    Spec s;
    s.sq = 64;
    s.sk = 64 * 6 + 17;
    s.d = 16;
    s.smooth = mode % 2 == 0;
    if (mode < 2) s.topk = {0.2f};
    else s.cdf = {0.3f};
    const std::string name = case_name("BLOCKMAP_TIES", s);
    cases.push_back({name, [s, name] {
                       auto rng = rng_for(name);
                       Inputs in = make_inputs(s, rng);
                       std::normal_distribution<float> nd(0.0f, 1.0f);
                       std::vector<float> u(16);
                       for (auto& x : u) x = nd(rng);
                       for (std::int64_t r = 0; r < s.sq; ++r)
                         for (int i = 0; i < 16; ++i) in.qv(0, r, 0, i) = u[i];
                       for (std::int64_t r = 0; r < s.sk; ++r)  // other K blocks: weak noise
                         for (int i = 0; i < 16; ++i) in.kv(0, r, 0, i) = 0.1f * nd(rng);
                       for (std::int64_t r = 0; r < 64; ++r)
                         for (int i = 0; i < 16; ++i) {
                           in.kv(0, 2 * 64 + r, 0, i) = 3.0f * u[i] + 0.5f * nd(rng);
                           in.kv(0, 5 * 64 + r, 0, i) = in.kv(0, 2 * 64 + r, 0, i);
                         }
                       const Result out = run_map(s, in);
                       ASSERT_TRUE(out.ok);
                       ASSERT_EQ(out.score_at(0, 0, 0, 2), out.score_at(0, 0, 0, 5));
                       EXPECT_EQ(out.count_at(0, 0, 0), 1);
                       EXPECT_EQ(out.lut_at(0, 0, 0, 0), 2);
                       expect_same_map(out, reference(s, in), "vs naive reference");
                     }});
  }
  // All blocks identical: every score ties, so topk keeps the first n blocks.
  for (int causal = 0; causal < 2; ++causal) {
    Spec s;
    s.sq = 64 * 8;
    s.sk = 64 * 8;
    s.d = 16;
    s.causal = causal != 0;
    s.smooth = false;
    s.topk = {0.5f};
    const std::string name = case_name("BLOCKMAP_ALL_TIED", s);
    cases.push_back({name, [s, name] {
                       auto rng = rng_for(name);
                       Inputs in = make_inputs(s, rng);
                       for (std::int64_t r = 0; r < s.sk; ++r)
                         for (int i = 0; i < 16; ++i) in.kv(0, r, 0, i) = in.kv(0, r % 64, 0, i);
                       const Result out = run_map(s, in);
                       ASSERT_TRUE(out.ok);
                       const auto nv = visible_counts(s, in);
                       for (std::int64_t qb = 0; qb < out.NQ; ++qb) {
                         const std::int64_t n = std::max<std::int64_t>(1, nv[qb] / 2);
                         ASSERT_EQ(out.count_at(0, 0, qb), n);
                         for (std::int64_t j = 0; j < n; ++j) ASSERT_EQ(out.lut_at(0, 0, qb, j), j) << "qb " << qb;
                       }
                     }});
  }

  // Sink: the map with the sink is the map without it plus block 0 wherever block 0 is visible.
  for (const auto& len : kPropLens) {
    for (int sel = 0; sel < 4; ++sel) {
      Spec s = prop_spec(len[0], len[1], true);
      if (sel % 2 == 0) s.topk = {0.05f};
      else s.cdf = {0.2f};
      if (sel >= 2) s.sim = {0.1f};
      s.sink = true;
      const std::string name = case_name("BLOCKMAP_SINK", s);
      cases.push_back({name, [s, name] {
                         auto rng = rng_for(name);
                         const Inputs in = make_inputs(s, rng);
                         const Result with = run_map(s, in);
                         Spec s0 = s;
                         s0.sink = false;
                         const Result without = run_map(s0, in);
                         ASSERT_TRUE(with.ok && without.ok);
                         const auto nv = visible_counts(s, in);
                         std::int64_t added = 0;
                         for (size_t row = 0; row < nv.size(); ++row) {
                           std::set<std::int32_t> want;
                           for (std::int64_t j = 0; j < without.counts[row]; ++j) want.insert(without.lut[row * with.NK + j]);
                           if (nv[row] > 0) added += want.insert(0).second;
                           std::vector<std::int32_t> got(with.lut.begin() + row * with.NK,
                                                         with.lut.begin() + row * with.NK + with.counts[row]);
                           ASSERT_EQ(got, std::vector<std::int32_t>(want.begin(), want.end())) << "row " << row;
                         }
                         // Without a similarity test block 0 is never forced, so the sink must
                         // add it somewhere (with one, every block 0 may be a forced column).
                         if (s.sim.empty()) EXPECT_GT(added, 0) << "the sink never mattered: weak case";
                       }});
    }
  }

  // Forced rows: Q blocks of pure noise are not self-similar and select every visible block.
  for (const auto& len : kPropLens) {
    for (int causal = 0; causal < 2; ++causal) {
      Spec s = prop_spec(len[0], len[1], causal != 0);
      s.topk = {0.1f};
      s.sim = {0.5f};
      const std::string name = case_name("BLOCKMAP_FORCED_ROWS", s);
      cases.push_back({name, [s, name] {
                         auto rng = rng_for(name);
                         Inputs in = make_inputs(s, rng);
                         std::normal_distribution<float> nd(0.0f, 1.0f);
                         // Pure noise, and blocks of fewer than 8 rows all zero (a lone row is
                         // trivially self-similar; a zero block has sim 0).
                         for (std::int64_t b = 0; b < in.batch; ++b)
                           for (std::int64_t r = 0; r < in.rows_q; ++r) {
                             const bool short_block = in.rows_q - r / 64 * 64 < 8;
                             for (int h = 0; h < in.hq; ++h)
                               for (int i = 0; i < in.d; ++i) in.qv(b, r, h, i) = short_block ? 0.0f : nd(rng);
                           }
                         const Result out = run_map(s, in);
                         ASSERT_TRUE(out.ok);
                         const auto nv = visible_counts(s, in);
                         for (size_t row = 0; row < nv.size(); ++row) {
                           ASSERT_LE(out.q_sim[row], 0.5);
                           ASSERT_EQ(out.counts[row], nv[row]) << "row " << row;
                           for (std::int64_t j = 0; j < out.NK; ++j) {
                             ASSERT_EQ(out.lut[row * out.NK + j], j < nv[row] ? j : -1) << "row " << row;
                           }
                         }
                       }});
    }
  }

  // Forced columns: a K block of pure noise is not self-similar; every row that sees it selects
  // it, its score is -inf, and it takes no ranked slot.
  for (const auto& len : kPropLens) {
    for (int causal = 0; causal < 2; ++causal) {
      Spec s = prop_spec(len[0], len[1], causal != 0);
      s.topk = {0.1f};
      s.sim = {0.5f};
      s.smooth = false;  // the K mean would dominate the noise block and make it look similar
      const std::string name = case_name("BLOCKMAP_FORCED_COLUMNS", s);
      cases.push_back({name, [s, name] {
                         auto rng = rng_for(name);
                         Inputs in = make_inputs(s, rng);
                         std::normal_distribution<float> nd(0.0f, 1.0f);
                         // Q and K: one strong direction per 64 rows (similar blocks), K block 1 noise.
                         for (auto* x : {&in.q, &in.k}) {
                           const bool is_k = x == &in.k;
                           const std::int64_t rows = is_k ? in.rows_k : in.rows_q;
                           const int heads = is_k ? in.hk : in.hq;
                           for (std::int64_t b = 0; b < in.batch; ++b)
                             for (int h = 0; h < heads; ++h) {
                               std::vector<float> dir(32);
                               for (std::int64_t r = 0; r < rows; ++r) {
                                 if (r % 64 == 0)
                                   for (auto& v : dir) v = nd(rng);
                                 const bool noise = is_k && r / 64 == 1;
                                 for (int i = 0; i < 32; ++i) {
                                   float& v = is_k ? in.kv(b, r, h, i) : in.qv(b, r, h, i);
                                   v = (noise ? 0.0f : 4.0f * dir[i]) + nd(rng);
                                 }
                               }
                             }
                         }
                         const Result out = run_map(s, in);
                         ASSERT_TRUE(out.ok);
                         const auto nv = visible_counts(s, in);
                         for (std::int64_t b = 0; b < out.B; ++b)
                           for (std::int64_t h = 0; h < out.Hq; ++h)
                             for (std::int64_t qb = 0; qb < out.NQ; ++qb) {
                               const size_t row = static_cast<size_t>((b * out.Hq + h) * out.NQ + qb);
                               const std::int64_t v = nv[row];
                               if (v == 0) {
                                 ASSERT_EQ(out.counts[row], 0);
                                 continue;
                               }
                               ASSERT_GT(out.q_sim[row], 0.5);
                               const bool sees1 = v > 1;
                               const std::int64_t ranked =
                                   std::min<std::int64_t>(v - sees1, std::max<std::int64_t>(1, static_cast<std::int64_t>(
                                                                                                   std::floor(static_cast<double>(0.1f) * v))));
                               ASSERT_EQ(out.counts[row], ranked + sees1) << "row " << row;
                               if (sees1) {
                                 ASSERT_EQ(out.score_at(b, h, qb, 1), -kInf);
                                 bool found = false;
                                 for (std::int64_t j = 0; j < out.counts[row]; ++j) found |= out.lut_at(b, h, qb, j) == 1;
                                 ASSERT_TRUE(found) << "row " << row << " misses the forced column";
                               }
                             }
                       }});
    }
  }

  // Varlen equals one run per sequence.
  const std::vector<std::array<std::vector<int>, 2>> varlens = {
      {{{100, 1, 300, 64}, {200, 50, 130, 64}}},
      {{{0, 129, 77}, {40, 0, 300}}},
      {{{65, 65, 200}, {1, 128, 600}}},
  };
  for (const auto& vl : varlens) {
    for (int causal = 0; causal < 2; ++causal) {
      Spec s;
      s.lens_q = vl[0];
      s.lens_k = vl[1];
      s.pad_max = 30;
      s.hq = 4;
      s.hk = 2;
      s.d = 32;
      s.causal = causal != 0;
      s.topk = {0.3f};
      s.sim = {0.3f};
      s.sink = true;
      const std::string name = case_name("BLOCKMAP_VARLEN_EQ_SEQS", s);
      cases.push_back({name, [s, name] {
                         auto rng = rng_for(name);
                         const Inputs in = make_inputs(s, rng);
                         const Result all = run_map(s, in);
                         ASSERT_TRUE(all.ok);
                         for (std::int64_t si = 0; si < s.seqs(); ++si) {
                           Spec one = s;
                           one.lens_q.clear();
                           one.lens_k.clear();
                           one.b = 1;
                           one.sq = s.lens_q[si];
                           one.sk = s.lens_k[si];
                           Inputs part;
                           part.hq = s.hq;
                           part.hk = s.hk;
                           part.d = s.d;
                           part.rows_q = one.sq;
                           part.rows_k = one.sk;
                           part.q.assign(in.q.begin() + in.cu_q[si] * s.hq * s.d, in.q.begin() + in.cu_q[si + 1] * s.hq * s.d);
                           part.k.assign(in.k.begin() + in.cu_k[si] * s.hk * s.d, in.k.begin() + in.cu_k[si + 1] * s.hk * s.d);
                           const Result r = one.sq > 0 ? run_map(one, part) : Result{};
                           for (int h = 0; h < s.hq; ++h)
                             for (std::int64_t qb = 0; qb < all.NQ; ++qb) {
                               const bool inside = qb < r.NQ;
                               ASSERT_EQ(all.count_at(si, h, qb), inside ? r.count_at(0, h, qb) : 0) << "seq " << si << " qb " << qb;
                               for (std::int64_t j = 0; j < all.NK; ++j) {
                                 const std::int32_t want = inside && j < r.NK ? r.lut_at(0, h, qb, j) : -1;
                                 ASSERT_EQ(all.lut_at(si, h, qb, j), want) << "seq " << si << " qb " << qb;
                                 const double ws = inside && j < r.NK ? r.score_at(0, h, qb, j) : -kInf;
                                 ASSERT_EQ(all.score_at(si, h, qb, j), ws) << "seq " << si << " qb " << qb;
                               }
                             }
                         }
                       }});
    }
  }

  // GQA equals repeating each kv head Hq/Hk times.
  for (int hk : {1, 2, 4}) {
    for (int causal = 0; causal < 2; ++causal) {
      Spec s = prop_spec(300, 500, causal != 0);
      s.hq = 8;
      s.hk = hk;
      s.cdf = {0.7f};
      s.sim = {0.3f};
      s.dtype = DType::bf16;
      const std::string name = case_name("BLOCKMAP_GQA_EQ_REPEAT", s);
      cases.push_back({name, [s, name] {
                         auto rng = rng_for(name);
                         const Inputs in = make_inputs(s, rng);
                         const Result gqa = run_map(s, in);
                         Spec full = s;
                         full.hk = s.hq;
                         Inputs rep = in;
                         rep.hk = s.hq;
                         rep.k.assign(static_cast<size_t>(in.batch * in.rows_k * s.hq * s.d), 0.0f);
                         for (std::int64_t b = 0; b < in.batch; ++b)
                           for (std::int64_t r = 0; r < in.rows_k; ++r)
                             for (int h = 0; h < s.hq; ++h)
                               for (int i = 0; i < s.d; ++i) rep.kv(b, r, h, i) = in.kv(b, r, h / (s.hq / s.hk), i);
                         const Result repeated = run_map(full, rep);
                         ASSERT_TRUE(gqa.ok && repeated.ok);
                         EXPECT_EQ(gqa.lut, repeated.lut);
                         EXPECT_EQ(gqa.counts, repeated.counts);
                         EXPECT_EQ(gqa.scores, repeated.scores);
                         EXPECT_EQ(gqa.q_sim, repeated.q_sim);
                       }});
    }
  }

  // Storage layouts and output strides change nothing, bit for bit.
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    for (int causal = 0; causal < 2; ++causal) {
      Spec s = prop_spec(333, 444, causal != 0);
      s.topk = {0.3f};
      s.sim = {0.3f};
      s.dtype = dt;
      const std::string name = case_name("BLOCKMAP_LAYOUTS_EQ", s);
      cases.push_back({name, [s, name] {
                         auto rng = rng_for(name);
                         const Inputs in = make_inputs(s, rng);
                         const Result nhd = run_map(s, in);
                         Spec t = s;
                         t.layout = Layout::hnd;
                         expect_identical(nhd, run_map(t, in), "HND vs NHD");
                         t.layout = Layout::pad;
                         t.out_strided = true;
                         expect_identical(nhd, run_map(t, in), "padded rows + strided outputs vs NHD");
                       }});
    }
  }

  // Broadcast: k with batch stride 0 equals the materialized copy.
  {
    Spec s = prop_spec(200, 300, true);
    s.cdf = {0.8f};
    const std::string name = case_name("BLOCKMAP_K_BROADCAST_STRIDE0", s);
    cases.push_back({name, [s, name] {
                       auto rng = rng_for(name);
                       Inputs in = make_inputs(s, rng);
                       const std::int64_t per_batch = in.rows_k * s.hk * s.d;
                       std::copy(in.k.begin(), in.k.begin() + per_batch, in.k.begin() + per_batch);
                       const Result copy = run_map(s, in);
                       // Same values through a stride-0 batch dimension.
                       Guarded<std::int32_t> lut(static_cast<size_t>(copy.lut.size())), counts(copy.counts.size());
                       lut.poison();
                       counts.poison();
                       BlockMapParams p;
                       p.q = make_tensor(in.q.data(), DType::f32, {2, s.sq, s.hq, s.d});
                       p.k = make_tensor(in.k.data(), DType::f32, {2, s.sk, s.hk, s.d},
                                         {0, s.hk * s.d, s.d, 1});
                       p.cdfthreshd = PerHead(s.cdf);
                       p.is_causal = true;
                       p.lut = make_tensor(lut.data(), DType::i32, {2, s.hq, copy.NQ, copy.NK});
                       p.counts = make_tensor(counts.data(), DType::i32, {2, s.hq, copy.NQ});
                       const Status st = build_block_map(p);
                       ASSERT_TRUE(st.ok()) << st.message();
                       EXPECT_EQ(std::vector<std::int32_t>(lut.data(), lut.data() + lut.size()), copy.lut);
                       EXPECT_EQ(std::vector<std::int32_t>(counts.data(), counts.data() + counts.size()), copy.counts);
                       EXPECT_TRUE(lut.guards_intact() && counts.guards_intact());
                     }});
  }

  // The thread count changes nothing, bit for bit; diagnostics off changes nothing either.
  for (int causal = 0; causal < 2; ++causal) {
    Spec s = prop_spec(1000, 1300, causal != 0);
    s.cdf = {0.8f};
    s.sim = {0.3f};
    s.lens_q = {400, 1, 599};
    s.lens_k = {700, 300, 300};
    s.sink = true;
    const std::string name = case_name("BLOCKMAP_THREADS_EQ", s);
    cases.push_back({name, [s, name] {
                       auto rng = rng_for(name);
                       const Inputs in = make_inputs(s, rng);
                       Spec t = s;
                       t.threads = 1;
                       const Result one = run_map(t, in);
                       for (int threads : {2, 3, 16}) {
                         t.threads = threads;
                         expect_identical(one, run_map(t, in), "threads");
                       }
                       const Result plain = run_map(s, in, false);
                       EXPECT_EQ(plain.lut, one.lut);
                       EXPECT_EQ(plain.counts, one.counts);
                     }});
  }

  // Smoothing matters: a large common K offset makes every raw K block self-similar, and the
  // smoothed map must still match the reference (a missing K mean would not).
  for (int smooth = 0; smooth < 2; ++smooth) {
    Spec s = prop_spec(256, 640, false);
    s.k_offset = 5.0f;
    s.smooth = smooth != 0;
    s.sim = {0.5f};
    s.topk = {0.2f};
    const std::string name = case_name("BLOCKMAP_SMOOTH_K", s);
    cases.push_back({name, [s, name] {
                       auto rng = rng_for(name);
                       const Inputs in = make_inputs(s, rng);
                       const Result out = run_map(s, in);
                       expect_same_map(out, reference(s, in), "vs naive reference");
                       double lowest = kInf;
                       for (double v : out.k_sim) lowest = std::min(lowest, v);
                       if (s.smooth) EXPECT_LT(lowest, 0.5) << "smoothing should expose dissimilar K blocks";
                       else EXPECT_GT(lowest, 0.5) << "the offset should make raw K blocks similar";
                     }});
  }

  // Zero rows: they count in n but add nothing to the similarity sum; all-zero blocks give 0.
  {
    Spec s = prop_spec(200, 200, false);
    s.smooth = false;
    s.topk = {0.5f};
    s.sim = {0.2f};
    const std::string name = case_name("BLOCKMAP_ZERO_ROWS", s);
    cases.push_back({name, [s, name] {
                       auto rng = rng_for(name);
                       Inputs in = make_inputs(s, rng);
                       for (std::int64_t r = 0; r < 64; ++r)
                         for (int i = 0; i < s.d; ++i) {
                           in.kv(0, r, 0, i) = 0.0f;                    // block 0 of kv head 0: all zero
                           if (r % 2) in.qv(0, 64 + r, 1, i) = 0.0f;    // half the rows of a Q block
                         }
                       const Result out = run_map(s, in);
                       expect_same_map(out, reference(s, in), "vs naive reference");
                       EXPECT_EQ(out.k_sim[0], 0.0);
                     }});
  }

  // A block is self-similar only when sim > threshold: a sim exactly equal to the threshold
  // (0 for an all-zero block, 1 for a lone one-hot row) makes a forced row / column.
  for (int exact_one = 0; exact_one < 2; ++exact_one) {
    Spec s;
    s.sq = 129;  // the tail query block is one row
    s.sk = 193;  // the tail key block is one row
    s.d = 16;
    s.smooth = false;
    s.topk = {0.3f};
    s.sim = {exact_one ? 1.0f : 0.0f};
    const std::string name = case_name("BLOCKMAP_SIM_AT_THRESHOLD", s);
    cases.push_back({name, [s, name, exact_one] {
                       auto rng = rng_for(name);
                       Inputs in = make_inputs(s, rng);
                       if (exact_one) {
                         for (int i = 0; i < s.d; ++i) {
                           in.qv(0, 128, 0, i) = i == 0 ? 1.0f : 0.0f;
                           in.kv(0, 192, 0, i) = i == 1 ? 1.0f : 0.0f;
                         }
                       } else {  // query block 1 and key block 1 all zero
                         for (int r = 64; r < 128; ++r)
                           for (int i = 0; i < s.d; ++i) in.qv(0, r, 0, i) = in.kv(0, r, 0, i) = 0.0f;
                       }
                       const Result out = run_map(s, in);
                       ASSERT_TRUE(out.ok);
                       const std::int64_t qb = exact_one ? 2 : 1, kb = exact_one ? 3 : 1;
                       ASSERT_EQ(out.q_sim[qb], exact_one ? 1.0 : 0.0);
                       ASSERT_EQ(out.k_sim[kb], exact_one ? 1.0 : 0.0);
                       EXPECT_EQ(out.count_at(0, 0, qb), 4) << "the query block at the threshold is a forced row";
                       for (std::int64_t q = 0; q < out.NQ; ++q) {
                         EXPECT_EQ(out.score_at(0, 0, q, kb), -kInf);
                         bool found = false;
                         for (std::int64_t j = 0; j < out.count_at(0, 0, q); ++j) found |= out.lut_at(0, 0, q, j) == kb;
                         EXPECT_TRUE(found) << "qb " << q << ": the key block at the threshold is a forced column";
                       }
                       expect_same_map(out, reference(s, in), "vs naive reference");
                     }});
  }

  // A long sequence: 4096 key blocks per row.
  {
    Spec s;
    s.sq = 262144;
    s.sk = 262144;
    s.d = 16;
    s.causal = true;
    s.topk = {0.05f};
    s.sim = {0.1f};
    s.dtype = DType::bf16;
    const std::string name = case_name("BLOCKMAP_LONG", s);
    cases.push_back({name, [s, name] {
                       auto rng = rng_for(name);
                       const Inputs in = make_inputs(s, rng);
                       const Result out = run_map(s, in, false);
                       ASSERT_TRUE(out.ok);
                       for (std::int64_t qb = 0; qb < out.NQ; ++qb) {
                         const std::int32_t c = out.count_at(0, 0, qb);
                         ASSERT_GE(c, std::max<std::int64_t>(1, static_cast<std::int64_t>(std::floor(0.05 * (qb + 1)))));
                         ASSERT_LE(c, qb + 1);
                         ASSERT_LE(out.lut_at(0, 0, qb, c - 1), qb);
                       }
                     }});
  }
}

// ---- BlockMapBad: one bad input per parameter --------------------------------------------------
// A valid problem (Hq = 4, Hk = 2, Sq = 100, Sk = 150, D = 16: NQ = 2, NK = 3) whose params each
// case breaks in one place.
struct BadFixture {
  std::vector<float> q = std::vector<float>(2 * 100 * 4 * 16, 0.5f);
  std::vector<float> k = std::vector<float>(2 * 150 * 2 * 16, 0.25f);
  std::vector<std::uint16_t> q16 = std::vector<std::uint16_t>(2 * 100 * 4 * 16, 0);
  Guarded<std::int32_t> lut{2 * 4 * 2 * 3}, counts{2 * 4 * 2};
  Guarded<float> scores{2 * 4 * 2 * 3}, q_sim{2 * 4 * 2}, k_sim{2 * 2 * 3};
  std::vector<float> topk{0.5f};
  std::vector<std::int32_t> cu_q{0, 40, 100}, cu_k{0, 70, 150};
  BlockMapParams p;
  BadFixture() {
    lut.poison();
    counts.poison();
    p.q = make_tensor(q.data(), DType::f32, {2, 100, 4, 16});
    p.k = make_tensor(k.data(), DType::f32, {2, 150, 2, 16});
    p.topk = PerHead(topk);
    p.lut = make_tensor(lut.data(), DType::i32, {2, 4, 2, 3});
    p.counts = make_tensor(counts.data(), DType::i32, {2, 4, 2});
    p.maybe_scores = make_tensor(scores.data(), DType::f32, {2, 4, 2, 3});
    p.maybe_q_sim = make_tensor(q_sim.data(), DType::f32, {2, 4, 2});
    p.maybe_k_sim = make_tensor(k_sim.data(), DType::f32, {2, 2, 3});
  }
  // The same data as two varlen sequences (40/70 and 60/80 rows): NQ = 1, NK = 2.
  void make_varlen() {
    p.q = make_tensor(q.data(), DType::f32, {1, 100, 4, 16});
    p.k = make_tensor(k.data(), DType::f32, {1, 150, 2, 16});
    p.varlen.cu_seqlens_q = cu_q.data();
    p.varlen.cu_seqlens_k = cu_k.data();
    p.varlen.num_seqs = 2;
    p.varlen.max_seqlen_q = 60;
    p.varlen.max_seqlen_k = 80;
    p.lut = make_tensor(lut.data(), DType::i32, {2, 4, 1, 2});
    p.counts = make_tensor(counts.data(), DType::i32, {2, 4, 1});
    p.maybe_scores = make_tensor(scores.data(), DType::f32, {2, 4, 1, 2});
    p.maybe_q_sim = make_tensor(q_sim.data(), DType::f32, {2, 4, 1});
    p.maybe_k_sim = make_tensor(k_sim.data(), DType::f32, {2, 2, 2});
  }
};

const float kZero[] = {0.0f};
const float kHalf[] = {0.5f};
const float kOneAndABit[] = {1.01f};
const float kMinus[] = {-0.1f};
const float kBelowMinusOne[] = {-1.5f};
const float kNaN[] = {std::numeric_limits<float>::quiet_NaN()};
const float kInfF[] = {std::numeric_limits<float>::infinity()};
const float kThree[] = {0.5f, 0.5f, 0.5f};
const float kFourBadLast[] = {0.5f, 0.5f, 0.5f, 2.0f};

struct BadCase {
  const char* name;
  const char* expect;  // a substring the message must contain (the parameter)
  std::function<void(BadFixture&)> mutate;
  const char* expect2 = nullptr;
};

SPARGE_CASES(BlockMapBad) {
  cases.push_back({"BLOCKMAP_BAD(valid_baseline)", [] {
                     BadFixture f;
                     const Status st = build_block_map(f.p);
                     EXPECT_TRUE(st.ok()) << st.message();
                     BadFixture g;
                     g.make_varlen();
                     const Status sv = build_block_map(g.p);
                     EXPECT_TRUE(sv.ok()) << sv.message();
                   }});
  const std::vector<BadCase> bad = {
      {"exec.backend", "exec.backend", [](BadFixture& f) { f.p.exec.backend = static_cast<Backend>(7); }},
      {"exec.cpu_threads", "exec.cpu_threads", [](BadFixture& f) { f.p.exec.cpu_threads = -2; }},
      {"q_missing", "q is missing", [](BadFixture& f) { f.p.q.data = nullptr; }},
      {"k_missing", "k is missing", [](BadFixture& f) { f.p.k.data = nullptr; }},
      {"q.ndim", "q.ndim", [](BadFixture& f) { f.p.q.ndim = 3; }},
      {"k.ndim", "k.ndim", [](BadFixture& f) { f.p.k.ndim = 2; }},
      {"q.dtype", "q.dtype", [](BadFixture& f) { f.p.q.dtype = DType::i32; }},
      {"k.dtype", "k.dtype", [](BadFixture& f) {
         f.p.k.dtype = DType::f16;
       }},
      {"q.dtype_cuda_f32", "q.dtype", [](BadFixture& f) { f.p.exec.backend = Backend::cuda; }},
      {"q.stride", "q.stride", [](BadFixture& f) { f.p.q.stride[1] = -64; }},
      {"k.stride", "k.stride", [](BadFixture& f) { f.p.k.stride[3] = -1; }},
      {"k.shape0", "k.shape[0]", [](BadFixture& f) { f.p.k.shape[0] = 3; }},
      {"k.shape3", "k.shape[3]", [](BadFixture& f) { f.p.k.shape[3] = 8; }},
      {"hq_not_multiple", "Hk", [](BadFixture& f) { f.p.k.shape[2] = 3; }},
      {"head_dim_zero", "head dim", [](BadFixture& f) {
         f.p.q.shape[3] = 0;
         f.p.k.shape[3] = 0;
       }},
      {"blkq", "blkq = 96", [](BadFixture& f) { f.p.blkq = 96; }},
      {"blkk", "blkk = 32", [](BadFixture& f) { f.p.blkk = 32; }},
      {"topk_and_cdf", "topk", [](BadFixture& f) { f.p.cdfthreshd = PerHead(kHalf); }, "cdfthreshd"},
      {"neither_topk_nor_cdf", "topk", [](BadFixture& f) { f.p.topk = {}; }, "cdfthreshd"},
      {"topk_zero", "topk[0] = 0", [](BadFixture& f) { f.p.topk = PerHead(kZero); }},
      {"topk_above_one", "topk", [](BadFixture& f) { f.p.topk = PerHead(kOneAndABit); }},
      {"topk_negative", "topk", [](BadFixture& f) { f.p.topk = PerHead(kMinus); }},
      {"topk_nan", "topk", [](BadFixture& f) { f.p.topk = PerHead(kNaN); }},
      {"topk_size", "topk has 3 values", [](BadFixture& f) { f.p.topk = PerHead(kThree); }},
      {"topk_per_head_bad", "topk[3] = 2", [](BadFixture& f) { f.p.topk = PerHead(kFourBadLast); }},
      {"cdf_zero", "cdfthreshd[0] = 0", [](BadFixture& f) {
         f.p.topk = {};
         f.p.cdfthreshd = PerHead(kZero);
       }},
      {"cdf_above_one", "cdfthreshd", [](BadFixture& f) {
         f.p.topk = {};
         f.p.cdfthreshd = PerHead(kOneAndABit);
       }},
      {"cdf_inf", "cdfthreshd", [](BadFixture& f) {
         f.p.topk = {};
         f.p.cdfthreshd = PerHead(kInfF);
       }},
      {"cdf_size", "cdfthreshd has 3 values", [](BadFixture& f) {
         f.p.topk = {};
         f.p.cdfthreshd = PerHead(kThree);
       }},
      {"simthreshd1_below", "simthreshd1", [](BadFixture& f) { f.p.simthreshd1 = PerHead(kBelowMinusOne); }},
      {"simthreshd1_above", "simthreshd1", [](BadFixture& f) { f.p.simthreshd1 = PerHead(kOneAndABit); }},
      {"simthreshd1_nan", "simthreshd1", [](BadFixture& f) { f.p.simthreshd1 = PerHead(kNaN); }},
      {"simthreshd1_inf", "simthreshd1", [](BadFixture& f) { f.p.simthreshd1 = PerHead(kInfF); }},
      {"simthreshd1_size", "simthreshd1 has 3 values", [](BadFixture& f) { f.p.simthreshd1 = PerHead(kThree); }},
      {"scale_negative", "scale = -1", [](BadFixture& f) { f.p.scale = -1.0f; }},
      {"scale_inf", "scale = inf", [](BadFixture& f) { f.p.scale = std::numeric_limits<float>::infinity(); }},
      {"scale_nan", "scale", [](BadFixture& f) { f.p.scale = std::numeric_limits<float>::quiet_NaN(); }},
      {"lut_missing", "lut is missing", [](BadFixture& f) { f.p.lut.data = nullptr; }},
      {"lut.dtype", "lut.dtype", [](BadFixture& f) { f.p.lut.dtype = DType::f32; }},
      {"lut.ndim", "lut.ndim", [](BadFixture& f) { f.p.lut.ndim = 3; }},
      {"lut.shape0", "lut.shape[0]", [](BadFixture& f) { f.p.lut.shape[0] = 1; }},
      {"lut.shape1", "lut.shape[1]", [](BadFixture& f) { f.p.lut.shape[1] = 2; }},
      {"lut.shape2", "lut.shape[2]", [](BadFixture& f) { f.p.lut.shape[2] = 3; }},
      {"lut.shape3", "lut.shape[3]", [](BadFixture& f) { f.p.lut.shape[3] = 2; }},
      {"lut.shape3_blkk128", "lut.shape[3]", [](BadFixture& f) { f.p.blkk = 128; }},
      {"lut.stride_zero", "lut.stride", [](BadFixture& f) { f.p.lut.stride[3] = 0; }},
      {"lut.stride_negative", "lut.stride", [](BadFixture& f) { f.p.lut.stride[0] = -24; }},
      {"counts_missing", "counts is missing", [](BadFixture& f) { f.p.counts.data = nullptr; }},
      {"counts.dtype", "counts.dtype", [](BadFixture& f) { f.p.counts.dtype = DType::u8; }},
      {"counts.ndim", "counts.ndim", [](BadFixture& f) { f.p.counts.ndim = 4; }},
      {"counts.shape0", "counts.shape[0]", [](BadFixture& f) { f.p.counts.shape[0] = 4; }},
      {"counts.shape1", "counts.shape[1]", [](BadFixture& f) { f.p.counts.shape[1] = 1; }},
      {"counts.shape2", "counts.shape[2]", [](BadFixture& f) { f.p.counts.shape[2] = 1; }},
      {"counts.stride", "counts.stride", [](BadFixture& f) { f.p.counts.stride[1] = 0; }},
      {"maybe_scores.dtype", "maybe_scores.dtype", [](BadFixture& f) { f.p.maybe_scores.dtype = DType::f16; }},
      {"maybe_scores.ndim", "maybe_scores.ndim", [](BadFixture& f) { f.p.maybe_scores.ndim = 3; }},
      {"maybe_scores.shape3", "maybe_scores.shape[3]", [](BadFixture& f) { f.p.maybe_scores.shape[3] = 4; }},
      {"maybe_scores.stride", "maybe_scores.stride", [](BadFixture& f) { f.p.maybe_scores.stride[2] = 0; }},
      {"maybe_q_sim.dtype", "maybe_q_sim.dtype", [](BadFixture& f) { f.p.maybe_q_sim.dtype = DType::i32; }},
      {"maybe_q_sim.shape2", "maybe_q_sim.shape[2]", [](BadFixture& f) { f.p.maybe_q_sim.shape[2] = 5; }},
      {"maybe_k_sim.shape1", "maybe_k_sim.shape[1]", [](BadFixture& f) { f.p.maybe_k_sim.shape[1] = 4; }},
      {"maybe_k_sim.shape2", "maybe_k_sim.shape[2]", [](BadFixture& f) { f.p.maybe_k_sim.shape[2] = 2; }},
      {"maybe_k_sim.dtype", "maybe_k_sim.dtype", [](BadFixture& f) { f.p.maybe_k_sim.dtype = DType::bf16; }},
      {"varlen_k_missing", "cu_seqlens_k", [](BadFixture& f) {
         f.make_varlen();
         f.p.varlen.cu_seqlens_k = nullptr;
       }},
      {"varlen_q_missing", "cu_seqlens_q", [](BadFixture& f) {
         f.make_varlen();
         f.p.varlen.cu_seqlens_q = nullptr;
       }},
      {"varlen_batch", "q.shape[0]", [](BadFixture& f) {
         f.make_varlen();
         f.p.q.shape[0] = 2;
         f.p.k.shape[0] = 2;
       }},
      {"varlen_num_seqs", "num_seqs", [](BadFixture& f) {
         f.make_varlen();
         f.p.varlen.num_seqs = 0;
       }},
      {"varlen_max_seqlen_q", "max_seqlen_q", [](BadFixture& f) {
         f.make_varlen();
         f.p.varlen.max_seqlen_q = 50;
       }},
      {"varlen_max_seqlen_k", "max_seqlen_k", [](BadFixture& f) {
         f.make_varlen();
         f.p.varlen.max_seqlen_k = 151;
       }},
      {"varlen_cu_q_decreasing", "cu_seqlens_q", [](BadFixture& f) {
         f.make_varlen();
         f.cu_q[1] = 120;
       }},
      {"varlen_cu_k_start", "cu_seqlens_k[0]", [](BadFixture& f) {
         f.make_varlen();
         f.cu_k[0] = 1;
       }},
      {"varlen_cu_k_total", "cu_seqlens_k", [](BadFixture& f) {
         f.make_varlen();
         f.cu_k[2] = 151;
       }},
      {"varlen_lut_batch", "lut.shape[0]", [](BadFixture& f) {
         f.make_varlen();
         f.p.varlen.num_seqs = 1;
       }},
      {"varlen_lut_nq", "lut.shape[2]", [](BadFixture& f) {
         f.make_varlen();
         f.p.varlen.max_seqlen_q = 65;
       }},
      {"varlen_k_sim_nk", "maybe_k_sim.shape[2]", [](BadFixture& f) {
         f.make_varlen();
         f.p.maybe_k_sim.shape[2] = 3;
       }},
  };
  for (const BadCase& c : bad) {
    cases.push_back({std::string("BLOCKMAP_BAD(") + c.name + ")", [c] {
                       BadFixture f;
                       c.mutate(f);
                       const Status sup = supported(f.p);
                       const Status st = build_block_map(f.p);
                       ASSERT_FALSE(st.ok()) << c.name << " was accepted";
                       EXPECT_NE(st.message().find(c.expect), std::string::npos) << st.message();
                       if (c.expect2) EXPECT_NE(st.message().find(c.expect2), std::string::npos) << st.message();
                       EXPECT_EQ(st.message().rfind("build_block_map: ", 0), 0u) << st.message();
                       EXPECT_FALSE(sup.ok());
                       EXPECT_EQ(sup.message(), st.message());
                       // Nothing ran: the outputs still hold the poison.
                       for (size_t i = 0; i < f.lut.size(); ++i) ASSERT_TRUE(is_poison(&f.lut[i]));
                       for (size_t i = 0; i < f.counts.size(); ++i) ASSERT_TRUE(is_poison(&f.counts[i]));
                     }});
  }
}

}  // namespace
}  // namespace sparge::test
