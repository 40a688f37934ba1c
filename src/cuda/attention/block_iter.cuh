// Which key blocks a query block visits, separate from how a block is computed. The sparse
// iterator walks one LUT row in its order; the dense iterator is the implicit full LUT (every key
// block in ascending order). Both drop blocks the query block cannot see (past the keys, or
// entirely in the causal future): such a block contributes nothing to O, to the denominator or to
// the running max, and pv_threshold would skip it anyway (its row maxima are all -inf).
//
// The LUT lives in device memory that the host could not check, so entries outside [0, NK) and
// counts outside [0, NK] are clamped here rather than trusted.
#pragma once

#include <cstdint>

namespace sparge::cuda::attn {

struct BlockIter {
  const std::int32_t* row = nullptr;  // lut row, or nullptr for the dense iterator
  std::int64_t stride = 1;
  int n = 0;          // entries (sparse) or visible blocks (dense)
  int pos = 0;
  int lookahead = -1; // row[pos], loaded one call early so the load's latency is hidden
  int visible = 0;    // key blocks [0, visible) can be seen by some row of this query block

  // Returns the next key block to compute, or -1 at the end. Uniform across the CTA.
  __device__ __forceinline__ int next() {
    if (row == nullptr) return pos < n ? pos++ : -1;
    while (pos < n) {
      const int kb = lookahead;
      ++pos;
      lookahead = pos < n ? __ldg(row + pos * stride) : -1;
      if (kb >= 0 && kb < visible) return kb;
    }
    return -1;
  }
};

// The pipeline's unit: key tiles of kTileK keys. With kSub = BLKK / kTileK > 1 (pv_threshold off)
// each LUT block is walked as its kSub sub-tiles in order, dropping the trailing ones no row can
// see (past sk or in the causal future: they would contribute exact zeros); a block the block
// iterator returns always has its first sub-tile visible. Tile t covers keys [t * kTileK, ...).
template <int kSub>
struct TileIter {
  BlockIter blocks;
  int visible_tiles = 0;
  int block = -1;
  int sub = 0;

  __device__ __forceinline__ int next() {
    if constexpr (kSub > 1) {
      if (block >= 0 && sub + 1 < kSub && block * kSub + sub + 1 < visible_tiles) return block * kSub + ++sub;
    }
    block = blocks.next();
    sub = 0;
    return block < 0 ? -1 : block * kSub;
  }
};

// visible = number of leading key blocks that hold a key seen by some row of [q0, q0 + rows),
// given the sequence's lengths (causal bound j <= i + sk - sq, bottom-right aligned).
__device__ __forceinline__ int visible_blocks(int q0, int rows, int sq, int sk, int blkk, bool causal) {
  int last_key = sk - 1;
  if (causal) {
    const long long bound = static_cast<long long>(q0) + rows - 1 + sk - sq;
    if (bound < last_key) last_key = static_cast<int>(bound < -1 ? -1 : bound);
  }
  return last_key < 0 ? 0 : last_key / blkk + 1;
}

__device__ __forceinline__ BlockIter make_dense_iter(int visible) {
  BlockIter it;
  it.n = visible;
  it.visible = visible;
  return it;
}

__device__ __forceinline__ BlockIter make_lut_iter(const std::int32_t* row, std::int64_t stride, int count,
                                                  int nk, int visible) {
  BlockIter it;
  it.row = row;
  it.stride = stride;
  it.n = count < 0 ? 0 : (count > nk ? nk : count);
  it.visible = visible;
  it.lookahead = it.n > 0 ? __ldg(row) : -1;
  return it;
}

}  // namespace sparge::cuda::attn
