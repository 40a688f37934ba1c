#!/usr/bin/env bash
# Device round for issue #7 (the fp8 recipe's Q/K quantization folded into the block map) and the
# async3 pooling default. Run from the repo root after building sparge_gpu_tests (Release, 90a) in $B:
#   B=build-dir scripts/round_fold.sh
# About 35 s of GPU time. What to look for is printed before each step.
set -u
B=${B:?set B to the build directory}
T=$B/tests/sparge_gpu_tests
pick() { grep -E '^\[  (PASSED|FAILED)|^\[  FAILED|Failure|differ|expected|Which is|max \||bench \]' | head -${1:-60}; }

echo "## 1. fold correctness: all FOLD_GPU cases PASSED (no 'differ' lines; the attention part runs on sm_90)"
timeout 90 $T --filter='FOLD_GPU' 2>&1 | pick 80

# (2. the block map cases, with the async3 pooling default, run in scripts/round_blockmap.sh: all BLOCKMAP_GPU.)
echo "## 3. the prepass (kv_tile split into K / V halves) and the fp8 attention entry: QUANT_GPU, FP8 all PASSED"
timeout 90 $T --filter='QUANT_GPU|FP8' 2>&1 | pick 40

echo "## 4. memcheck on two small fold cases: 'ERROR SUMMARY: 0 errors'"
timeout 120 compute-sanitizer --tool memcheck $T \
  --filter='FOLD_GPU.dt=f16,b=1,hq=2,hk=2,sq=203,sk=333|FOLD_GPU.dt=f16,b=1,hq=2,hk=2,sq=256,sk=333.*misaligned' 2>&1 \
  | grep -E 'ERROR SUMMARY|PASSED|FAILED' | head -5

echo "## 5. timings: block map with / without fp8 outputs, V-only prepass (GB/s vs ~4000), folded vs unfolded pipeline"
echo "##    target: 'pipeline ... folded' at 128x64 / 128x128 topk 0.4 <= 5.9 ms"
SPARGE_BENCH=1 timeout 120 $T --filter='FOLD_BENCH' 2>&1 | grep -E 'bench \]|FAILED|Failure' | head -30
