// PLACEHOLDER: to be replaced by the real implementation.
#include "cpu/cpu.h"
namespace sparge::cpu {
Status merge_attention(const MergeAttentionParams&) { return unsupported("cpu::merge_attention is not implemented yet"); }
}  // namespace sparge::cpu
