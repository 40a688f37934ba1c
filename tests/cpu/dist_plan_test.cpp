// The planning of context parallelism (src/dist/plan.h, docs/context_parallel.md), on the CPU:
//   DIST_ZIGZAG  - shards partition [0, S): rank r holds chunks r and 2R-1-r, chunk starts are
//                  multiples of the alignment, a partial chunk is the last nonempty one, local
//                  rows follow the pieces; equal lengths and equal causal work when S fills all
//                  chunks; the public shard_of uses kChunkAlign.
//   DIST_COVER   - for random LUTs (causal-visible or not), the per-step restriction of every rank
//                  attends each selected block exactly once over all steps and calls, never one
//                  that is not selected, rows stay ascending and -1 padded.
//   DIST_CAUSAL  - token level: the pairs (i, j) the calls attend (each call with its own causal
//                  flag, bottom-right aligned on its own q/k rows, as the kernels do) are exactly
//                  {(i, j): block(j) selected for block(i), j <= i when causal}, each once.
//   DIST_EMULATE - the whole algorithm on the CPU backend: the global map, then per rank and ring
//                  step the restricted calls through block_sparse_attention and merge_attention;
//                  equals single-device block_sparse_attention up to fp32 rounding.
//   DIST_BAD     - validation of dist::sparse_attention: one bad parameter at a time, named.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "dist/plan.h"
#include "harness/harness.h"
#include "sparge/dist.h"

namespace sparge::test {
namespace {

using dist::Piece;
using dist::Shard;
namespace plan = dist::plan;

std::int64_t cdiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

struct Geo {
  std::int64_t s = 0;
  int world = 2, blkq = 64, blkk = 64;
  std::int64_t align = 64;
  bool causal = false;
  plan::Layout layout() const {
    plan::Layout L;
    L.seq_len = s;
    L.world = world;
    L.blkq = blkq;
    L.blkk = blkk;
    L.causal = causal;
    L.align = align;
    return L;
  }
  Shard shard(int r) const { return plan::shard_of_aligned(s, world, r, align); }
  std::string name(const char* op) const {
    return Name(op)("s", s)("world", world)("blkq", blkq)("blkk", blkk)("align", align)("causal", causal ? 1 : 0);
  }
};

// Global row of shard row `row` of shard sh.
std::int64_t global_row(const Shard& sh, std::int64_t row) {
  const Piece& pc = row < sh.piece[0].len ? sh.piece[0] : sh.piece[1];
  return pc.global_begin + row - pc.local_begin;
}

std::vector<Geo> geometries() {
  std::vector<Geo> out;
  for (int world : {1, 2, 3, 4, 8}) {
    for (auto [bq, bk] : {std::pair{64, 64}, std::pair{128, 64}, std::pair{64, 128}}) {
      const std::int64_t a = std::max(bq, bk);
      for (std::int64_t align : {a, 2 * a}) {
        for (std::int64_t s : {std::int64_t{1}, std::int64_t{63}, 2 * world * align, 2 * world * align - 37,
                               2 * world * align + 5, 3 * align + 17}) {
          for (bool causal : {false, true}) out.push_back({s, world, bq, bk, align, causal});
        }
      }
    }
  }
  return out;
}

// ---- DIST_ZIGZAG ---------------------------------------------------------------------------------
SPARGE_CASES(DistZigzag) {
  for (const Geo& g : geometries()) {
    if (g.causal) continue;
    cases.push_back({g.name("DIST_ZIGZAG"), [g] {
      const std::int64_t c = plan::chunk_len_aligned(g.s, g.world, g.align);
      ASSERT_GT(c, 0);
      EXPECT_EQ(c % g.align, 0);
      EXPECT_GE(c * 2 * g.world, g.s);
      std::vector<int> owner(static_cast<std::size_t>(g.s), -1);
      std::int64_t last_nonempty = -1;
      for (int r = 0; r < g.world; ++r) {
        const Shard sh = g.shard(r);
        EXPECT_EQ(sh.piece[0].chunk, r);
        EXPECT_EQ(sh.piece[1].chunk, 2 * g.world - 1 - r);
        EXPECT_EQ(sh.len, sh.piece[0].len + sh.piece[1].len);
        EXPECT_EQ(sh.piece[0].local_begin, 0);
        EXPECT_EQ(sh.piece[1].local_begin, sh.piece[0].len);
        for (const Piece& pc : sh.piece) {
          if (pc.len == 0) continue;
          EXPECT_EQ(pc.global_begin, pc.chunk * c);
          EXPECT_EQ(pc.global_begin % g.align, 0);
          EXPECT_LE(pc.len, c);
          // A partial chunk ends the sequence.
          if (pc.len < c) EXPECT_EQ(pc.global_begin + pc.len, g.s);
          last_nonempty = std::max(last_nonempty, pc.chunk);
          for (std::int64_t i = 0; i < pc.len; ++i) {
            ASSERT_EQ(owner[static_cast<std::size_t>(pc.global_begin + i)], -1) << "row " << pc.global_begin + i << " held twice";
            owner[static_cast<std::size_t>(pc.global_begin + i)] = r;
            ASSERT_EQ(global_row(sh, pc.local_begin + i), pc.global_begin + i);
          }
        }
        // Piece 1 starts at a block boundary of the shard (piece 0 full, or piece 1 empty).
        if (sh.piece[1].len > 0) EXPECT_EQ(sh.piece[0].len, c);
      }
      for (std::int64_t i = 0; i < g.s; ++i) ASSERT_GE(owner[static_cast<std::size_t>(i)], 0) << "row " << i << " held by no rank";
      EXPECT_EQ(last_nonempty, cdiv(g.s, c) - 1);
      if (g.s == 2 * g.world * c) {
        // Full chunks: equal shards and equal causal work (sum over rows of the keys they see).
        std::int64_t work0 = -1;
        for (int r = 0; r < g.world; ++r) {
          const Shard sh = g.shard(r);
          EXPECT_EQ(sh.len, 2 * c);
          std::int64_t work = 0;
          for (const Piece& pc : sh.piece) {
            for (std::int64_t i = 0; i < pc.len; ++i) work += pc.global_begin + i + 1;
          }
          if (work0 < 0) work0 = work;
          EXPECT_EQ(work, work0) << "rank " << r;
        }
      }
    }});
  }
  cases.push_back({"DIST_ZIGZAG(public,kChunkAlign)", [] {
    for (int world : {1, 2, 4, 8}) {
      for (std::int64_t s : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{131072}, std::int64_t{131072 + 77}}) {
        const std::int64_t c = dist::chunk_len(s, world);
        EXPECT_EQ(c % dist::kChunkAlign, 0);
        EXPECT_EQ(c, plan::chunk_len_aligned(s, world, dist::kChunkAlign));
        std::int64_t total = 0;
        for (int r = 0; r < world; ++r) total += dist::shard_of(s, world, r).len;
        EXPECT_EQ(total, s);
      }
    }
    EXPECT_EQ(dist::chunk_len(131072, 8), 8192);
    EXPECT_EQ(dist::shard_of(131072, 8, 3).piece[1].global_begin, 12 * 8192);
  }});
}

// ---- random global LUTs ------------------------------------------------------------------------
// lut[b][h][qb] = ascending selected key blocks; causal: only blocks with a key <= the block's last
// row (the block map's visibility), non-causal: any block.
using Lut = std::vector<std::vector<std::vector<std::vector<std::int32_t>>>>;

Lut random_lut(const Geo& g, int batch, int heads, std::mt19937_64& rng, double density) {
  const std::int64_t nq = cdiv(g.s, g.blkq), nk = cdiv(g.s, g.blkk);
  std::bernoulli_distribution keep(density);
  Lut lut(static_cast<std::size_t>(batch), std::vector<std::vector<std::vector<std::int32_t>>>(
                                               static_cast<std::size_t>(heads), std::vector<std::vector<std::int32_t>>(static_cast<std::size_t>(nq))));
  for (auto& per_b : lut) {
    for (auto& per_h : per_b) {
      for (std::int64_t qb = 0; qb < nq; ++qb) {
        const std::int64_t last_row = std::min((qb + 1) * g.blkq, g.s) - 1;
        const std::int64_t nv = g.causal ? last_row / g.blkk + 1 : nk;
        for (std::int64_t kb = 0; kb < nv; ++kb) {
          if (keep(rng)) per_h[static_cast<std::size_t>(qb)].push_back(static_cast<std::int32_t>(kb));
        }
      }
    }
  }
  return lut;
}

// Global query block of the rank's local block j.
std::int64_t global_q_block(const Shard& sh, std::int64_t j, int blkq) {
  const std::int64_t split = cdiv(sh.piece[0].len, blkq);
  const Piece& pc = j < split ? sh.piece[0] : sh.piece[1];
  return pc.global_begin / blkq + j - pc.local_begin / blkq;
}

// Runs filter_row for every call of every step of every rank; calls visit(rank, step, call,
// b, h, j (call-local q block), restricted row).
template <class Visit>
void for_each_restricted(const Geo& g, const Lut& lut, Visit visit) {
  const plan::Layout L = g.layout();
  for (int r = 0; r < g.world; ++r) {
    const Shard me = g.shard(r);
    for (int t = 0; t < g.world; ++t) {
      for (const plan::Call& c : plan::step_calls(L, r, t)) {
        for (std::size_t b = 0; b < lut.size(); ++b) {
          for (std::size_t h = 0; h < lut[b].size(); ++h) {
            for (std::int64_t j = 0; j < c.q_blocks; ++j) {
              const std::int64_t qj = c.q_block_begin + j;
              const auto& row = lut[b][h][static_cast<std::size_t>(global_q_block(me, qj, g.blkq))];
              std::vector<std::int32_t> out(static_cast<std::size_t>(c.kv_blocks) + 1, 12345);
              const int n = plan::filter_row(c, qj, row.data(), 1, static_cast<int>(row.size()), out.data(), 1, c.kv_blocks);
              ASSERT_EQ(out.back(), 12345) << "filter_row wrote past the row width";
              out.pop_back();
              for (std::int64_t i = n; i < c.kv_blocks; ++i) ASSERT_EQ(out[static_cast<std::size_t>(i)], -1);
              for (int i = 1; i < n; ++i) ASSERT_LT(out[static_cast<std::size_t>(i - 1)], out[static_cast<std::size_t>(i)]);
              ASSERT_EQ(n, plan::filter_row(c, qj, row.data(), 1, static_cast<int>(row.size()), nullptr, 1, 0));
              out.resize(static_cast<std::size_t>(n));
              visit(r, t, c, static_cast<int>(b), static_cast<int>(h), j, out);
            }
          }
        }
      }
    }
  }
}

// ---- DIST_COVER --------------------------------------------------------------------------------
SPARGE_CASES(DistCover) {
  for (const Geo& g : geometries()) {
    for (double density : {1.0, 0.3}) {
      const std::string name = g.name("DIST_COVER") + "/density=" + std::to_string(density).substr(0, 3);
      cases.push_back({name, [g, density, name] {
        auto rng = rng_for(name);
        const int batch = 2, heads = 2;
        const Lut lut = random_lut(g, batch, heads, rng, density);
        // seen[(b, h, global qb, global kb)] = times attended
        std::map<std::tuple<int, int, std::int64_t, std::int64_t>, int> seen;
        for_each_restricted(g, lut, [&](int r, int t, const plan::Call& c, int b, int h, std::int64_t j,
                                        const std::vector<std::int32_t>& row) {
          const Shard me = g.shard(r);
          const Shard kv = g.shard(plan::shard_at_step(r, g.world, t));
          const std::int64_t gq = global_q_block(me, c.q_block_begin + j, g.blkq);
          for (std::int32_t local : row) {
            ASSERT_GE(local, 0);
            ASSERT_LT(local, c.kv_blocks);
            // Back to a global key block through the shard (not through the call's windows).
            const std::int64_t shard_row = c.kv_row_begin + static_cast<std::int64_t>(local) * g.blkk;
            ASSERT_LT(shard_row, kv.len);
            const std::int64_t gk = global_row(kv, shard_row) / g.blkk;
            ++seen[{b, h, gq, gk}];
            if (c.diagonal) {
              ASSERT_EQ(t, 0) << "a diagonal call away from the own shard";
            }
          }
        });
        std::size_t expected = 0;
        for (int b = 0; b < batch; ++b) {
          for (int h = 0; h < heads; ++h) {
            for (std::size_t qb = 0; qb < lut[static_cast<std::size_t>(b)][static_cast<std::size_t>(h)].size(); ++qb) {
              for (std::int32_t kb : lut[static_cast<std::size_t>(b)][static_cast<std::size_t>(h)][qb]) {
                ++expected;
                const auto it = seen.find({b, h, static_cast<std::int64_t>(qb), kb});
                ASSERT_TRUE(it != seen.end()) << "b=" << b << " h=" << h << " qb=" << qb << " kb=" << kb << " never attended";
                ASSERT_EQ(it->second, 1) << "b=" << b << " h=" << h << " qb=" << qb << " kb=" << kb << " attended "
                                         << it->second << " times";
              }
            }
          }
        }
        ASSERT_EQ(seen.size(), expected) << "a block that is not selected was attended";
      }});
    }
  }
}

// ---- DIST_CAUSAL -------------------------------------------------------------------------------
SPARGE_CASES(DistCausal) {
  for (const Geo& g : geometries()) {
    if (g.s > 1100) continue;  // token pairs: keep it quick
    for (double density : {1.0, 0.5}) {
      const std::string name = g.name("DIST_CAUSAL") + "/density=" + std::to_string(density).substr(0, 3);
      cases.push_back({name, [g, density, name] {
        auto rng = rng_for(name);
        const Lut lut = random_lut(g, 1, 1, rng, density);
        const auto& rows = lut[0][0];
        std::vector<std::uint8_t> count(static_cast<std::size_t>(g.s * g.s), 0);
        for_each_restricted(g, lut, [&](int r, int t, const plan::Call& c, int, int, std::int64_t j,
                                        const std::vector<std::int32_t>& row) {
          const Shard me = g.shard(r);
          const Shard kv = g.shard(plan::shard_at_step(r, g.world, t));
          // The kernel's rule for one call: rows of call-local block j, keys of the listed
          // call-local blocks below kv_rows, causal bottom-right on the call's own lengths.
          for (std::int64_t il = j * g.blkq; il < std::min((j + 1) * g.blkq, c.q_rows); ++il) {
            const std::int64_t gi = global_row(me, c.q_row_begin + il);
            for (std::int32_t lb : row) {
              for (std::int64_t jl = static_cast<std::int64_t>(lb) * g.blkk;
                   jl < std::min((static_cast<std::int64_t>(lb) + 1) * g.blkk, c.kv_rows); ++jl) {
                if (c.causal && jl > il + c.kv_rows - c.q_rows) continue;
                const std::int64_t gj = global_row(kv, c.kv_row_begin + jl);
                ++count[static_cast<std::size_t>(gi * g.s + gj)];
              }
            }
          }
        });
        for (std::int64_t i = 0; i < g.s; ++i) {
          const auto& sel = rows[static_cast<std::size_t>(i / g.blkq)];
          for (std::int64_t jj = 0; jj < g.s; ++jj) {
            const bool in_lut = std::binary_search(sel.begin(), sel.end(), static_cast<std::int32_t>(jj / g.blkk));
            const int want = in_lut && (!g.causal || jj <= i) ? 1 : 0;
            ASSERT_EQ(count[static_cast<std::size_t>(i * g.s + jj)], want) << "query " << i << ", key " << jj;
          }
        }
      }});
    }
  }
}

// ---- DIST_EMULATE ------------------------------------------------------------------------------
struct Emu {
  Geo g;
  int batch = 1, hq = 4, hk = 2, d = 32;
  float topk = 0.4f;
};

// Rows of shard sh of a global [B, S, H, D] f32 array, contiguous [B, L, H, D].
std::vector<float> gather_rows(const std::vector<float>& x, const Shard& sh, std::int64_t batch, std::int64_t s,
                               std::int64_t h, std::int64_t d) {
  std::vector<float> out(static_cast<std::size_t>(batch * sh.len * h * d));
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t r = 0; r < sh.len; ++r) {
      const std::int64_t gr = global_row(sh, r);
      std::copy_n(x.begin() + (b * s + gr) * h * d, h * d, out.begin() + (b * sh.len + r) * h * d);
    }
  }
  return out;
}

SPARGE_CASES(DistEmulate) {
  std::vector<Emu> emus;
  for (int world : {1, 2, 3, 4}) {
    for (bool causal : {true, false}) {
      for (float topk : {1.0f, 0.4f, 0.1f}) {
        Emu e;
        e.g = {2 * world * 128 - 45, world, 64, 64, 128, causal};
        e.topk = topk;
        emus.push_back(e);
      }
    }
  }
  {
    Emu e;  // blkq != blkk, GQA 4:1, batch 2
    e.g = {700, 3, 128, 64, 128, true};
    e.batch = 2;
    e.hq = 4;
    e.hk = 1;
    emus.push_back(e);
  }
  for (const Emu& e : emus) {
    const std::string name = Name("DIST_EMULATE")("s", e.g.s)("world", e.g.world)("blkq", e.g.blkq)("blkk", e.g.blkk)(
                                 "b", e.batch)("hq", e.hq)("hk", e.hk)("d", e.d)("causal", e.g.causal ? 1 : 0)("topk", e.topk);
    cases.push_back({name, [e, name] {
      auto rng = rng_for(name);
      const Geo& g = e.g;
      const std::int64_t B = e.batch, S = g.s, Hq = e.hq, Hk = e.hk, D = e.d;
      std::vector<float> q(static_cast<std::size_t>(B * S * Hq * D)), k(static_cast<std::size_t>(B * S * Hk * D)),
          v(k.size());
      fill_normal(q, rng);
      fill_normal(k, rng);
      fill_normal(v, rng);
      const std::int64_t nq = cdiv(S, g.blkq), nk = cdiv(S, g.blkk);
      std::vector<std::int32_t> lut(static_cast<std::size_t>(B * Hq * nq * nk)), counts(static_cast<std::size_t>(B * Hq * nq));
      const float topk[1] = {e.topk};
      BlockMapParams bp;
      bp.q = make_tensor(q.data(), DType::f32, {B, S, Hq, D});
      bp.k = make_tensor(k.data(), DType::f32, {B, S, Hk, D});
      bp.blkq = g.blkq;
      bp.blkk = g.blkk;
      bp.topk = topk;
      bp.is_causal = g.causal;
      bp.lut = make_tensor(lut.data(), DType::i32, {B, Hq, nq, nk});
      bp.counts = make_tensor(counts.data(), DType::i32, {B, Hq, nq});
      ASSERT_TRUE(build_block_map(bp).ok());

      // Single device.
      std::vector<float> o_ref(q.size()), lse_ref(static_cast<std::size_t>(B * Hq * S));
      BlockSparseAttentionParams ap;
      ap.q = bp.q;
      ap.k = bp.k;
      ap.v = make_tensor(v.data(), DType::f32, {B, S, Hk, D});
      ap.o = make_tensor(o_ref.data(), DType::f32, {B, S, Hq, D});
      ap.maybe_lse = make_tensor(lse_ref.data(), DType::f32, {B, Hq, S});
      ap.lut = bp.lut;
      ap.counts = bp.counts;
      ap.blkq = g.blkq;
      ap.blkk = g.blkk;
      ap.is_causal = g.causal;
      ASSERT_TRUE(block_sparse_attention(ap).ok());

      const plan::Layout L = g.layout();
      for (int r = 0; r < g.world; ++r) {
        const Shard me = g.shard(r);
        const std::int64_t len = me.len, nql = cdiv(len, g.blkq);
        if (len == 0) continue;
        // The rank's rows of the global map, as the distributed map builds them.
        std::vector<std::int32_t> my_lut(static_cast<std::size_t>(B * Hq * nql * nk)), my_counts(static_cast<std::size_t>(B * Hq * nql));
        for (std::int64_t b = 0; b < B; ++b) {
          for (std::int64_t h = 0; h < Hq; ++h) {
            for (std::int64_t j = 0; j < nql; ++j) {
              const std::int64_t gq = global_q_block(me, j, g.blkq);
              std::copy_n(lut.begin() + ((b * Hq + h) * nq + gq) * nk, nk, my_lut.begin() + ((b * Hq + h) * nql + j) * nk);
              my_counts[static_cast<std::size_t>((b * Hq + h) * nql + j)] = counts[static_cast<std::size_t>((b * Hq + h) * nq + gq)];
            }
          }
        }
        std::vector<float> my_q = gather_rows(q, me, B, S, Hq, D);
        std::vector<float> acc_o(static_cast<std::size_t>(B * len * Hq * D), 0.0f), acc_lse(static_cast<std::size_t>(B * Hq * len), -INFINITY);
        std::vector<float> part_o(acc_o.size()), part_lse(acc_lse.size());
        const auto o_view = [&](std::vector<float>& o, std::int64_t r0, std::int64_t n) {
          return make_tensor(o.data() + r0 * Hq * D, DType::f32, {B, n, Hq, D}, {len * Hq * D, Hq * D, D, 1});
        };
        const auto lse_view = [&](std::vector<float>& l, std::int64_t r0, std::int64_t n) {
          return make_tensor(l.data() + r0, DType::f32, {B, Hq, n}, {Hq * len, len, 1});
        };
        for (int t = 0; t < g.world; ++t) {
          const Shard kv = g.shard(plan::shard_at_step(r, g.world, t));
          std::vector<float> kv_k = gather_rows(k, kv, B, S, Hk, D), kv_v = gather_rows(v, kv, B, S, Hk, D);
          for (const plan::Call& c : plan::step_calls(L, r, t)) {
            std::vector<std::int32_t> slut(static_cast<std::size_t>(B * Hq * c.q_blocks * c.kv_blocks)),
                scnt(static_cast<std::size_t>(B * Hq * c.q_blocks));
            for (std::int64_t bh = 0; bh < B * Hq; ++bh) {
              for (std::int64_t j = 0; j < c.q_blocks; ++j) {
                const std::int64_t qj = c.q_block_begin + j;
                scnt[static_cast<std::size_t>(bh * c.q_blocks + j)] =
                    plan::filter_row(c, qj, my_lut.data() + (bh * nql + qj) * nk, 1, my_counts[static_cast<std::size_t>(bh * nql + qj)],
                                     slut.data() + (bh * c.q_blocks + j) * c.kv_blocks, 1, c.kv_blocks);
              }
            }
            BlockSparseAttentionParams cp;
            cp.q = make_tensor(my_q.data() + c.q_row_begin * Hq * D, DType::f32, {B, c.q_rows, Hq, D}, {len * Hq * D, Hq * D, D, 1});
            cp.k = make_tensor(kv_k.data() + c.kv_row_begin * Hk * D, DType::f32, {B, c.kv_rows, Hk, D},
                               {kv.len * Hk * D, Hk * D, D, 1});
            cp.v = make_tensor(kv_v.data() + c.kv_row_begin * Hk * D, DType::f32, {B, c.kv_rows, Hk, D},
                               {kv.len * Hk * D, Hk * D, D, 1});
            cp.o = o_view(part_o, c.q_row_begin, c.q_rows);
            cp.maybe_lse = lse_view(part_lse, c.q_row_begin, c.q_rows);
            cp.lut = make_tensor(slut.data(), DType::i32, {B, Hq, c.q_blocks, c.kv_blocks});
            cp.counts = make_tensor(scnt.data(), DType::i32, {B, Hq, c.q_blocks});
            cp.blkq = g.blkq;
            cp.blkk = g.blkk;
            cp.is_causal = c.causal;
            const Status st = block_sparse_attention(cp);
            ASSERT_TRUE(st.ok()) << st.message();
            MergeAttentionParams mp;
            mp.o_a = mp.o = o_view(acc_o, c.q_row_begin, c.q_rows);
            mp.lse_a = mp.lse = lse_view(acc_lse, c.q_row_begin, c.q_rows);
            mp.o_b = cp.o;
            mp.lse_b = cp.maybe_lse;
            const Status ms = merge_attention(mp);
            ASSERT_TRUE(ms.ok()) << ms.message();
          }
        }
        // Compare the rank's rows with the single-device result.
        double max_o = 0, max_lse = 0;
        for (std::int64_t b = 0; b < B; ++b) {
          for (std::int64_t rr = 0; rr < len; ++rr) {
            const std::int64_t gr = global_row(me, rr);
            for (std::int64_t h = 0; h < Hq; ++h) {
              const float a = acc_lse[static_cast<std::size_t>((b * Hq + h) * len + rr)];
              const float want = lse_ref[static_cast<std::size_t>((b * Hq + h) * S + gr)];
              ASSERT_EQ(std::isinf(a), std::isinf(want)) << "rank " << r << " row " << gr << " head " << h;
              if (std::isfinite(want)) max_lse = std::max(max_lse, std::fabs(static_cast<double>(a) - want));
              for (std::int64_t x = 0; x < D; ++x) {
                const float oa = acc_o[static_cast<std::size_t>(((b * len + rr) * Hq + h) * D + x)];
                const float ow = o_ref[static_cast<std::size_t>(((b * S + gr) * Hq + h) * D + x)];
                max_o = std::max(max_o, std::fabs(static_cast<double>(oa) - ow));
              }
            }
          }
        }
        EXPECT_LT(max_lse, 2e-5) << "rank " << r;
        EXPECT_LT(max_o, 2e-5) << "rank " << r;
      }
    }});
  }
}

// ---- DIST_BAD ----------------------------------------------------------------------------------
SPARGE_CASES(DistBad) {
  struct Bad {
    const char* name;
    void (*edit)(dist::SparseAttentionParams&);
    const char* expect;  // a substring of the message
  };
  static const Bad bads[] = {
      {"backend_cpu", [](dist::SparseAttentionParams& p) { p.exec.backend = Backend::cpu; }, "exec.backend"},
      {"no_comm", [](dist::SparseAttentionParams& p) { p.comm.nccl_comm = nullptr; }, "comm.nccl_comm"},
      {"size_0", [](dist::SparseAttentionParams& p) { p.comm.size = 0; }, "comm.size = 0"},
      {"rank_2_of_2", [](dist::SparseAttentionParams& p) { p.comm.rank = 2; }, "comm.rank = 2"},
      {"same_stream", [](dist::SparseAttentionParams& p) { p.comm.stream = p.exec.stream = reinterpret_cast<void*>(8); },
       "comm.stream"},
      {"seq_len_0", [](dist::SparseAttentionParams& p) { p.seq_len = 0; }, "seq_len = 0"},
      {"seq_len_mismatch", [](dist::SparseAttentionParams& p) { p.seq_len = 5000; }, "q.shape[1]"},
      {"timeout_0", [](dist::SparseAttentionParams& p) { p.timeout_seconds = 0; }, "timeout_seconds"},
      {"timeout_nan", [](dist::SparseAttentionParams& p) { p.timeout_seconds = NAN; }, "timeout_seconds"},
      {"blkq_96", [](dist::SparseAttentionParams& p) { p.blkq = 96; }, "blkq = 96"},
      {"no_rule", [](dist::SparseAttentionParams& p) { p.topk = {}; }, "exactly one of topk"},
      {"k_dtype", [](dist::SparseAttentionParams& p) { p.k.dtype = DType::bf16; }, "k.dtype"},
      {"lut_without_counts", [](dist::SparseAttentionParams& p) { p.maybe_counts = Tensor{}; }, "maybe_lut and maybe_counts"},
      {"lut_width", [](dist::SparseAttentionParams& p) { p.maybe_lut.shape[3] = 7; }, "maybe_lut.shape[3] = 7"},
      {"lse_rows", [](dist::SparseAttentionParams& p) { p.maybe_lse.shape[2] = 3; }, "maybe_lse.shape[2] = 3"},
  };
  cases.push_back({"DIST_BAD(valid_params_without_nccl)", [] {
    if (dist::available()) GTEST_SKIP() << "this build has NCCL: the GPU test program covers valid params";
    const std::int64_t L = 1024, H = 2, D = 64;
    static std::vector<std::uint16_t> x(static_cast<std::size_t>(L * H * D));
    static const float topk[1] = {0.5f};
    dist::SparseAttentionParams p;
    p.comm = {reinterpret_cast<void*>(16), 0, 1, nullptr};
    p.q = p.k = p.v = p.o = make_tensor(x.data(), DType::f16, {1, L, H, D});
    p.seq_len = L;
    p.topk = topk;
    p.exec.backend = Backend::cuda;
    const Status st = dist::sparse_attention(p);
    EXPECT_EQ(st.code(), StatusCode::unsupported) << st.message();
    EXPECT_NE(st.message().find("NCCL"), std::string::npos) << st.message();
  }});
  for (const Bad& bad : bads) {
    cases.push_back({std::string("DIST_BAD(") + bad.name + ")", [bad] {
      // Rank 1 of 2 for S = 4096: chunk_len 1024, chunks 1 and 2, L = 2048 rows. The pointers are
      // host memory; validation reads none of them.
      const std::int64_t S = 4096, L = 2048, B = 1, H = 2, D = 64;
      static std::vector<std::uint16_t> q(static_cast<std::size_t>(B * L * H * D)), k(q.size()), v(q.size()), o(q.size());
      static std::vector<float> lse(static_cast<std::size_t>(B * H * L));
      static std::vector<std::int32_t> lut(static_cast<std::size_t>(B * H * (L / 64) * (S / 64))), cnt(static_cast<std::size_t>(B * H * (L / 64)));
      static const float topk[1] = {0.5f};
      ASSERT_EQ(dist::shard_of(S, 2, 1).len, L);
      dist::SparseAttentionParams p;
      p.comm = {reinterpret_cast<void*>(16), 1, 2, nullptr};
      p.q = make_tensor(q.data(), DType::f16, {B, L, H, D});
      p.k = make_tensor(k.data(), DType::f16, {B, L, H, D});
      p.v = make_tensor(v.data(), DType::f16, {B, L, H, D});
      p.o = make_tensor(o.data(), DType::f16, {B, L, H, D});
      p.maybe_lse = make_tensor(lse.data(), DType::f32, {B, H, L});
      p.maybe_lut = make_tensor(lut.data(), DType::i32, {B, H, L / 64, S / 64});
      p.maybe_counts = make_tensor(cnt.data(), DType::i32, {B, H, L / 64});
      p.seq_len = S;
      p.topk = topk;
      p.exec.backend = Backend::cuda;
      bad.edit(p);
      const Status st = dist::sparse_attention(p);
      ASSERT_FALSE(st.ok());
      EXPECT_NE(st.message().find(bad.expect), std::string::npos) << st.message();
      EXPECT_NE(st.message().find("dist::sparse_attention"), std::string::npos) << st.message();
    }});
  }
}

}  // namespace
}  // namespace sparge::test
