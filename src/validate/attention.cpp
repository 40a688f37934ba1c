// PLACEHOLDER: to be replaced by the real validation.
#include "validate/validate.h"
namespace sparge::detail {
Status validate(const BlockSparseAttentionParams& p) { return check_exec("op", p.exec); }
Status validate(const DenseAttentionParams& p) { return check_exec("op", p.exec); }
}  // namespace sparge::detail
