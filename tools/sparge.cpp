// PLACEHOLDER main for the sparge tool.
#include <cstdio>
#include "sparge/ops.h"
int main() { std::printf("sparge: cuda available = %d\n", sparge::cuda_available() ? 1 : 0); return 0; }
