#!/bin/bash
# Device round for issue #3 (block map scores + selection speed; helper h3). Run from the repo root
# after the Release build of sparge_gpu_tests (SPARGE_CUDA_ARCHS=90a) in $B:
#   B=build-dir scripts/round_blockmap.sh
# About 30 s of device time. The BLOCKMAP correctness cases (every switch bitwise against the
# default) run in the full GPU suite, not here. What to look for:
#  1. "== timings": per variant, the profile line of the 128 x 64 shape ("scores" and "select"
#     stages; round 2: 0.0235 / 0.0237 ms with pivot + PDL) and the bench median with the profile
#     on; then the three bench medians with the profile off (the honest numbers; round 2 at
#     blkq128 blkk64: default (pivot + PDL) 0.2926, PDL=0 0.3053, bit search + PDL 0.2992 ms;
#     session 8: 0.263-0.267 at 128 x 64 = 1.014-1.024x the device copy). Variants: default | SPARGE_BLOCKMAP_PDL=0 | SPARGE_BLOCKMAP_SELECT=bits |
#     SPARGE_BLOCKMAP_PDL=2 (session 8, opt-in: the pooling launches in a PDL chain too; is the bench
#     median below the default's? The switch cases in the suite check its bits) |
#     SPARGE_BLOCKMAP_POOL=async3 (the cp.async ring, the default before session 9's TMA ring) |
#     SPARGE_BLOCKMAP_SCORES=fma (the scores tile by fmaf chains, before session 9's tensor-core tile).
#  2. "== ncu": duration, SM throughput, occupancy and executed instructions of the scores kernel
#     and select_row_kernel at 128 x 64.
set -u
B=${B:?set B to the build directory}
T=$B/tests/sparge_gpu_tests
echo "== timings"
for v in X=0 SPARGE_BLOCKMAP_PDL=0 SPARGE_BLOCKMAP_SELECT=bits SPARGE_BLOCKMAP_PDL=2 SPARGE_BLOCKMAP_POOL=async3 SPARGE_BLOCKMAP_SCORES=fma; do
  echo "-- $v (profile on)"
  env $v SPARGE_BENCH=1 SPARGE_BLOCKMAP_BENCH_QUICK=1 SPARGE_BLOCKMAP_PROFILE=1 timeout 30 "$T" --filter=BLOCKMAP_GPU_BENCH 2>&1 |
    grep -E 'blkq128 blkk64|profile.*blkq 128 blkk 64' | tail -2
  echo "-- $v (profile off)"
  env $v SPARGE_BENCH=1 SPARGE_BLOCKMAP_BENCH_QUICK=1 timeout 30 "$T" --filter=BLOCKMAP_GPU_BENCH 2>&1 | grep -E '^\[ bench \]'
done
echo "== ncu"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
if [ -n "$NCU" ]; then
  # The quick bench's second shape (128 x 64): each shape makes 13 calls, one launch of each kernel per call.
  for v in X=0; do
    echo "-- $v"
    env $v SPARGE_BENCH=1 SPARGE_BLOCKMAP_BENCH_QUICK=1 timeout 40 "$NCU" -k 'regex:select_row_kernel|scores_stage_kernel' \
      --launch-skip 26 --launch-count 2 --section SpeedOfLight --section WarpStateStats --section LaunchStats \
      --section Occupancy --section InstructionStats "$T" --filter=BLOCKMAP_GPU_BENCH 2>&1 |
      grep -E 'select_row_kernel|scores_stage_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Executed Instructions  ' | head -30
  done
else
  echo "ncu not found"
fi
