// PLACEHOLDER: to be replaced by the real implementation.
#include "cpu/cpu.h"
namespace sparge::cpu {
Status build_block_map(const BlockMapParams&) { return unsupported("cpu::build_block_map is not implemented yet"); }
}  // namespace sparge::cpu
