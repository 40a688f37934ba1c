// PLACEHOLDER: to be replaced by the real validation.
#include "validate/validate.h"
namespace sparge::detail {
Status validate(const TopkSelectParams& p) { return check_exec("op", p.exec); }
Status validate(const CompactMaskParams& p) { return check_exec("op", p.exec); }
Status validate(const GatherAttentionParams& p) { return check_exec("op", p.exec); }
}  // namespace sparge::detail
