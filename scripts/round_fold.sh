#!/usr/bin/env bash
# Device round for issue #7 (the fp8 recipe's Q/K quantization folded into the block map) and the
# async3 pooling default. Run from the repo root after building sparge_gpu_tests (Release, 90a) in $B:
#   B=build-dir scripts/round_fold.sh
# About 40 s of GPU time. What to look for is printed before each step.
set -u
B=${B:?set B to the build directory}
T=$B/tests/sparge_gpu_tests
pick() { grep -E '^\[  (PASSED|FAILED)|^\[  FAILED|Failure|differ|expected|Which is|max \|' | head -${1:-60}; }

echo "## 1. fold correctness: all FOLD_GPU cases PASSED (no 'differ' lines): the V-only prepass (default split;"
echo "##    launches and stream checked too), lse_shift at SPARGE_QUANT_SHIFT_OCC 3 (default) / 2 / 4 bitwise"
timeout 90 $T --filter='FOLD_GPU' 2>&1 | pick 80

echo "## 2. the prepass and the fp8 attention entry: QUANT_GPU, FP8 all PASSED"
timeout 90 $T --filter='QUANT_GPU|FP8' 2>&1 | grep -E '^\[  (PASSED|FAILED)|^\[  FAILED|Failure' | head -20

echo "## 3. memcheck on two small fold cases: 'ERROR SUMMARY: 0 errors'"
timeout 120 compute-sanitizer --tool memcheck $T \
  --filter='FOLD_GPU.dt=f16,b=1,hq=2,hk=2,sq=203,sk=333|FOLD_GPU.dt=f16,b=1,hq=2,hk=2,sq=256,sk=333.*misaligned' 2>&1 \
  | grep -E 'ERROR SUMMARY|PASSED|FAILED' | head -5

echo "## 4. timings (pairs timed in alternation): block map with / without fp8 outputs, V-only prepass split vs"
echo "##    launches vs stream, LSE shift per SPARGE_QUANT_SHIFT_OCC, folded vs unfolded pipeline (target: topk 0.4 folded"
echo "##    <= 5.9 ms); at topk 0.4 two profile lines each: block map without, then with the fp8 outputs"
SPARGE_BENCH=1 SPARGE_FOLD_BENCH_PROFILE=1 timeout 120 $T --filter='FOLD_BENCH' 2>&1 \
  | grep -E 'bench \]|sparge block map profile|FAILED|Failure' | head -40
