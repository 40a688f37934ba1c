#include "harness/harness.h"
SPARGE_CASES(Smoke) {
  cases.push_back({"HALF(roundtrip)", [] {
    for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 1e-7f}) {
      EXPECT_EQ(sparge::half_to_float(sparge::float_to_half(f)), sparge::half_to_float(sparge::float_to_half(sparge::half_to_float(sparge::float_to_half(f)))));
    }
  }});
}
