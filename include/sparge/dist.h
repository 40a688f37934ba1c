// sparge::dist: context parallelism. One sequence is sharded over the ranks of an NCCL
// communicator; every rank builds exactly the rows of the global block map that a single GPU would
// build for its own query blocks, K/V shards travel around a ring, and the partial results merge by
// LSE. The result equals the single-GPU build_block_map + block_sparse_attention up to fp32 merge
// rounding; the block map is the same bit for bit. Design and exactness argument:
// docs/context_parallel.md.
//
// This header does not include nccl.h: the communicator travels as a void* (an ncclComm_t), as
// Exec carries its cudaStream_t. A build without NCCL returns `unsupported` from sparse_attention.
#pragma once

#include <cstdint>

#include "sparge/ops.h"

namespace sparge::dist {

// ---- sharding (zigzag) ----------------------------------------------------------------------
// The sequence of S rows is cut into 2R chunks of chunk_len rows (the last nonempty chunk may be
// shorter, later chunks may be empty); rank r holds chunk r and chunk 2R-1-r, so that under causal
// masking every rank has the same amount of work (as ring-flash-attention does). chunk_len is a
// multiple of kChunkAlign, which is a multiple of both block sizes (so no block straddles two
// ranks) and of the K-mean chunk of the block map (so the K mean is the same bits as on one GPU).
constexpr std::int64_t kChunkAlign = 1024;

struct Piece {
  std::int64_t chunk = 0;         // global chunk index
  std::int64_t global_begin = 0;  // first row in the global sequence
  std::int64_t len = 0;           // rows (0 for an empty chunk)
  std::int64_t local_begin = 0;   // first row in the rank's shard
};

// The rows rank `rank` holds: piece[0] (chunk r) at shard rows [0, piece[0].len), then piece[1]
// (chunk 2R-1-r). Callers lay out their local q/k/v shards this way.
struct Shard {
  Piece piece[2];
  std::int64_t len = 0;  // piece[0].len + piece[1].len
};

std::int64_t chunk_len(std::int64_t seq_len, int world);
Shard shard_of(std::int64_t seq_len, int world, int rank);

// ---- the communicator ---------------------------------------------------------------------------
// Wraps a communicator the caller created (and keeps owning). The calling thread's current CUDA
// device must be the communicator's. For the bounded-wait guarantee create it non-blocking
// (ncclConfig_t::blocking = 0): with a blocking communicator NCCL may block inside ncclGroupEnd
// while it connects to a peer that never comes, before sparge can look at the clock.
struct Communicator {
  void* nccl_comm = nullptr;  // ncclComm_t
  int rank = 0;               // must equal ncclCommUserRank
  int size = 0;               // must equal ncclCommCount
  // cudaStream_t for the ring's transfers, so they overlap the compute on exec.stream; must not
  // be exec.stream. nullptr: a stream is created for the call.
  void* stream = nullptr;
};

// ---- the operation ------------------------------------------------------------------------------
// Self-attention of one sequence of seq_len rows (Sq = Sk), sharded as shard_of() says.
// Local logical layouts (strides may describe any storage, as everywhere in sparge):
//   q, o        [B, L, Hq, D]   L = shard_of(seq_len, comm.size, comm.rank).len
//   k, v        [B, L, Hk, D]
//   maybe_lse   [B, Hq, L]  f32
//   maybe_lut   [B, Hq, NQL, NK] i32   NQL = ceil(L / blkq), NK = ceil(seq_len / blkk)
//   maybe_counts[B, Hq, NQL]     i32
// The LUT rows are the global map's rows of this rank's query blocks (local block j is global
// block piece.global_begin / blkq + j - piece.local_begin / blkq), with global key block indices.
struct SparseAttentionParams {
  Communicator comm;
  Tensor q, k, v;  // f16 / bf16
  Tensor o;        // same dtype as q, or f32
  Tensor maybe_lse;
  std::int64_t seq_len = 0;  // global S
  // The block map (docs/semantics.md, Stage 1), as in BlockMapParams.
  int blkq = 64;
  int blkk = 64;
  float scale = 0.0f;  // 0 = 1/sqrt(D)
  PerHead topk;
  PerHead cdfthreshd;
  PerHead simthreshd1;
  bool is_causal = false;
  bool attention_sink = false;
  bool smooth_k = true;
  Tensor maybe_lut;
  Tensor maybe_counts;
  // Every wait on a peer (collectives, ring transfers, the final completion) ends by then; on a
  // timeout or an NCCL error the communicator is aborted (ncclCommAbort) and an error returned.
  double timeout_seconds = 300.0;
  Exec exec;  // backend must be cuda; exec.stream carries the compute
};

// Blocks the calling thread until the outputs are ready on exec.stream (bounded by the timeout).
// On an error after communication started, the communicator has been aborted: the caller must not
// use (nor destroy) it again, must synchronize exec.stream before reusing the buffers, and the
// outputs are unspecified.
Status sparse_attention(const SparseAttentionParams& p);

// Whether this build has the NCCL path (a CUDA build that found nccl.h and libnccl).
bool available();

}  // namespace sparge::dist
