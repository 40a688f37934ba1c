// PLACEHOLDER: to be replaced by the real implementation.
#include "cpu/cpu.h"
namespace sparge::cpu {
Status topk_select(const TopkSelectParams&) { return unsupported("cpu::topk_select is not implemented yet"); }
Status compact_mask(const CompactMaskParams&) { return unsupported("cpu::compact_mask is not implemented yet"); }
Status gather_attention(const GatherAttentionParams&) { return unsupported("cpu::gather_attention is not implemented yet"); }
}  // namespace sparge::cpu
