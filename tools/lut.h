// Host-side facts about block maps that the tool checks and reports: which key blocks a query block
// can see, how many query-key pairs a block computes (for FLOPs), whether a LUT is well formed, the
// selection that docs/semantics.md prescribes given the scores, the LUT expanded to a token mask,
// and the token-level top-k rule. All of it is independent of the library's implementation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sparge::tool {

// Block geometry of one (non-varlen) attention problem.
struct BlockGeom {
  std::int64_t sq = 0, sk = 0;
  int blkq = 64, blkk = 64;
  bool causal = false;
  std::int64_t nq() const { return (sq + blkq - 1) / blkq; }
  std::int64_t nk() const { return (sk + blkk - 1) / blkk; }
  // Number of visible key blocks of query block qb; visibility is a prefix [0, NV).
  std::int64_t visible(std::int64_t qb) const;
  // Query-key pairs of block (qb, kb) that attention computes: rows x keys, minus keys in the
  // causal future of each row. Zero for invisible blocks.
  std::int64_t pairs(std::int64_t qb, std::int64_t kb) const;
  // Whether query row i (global) attends key j, causal masking included.
  bool sees(std::int64_t i, std::int64_t j) const { return j < sk && (!causal || j <= i + sk - sq); }
};

// Per-(qb, kb) pair counts, NQ x NK, computed once.
std::vector<std::int64_t> pair_table(const BlockGeom& g);

// LUT rows are contiguous [rows, NK] with counts [rows]; row r has query block r % NQ.
struct LutStats {
  std::int64_t rows = 0;
  std::int64_t sum_counts = 0, sum_visible = 0, grid = 0;
  std::int64_t pairs = 0;  // query-key pairs of the selected blocks
};
LutStats lut_stats(const BlockGeom& g, const std::vector<std::int64_t>& pairs, const std::int32_t* lut,
                   const std::int32_t* counts, std::int64_t rows);

// Well-formedness: 0 <= count <= NV, count >= 1 when NV >= 1, entries [0, count) strictly
// ascending and visible, entries [count, NK) == -1. Returns the number of bad rows and describes
// the first one in *first.
std::int64_t check_lut(const BlockGeom& g, const std::int32_t* lut, const std::int32_t* counts,
                       std::int64_t rows, std::string* first);

// A LUT in which every row selects all its visible blocks (the dense baseline).
void full_lut(const BlockGeom& g, std::int64_t rows, std::vector<std::int32_t>& lut, std::vector<std::int32_t>& counts);

// The selection of docs/semantics.md for one row, given the row's scores S[NK] (-inf for invisible
// and non-self-similar blocks), whether the Q block is self-similar, and exactly one of topk / cdf.
struct SelectRule {
  double topk = 0;  // > 0: top-k mode
  double cdf = 0;   // > 0: cdf mode
  bool sink = false;
};
std::vector<std::int32_t> select_from_scores(const float* scores, std::int64_t nv, bool q_self_similar,
                                             const SelectRule& rule);
// How close the selection of this row is to a tie: the smallest gap between the last kept and the
// first dropped ranked score, relative to the row's largest |score| (and in cdf mode the distance of
// the cumulative mass to the threshold at the cut). Large = a clear decision.
double selection_margin(const float* scores, std::int64_t nv, const SelectRule& rule);

// Expands LUT row (b, h, qb) into a token mask for rows [r0, r1) of that block over all Sk keys
// (1 = attend), causal masking included.
void expand_row_mask(const BlockGeom& g, std::int64_t qb, const std::int32_t* lut_row, std::int32_t count,
                     std::uint8_t* mask);

// topk_select's rule for one row (docs/semantics.md, Stage 3): -inf never selected, +inf largest,
// strictly-greater indices ascending, then ties ascending, -1 padded; a row with at most k
// selectable values returns all of them ascending. Returns the count.
std::int32_t topk_reference(const float* row, std::int64_t n, int k, std::int32_t* out);

}  // namespace sparge::tool
