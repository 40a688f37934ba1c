// PLACEHOLDER: to be replaced by the real validation.
#include "validate/validate.h"
namespace sparge::detail {
Status validate(const BlockMapParams& p) { return check_exec("op", p.exec); }
}  // namespace sparge::detail
