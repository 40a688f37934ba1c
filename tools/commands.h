// The tool's commands besides bench (bench.h): each reads its flags from Args and returns the exit code.
#pragma once

#include "args.h"

namespace sparge::tool {

int run_topk(Args& a);
int run_validate(Args& a);
void print_usage();

}  // namespace sparge::tool
