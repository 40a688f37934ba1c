// Which key blocks one query block keeps (docs/semantics.md, Stage 1 steps 4-6), separated from how
// the scores are computed: given the scores of the visible key blocks, the selection rule and the
// forced rows / columns, mark the kept blocks. Visibility is always a prefix [0, NV) of the key
// blocks (a query block sees key blocks from the start of its sequence up to its causal bound), so
// the row works on that prefix only and nothing invisible can ever be marked.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace sparge::cpu {

struct SelectionRule {
  bool use_topk = true;
  double topk = 0.0;        // fraction of the visible blocks, (0, 1]
  double cdfthreshd = 0.0;  // probability mass to reach, (0, 1]
  bool attention_sink = false;
};

// Reused buffers of one worker, so a row costs no allocation once they have grown.
struct SelectionScratch {
  std::vector<std::int32_t> order;
};

// scores[kb] for the NV = scores.size() visible key blocks, -inf where the block takes no part in
// the ranking (a forced column); forced_col[kb] marks the K blocks that are always selected.
// Sets keep[kb] (size NV) and returns the number of kept blocks.
std::int64_t select_row(std::span<const double> scores, std::span<const unsigned char> forced_col,
                        bool forced_row, const SelectionRule& rule, SelectionScratch& scratch,
                        std::span<unsigned char> keep);

}  // namespace sparge::cpu
