// The pure planning of context parallelism (docs/context_parallel.md), shared by the NCCL driver,
// its CUDA kernels and the CPU tests: which rows each rank holds, which attention calls each ring
// step makes, and how one row of the global LUT is restricted to a call and re-indexed to the
// shard at hand. Nothing here touches a device or a communicator.
#pragma once

#include <cstdint>
#include <vector>

#include "sparge/dist.h"

#if defined(__CUDACC__)
#define SPARGE_DIST_HD __host__ __device__
#else
#define SPARGE_DIST_HD
#endif

namespace sparge::dist::plan {

// The shard rank s holds at ring step t: K/V move one rank forward per step, so rank r sees its
// own shard at step 0, then those of r-1, r-2, ...
inline int shard_at_step(int rank, int world, int step) { return ((rank - step) % world + world) % world; }

// A window of global key blocks [first, first + count) that lives at shard blocks
// [local_first, local_first + count).
struct Window {
  std::int64_t first = 0;
  std::int64_t count = 0;
  std::int64_t local_first = 0;
};

// One block_sparse_attention call of a ring step.
//   q rows:  the rank's shard rows [q_row_begin, q_row_begin + q_rows), blocks [q_block_begin, +q_blocks)
//   kv rows: rows [kv_row_begin, kv_row_begin + kv_rows) of the shard at hand (kv_blocks LUT columns)
// Query block j of the rank belongs to q piece 0 when j < q_split (in blocks), else to q piece 1.
// A LUT entry kb of such a block is attended when it lies in window w and enabled[q piece][w].
struct Call {
  bool causal = false;  // passed to the kernel: bottom-right aligned on this call's q/k rows
  bool diagonal = false;
  std::int64_t q_row_begin = 0, q_rows = 0;
  std::int64_t q_block_begin = 0, q_blocks = 0;
  std::int64_t q_split = 0;
  std::int64_t kv_row_begin = 0, kv_rows = 0;
  std::int64_t kv_blocks = 0;
  Window win[2];
  bool enabled[2][2] = {{false, false}, {false, false}};
};

struct Layout {
  std::int64_t seq_len = 0;
  int world = 1;
  int blkq = 64, blkk = 64;
  bool causal = false;
  // Chunk alignment: kChunkAlign in the library; the CPU tests use smaller multiples of the block
  // sizes to cover many layouts at small sizes (the planning is correct for any multiple of both).
  std::int64_t align = kChunkAlign;
};

// shard_of with an explicit alignment (a positive multiple of both block sizes).
std::int64_t chunk_len_aligned(std::int64_t seq_len, int world, std::int64_t align);
Shard shard_of_aligned(std::int64_t seq_len, int world, int rank, std::int64_t align);

// The calls rank `rank` makes at ring step `step`, in the order they are run and merged:
//   - the "off" call: all of the rank's query rows against the whole shard at hand, non-causal,
//     restricted to the pieces that are entirely in the past of the query piece (or, without
//     causal masking, to every piece);
//   - causal only, step 0 only (the rank's own shard): one "diagonal" call per nonempty piece,
//     the piece's query rows against the same rows of keys, causal (bottom-right = top-left on
//     equal-length slices, which is the global rule j <= i on these rows).
// Calls with no query or key rows are left out.
std::vector<Call> step_calls(const Layout& L, int rank, int step);

// The query piece (0 or 1) of the rank's query block j.
SPARGE_DIST_HD inline int q_piece_of(const Call& c, std::int64_t j) { return j < c.q_split ? 0 : 1; }

// The shard block (LUT column of the call) at which call c attends global key block kb for a
// query block of piece qp, or -1 when the call does not attend kb.
SPARGE_DIST_HD inline std::int64_t map_block(const Call& c, int qp, std::int64_t kb) {
  for (int w = 0; w < 2; ++w) {
    if (c.enabled[qp][w] && kb >= c.win[w].first && kb < c.win[w].first + c.win[w].count) {
      return kb - c.win[w].first + c.win[w].local_first;
    }
  }
  return -1;
}

// Restricts the LUT row of the rank's query block j (count ascending global key blocks, stride
// row_stride) to call c: the attended blocks re-indexed to shard blocks, written to
// out[0..n) (stride out_stride) and padded with -1 up to width; returns n. Windows are ascending
// and map ascending, so out stays ascending. out == nullptr only counts. (The CUDA kernel does the
// same per warp with map_block.)
inline int filter_row(const Call& c, std::int64_t j, const std::int32_t* row, std::int64_t row_stride, int count,
                      std::int32_t* out, std::int64_t out_stride, std::int64_t width) {
  const int qp = q_piece_of(c, j);
  int n = 0;
  for (int i = 0; i < count; ++i) {
    const std::int64_t local = map_block(c, qp, row[i * row_stride]);
    if (local < 0) continue;
    if (out != nullptr) out[n * out_stride] = static_cast<std::int32_t>(local);
    ++n;
  }
  if (out != nullptr) {
    for (std::int64_t slot = n; slot < width; ++slot) out[slot * out_stride] = -1;
  }
  return n;
}

}  // namespace sparge::dist::plan
