// GPU tests of the attention kernels (block-sparse and dense; the portable mma.sync kernel and the
// Hopper wgmma kernel) and of merge_attention, against the CPU backend on the same rounded inputs.
//
// Paths: every attention case runs as named on the path the library selects (the Hopper kernel on
// sm_90 devices when the problem fits it, the portable kernel otherwise) and once more with
// ",path=portable" appended, forced through SPARGE_ATTN_PATH (skipped on devices other than sm_90,
// where the selected path already is the portable one). BENCH_ATTENTION prints TFLOPS of both paths
// side by side when SPARGE_BENCH=1 (skipped otherwise; SPARGE_BENCH=dense: the dense rows on sm90 only).
//
// Pass criterion (FlashAttention-3 style): with the CPU backend (fp64) as the oracle, the kernel's
// max error must be at most 2x the max error of a plain fp32 reference of the same computation on
// the same inputs (online softmax in LUT order, P rounded to the input dtype before PV, written
// below), plus 1e-5 (plus the output dtype's own rounding of the oracle when O is stored as f16 or
// bf16). NaN/Inf must match exactly, guard regions must be intact, and every written position of
// poisoned outputs must have been overwritten.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "gpu/gpu_harness.h"
#include "sparge/half.h"
#include "sparge/ops.h"

namespace sparge::test {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

enum class Lut { dense_api, full, empty, one, random };

const char* to_string(Lut m) {
  switch (m) {
    case Lut::dense_api: return "dense";
    case Lut::full: return "full";
    case Lut::empty: return "empty";
    case Lut::one: return "one";
    default: return "random";
  }
}

struct Cfg {
  DType dt = DType::f16;
  int b = 1, hq = 2, hk = 2, sq = 128, sk = 128, d = 64, blkq = 64, blkk = 64;
  bool causal = false, lse = true, hnd = false, o_f32 = true;
  std::vector<int> lens_q, lens_k;  // varlen when non-empty (b = number of sequences)
  // Varlen with a LUT: every sequence after the first has NaN keys and +Inf values in its first key
  // block, which its own LUT rows never select. A block crossing the previous sequence's end reads
  // those rows (the Hopper kernel loads whole blocks through one tensor map), and they must not get
  // into any output (masked scores, and 0 * Inf = NaN: V there must be zeroed).
  bool poison_next = false;
  Lut lut = Lut::random;
  double density = 0.5;
  float pv_thr = 0.0f;  // 0 = off
  float scale = 0.0f;
  float q_mul = 1.0f;   // multiplies q (logit spread tests)
  bool pv_probe = false;  // inputs built so that pv_threshold skips blocks that matter
  // Inputs built so that pv_threshold decisions differ between rows, warps, warpgroups and the two
  // halves of paired tiles, all far from their threshold (make_problem, "pv pattern").
  bool pv_pattern = false;
  int variant = -1;  // SPARGE_SM90_VARIANT for this case (-1: as the environment has it)
  const char* path = nullptr;  // SPARGE_ATTN_PATH forced for this case ("portable"), or the selected one
  // Extra absolute noise for the logit-spread cases: with logits ~1e3..1e4 an fp32 logit carries
  // ~1e-2 of rounding (tensor-core and sequential sums round differently), which moves the few
  // non-negligible weights of a near-tie by more than 2x the reference's own error.
  double spread_noise_o = 0.0, spread_noise_lse = 0.0;

  bool varlen() const { return !lens_q.empty(); }
  std::string name() const {
    Name n(lut == Lut::dense_api ? "DENSE" : "BSA");
    n("dt", sparge::to_string(dt))("b", b)("hq", hq)("hk", hk);
    if (varlen()) {
      std::string s;
      for (size_t i = 0; i < lens_q.size(); ++i) s += (i ? "/" : "") + std::to_string(lens_q[i]) + ":" + std::to_string(lens_k[i]);
      n("varlen", s);
      if (poison_next) n("poison_next", 1);
    } else {
      n("sq", sq)("sk", sk);
    }
    n("d", d);
    if (lut != Lut::dense_api) n("blkq", blkq)("blkk", blkk)("lut", to_string(lut));
    if (lut == Lut::random) n("density", density);
    n("causal", causal)("lse", lse)("layout", hnd ? "HND" : "NHD")("o", o_f32 ? "f32" : sparge::to_string(dt));
    if (pv_thr > 0) n("pv", pv_thr);
    if (scale != 0) n("scale", scale);
    if (q_mul != 1) n("qmul", q_mul);
    if (pv_probe) n("probe", 1);
    if (pv_pattern) n("pattern", 1);
    if (variant >= 0) n("v", variant);
    if (path != nullptr) n("path", path);
    return n.str();
  }
};

// Sets an environment variable for one scope when the case names a value (ScopedEnv); nullptr
// leaves it as the environment has it (SPARGE_ATTN_PATH, SPARGE_SM90_VARIANT).
std::optional<ScopedEnv> scoped_env_if(const char* name, const char* value) {
  if (value == nullptr) return std::nullopt;
  return std::optional<ScopedEnv>(std::in_place, name, value);
}
std::optional<ScopedEnv> scoped_path(const char* path) { return scoped_env_if("SPARGE_ATTN_PATH", path); }
// SPARGE_SM90_VARIANT = v for one scope (v < 0: left as the environment has it).
std::optional<ScopedEnv> scoped_variant(int v) {
  return scoped_env_if("SPARGE_SM90_VARIANT", v >= 0 ? std::to_string(v).c_str() : nullptr);
}

bool device_is_sm90() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major == 9 && minor == 0;
}

// Host copy of one logical [B, S, H, D] tensor (floats already rounded to the dtype).
struct Host4 {
  std::int64_t B, S, H, D;
  std::vector<float> v;
  float& at(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) { return v[((b * S + s) * H + h) * D + d]; }
  float at(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const { return v[((b * S + s) * H + h) * D + d]; }
};

// Element strides of a [B, S, H, D] tensor stored NHD or HND.
void strides_of(bool hnd, std::int64_t S, std::int64_t H, std::int64_t D, std::int64_t (&st)[4]) {
  if (hnd) {
    st[0] = H * S * D; st[1] = D; st[2] = S * D; st[3] = 1;
  } else {
    st[0] = S * H * D; st[1] = H * D; st[2] = D; st[3] = 1;
  }
}

Tensor view(void* data, DType dt, const Host4& t, bool hnd) {
  std::int64_t st[4];
  strides_of(hnd, t.S, t.H, t.D, st);
  return make_tensor(data, dt, {t.B, t.S, t.H, t.D}, {st[0], st[1], st[2], st[3]});
}

// Logical -> storage order (NHD or HND).
std::vector<float> to_layout(const Host4& t, bool hnd) {
  std::int64_t st[4];
  strides_of(hnd, t.S, t.H, t.D, st);
  std::vector<float> out(t.v.size());
  for (std::int64_t b = 0; b < t.B; ++b)
    for (std::int64_t s = 0; s < t.S; ++s)
      for (std::int64_t h = 0; h < t.H; ++h)
        for (std::int64_t d = 0; d < t.D; ++d) out[b * st[0] + s * st[1] + h * st[2] + d] = t.at(b, s, h, d);
  return out;
}

float element(const std::vector<std::uint16_t>& raw, DType dt, std::size_t i) {
  return dt == DType::f16 ? half_to_float(raw[i]) : bf16_to_float(raw[i]);
}

float round_to(float x, DType dt) {
  if (dt == DType::f16) return half_to_float(float_to_half(x));
  if (dt == DType::bf16) return bf16_to_float(float_to_bf16(x));
  return x;
}

// Sequence bounds of batch entry b: rows [q_begin, q_begin + sq) of dimension 1 of batch index
// q_batch (0 with varlen).
struct SeqInfo {
  int q_batch, q_begin, sq, k_begin, sk;
};

struct Problem {
  Cfg c;
  Host4 q, k, v;
  std::vector<std::int32_t> cu_q, cu_k;
  int batch = 0, max_sq = 0, max_sk = 0, nq = 0, nk = 0, blkq = 0, blkk = 0;
  std::vector<std::int32_t> lut, counts;  // [batch, hq, nq, nk], [batch, hq, nq]

  SeqInfo seq(int b) const {
    if (!c.varlen()) return {b, 0, c.sq, 0, c.sk};
    return {0, cu_q[b], cu_q[b + 1] - cu_q[b], cu_k[b], cu_k[b + 1] - cu_k[b]};
  }
};

Problem make_problem(const Cfg& c) {
  Problem p;
  p.c = c;
  auto rng = rng_for(c.name());
  std::int64_t tq = c.sq, tk = c.sk, B = c.b;
  if (c.varlen()) {
    p.cu_q = {0};
    p.cu_k = {0};
    for (size_t i = 0; i < c.lens_q.size(); ++i) {
      p.cu_q.push_back(p.cu_q.back() + c.lens_q[i]);
      p.cu_k.push_back(p.cu_k.back() + c.lens_k[i]);
    }
    tq = p.cu_q.back();
    tk = p.cu_k.back();
    B = 1;
    p.batch = static_cast<int>(c.lens_q.size());
    p.max_sq = *std::max_element(c.lens_q.begin(), c.lens_q.end());
    p.max_sk = *std::max_element(c.lens_k.begin(), c.lens_k.end());
  } else {
    p.batch = c.b;
    p.max_sq = c.sq;
    p.max_sk = c.sk;
  }
  p.q = {B, tq, c.hq, c.d, std::vector<float>(static_cast<size_t>(B * tq * c.hq * c.d))};
  p.k = {B, tk, c.hk, c.d, std::vector<float>(static_cast<size_t>(B * tk * c.hk * c.d))};
  p.v = {B, tk, c.hk, c.d, std::vector<float>(static_cast<size_t>(B * tk * c.hk * c.d))};
  fill_normal(p.q.v, rng);
  fill_normal(p.k.v, rng);
  fill_normal(p.v.v, rng);
  for (float& x : p.q.v) x *= c.q_mul;
  for (int b = 1; c.poison_next && b < p.batch; ++b) {
    for (int s = p.cu_k[b]; s < std::min(p.cu_k[b + 1], p.cu_k[b] + c.blkk); ++s)
      for (int h = 0; h < c.hk; ++h)
        for (int d = 0; d < c.d; ++d) {
          p.k.at(0, s, h, d) = std::numeric_limits<float>::quiet_NaN();
          p.v.at(0, s, h, d) = std::numeric_limits<float>::infinity();
        }
  }
  p.blkq = c.lut == Lut::dense_api ? 128 : c.blkq;
  p.blkk = c.lut == Lut::dense_api ? 64 : c.blkk;
  if (c.pv_probe) {
    // q . k = 10 for keys of key block 0 and 0 elsewhere (scale 1), V of the other blocks is 1000:
    // with pv_threshold < 14 every block after the first is skipped, and skipping moves O by
    // about 1000 * (their weight ~ e^-10), far above the tolerance.
    std::fill(p.q.v.begin(), p.q.v.end(), 0.0f);
    std::fill(p.k.v.begin(), p.k.v.end(), 0.0f);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t s = 0; s < tq; ++s)
        for (int h = 0; h < c.hq; ++h) p.q.at(b, s, h, 0) = 2.5f;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t s = 0; s < tk; ++s)
        for (int h = 0; h < c.hk; ++h) {
          if (s < p.blkk) {
            p.k.at(b, s, h, 0) = 4.0f;
          } else {
            for (int d = 0; d < c.d; ++d) p.v.at(b, s, h, d) = 1000.0f;
          }
        }
  }
  if (c.pv_pattern) {
    // Row classes (position in the query block): A = rows 0..47 of the first 64 (warps 0-2 of
    // consumer warpgroup 0), B = rows 64..111 (warps 0-2 of warpgroup 1, BLKQ 128), C = the last
    // 16 rows of each 64 (warp 3 of each warpgroup). A row of class c has q[c] = 2 and zeros
    // elsewhere; a key of block kb has k[c] = 3 when the block is "high" for class c and 0
    // otherwise, so every logit is exactly 6 or 0 (scale 1). Block types (kb % 6, levels of
    // A B C): 0, 4 HHH; 1, 5 LLL; 2 LHL (only B high); 3 LLH (only C high). With pv_threshold 4
    // (log2 units) a low block after a high one has (x - m) + thr = -6 log2(e) + 4 = -4.66 and a
    // high block 0 + 4 = +4: every row test is far from its threshold. V = 100 + 10 N(0, 1): a
    // low block's keys weigh e^-6 each, so skipping (or not skipping) one moves O by ~0.1, far
    // above the tolerance (~1e-3 at |O| ~ 100). The LUT rows are built below.
    if (c.d < 3) std::abort();
    std::fill(p.q.v.begin(), p.q.v.end(), 0.0f);
    std::fill(p.k.v.begin(), p.k.v.end(), 0.0f);
    for (float& x : p.v.v) x = 100.0f + 10.0f * x;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t s = 0; s < tq; ++s) {
        const int l = static_cast<int>(s % c.blkq);
        const int cls = l % 64 >= 48 ? 2 : (l >= 64 ? 1 : 0);
        for (int h = 0; h < c.hq; ++h) p.q.at(b, s, h, cls) = 2.0f;
      }
    const int nkb = static_cast<int>(num_blocks(tk, c.blkk));
    for (int h = 0; h < c.hk; ++h)
      for (int kb = 0; kb < nkb; ++kb)
        for (int cls = 0; cls < 3; ++cls) {
          const int type = kb % 6;
          const bool is_high = type == 0 || type == 4 || (type == 2 && cls == 1) || (type == 3 && cls == 2);
          if (!is_high) continue;
          for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t s = static_cast<std::int64_t>(kb) * c.blkk; s < std::min<std::int64_t>(tk, (kb + 1LL) * c.blkk); ++s)
              p.k.at(b, s, h, cls) = 3.0f;
        }
  }
  p.q.v = round_through(p.q.v, c.dt);
  p.k.v = round_through(p.k.v, c.dt);
  p.v.v = round_through(p.v.v, c.dt);

  p.nq = static_cast<int>(num_blocks(p.max_sq, p.blkq));
  p.nk = static_cast<int>(num_blocks(p.max_sk, p.blkk));
  p.lut.assign(static_cast<size_t>(p.batch) * c.hq * p.nq * p.nk, -1);
  p.counts.assign(static_cast<size_t>(p.batch) * c.hq * p.nq, 0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int b = 0; b < p.batch; ++b) {
    const SeqInfo s = p.seq(b);
    const int nq_seq = static_cast<int>(num_blocks(s.sq, p.blkq));
    const int nk_seq = static_cast<int>(num_blocks(s.sk, p.blkk));
    for (int h = 0; h < c.hq; ++h) {
      for (int qb = 0; qb < nq_seq; ++qb) {
        std::vector<int> sel;
        for (int kb = 0; kb < nk_seq; ++kb) {
          const bool take = c.lut == Lut::full || c.lut == Lut::dense_api || (c.lut == Lut::random && u(rng) < c.density);
          if (take) sel.push_back(kb);
        }
        if (c.lut == Lut::one && nk_seq > 0) sel.push_back(static_cast<int>(u(rng) * nk_seq) % nk_seq);
        if (c.pv_pattern) {
          // Pairs (consecutive visible entries, as the paired kernel forms them) of every kind:
          // a row opens with (L, H) or (H, L) (even / odd query block: a first block is never
          // skipped; the second is, after H), then (L, H): only the first skipped, (H, L): only
          // the second, (L, L): both, (LHL, LLH): neither for BLKQ 128 (B rows, resp. C rows,
          // see them high), while warpgroup 0's rows alone would skip the first; for BLKQ 64 the
          // first is skipped and the second is not (only warp 3 sees it high), (H, H): neither,
          // then one L: an odd count, a skipped half tile. Blocks of each type are taken in a
          // rotated order per (head, query block); a type with no block left is left out.
          std::vector<int> pool[4];  // H, L, LHL, LLH
          for (int kb = 0; kb < nk_seq; ++kb) {
            const int type = kb % 6;
            pool[type == 0 || type == 4 ? 0 : type == 1 || type == 5 ? 1 : type == 2 ? 2 : 3].push_back(kb);
          }
          for (auto& v : pool)
            if (!v.empty()) std::rotate(v.begin(), v.begin() + (h + qb) % v.size(), v.end());
          const int first[2][2] = {{1, 0}, {0, 1}};
          std::vector<int> types = {first[qb % 2][0], first[qb % 2][1], 1, 0, 0, 1, 1, 1, 2, 3, 0, 0, 1};
          size_t used[4] = {0, 0, 0, 0};
          sel.clear();
          for (int ty : types)
            if (used[ty] < pool[ty].size()) sel.push_back(pool[ty][used[ty]++]);
        }
        if (c.poison_next && b > 0) sel.erase(std::remove(sel.begin(), sel.end(), 0), sel.end());
        const size_t row = ((static_cast<size_t>(b) * c.hq + h) * p.nq + qb);
        p.counts[row] = static_cast<int>(sel.size());
        for (size_t e = 0; e < sel.size(); ++e) p.lut[row * p.nk + e] = sel[e];
      }
    }
  }
  return p;
}

// pv_threshold decision rules of the fp32 reference: `exact` is docs/semantics.md Stage 2; the
// others are plausible kernel bugs, used to show that the pattern cases would catch them (the
// pairs are consecutive visible LUT entries, as the paired sm90 kernel forms them).
enum class PvRule {
  exact,
  never,        // no block ever skipped (the vote disabled)
  own_half,     // each 64-row half of the query block decides on its own rows (no peer vote)
  own_warp,     // each 16-row group (one warp of the wgmma layout) decides on its own rows
  pair_m1,      // a pair's first block tested against the max after both blocks
  pair_mprev,   // a pair's second block tested against the max before the pair (its first block ignored)
  pair_tile,    // a pair skipped as a whole (one 128-key block) or not at all
};
const char* to_string(PvRule r) {
  switch (r) {
    case PvRule::exact: return "exact";
    case PvRule::never: return "never";
    case PvRule::own_half: return "own_half";
    case PvRule::own_warp: return "own_warp";
    case PvRule::pair_m1: return "pair_m1";
    case PvRule::pair_mprev: return "pair_mprev";
    default: return "pair_tile";
  }
}
// Per paired tile (exact rule, pairs of visible entries): how many skipped neither block, only the
// first, only the second, both; [4]: odd last blocks (half tiles) skipped; [5]: blocks that one
// 64-row half of the query block alone would have skipped but the other half did not allow.
using PairStats = std::array<long, 6>;

// The plain fp32 reference: the same block walk as the kernel and the CPU (online softmax in LUT
// order, pv_threshold per query block), in fp32, with P rounded to the input dtype before PV.
// out_o [total_q rows of the logical q layout], out_lse [batch, hq, max_sq].
void reference_fp32(const Problem& p, std::vector<float>& out_o, std::vector<float>& out_lse,
                    PvRule rule = PvRule::exact, PairStats* stats = nullptr) {
  const Cfg& c = p.c;
  out_o.assign(p.q.v.size(), 0.0f);
  out_lse.assign(static_cast<size_t>(p.batch) * c.hq * p.max_sq, kNegInf);
  const float scale = c.scale != 0 ? c.scale : 1.0f / std::sqrt(static_cast<float>(c.d));
  const float scale_log2 = scale * 1.4426950408889634f;
  const int group = c.hq / c.hk;
  if (stats != nullptr) stats->fill(0);
  for (int b = 0; b < p.batch; ++b) {
    const SeqInfo s = p.seq(b);
    for (int h = 0; h < c.hq; ++h) {
      const int hk = h / group;
      const float thr = c.pv_thr;
      for (int qb = 0; qb * p.blkq < s.sq; ++qb) {
        const int i0 = qb * p.blkq, n = std::min(p.blkq, s.sq - i0);
        const size_t row = ((static_cast<size_t>(b) * c.hq + h) * p.nq + qb);
        // The visible entries in LUT order (blocks wholly in the causal future are left out, as
        // the kernels' iterator does; they would change nothing here).
        long long last_key = s.sk - 1;
        if (c.causal) last_key = std::min<long long>(last_key, static_cast<long long>(i0) + n - 1 + s.sk - s.sq);
        std::vector<int> vis;
        for (int e = 0; e < p.counts[row]; ++e) {
          const int kb = p.lut[row * p.nk + e];
          if (static_cast<long long>(kb) * p.blkk <= last_key) vis.push_back(kb);
        }
        const int nv = static_cast<int>(vis.size());
        // Scaled logits (log2 units) and block row maxima of every visible entry.
        std::vector<float> t(static_cast<size_t>(nv) * n * p.blkk), x(static_cast<size_t>(nv) * n);
        for (int e = 0; e < nv; ++e) {
          const int j0 = vis[e] * p.blkk;
          for (int r = 0; r < n; ++r) {
            const int i = i0 + r;
            const long long lim = c.causal ? std::min<long long>(s.sk - 1, static_cast<long long>(i) + s.sk - s.sq) : s.sk - 1;
            float mx = kNegInf;
            for (int j = 0; j < p.blkk; ++j) {
              float val = kNegInf;
              if (j0 + j <= lim) {
                float dot = 0.0f;
                for (int d = 0; d < c.d; ++d) dot += p.q.at(s.q_batch, s.q_begin + i, h, d) * p.k.at(s.q_batch, s.k_begin + j0 + j, hk, d);
                val = dot * scale_log2;
              }
              t[(static_cast<size_t>(e) * n + r) * p.blkk + j] = val;
              mx = std::max(mx, val);
            }
            x[static_cast<size_t>(e) * n + r] = mx;
          }
        }
        auto xe = [&](int e, int r) { return x[static_cast<size_t>(e) * n + r]; };
        std::vector<float> m(n, kNegInf), l(n, 0.0f), acc(static_cast<size_t>(n) * c.d, 0.0f), m_pair(n, kNegInf);
        std::vector<char> skip(n), pass(n);
        int pair_bits = 0;
        for (int e = 0; e < nv; ++e) {
          const int j0 = vis[e] * p.blkk;
          const bool first_of_pair = e % 2 == 0;
          if (first_of_pair) m_pair = m;  // the running max before this pair
          // Per row: may this block's PV be skipped for this row (under the rule)?
          for (int r = 0; r < n; ++r) {
            float xr = xe(e, r), mr = std::max(m[r], xr);
            if (rule == PvRule::pair_m1 && first_of_pair && e + 1 < nv) mr = std::max(mr, xe(e + 1, r));
            if (rule == PvRule::pair_mprev && !first_of_pair) mr = std::max(m_pair[r], xr);
            const bool in_pair = !first_of_pair || e + 1 < nv;  // not the odd last block
            if (rule == PvRule::pair_tile && in_pair) {
              const int e0 = first_of_pair ? e : e - 1;
              xr = std::max(xe(e0, r), xe(e0 + 1, r));
              mr = std::max(m_pair[r], xr);
            }
            pass[r] = xr == kNegInf || (xr - mr) + thr <= 0.0f;
          }
          // Who decides: the whole query block, or each 64-row half (own_half) or 16-row warp
          // (own_warp) on its own.
          const int span = rule == PvRule::own_half ? 64 : rule == PvRule::own_warp ? 16 : n;
          for (int g0 = 0; g0 < n; g0 += span) {
            bool all = thr > 0 && rule != PvRule::never;
            for (int r = g0; r < std::min(n, g0 + span); ++r) all = all && pass[r];
            for (int r = g0; r < std::min(n, g0 + span); ++r) skip[r] = all;
          }
          if (stats != nullptr && rule == PvRule::exact && thr > 0) {
            const bool sk = n > 0 && skip[0];
            if (first_of_pair && e + 1 == nv) (*stats)[4] += sk;
            if (first_of_pair) pair_bits = sk ? 1 : 0;
            if (!first_of_pair) ++(*stats)[pair_bits | (sk ? 2 : 0)];
            if (!sk && n > 64) {
              bool lo = true, hi = true;
              for (int r = 0; r < n; ++r) {
                if (r < 64) lo = lo && pass[r]; else hi = hi && pass[r];
              }
              (*stats)[5] += lo || hi;
            }
          }
          for (int r = 0; r < n; ++r) {
            const float mn = std::max(m[r], xe(e, r));
            const float mu = mn == kNegInf ? 0.0f : mn;
            const float alpha = std::exp2(m[r] - mu);
            float sum = 0.0f;
            for (int j = 0; j < p.blkk; ++j) {
              float& pj = t[(static_cast<size_t>(e) * n + r) * p.blkk + j];
              pj = std::exp2(pj - mu);
              sum += pj;
            }
            l[r] = l[r] * alpha + sum;
            m[r] = mn;
            for (int d = 0; d < c.d; ++d) acc[static_cast<size_t>(r) * c.d + d] *= alpha;
            if (skip[r]) continue;
            for (int j = 0; j < p.blkk && j0 + j < s.sk; ++j) {
              const float pr = round_to(t[(static_cast<size_t>(e) * n + r) * p.blkk + j], c.dt);
              if (pr == 0.0f) continue;
              for (int d = 0; d < c.d; ++d) acc[static_cast<size_t>(r) * c.d + d] += pr * p.v.at(s.q_batch, s.k_begin + j0 + j, hk, d);
            }
          }
        }
        for (int r = 0; r < n; ++r) {
          const int i = i0 + r;
          const bool empty = !(l[r] > 0.0f);
          for (int d = 0; d < c.d; ++d) {
            const float o = empty ? 0.0f : acc[static_cast<size_t>(r) * c.d + d] / l[r];
            out_o[((static_cast<size_t>(s.q_batch) * p.q.S + s.q_begin + i) * c.hq + h) * c.d + d] = c.o_f32 ? o : round_to(o, c.dt);
          }
          out_lse[(static_cast<size_t>(b) * c.hq + h) * p.max_sq + i] = empty ? kNegInf : (m[r] + std::log2(l[r])) * 0.6931471805599453f;
        }
      }
    }
  }
}

// The oracle: the CPU backend on f32 copies of the rounded inputs (block_sparse_attention, or
// dense_attention for the dense cases).
void oracle_cpu(const Problem& p, std::vector<float>& out_o, std::vector<float>& out_lse) {
  const Cfg& c = p.c;
  Host4 qf = p.q, kf = p.k, vf = p.v;
  out_o.assign(p.q.v.size(), 0.0f);
  out_lse.assign(static_cast<size_t>(p.batch) * c.hq * p.max_sq, kNegInf);
  Host4 o = p.q;
  Tensor tq = view(qf.v.data(), DType::f32, qf, false), tk = view(kf.v.data(), DType::f32, kf, false),
         tv = view(vf.v.data(), DType::f32, vf, false), to = view(out_o.data(), DType::f32, o, false);
  Tensor tl = make_tensor(out_lse.data(), DType::f32, {p.batch, c.hq, p.max_sq});
  Varlen vl;
  if (c.varlen()) vl = {p.cu_q.data(), p.cu_k.data(), p.batch, p.max_sq, p.max_sk};
  Status st;
  if (c.lut == Lut::dense_api) {
    DenseAttentionParams d;
    d.q = tq; d.k = tk; d.v = tv; d.o = to; d.maybe_lse = tl; d.varlen = vl; d.scale = c.scale; d.is_causal = c.causal;
    st = dense_attention(d);
  } else {
    BlockSparseAttentionParams s;
    s.q = tq; s.k = tk; s.v = tv; s.o = to; s.maybe_lse = tl; s.varlen = vl; s.scale = c.scale; s.is_causal = c.causal;
    s.blkq = c.blkq; s.blkk = c.blkk;
    s.lut = make_tensor(const_cast<std::int32_t*>(p.lut.data()), DType::i32, {p.batch, c.hq, p.nq, p.nk});
    s.counts = make_tensor(const_cast<std::int32_t*>(p.counts.data()), DType::i32, {p.batch, c.hq, p.nq});
    if (c.pv_thr > 0) s.pv_threshold = PerHead(&c.pv_thr, 1);
    st = block_sparse_attention(s);
  }
  ASSERT_TRUE(st.ok()) << "cpu oracle: " << st.message();
}

// Runs the CUDA kernel; returns O in the logical layout (as float) and the LSE.
struct GpuOut {
  std::vector<float> o, lse;
  bool guards = true;
};

GpuOut run_gpu(const Problem& p, int repeats = 1, std::vector<std::vector<std::uint32_t>>* bits = nullptr) {
  const Cfg& c = p.c;
  GpuOut out;
  DeviceGuarded<std::uint16_t> dq(p.q.v.size()), dk(p.k.v.size()), dv(p.v.v.size());
  dq.upload(to_storage16(to_layout(p.q, c.hnd), c.dt));
  dk.upload(to_storage16(to_layout(p.k, c.hnd), c.dt));
  dv.upload(to_storage16(to_layout(p.v, c.hnd), c.dt));
  DeviceGuarded<float> do32(c.o_f32 ? p.q.v.size() : 0);
  DeviceGuarded<std::uint16_t> do16(c.o_f32 ? 0 : p.q.v.size());
  const size_t nlse = static_cast<size_t>(p.batch) * c.hq * p.max_sq;
  DeviceGuarded<float> dlse(nlse);
  DeviceGuarded<std::int32_t> dlut(p.lut.size()), dcnt(p.counts.size()), dcuq(p.cu_q.size()), dcuk(p.cu_k.size());
  dlut.upload(p.lut);
  dcnt.upload(p.counts);
  if (c.varlen()) {
    dcuq.upload(p.cu_q);
    dcuk.upload(p.cu_k);
  }
  Tensor tq = view(dq.data(), c.dt, p.q, c.hnd), tk = view(dk.data(), c.dt, p.k, c.hnd),
         tv = view(dv.data(), c.dt, p.v, c.hnd);
  Tensor to = c.o_f32 ? view(do32.data(), DType::f32, p.q, c.hnd) : view(do16.data(), c.dt, p.q, c.hnd);
  Tensor tl;
  if (c.lse) tl = make_tensor(dlse.data(), DType::f32, {p.batch, c.hq, p.max_sq});
  Varlen vl;
  if (c.varlen()) vl = {dcuq.data(), dcuk.data(), p.batch, p.max_sq, p.max_sk};
  Exec ex{Backend::cuda, nullptr, 0};
  const auto path = scoped_path(c.path);
  const auto variant = scoped_variant(c.variant);
  for (int rep = 0; rep < repeats; ++rep) {
    if (c.o_f32) do32.poison(); else do16.poison();
    dlse.poison();
    Status st;
    if (c.lut == Lut::dense_api) {
      DenseAttentionParams d;
      d.q = tq; d.k = tk; d.v = tv; d.o = to; d.maybe_lse = tl; d.varlen = vl; d.scale = c.scale; d.is_causal = c.causal;
      d.exec = ex;
      st = dense_attention(d);
    } else {
      BlockSparseAttentionParams s;
      s.q = tq; s.k = tk; s.v = tv; s.o = to; s.maybe_lse = tl; s.varlen = vl; s.scale = c.scale; s.is_causal = c.causal;
      s.blkq = c.blkq; s.blkk = c.blkk; s.exec = ex;
      s.lut = make_tensor(dlut.data(), DType::i32, {p.batch, c.hq, p.nq, p.nk});
      s.counts = make_tensor(dcnt.data(), DType::i32, {p.batch, c.hq, p.nq});
      if (c.pv_thr > 0) s.pv_threshold = PerHead(&c.pv_thr, 1);
      st = block_sparse_attention(s);
    }
    EXPECT_TRUE(st.ok()) << st.message();
    SPARGE_CUDA_CHECK(cudaDeviceSynchronize());
    if (bits != nullptr) {
      std::vector<std::uint32_t> h;
      if (c.o_f32) {
        for (float f : do32.download()) h.push_back(float_to_bits(f));
      } else {
        for (std::uint16_t u : do16.download()) h.push_back(u);
      }
      for (float f : dlse.download()) h.push_back(float_to_bits(f));
      bits->push_back(std::move(h));
    }
  }
  std::vector<float> stored(p.q.v.size());
  if (c.o_f32) {
    stored = do32.download();
  } else {
    const auto raw = do16.download();
    for (size_t i = 0; i < raw.size(); ++i) stored[i] = element(raw, c.dt, i);
  }
  // Storage -> logical.
  std::int64_t st4[4];
  strides_of(c.hnd, p.q.S, p.q.H, p.q.D, st4);
  out.o.resize(stored.size());
  for (std::int64_t b = 0; b < p.q.B; ++b)
    for (std::int64_t s = 0; s < p.q.S; ++s)
      for (std::int64_t h = 0; h < p.q.H; ++h)
        for (std::int64_t d = 0; d < p.q.D; ++d)
          out.o[((b * p.q.S + s) * p.q.H + h) * p.q.D + d] = stored[b * st4[0] + s * st4[1] + h * st4[2] + d];
  out.lse = dlse.download();
  out.guards = dq.guards_intact() && dk.guards_intact() && dv.guards_intact() && do32.guards_intact() &&
               do16.guards_intact() && dlse.guards_intact() && dlut.guards_intact() && dcnt.guards_intact();
  return out;
}

// Positions of lse that the kernel writes (rows inside their sequence).
std::vector<char> lse_written(const Problem& p) {
  std::vector<char> w(static_cast<size_t>(p.batch) * p.c.hq * p.max_sq, 0);
  for (int b = 0; b < p.batch; ++b) {
    const SeqInfo s = p.seq(b);
    for (int h = 0; h < p.c.hq; ++h)
      for (int i = 0; i < s.sq; ++i) w[(static_cast<size_t>(b) * p.c.hq + h) * p.max_sq + i] = 1;
  }
  return w;
}

// The oracle's and the fp32 reference's outputs of one problem.
struct Expected {
  std::vector<float> oracle_o, oracle_lse, ref_o, ref_lse;
};

void check_case(const Cfg& c, const Problem* given = nullptr, const Expected* given_expected = nullptr) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  if (c.path != nullptr && !device_is_sm90()) GTEST_SKIP() << "the selected path already is the portable one here";
  Problem made;
  Expected computed;
  if (given == nullptr) {
    made = make_problem(c);
    oracle_cpu(made, computed.oracle_o, computed.oracle_lse);
    if (::testing::Test::HasFatalFailure()) return;
    reference_fp32(made, computed.ref_o, computed.ref_lse);
  }
  const Problem& p = given != nullptr ? *given : made;
  const Expected& ex = given != nullptr ? *given_expected : computed;
  const std::vector<float>&oracle_o = ex.oracle_o, &oracle_lse = ex.oracle_lse, &ref_o = ex.ref_o, &ref_lse = ex.ref_lse;
  const GpuOut g = run_gpu(p);
  EXPECT_TRUE(g.guards) << "a guard region was overwritten";

  // O: every position belongs to some sequence row here (the tensors hold exactly the tokens).
  const Error eg = compare(g.o.data(), oracle_o.data(), oracle_o.size());
  const Error er = compare(ref_o.data(), oracle_o.data(), oracle_o.size());
  double noise = 1e-5 + c.spread_noise_o;
  if (!c.o_f32) {
    double rep = 0;
    for (float x : oracle_o) rep = std::max(rep, static_cast<double>(std::abs(round_to(x, c.dt) - x)));
    noise += rep;
  }
  EXPECT_EQ(eg.nonfinite_mismatch, 0) << "O non-finite mismatch (unwritten or NaN): " << describe(eg);
  EXPECT_EQ(er.nonfinite_mismatch, 0) << "fp32 reference disagrees with the oracle on NaN/Inf: " << describe(er);
  EXPECT_LE(eg.max_abs, 2 * er.max_abs + noise) << "O: gpu " << describe(eg) << " vs fp32 reference " << describe(er);

  if (c.lse) {
    const auto w = lse_written(p);
    std::vector<float> gl, ol, rl;
    for (size_t i = 0; i < w.size(); ++i) {
      if (!w[i]) continue;
      gl.push_back(g.lse[i]);
      ol.push_back(oracle_lse[i]);
      rl.push_back(ref_lse[i]);
    }
    const Error lg = compare(gl.data(), ol.data(), ol.size());
    const Error lr = compare(rl.data(), ol.data(), ol.size());
    EXPECT_EQ(lg.nonfinite_mismatch, 0) << "LSE non-finite mismatch: " << describe(lg);
    EXPECT_LE(lg.max_abs, 2 * lr.max_abs + 1e-5 + c.spread_noise_lse) << "LSE: gpu " << describe(lg) << " vs fp32 reference " << describe(lr);
  }
}

// The pv pattern cases, on the CPU first (so this part runs without a GPU too): the inputs must
// produce every kind of decision the sm90 kernel distinguishes (pairs skipping neither, only the
// first, only the second, both blocks; half tiles skipped; for BLKQ 128 blocks that one
// warpgroup's rows alone would skip), and the fp32 reference under each wrong rule (PvRule) must
// miss the oracle by far more than the tolerance the GPU gets, so a kernel with that bug fails.
// Then the GPU comparison of check_case.
void check_pattern_case(const Cfg& c) {
  if (c.path != nullptr || c.variant >= 0) return check_case(c);  // the inputs' checks run once, on the plain case
  const Problem p = make_problem(c);
  Expected ex;
  oracle_cpu(p, ex.oracle_o, ex.oracle_lse);
  if (::testing::Test::HasFatalFailure()) return;
  PairStats st{};
  reference_fp32(p, ex.ref_o, ex.ref_lse, PvRule::exact, &st);
  const std::vector<float>&oracle_o = ex.oracle_o, &ref_o = ex.ref_o;
  const double tol = 2 * compare(ref_o.data(), oracle_o.data(), oracle_o.size()).max_abs + 1e-5 + c.spread_noise_o;
  if (c.blkk == 64) {
    EXPECT_GT(st[0], 0) << "no pair with neither block skipped";
    EXPECT_GT(st[1], 0) << "no pair with only its first block skipped";
    EXPECT_GT(st[2], 0) << "no pair with only its second block skipped";
    EXPECT_GT(st[3], 0) << "no pair with both blocks skipped";
    EXPECT_GT(st[4], 0) << "no odd last block skipped";
  }
  if (c.blkq == 128) EXPECT_GT(st[5], 0) << "no block that one half of the query block alone would skip";
  std::vector<PvRule> wrong = {PvRule::never, PvRule::own_warp};
  if (c.blkq == 128) wrong.push_back(PvRule::own_half);
  if (c.blkk == 64) {
    wrong.push_back(PvRule::pair_m1);
    wrong.push_back(PvRule::pair_mprev);
    wrong.push_back(PvRule::pair_tile);
  }
  for (PvRule r : wrong) {
    std::vector<float> mo, ml;
    reference_fp32(p, mo, ml, r);
    const double err = compare(mo.data(), oracle_o.data(), oracle_o.size()).max_abs;
    EXPECT_GT(err, 20 * tol) << "rule " << to_string(r) << " is not detectable: error " << err << " vs tolerance " << tol;
  }
  check_case(c, &p, &ex);
}

// ---- case lists ----------------------------------------------------------------------------------
const DType kTypes[] = {DType::f16, DType::bf16};
const int kDims[] = {64, 128};
const int kBlocks[][2] = {{64, 64}, {64, 128}, {128, 64}, {128, 128}};

void add(std::vector<Case>& cases, const Cfg& c) {
  const bool pattern = c.pv_pattern;
  cases.push_back({c.name(), [c, pattern] { pattern ? check_pattern_case(c) : check_case(c); }});
  Cfg forced = c;
  forced.path = "portable";
  cases.push_back({forced.name(), [forced, pattern] { pattern ? check_pattern_case(forced) : check_case(forced); }});
}

// ---- timing --------------------------------------------------------------------------------------
// Median of 10 launches (CUDA events) after 2 warm-ups; TFLOPS count only the key blocks a query
// block visits (4 * blkq * blkk * d per visited block, tails included as whole blocks).
double median_ms(const std::function<Status()>& call) {
  cudaEvent_t a, b;
  SPARGE_CUDA_CHECK(cudaEventCreate(&a));
  SPARGE_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    SPARGE_CUDA_CHECK(cudaEventRecord(a));
    const Status st = call();
    SPARGE_CUDA_CHECK(cudaEventRecord(b));
    SPARGE_CUDA_CHECK(cudaEventSynchronize(b));
    EXPECT_TRUE(st.ok()) << st.message();
    if (!st.ok()) break;
    float t = 0;
    SPARGE_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    if (i >= 2) ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (ms.empty()) return 0;
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// A benchmark LUT over nk key blocks: row r keeps take(r, nv) of its first nv = visible(r) blocks, chosen
// at random (rng) and ascending, -1 padded; blocks = the kept total.
struct BenchLut {
  std::vector<std::int32_t> lut, counts;
  double blocks = 0;
};
template <class Visible, class Take>
BenchLut bench_lut(std::size_t rows, int nk, std::mt19937_64& rng, Visible visible, Take take_of) {
  BenchLut b;
  b.lut.assign(rows * static_cast<std::size_t>(nk), -1);
  b.counts.assign(rows, 0);
  std::vector<int> perm(nk);
  for (std::size_t row = 0; row < rows; ++row) {
    const int nv = visible(row);
    const int take = take_of(row, nv);
    for (int i = 0; i < nv; ++i) perm[i] = i;
    for (int i = 0; i < take; ++i) std::swap(perm[i], perm[i + static_cast<int>(rng() % (nv - i))]);
    std::sort(perm.begin(), perm.begin() + take);
    b.counts[row] = take;
    b.blocks += take;
    for (int i = 0; i < take; ++i) b.lut[row * nk + i] = perm[i];
  }
  return b;
}

void bench_attention() {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const char* on = std::getenv("SPARGE_BENCH");
  const std::string mode = on == nullptr ? "" : on;
  if (mode != "1" && mode != "dense" && mode != "varlen" && mode != "causal_lut") {
    GTEST_SKIP() << "set SPARGE_BENCH=1 (or =dense: the dense rows, sm90 path only; =varlen: the varlen rows; "
                    "=causal_lut: causal LUT rows, sm90 path only)";
  }
  const bool dense_only = mode == "dense" || mode == "causal_lut";
  const bool varlen_only = std::string(on) == "varlen";
  const int B = 2, H = 32, S = 16384, D = 128;
  const size_t n = static_cast<size_t>(B) * S * H * D;
  std::vector<std::uint16_t> host(n);
  std::uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < n; ++i) {  // xorshift values in [-1, 1) as f16
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    host[i] = float_to_half(static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0 * 2.0 - 1.0));
  }
  DeviceGuarded<std::uint16_t> dq(n), dk(n), dv(n), dout(n);
  dq.upload(host);
  dk.upload(host);
  dv.upload(host);
  auto t4 = [&](void* p) { return make_tensor(p, DType::f16, {B, S, H, D}); };
  const Exec ex{Backend::cuda, nullptr, 0};
  const double dense_flops = 4.0 * B * H * static_cast<double>(S) * S * D;
  auto run_paths = [&](const char* label, double flops, const std::function<Status()>& call) {
    std::array<double, 2> tf = {0, 0};
    const char* paths[2] = {"portable", "sm90"};
    for (int i = dense_only ? 1 : 0; i < 2; ++i) {
      const auto path = scoped_path(paths[i]);
      const double ms = median_ms(call);
      tf[i] = ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0;
    }
    std::printf("BENCH %-34s portable %7.1f TFLOPS   sm90 %7.1f TFLOPS   (x%.2f)\n", label, tf[0], tf[1],
                tf[0] > 0 ? tf[1] / tf[0] : 0.0);
    std::fflush(stdout);
    return tf;
  };
  if (varlen_only) {
    // Ragged batch in the same buffers: 16 sequences, 32768 tokens (b2 s16384's), h32 d128; the
    // same sequences as a dense padded batch would waste ~60%. TFLOPS on each sequence's own work.
    const std::vector<int> lens = {6144, 4096, 4096, 3072, 2048, 2048, 2048, 1536, 1500, 1024, 1024, 1000, 777, 513, 300, 1536};
    std::vector<std::int32_t> cu = {0};
    double flops = 0;
    for (int l : lens) {
      cu.push_back(cu.back() + l);
      flops += 4.0 * H * static_cast<double>(l) * l * D;
    }
    const int total = cu.back(), max_len = *std::max_element(lens.begin(), lens.end());
    DeviceGuarded<std::int32_t> dcu(cu.size());
    dcu.upload(cu);
    auto tv = [&](void* p) { return make_tensor(p, DType::f16, {1, total, H, D}); };
    for (bool causal : {false, true}) {
      DenseAttentionParams d;
      d.q = tv(dq.data()); d.k = tv(dk.data()); d.v = tv(dv.data()); d.o = tv(dout.data()); d.exec = ex;
      d.is_causal = causal;
      d.varlen = {dcu.data(), dcu.data(), static_cast<int>(lens.size()), max_len, max_len};
      run_paths(causal ? "varlen 16 seqs causal" : "varlen 16 seqs", causal ? flops / 2 : flops,
                [&] { return dense_attention(d); });
    }
    {  // the same token count as 8 equal sequences without varlen (b8 s4096), for the rate
      auto t8 = [&](void* p) { return make_tensor(p, DType::f16, {8, 4096, H, D}); };
      DenseAttentionParams d;
      d.q = t8(dq.data()); d.k = t8(dk.data()); d.v = t8(dv.data()); d.o = t8(dout.data()); d.exec = ex;
      run_paths("dense b8 s4096 (no varlen)", 4.0 * 8 * H * 4096.0 * 4096 * D, [&] { return dense_attention(d); });
      std::vector<std::int32_t> cu8 = {0};
      for (int i = 0; i < 8; ++i) cu8.push_back(cu8.back() + 4096);
      DeviceGuarded<std::int32_t> dcu8(cu8.size());
      dcu8.upload(cu8);
      auto t1 = [&](void* p) { return make_tensor(p, DType::f16, {1, 8 * 4096, H, D}); };
      d.q = t1(dq.data()); d.k = t1(dk.data()); d.v = t1(dv.data()); d.o = t1(dout.data());
      d.varlen = {dcu8.data(), dcu8.data(), 8, 4096, 4096};
      run_paths("varlen 8 x 4096", 4.0 * 8 * H * 4096.0 * 4096 * D, [&] { return dense_attention(d); });
    }
    return;
  }
  if (mode == "causal_lut") {
    // Causal LUTs shaped like the block map's topk rows: query block qb keeps round(density * visible)
    // of its visible key blocks (at least 1), chosen at random. TFLOPS on the selected blocks counted
    // whole (the diagonal ones are partly masked), so compare rows with each other, not with dense.
    std::mt19937_64 crng(5);
    for (int blkk : {64, 128}) {
      for (double density : {1.0, 0.4, 0.1}) {
        const int blkq = 128, nq = S / blkq, nk = S / blkk;
        auto [lut, counts, blocks] = bench_lut(
            static_cast<size_t>(B) * H * nq, nk, crng,
            [&](size_t row) { return ((static_cast<int>(row % nq) + 1) * blkq + blkk - 1) / blkk; },
            [&](size_t, int nv) { return std::max(1, static_cast<int>(std::lround(density * nv))); });
        DeviceGuarded<std::int32_t> dlut(lut.size()), dcnt(counts.size());
        dlut.upload(lut);
        dcnt.upload(counts);
        BlockSparseAttentionParams s;
        s.q = t4(dq.data()); s.k = t4(dk.data()); s.v = t4(dv.data()); s.o = t4(dout.data()); s.exec = ex;
        s.blkq = blkq; s.blkk = blkk; s.is_causal = true;
        s.lut = make_tensor(dlut.data(), DType::i32, {B, H, nq, nk});
        s.counts = make_tensor(dcnt.data(), DType::i32, {B, H, nq});
        const std::string label = "causal lut blkk=" + std::to_string(blkk) + " density=" + std::to_string(density).substr(0, 4);
        run_paths(label.c_str(), 4.0 * blkq * blkk * D * blocks, [&] { return block_sparse_attention(s); });
      }
    }
    return;
  }
  std::array<double, 2> dense_tf = {0, 0};
  for (bool causal : {false, true}) {
    DenseAttentionParams d;
    d.q = t4(dq.data()); d.k = t4(dk.data()); d.v = t4(dv.data()); d.o = t4(dout.data()); d.exec = ex;
    d.is_causal = causal;
    const auto tf = run_paths(causal ? "dense causal" : "dense", causal ? dense_flops / 2 : dense_flops,
                              [&] { return dense_attention(d); });
    if (!causal) dense_tf = tf;
  }
  {  // head dim 64 (same buffers, viewed as [B, S, H, 64])
    auto t64 = [&](void* p) { return make_tensor(p, DType::f16, {B, S, H, 64}); };
    DenseAttentionParams d;
    d.q = t64(dq.data()); d.k = t64(dk.data()); d.v = t64(dv.data()); d.o = t64(dout.data()); d.exec = ex;
    run_paths("dense d=64", dense_flops / 2, [&] { return dense_attention(d); });
    d.is_causal = true;
    run_paths("dense d=64 causal", dense_flops / 4, [&] { return dense_attention(d); });
  }
  if (dense_only) return;
  {  // Skewed LUT (blkq = blkk = 128): 10% of the query blocks dense, the rest at density 0.05.
    // A balanced schedule takes the useful work's time at the dense rate; printed as a ratio.
    const int blk = 128, nq = S / blk, nk = S / blk;
    std::mt19937_64 srng(11);
    auto [lut, counts, blocks] = bench_lut(
        static_cast<size_t>(B) * H * nq, nk, srng, [&](size_t) { return nk; },
        [&](size_t, int) { return srng() % 10 == 0 ? nk : std::max(1, static_cast<int>(std::lround(0.05 * nk))); });
    DeviceGuarded<std::int32_t> dlut(lut.size()), dcnt(counts.size());
    dlut.upload(lut);
    dcnt.upload(counts);
    BlockSparseAttentionParams s;
    s.q = t4(dq.data()); s.k = t4(dk.data()); s.v = t4(dv.data()); s.o = t4(dout.data()); s.exec = ex;
    s.blkq = blk; s.blkk = blk;
    s.lut = make_tensor(dlut.data(), DType::i32, {B, H, nq, nk});
    s.counts = make_tensor(dcnt.data(), DType::i32, {B, H, nq});
    const auto tf = run_paths("sparse skewed 10% dense / 5%", 4.0 * blk * blk * D * blocks,
                              [&] { return block_sparse_attention(s); });
    std::printf("BENCH skewed: time / (useful work at the dense rate)   portable %.2f   sm90 %.2f\n",
                tf[0] > 0 ? dense_tf[0] / tf[0] : 0.0, tf[1] > 0 ? dense_tf[1] / tf[1] : 0.0);
    std::fflush(stdout);
  }
  std::mt19937_64 rng(7);
  for (int blkk : {64, 128}) {
    for (double density : {1.0, 0.4, 0.1}) {
      const int blkq = 128, nq = S / blkq, nk = S / blkk;
      const int take = std::max(1, static_cast<int>(std::lround(density * nk)));
      auto [lut, counts, blocks] = bench_lut(static_cast<size_t>(B) * H * nq, nk, rng, [&](size_t) { return nk; },
                                             [&](size_t, int) { return take; });
      (void)blocks;
      DeviceGuarded<std::int32_t> dlut(lut.size()), dcnt(counts.size());
      dlut.upload(lut);
      dcnt.upload(counts);
      BlockSparseAttentionParams s;
      s.q = t4(dq.data()); s.k = t4(dk.data()); s.v = t4(dv.data()); s.o = t4(dout.data()); s.exec = ex;
      s.blkq = blkq; s.blkk = blkk;
      s.lut = make_tensor(dlut.data(), DType::i32, {B, H, nq, nk});
      s.counts = make_tensor(dcnt.data(), DType::i32, {B, H, nq});
      const double flops = 4.0 * blkq * blkk * D * static_cast<double>(take) * counts.size();
      const std::string label = "sparse blkq=128 blkk=" + std::to_string(blkk) + " density=" + std::to_string(density).substr(0, 4);
      run_paths(label.c_str(), flops, [&] { return block_sparse_attention(s); });
      if (density < 1.0) {
        // pv_threshold on but never met (1e4 in log2 units): the skip test and vote run, no block
        // is skipped, so the FLOP count stays exact. With blkk = 128 the portable path runs its
        // whole-block shape here (docs/attention_portable.md).
        const float never = 1e4f;
        s.pv_threshold = PerHead(&never, 1);
        run_paths((label + " pv=on").c_str(), flops, [&] { return block_sparse_attention(s); });
        s.pv_threshold = {};
      }
    }
  }
}

}  // namespace

SPARGE_CASES(AttentionGpuSparse) {
  // Every (dtype, head dim, block shape) x causal x odd length pairs, random LUTs.
  const int kLens[][2] = {{1, 1}, {113, 203}, {203, 113}, {799, 3}, {256, 256}};
  for (DType dt : kTypes)
    for (int d : kDims)
      for (auto& bl : kBlocks)
        for (bool causal : {false, true})
          for (auto& len : kLens) {
            Cfg c;
            c.dt = dt; c.d = d; c.blkq = bl[0]; c.blkk = bl[1]; c.causal = causal; c.sq = len[0]; c.sk = len[1];
            c.lut = Lut::random; c.density = 0.6;
            add(cases, c);
          }
  // The split tail on LUTs (bit 32768: every query tile's LUT entries in 3 chunks, combined by LSE;
  // with bit 32 a few persistent CTAs walk all chunks): paired 64-key blocks split at odd entries,
  // chunks with no visible entry, empty rows, no LSE output.
  for (int v : {32768, 32768 | 32})
    for (int d : kDims)
      for (int blkk : {64, 128})
        for (Lut m : {Lut::random, Lut::empty, Lut::full}) {
          Cfg c;
          c.dt = d == 64 ? DType::bf16 : DType::f16; c.d = d; c.blkq = 128; c.blkk = blkk; c.sq = 300; c.sk = 700;
          c.lut = m; c.density = 0.3; c.causal = m == Lut::full; c.b = 2; c.hq = 4; c.hk = 2; c.o_f32 = d == 128;
          c.lse = !(m == Lut::random && blkk == 64);  // the combine without an LSE output
          c.variant = v;
          add(cases, c);
        }
  // Densities 0, one block, 0.1, 1.0 (full LUT).
  for (DType dt : kTypes)
    for (int d : kDims)
      for (auto& bl : kBlocks)
        for (Lut m : {Lut::empty, Lut::one, Lut::random, Lut::full}) {
          Cfg c;
          c.dt = dt; c.d = d; c.blkq = bl[0]; c.blkk = bl[1]; c.sq = 300; c.sk = 700; c.lut = m; c.density = 0.1;
          c.causal = m == Lut::full;
          add(cases, c);
        }
  // GQA, NHD/HND, LSE off, O in the input dtype.
  for (DType dt : kTypes)
    for (int d : kDims)
      for (auto& bl : kBlocks) {
        Cfg c;
        c.dt = dt; c.d = d; c.blkq = bl[0]; c.blkk = bl[1]; c.b = 2; c.hq = 6; c.hk = 2; c.sq = 203; c.sk = 331;
        c.causal = true; c.hnd = true; c.density = 0.5;
        add(cases, c);
        c.hnd = false; c.hq = 4; c.hk = 1; c.lse = false; c.o_f32 = false; c.causal = false;
        add(cases, c);
      }
  // The staged epilogue (session 18: O through the tile's Q buffer and TMA stores; opt-in: with two Q buffers,
  // bit 2048, where they fit, hd64 here; on one Q buffer, bit 262144): O in the input dtype with the LSE, NHD
  // and HND, causal, more query tiles than CTAs (persistent), a ragged last tile (sq % 128 != 0), against the
  // default register epilogue; then ragged batches, whose warpgroups that reach past their sequence's end
  // store from registers.
  for (int v : {-1, 2048, 262144})
    for (int d : kDims)
      for (int blkk : {64, 128})
        for (bool causal : {false, true}) {
          Cfg c;
          c.dt = causal ? DType::bf16 : DType::f16; c.d = d; c.blkq = 128; c.blkk = blkk; c.b = 2; c.hq = 8; c.hk = 2;
          c.sq = 2100; c.sk = 1100; c.density = 0.4; c.causal = causal; c.hnd = causal; c.o_f32 = false;
          c.variant = v;
          add(cases, c);
        }
  for (int d : kDims)
    for (int blkk : {64, 128})
      for (bool causal : {false, true}) {
        Cfg c;
        c.dt = DType::f16; c.d = d; c.blkq = 128; c.blkk = blkk; c.causal = causal; c.hq = 4; c.hk = 2;
        c.lens_q = {256, 300, 0, 128, 77, 200};
        c.lens_k = {300, 256, 5, 128, 400, 64};
        c.b = 6; c.density = 0.6; c.hnd = !causal; c.o_f32 = false; c.variant = 262144;
        add(cases, c);
      }
  // More query blocks than CTAs fit on an H200 at once (132 SMs x 1 or 2): the sm90 launch then
  // runs the tiles in order of their LUT row length (random rows: lengths vary), so a wrong order
  // computes some tile twice and leaves another's O poisoned.
  for (int d : kDims)
    for (int blk : {64, 128}) {
      Cfg c;
      c.dt = DType::f16; c.d = d; c.blkq = blk; c.blkk = blk; c.b = 2; c.hq = 4; c.hk = 2; c.sq = 4096 + 77; c.sk = 512;
      c.density = 0.5; c.causal = blk == 64;
      add(cases, c);
    }
  // Varlen (ragged batches; the LUT batch index is the sequence), including an empty sequence and
  // Sq > Sk (empty causal rows).
  for (DType dt : kTypes)
    for (int d : kDims)
      for (auto& bl : kBlocks)
        for (bool causal : {false, true}) {
          Cfg c;
          c.dt = dt; c.d = d; c.blkq = bl[0]; c.blkk = bl[1]; c.causal = causal; c.hq = 4; c.hk = 2;
          c.lens_q = {113, 0, 64, 203, 7};
          c.lens_k = {203, 5, 64, 113, 0};
          c.b = 5; c.density = 0.7; c.hnd = causal;
          add(cases, c);
        }
  // pv_threshold: random data (skips are rare, decisions must agree) and the probe whose skips
  // change O visibly.
  for (DType dt : kTypes)
    for (int d : kDims)
      for (auto& bl : kBlocks) {
        Cfg c;
        c.dt = dt; c.d = d; c.blkq = bl[0]; c.blkk = bl[1]; c.sq = 257; c.sk = 513; c.pv_thr = 2.0f; c.density = 0.8;
        c.scale = 0.5f;  // wider logits, more skips
        add(cases, c);
        c.pv_probe = true; c.pv_thr = 4.0f; c.scale = 1.0f; c.lut = Lut::full; c.causal = false;
        add(cases, c);
      }
  // pv_threshold patterns (issue #7: paired tiles decide per LUT block; the two consumer
  // warpgroups vote without lockstep): every (dtype, head dim, block shape), causal and not, odd
  // key-block counts (half tiles), and on the sm90 path with the switches that change the pv
  // path: 1 (unpaired, per-warpgroup vote), 4 (no pingpong), 32 (persistent, 3 CTAs: the vote
  // ring's tags run on across many query tiles), 256 (the legacy path).
  // |O| ~ 100 here (V = 100 + 10 N): the fp32 accumulations of the kernels (tensor-core sums, P
  // rounded to the input dtype) land up to 2.4x the fp32 reference's error (max 6e-4, H200
  // 2026-11-30, on every path including the portable kernel and the legacy pv path), so the
  // absolute noise term allows 1e-3; the wrong decision rules still miss by more than 20x the
  // resulting tolerance (checked on the CPU by check_pattern_case).
  constexpr double kPatternNoise = 1e-3;
  for (DType dt : kTypes)
    for (int d : kDims)
      for (auto& bl : kBlocks)
        for (bool causal : {false, true}) {
          Cfg c;
          c.dt = dt; c.d = d; c.blkq = bl[0]; c.blkk = bl[1]; c.causal = causal; c.hq = 2; c.hk = 1;
          c.sq = 389; c.sk = 1100; c.lut = Lut::full; c.pv_thr = 4.0f; c.scale = 1.0f;
          c.pv_pattern = true; c.spread_noise_o = kPatternNoise;
          add(cases, c);
        }
  for (int d : kDims)
    for (auto& bl : kBlocks)
      for (int v : {1, 4, 32, 256}) {
        if (v == 1 && bl[1] != 64) continue;
        Cfg c;
        c.dt = DType::f16; c.d = d; c.blkq = bl[0]; c.blkk = bl[1]; c.causal = v == 32; c.hq = 2; c.hk = 1;
        c.sq = 389; c.sk = 1100; c.lut = Lut::full; c.pv_thr = 4.0f; c.scale = 1.0f;
        c.pv_pattern = true; c.variant = v; c.spread_noise_o = kPatternNoise;
        add(cases, c);
      }
  // Empty rows: Sq > Sk under causal masking.
  for (DType dt : kTypes)
    for (auto& bl : kBlocks) {
      Cfg c;
      c.dt = dt; c.d = 128; c.blkq = bl[0]; c.blkk = bl[1]; c.sq = 300; c.sk = 100; c.causal = true; c.lut = Lut::full;
      add(cases, c);
    }
  // Logit spreads of ~1e4 (massive activations): finite, within the same tolerance.
  for (DType dt : kTypes)
    for (int d : kDims) {
      Cfg c;
      c.dt = dt; c.d = d; c.sq = 200; c.sk = 600; c.scale = 200.0f; c.density = 0.7; c.causal = true;
      c.spread_noise_o = 0.02;
      c.spread_noise_lse = 0.1;
      add(cases, c);
    }
  // Peaked rows (q x 20: logits spread over ~10 log2 units, one or two keys carry a row): the running
  // max moves by several units on some tiles and not on others, rows of one warp disagree, and the
  // output is dominated by the few P that are 1 or close to it. These cases caught a stale-max softmax
  // (the max moved only when a tile exceeded it by more than 8: 2-3x the error; session 19).
  for (DType dt : kTypes)
    for (int d : kDims)
      for (bool causal : {false, true})
        for (Lut lut : {Lut::random, Lut::dense_api}) {
          Cfg c;
          c.dt = dt; c.d = d; c.sq = 300; c.sk = 1000; c.q_mul = 20.0f; c.causal = causal; c.lut = lut;
          add(cases, c);
        }
}

SPARGE_CASES(AttentionGpuDense) {
  const int kLens[][2] = {{1, 1}, {113, 203}, {203, 113}, {799, 3}, {3, 799}, {1024, 1024}};
  for (DType dt : kTypes)
    for (int d : kDims)
      for (bool causal : {false, true})
        for (auto& len : kLens) {
          Cfg c;
          c.dt = dt; c.d = d; c.causal = causal; c.sq = len[0]; c.sk = len[1]; c.lut = Lut::dense_api;
          c.hq = 4; c.hk = 2; c.hnd = len[0] == 113; c.o_f32 = len[0] != 203;
          add(cases, c);
        }
  for (DType dt : kTypes)
    for (int d : kDims)
      for (bool causal : {false, true}) {
        Cfg c;
        c.dt = dt; c.d = d; c.causal = causal; c.lut = Lut::dense_api; c.hq = 8; c.hk = 2;
        c.lens_q = {1, 799, 0, 128, 129};
        c.lens_k = {1, 3, 17, 128, 300};
        c.b = 5;
        add(cases, c);
      }
  // Causal dense hd128 with K/V multicast (session 15: clusters of query blocks qb, qb - 1 of one head, both
  // walking the longer row; the shorter one's extra tile is masked whole): an even number of query
  // blocks, sk > sq (every row sees keys) and sq > sk (empty rows, an extra tile for rows with no key),
  // and the same shapes without the multicast (bit 65536), the persistent hook (32) on top.
  const int kMcLens[][2] = {{256, 700}, {512, 357}, {1024, 1024}};
  for (DType dt : kTypes)
    for (int v : {-1, 65536, 32})
      for (auto& len : kMcLens) {
        if (v != -1 && len[0] == 1024) continue;
        Cfg c;
        c.dt = dt; c.d = 128; c.causal = true; c.sq = len[0]; c.sk = len[1]; c.lut = Lut::dense_api;
        c.b = 1; c.hq = 2; c.hk = 1; c.variant = v; c.o_f32 = dt == DType::f16;
        cases.push_back({c.name(), [c] { check_case(c); }});
      }
  // Varlen on the persistent and split paths of the Hopper kernel (hooks: 32 = three persistent CTAs
  // walk every tile, empty ones past a sequence's end included; 32768 = every tile's keys in 3 chunks
  // merged by LSE), dense (the 176-key tile) and a paired 128 x 64 LUT with poisoned first blocks.
  for (int v : {32, 32768, 32768 | 32})
    for (bool dense : {true, false})
      for (bool causal : {false, true}) {
        if (causal && v != 32) continue;  // the split does not take causal masking
        Cfg c;
        c.dt = DType::f16; c.d = 128; c.causal = causal; c.hq = 4; c.hk = 2; c.variant = v;
        if (dense) c.lut = Lut::dense_api; else { c.blkq = 128; c.blkk = 64; c.density = 0.7; c.poison_next = true; }
        c.lens_q = {300, 77, 0, 513, 129};
        c.lens_k = {129, 400, 64, 513, 177};
        c.b = 5;
        add(cases, c);
      }
  // Varlen whose sequences start with a poisoned key block that they never select (NaN keys, +Inf
  // values; Cfg::poison_next): the Hopper kernel's blocks crossing the previous sequence's end load
  // those rows through the one tensor map and must zero V there (the portable kernel zero-fills).
  // Every block shape (paired and not), BLKQ 64 and 128, causal and not; lengths that end blocks
  // at 1, 13, 63 rows in.
  for (int d : kDims)
    for (bool causal : {false, true})
      for (auto& bl : kBlocks) {
        Cfg c;
        c.dt = bl[1] == 64 ? DType::bf16 : DType::f16; c.d = d; c.causal = causal; c.hq = 4; c.hk = 2;
        c.blkq = bl[0]; c.blkk = bl[1]; c.density = 0.8;
        c.lens_q = {100, 77, 130, 3, 200};
        c.lens_k = {129, 77, 191, 141, 200};
        c.poison_next = true;
        c.b = 5;
        add(cases, c);
      }
  // The split tail of the 128 x 176 tile (bit 32768: every query tile's keys in 3 chunks, combined by
  // LSE; with bit 32 one persistent CTA or cluster walks all chunks): chunks without keys (sk 3),
  // rows without keys in some chunks (causal), partial tiles, bf16 and f16 outputs.
  for (int v : {32768, 32768 | 32})
    for (bool causal : {false, true})
      for (auto& len : kLens) {
        if (len[0] == 1) continue;
        Cfg c;
        c.dt = len[0] == 203 ? DType::bf16 : DType::f16; c.d = 128; c.causal = causal; c.sq = len[0]; c.sk = len[1];
        c.lut = Lut::dense_api; c.hq = 4; c.hk = 2; c.o_f32 = len[0] != 203; c.variant = v;
        add(cases, c);
      }
}

// Launches c's problem `relaunches` times on the same inputs: every O and LSE bitwise equal to the
// first launch's, guards intact.
void expect_relaunches_bitwise(const Cfg& c, int relaunches) {
  const Problem p = make_problem(c);
  std::vector<std::vector<std::uint32_t>> bits;
  const GpuOut g = run_gpu(p, relaunches, &bits);
  EXPECT_TRUE(g.guards);
  int differing = 0;
  for (size_t i = 1; i < bits.size(); ++i) differing += bits[i] != bits[0];
  EXPECT_EQ(differing, 0) << differing << " of " << relaunches - 1 << " relaunches differ from the first";
}

// c's problem launched twice under variant bits `launch` and once under `reference` (bits that give
// the same tiles and arithmetic another way): both launches of the first bitwise equal to each other
// and to the reference, guards intact. `what` names the first launch in the failure messages.
void expect_launches_bitwise(const Cfg& c, int launch, int reference, const std::string& what) {
  Problem p = make_problem(c);
  std::vector<std::vector<std::uint32_t>> got, ref;
  p.c.variant = launch;
  EXPECT_TRUE(run_gpu(p, 2, &got).guards);
  p.c.variant = reference;
  EXPECT_TRUE(run_gpu(p, 1, &ref).guards);
  ASSERT_EQ(got.size(), 2u);
  ASSERT_EQ(ref.size(), 1u);
  EXPECT_TRUE(got[0] == got[1]) << what << " differs between relaunches";
  EXPECT_TRUE(got[0] == ref[0]) << what << " differs from one tile per CTA";
}

SPARGE_CASES(AttentionGpuProperties) {
  // 400 relaunches of one mid-size case give bitwise the same O and LSE.
  cases.push_back({"BSA_DETERMINISM(dt=bf16,b=2,hq=4,hk=2,sq=1000,sk=1000,d=128,causal=1,relaunches=400)", [] {
    if (!have_gpu()) GTEST_SKIP() << "no GPU";
    Cfg c;
    c.dt = DType::bf16; c.b = 2; c.hq = 4; c.hk = 2; c.sq = 1000; c.sk = 1000; c.d = 128; c.causal = true;
    c.blkq = 128; c.blkk = 64; c.density = 0.5; c.pv_thr = 6.0f;
    expect_relaunches_bitwise(c, 400);
  }});
  // The same for dense attention at head dim 128 without causal masking: on sm_90 the 128 x 176
  // tile, whose last key tile per row (1000 = 5 * 176 + 120) is a masked partial one.
  cases.push_back({"DENSE_DETERMINISM(dt=f16,b=2,hq=4,hk=2,sq=1000,sk=1000,d=128,causal=0,relaunches=400)", [] {
    if (!have_gpu()) GTEST_SKIP() << "no GPU";
    Cfg c;
    c.dt = DType::f16; c.b = 2; c.hq = 4; c.hk = 2; c.sq = 1000; c.sk = 1000; c.d = 128; c.lut = Lut::dense_api;
    expect_relaunches_bitwise(c, 400);
  }});
  // The dense 128 x 176 tile's default launch where it is persistent and multicast (512 query tiles,
  // more than one wave of CTAs; the DENSE cases above are all smaller than a wave) against the same
  // kernel one tile per CTA without multicast (bits 64 | 8192): the same tiles and arithmetic, so
  // bitwise the same O and LSE (sk = 2048: every row ends with a masked partial tile).
  cases.push_back({"DENSE_PERSISTENT_MC(dt=f16,b=2,hq=16,hk=4,sq=2048,sk=2048,d=128)", [] {
    if (!have_gpu()) GTEST_SKIP() << "no GPU";
    if (!device_is_sm90()) GTEST_SKIP() << "not an sm_90 device (the 176 tile is the sm90 kernel's)";
    Cfg c;
    c.dt = DType::f16; c.b = 2; c.hq = 16; c.hk = 4; c.sq = 2048; c.sk = 2048; c.d = 128; c.lut = Lut::dense_api;
    // 0: the defaults, whatever SPARGE_SM90_VARIANT the run has.
    expect_launches_bitwise(c, 0, 64 | 8192, "the persistent multicast launch");
  }});
  // Causal dense on the 176 tile (session 16): persistent CTAs on the paired order of
  // causal_pair_slot, with multicast, against one tile per CTA (bit 131072; multicast stays on, so
  // both walk the same blocks per tile): bitwise the same O and LSE. 512 tiles on 132 CTAs: one whole
  // round pair, the rest in the leftover layout; the last round (116 tiles) is not split (n < 2).
  // Head dim 64 (the 192 x 128 tile: 11 query blocks per head, odd, so each head's middle one goes to
  // the leftover slots; no multicast) and hd128 with bit 4096 (128 x 128) the same way.
  for (int d : {128, 64, -128})
  cases.push_back({"DENSE_CAUSAL_PAIRS(dt=f16,b=2,hq=16,hk=4,sq=2048,sk=2048,d=" + std::to_string(d < 0 ? -d : d) +
                   ",causal=1" + (d < 0 ? ",v=4096)" : ")"), [d] {
    if (!have_gpu()) GTEST_SKIP() << "no GPU";
    if (!device_is_sm90()) GTEST_SKIP() << "not an sm_90 device (the 176 tile is the sm90 kernel's)";
    Cfg c;
    c.dt = DType::f16; c.b = 2; c.hq = 16; c.hk = 4; c.sq = 2048; c.sk = 2048; c.d = d < 0 ? -d : d; c.causal = true;
    c.lut = Lut::dense_api;
    const int base = d < 0 ? 4096 : 0;  // the defaults (or the 128 x 128 tile), whatever SPARGE_SM90_VARIANT the run has
    expect_launches_bitwise(c, base, base | 131072, "the paired persistent launch");
  }});
  // Causal LUTs (session 16): the paired persistent order against one CTA per tile in the longest-row-
  // first order (bit 131072): the same tiles and walks, so bitwise the same O and LSE; unpaired 128 x 128
  // and paired 128 x 64 (hd128), 512 query tiles.
  for (int blkk : {128, 64})
  cases.push_back({"BSA_CAUSAL_PAIRS(dt=f16,b=2,hq=16,hk=4,sq=2048,sk=2048,d=128,blkq=128,blkk=" + std::to_string(blkk) +
                   ",causal=1)", [blkk] {
    if (!have_gpu()) GTEST_SKIP() << "no GPU";
    if (!device_is_sm90()) GTEST_SKIP() << "not an sm_90 device (the paired order is the sm90 kernel's)";
    Cfg c;
    c.dt = DType::f16; c.b = 2; c.hq = 16; c.hk = 4; c.sq = 2048; c.sk = 2048; c.d = 128; c.causal = true;
    c.lut = Lut::random; c.blkq = 128; c.blkk = blkk; c.density = 0.5;
    expect_launches_bitwise(c, 0, 131072, "the paired persistent launch");
  }});
  // The V-staged epilogue (session 26: O of the hd128 BLKQ-128 LUT kernels through the tile's last V stage and TMA
  // stores, the default) against the register epilogue (bit 1048576): the same O and LSE values written another way,
  // so bitwise equal, and equal over relaunches. O in the input dtype (the map's), NHD and HND, causal, GQA, a ragged
  // last query tile (sq % 128 != 0; TMA clips its rows), more query tiles than CTAs (persistent, the held stage
  // released across tiles), paired and unpaired 128-key stages, empty LUT rows (no stage: register epilogue, the
  // warpgroups pair up on nothing), pv_threshold, and ragged batches (warpgroups reaching past their sequence's end
  // store from registers but still pair up on the stage barrier).
  for (int blkk : {64, 128})
    for (int k = 0; k < 5; ++k) {
      Cfg c;
      c.dt = k % 2 ? DType::bf16 : DType::f16; c.d = 128; c.blkq = 128; c.blkk = blkk; c.o_f32 = false;
      c.b = 2; c.hq = 8; c.hk = 2; c.sq = 2100; c.sk = 1500; c.density = 0.3; c.hnd = k % 2 == 1;
      if (k == 1) c.causal = true;
      if (k == 2) { c.lut = Lut::empty; c.sq = 300; }
      if (k == 3) { c.pv_thr = 2.0f; c.scale = 0.5f; c.lse = false; }
      if (k == 4) {
        c.lens_q = {256, 300, 0, 128, 77, 200, 1030};
        c.lens_k = {300, 256, 5, 128, 400, 64, 900};
        c.b = 7; c.density = 0.6;
      }
      const std::string name = c.name();
      cases.push_back({"BSA_VSTAGED" + name.substr(name.find('(')), [c] {
        if (!have_gpu()) GTEST_SKIP() << "no GPU";
        if (!device_is_sm90()) GTEST_SKIP() << "not an sm_90 device (the V-staged epilogue is the sm90 kernel's)";
        expect_launches_bitwise(c, 0, 1048576, "the V-staged epilogue");
      }});
    }
  // The split tail where the default launch makes it: 144 query tiles on an H200's 132 persistent CTAs
  // (66 clusters for the dense 176 tile) leave 12 for a last round, each cut into chunks (dense: min(132 /
  // 12, 24 / 4) = 6 of its 176-key tiles; LUT: min(11, NK / 4) = 8 or 11 of its entries). Against the
  // same kernel without the split (bit 16384): the same keys in another summation order, so within a
  // few fp16 units of O and 1e-5 of the LSE; and bitwise the same over relaunches.
  // Causal dense (blkk -1, session 16: the paired order's last round, 12 light tiles of 1024 / 4096
  // rows, split in 2 chunks each): the same check.
  for (int blkk : {0, -1, 64, 128}) {
    Cfg c;
    c.dt = DType::f16; c.b = 1; c.hq = 18; c.hk = 6; c.sq = 1024; c.sk = 4096; c.d = 128; c.o_f32 = false;
    if (blkk <= 0) {
      c.lut = Lut::dense_api;
      c.causal = blkk < 0;
    } else {
      c.lut = Lut::random; c.blkq = 128; c.blkk = blkk; c.density = 0.5;
    }
    const std::string name = c.name();
    cases.push_back({(c.lut == Lut::dense_api ? "DENSE_SPLIT_TAIL" : "BSA_SPLIT_TAIL") + name.substr(name.find('(')), [c] {
      if (!have_gpu()) GTEST_SKIP() << "no GPU";
      if (!device_is_sm90()) GTEST_SKIP() << "not an sm_90 device (the split tail is the sm90 kernel's)";
      Problem p = make_problem(c);
      std::vector<std::vector<std::uint32_t>> split_bits;
      p.c.variant = 0;
      const GpuOut split = run_gpu(p, 3, &split_bits);
      p.c.variant = 16384;
      const GpuOut whole = run_gpu(p);
      EXPECT_TRUE(split.guards && whole.guards);
      ASSERT_EQ(split_bits.size(), 3u);
      EXPECT_TRUE(split_bits[0] == split_bits[1] && split_bits[0] == split_bits[2]) << "the split launch differs between relaunches";
      const Error eo = compare(split.o.data(), whole.o.data(), whole.o.size());
      const Error el = compare(split.lse.data(), whole.lse.data(), whole.lse.size());
      EXPECT_EQ(eo.nonfinite_mismatch + el.nonfinite_mismatch, 0);
      EXPECT_LE(eo.max_abs, 5e-4) << "O: split vs whole " << describe(eo);
      EXPECT_LE(el.max_abs, 1e-5) << "LSE: split vs whole " << describe(el);
      // On a 132-SM H200 the split runs (12 tail tiles), and its other summation order moves the last
      // bits of some of their 12 x 128 LSE values: all equal would mean the default launch did not
      // split. (Added after the last device round of session 14: not yet run on a GPU.)
      int dev = 0, sms = 0;
      SPARGE_CUDA_CHECK(cudaGetDevice(&dev));
      SPARGE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
      if (sms == 132) {
        int differ = 0;
        for (size_t i = 0; i < whole.lse.size(); ++i) differ += float_to_bits(split.lse[i]) != float_to_bits(whole.lse[i]);
        EXPECT_GT(differ, 0) << "the default launch gave bitwise the unsplit LSE: the split tail did not run";
      }
    }});
  }
  // On an sm_90 device with a 90a build the Hopper kernel is selected for a plain problem and for
  // varlen (since session 15; before, forcing it on varlen was an `unsupported` naming the reason).
  cases.push_back({"SM90_SELECTED(dt=f16,sq=256,sk=256,d=128)", [] {
    if (!have_gpu()) GTEST_SKIP() << "no GPU";
    if (!device_is_sm90()) GTEST_SKIP() << "not an sm_90 device";
    DeviceGuarded<std::uint16_t> buf(256 * 2 * 128);
    DeviceGuarded<std::int32_t> cu(2);
    SPARGE_CUDA_CHECK(cudaMemset(cu.data(), 0, 2 * sizeof(std::int32_t)));
    DenseAttentionParams d;
    d.exec.backend = Backend::cuda;
    d.q = make_tensor(buf.data(), DType::f16, {1, 256, 2, 128});
    d.k = d.q; d.v = d.q; d.o = d.q;
    {
      const auto path = scoped_path("sm90");
      const Status st = supported(d);
      EXPECT_TRUE(st.ok()) << "sm90 path not available: " << st.message()
                           << " (build with SPARGE_CUDA_ARCHS including 90a)";
      d.varlen = {cu.data(), cu.data(), 1, 256, 256};
      const Status sv = supported(d);
      EXPECT_TRUE(sv.ok()) << "varlen on the sm90 path: " << sv.message();
    }
    const Status sa = supported(d);
    EXPECT_TRUE(sa.ok()) << sa.message();
  }});
  // Timing (SPARGE_BENCH=1): b2 h32 s16384 d128 f16, dense and random LUTs, both paths.
  cases.push_back({"BENCH_ATTENTION(dt=f16,b=2,h=32,s=16384,d=128)", [] { bench_attention(); }});
  // supported() and the entry share one selection function and name what they reject.
  cases.push_back({"BSA_UNSUPPORTED(head_dim=96,stride3=2,maybe_mask)", [] {
    if (!have_gpu()) GTEST_SKIP() << "no GPU";
    DeviceGuarded<std::uint16_t> buf(2 * 64 * 2 * 192);
    DeviceGuarded<std::int32_t> lut(4), cnt(2);
    DeviceGuarded<std::uint8_t> mask(2 * 64 * 64);
    BlockSparseAttentionParams s;
    s.exec.backend = Backend::cuda;
    s.q = make_tensor(buf.data(), DType::f16, {1, 64, 2, 96});
    s.k = s.q; s.v = s.q; s.o = s.q;
    s.lut = make_tensor(lut.data(), DType::i32, {1, 2, 1, 1});
    s.counts = make_tensor(cnt.data(), DType::i32, {1, 2, 1});
    Status st = supported(s);
    EXPECT_EQ(st.code(), StatusCode::unsupported) << st.message();
    EXPECT_NE(st.message().find("head dim 96"), std::string::npos) << st.message();
    EXPECT_EQ(block_sparse_attention(s).message(), st.message());
    s.q = make_tensor(buf.data(), DType::f16, {1, 64, 1, 64}, {64 * 2 * 64, 2 * 64, 64, 2});
    s.k = s.q; s.v = s.q; s.o = s.q;
    s.lut = make_tensor(lut.data(), DType::i32, {1, 1, 1, 1});
    s.counts = make_tensor(cnt.data(), DType::i32, {1, 1, 1});
    st = supported(s);
    EXPECT_EQ(st.code(), StatusCode::unsupported) << st.message();
    EXPECT_NE(st.message().find("stride[3]"), std::string::npos) << st.message();
    DenseAttentionParams d;
    d.exec.backend = Backend::cuda;
    d.q = make_tensor(buf.data(), DType::f16, {1, 64, 1, 64});
    d.k = d.q; d.v = d.q; d.o = d.q;
    d.maybe_mask = make_tensor(mask.data(), DType::u8, {1, 1, 64, 64});
    st = dense_attention(d);
    EXPECT_EQ(st.code(), StatusCode::unsupported) << st.message();
    EXPECT_NE(st.message().find("maybe_mask"), std::string::npos) << st.message();
  }});
}

// ---- merge ---------------------------------------------------------------------------------------
namespace {
struct MergeCfg {
  DType dt;
  bool alias;
};

void check_merge(const MergeCfg& mc) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const int B = 2, S = 37, H = 3, D = 72;
  const size_t no = static_cast<size_t>(B) * S * H * D, nl = static_cast<size_t>(B) * H * S;
  auto rng = rng_for(std::string("merge") + sparge::to_string(mc.dt) + (mc.alias ? "a" : ""));
  std::vector<float> oa(no), ob(no), la(nl), lb(nl);
  fill_normal(oa, rng);
  fill_normal(ob, rng);
  fill_uniform(la, rng, -5.0f, 5.0f);
  fill_uniform(lb, rng, -5.0f, 5.0f);
  for (size_t i = 0; i < nl; i += 5) la[i] = kNegInf;           // a empty
  for (size_t i = 0; i < nl; i += 7) lb[i] = kNegInf;           // b empty (both at multiples of 35)
  for (size_t i = 3; i < nl; i += 11) lb[i] = la[i] + 30.0f;    // one side dominates
  if (mc.dt != DType::f32) {
    oa = round_through(oa, mc.dt);
    ob = round_through(ob, mc.dt);
  }
  // CPU oracle in f32.
  std::vector<float> co(no), cl(nl);
  MergeAttentionParams cp;
  cp.o_a = make_tensor(oa.data(), DType::f32, {B, S, H, D});
  cp.o_b = make_tensor(ob.data(), DType::f32, {B, S, H, D});
  cp.o = make_tensor(co.data(), DType::f32, {B, S, H, D});
  cp.lse_a = make_tensor(la.data(), DType::f32, {B, H, S});
  cp.lse_b = make_tensor(lb.data(), DType::f32, {B, H, S});
  cp.lse = make_tensor(cl.data(), DType::f32, {B, H, S});
  Status st = merge_attention(cp);
  ASSERT_TRUE(st.ok()) << st.message();

  const bool f32 = mc.dt == DType::f32;
  DeviceGuarded<float> da32(f32 ? no : 0), db32(f32 ? no : 0), do32(f32 ? no : 0);
  DeviceGuarded<std::uint16_t> da16(f32 ? 0 : no), db16(f32 ? 0 : no), do16(f32 ? 0 : no);
  DeviceGuarded<float> dla(nl), dlb(nl), dlo(nl);
  if (f32) {
    da32.upload(oa);
    db32.upload(ob);
    do32.poison();
  } else {
    da16.upload(to_storage16(oa, mc.dt));
    db16.upload(to_storage16(ob, mc.dt));
    do16.poison();
  }
  dla.upload(la);
  dlb.upload(lb);
  dlo.poison();
  void* pa = f32 ? static_cast<void*>(da32.data()) : da16.data();
  void* pb = f32 ? static_cast<void*>(db32.data()) : db16.data();
  void* po = mc.alias ? pa : (f32 ? static_cast<void*>(do32.data()) : do16.data());
  MergeAttentionParams gp;
  gp.exec.backend = Backend::cuda;
  gp.o_a = make_tensor(pa, mc.dt, {B, S, H, D});
  gp.o_b = make_tensor(pb, mc.dt, {B, S, H, D});
  gp.o = make_tensor(po, mc.dt, {B, S, H, D});
  gp.lse_a = make_tensor(dla.data(), DType::f32, {B, H, S});
  gp.lse_b = make_tensor(dlb.data(), DType::f32, {B, H, S});
  gp.lse = make_tensor(mc.alias ? dla.data() : dlo.data(), DType::f32, {B, H, S});
  st = merge_attention(gp);
  ASSERT_TRUE(st.ok()) << st.message();
  SPARGE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> go(no);
  const bool out_is_a = mc.alias;
  if (f32) {
    go = out_is_a ? da32.download() : do32.download();
  } else {
    const auto raw = out_is_a ? da16.download() : do16.download();
    for (size_t i = 0; i < no; ++i) go[i] = element(raw, mc.dt, i);
  }
  const std::vector<float> gl = mc.alias ? dla.download() : dlo.download();
  double tol = 1e-5;
  if (!f32) tol += mc.dt == DType::f16 ? 4e-3 : 3e-2;  // one rounding of |O| <= ~4 to the dtype
  const Error eo = compare(go.data(), co.data(), no), el = compare(gl.data(), cl.data(), nl);
  EXPECT_EQ(eo.nonfinite_mismatch, 0) << describe(eo);
  EXPECT_EQ(el.nonfinite_mismatch, 0) << describe(el);
  EXPECT_LE(eo.max_abs, tol) << describe(eo);
  EXPECT_LE(el.max_abs, 1e-5) << describe(el);
  for (size_t i = 0; i < nl; i += 35) EXPECT_EQ(gl[i], kNegInf) << "both sides empty at " << i;
  EXPECT_TRUE(da32.guards_intact() && db32.guards_intact() && do32.guards_intact() && da16.guards_intact() &&
              db16.guards_intact() && do16.guards_intact() && dla.guards_intact() && dlb.guards_intact() &&
              dlo.guards_intact());
}
}  // namespace

SPARGE_CASES(MergeGpu) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (bool alias : {false, true}) {
      const MergeCfg mc{dt, alias};
      cases.push_back({Name("MERGE")("dt", sparge::to_string(dt))("alias", alias).str(), [mc] { check_merge(mc); }});
    }
}

}  // namespace sparge::test
