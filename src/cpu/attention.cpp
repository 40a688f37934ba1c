// PLACEHOLDER: to be replaced by the real implementation.
#include "cpu/cpu.h"
namespace sparge::cpu {
Status block_sparse_attention(const BlockSparseAttentionParams&) { return unsupported("cpu::block_sparse_attention is not implemented yet"); }
Status dense_attention(const DenseAttentionParams&) { return unsupported("cpu::dense_attention is not implemented yet"); }
}  // namespace sparge::cpu
