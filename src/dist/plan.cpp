// Zigzag sharding and the per-step call list of context parallelism (docs/context_parallel.md).
#include "dist/plan.h"

#include <algorithm>

namespace sparge::dist {

namespace {
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
}  // namespace

namespace plan {

std::int64_t chunk_len_aligned(std::int64_t seq_len, int world, std::int64_t align) {
  if (seq_len <= 0 || world <= 0 || align <= 0) return 0;
  return ceil_div(ceil_div(seq_len, 2 * static_cast<std::int64_t>(world)), align) * align;
}

Shard shard_of_aligned(std::int64_t seq_len, int world, int rank, std::int64_t align) {
  Shard s;
  const std::int64_t c = chunk_len_aligned(seq_len, world, align);
  if (c == 0 || rank < 0 || rank >= world) return s;
  const std::int64_t chunks[2] = {rank, 2 * static_cast<std::int64_t>(world) - 1 - rank};
  for (int p = 0; p < 2; ++p) {
    Piece& pc = s.piece[p];
    pc.chunk = chunks[p];
    pc.global_begin = std::min(chunks[p] * c, seq_len);
    pc.len = std::min(pc.global_begin + c, seq_len) - pc.global_begin;
    pc.local_begin = p == 0 ? 0 : s.piece[0].len;
  }
  s.len = s.piece[0].len + s.piece[1].len;
  return s;
}

std::vector<Call> step_calls(const Layout& L, int rank, int step) {
  std::vector<Call> calls;
  const Shard q = shard_of_aligned(L.seq_len, L.world, rank, L.align);
  const Shard kv = shard_of_aligned(L.seq_len, L.world, shard_at_step(rank, L.world, step), L.align);
  if (q.len == 0 || kv.len == 0) return calls;
  const std::int64_t q_split = ceil_div(q.piece[0].len, L.blkq);

  Call off;
  off.q_rows = q.len;
  off.q_blocks = ceil_div(q.len, L.blkq);
  off.q_split = q_split;
  off.kv_rows = kv.len;
  off.kv_blocks = ceil_div(kv.len, L.blkk);
  bool any = false;
  for (int w = 0; w < 2; ++w) {
    const Piece& k = kv.piece[w];
    off.win[w] = {k.global_begin / L.blkk, ceil_div(k.len, L.blkk), k.local_begin / L.blkk};
    for (int a = 0; a < 2; ++a) {
      // Causal: only pieces entirely in the past of the query piece (an earlier chunk); the own
      // chunk is the diagonal call's, later chunks are invisible.
      const bool en = q.piece[a].len > 0 && k.len > 0 && (!L.causal || k.chunk < q.piece[a].chunk);
      off.enabled[a][w] = en;
      any = any || en;
    }
  }
  if (any) calls.push_back(off);

  if (L.causal && step == 0) {
    for (int a = 0; a < 2; ++a) {
      const Piece& p = q.piece[a];
      if (p.len == 0) continue;
      Call d;
      d.causal = true;
      d.diagonal = true;
      d.q_row_begin = p.local_begin;
      d.q_rows = p.len;
      d.q_block_begin = p.local_begin / L.blkq;
      d.q_blocks = ceil_div(p.len, L.blkq);
      d.q_split = q_split;
      d.kv_row_begin = p.local_begin;
      d.kv_rows = p.len;
      d.kv_blocks = ceil_div(p.len, L.blkk);
      d.win[0] = {p.global_begin / L.blkk, ceil_div(p.len, L.blkk), 0};
      d.enabled[a][0] = true;
      calls.push_back(d);
    }
  }
  return calls;
}

}  // namespace plan

std::int64_t chunk_len(std::int64_t seq_len, int world) { return plan::chunk_len_aligned(seq_len, world, kChunkAlign); }

Shard shard_of(std::int64_t seq_len, int world, int rank) {
  return plan::shard_of_aligned(seq_len, world, rank, kChunkAlign);
}

}  // namespace sparge::dist
