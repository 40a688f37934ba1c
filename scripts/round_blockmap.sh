#!/bin/bash
# Device round for issue #3 (block map scores + selection speed; helper h3). Run from the repo root
# after the Release build of sparge_gpu_tests (SPARGE_CUDA_ARCHS=90a) in $B:
#   B=build-dir scripts/round_blockmap.sh
# About 50 s of device time. What to look for:
#  1. "== block map cases": "[  PASSED  ]" and no FAILED / "differ" line. The switches=all cases
#     rerun under SPARGE_BLOCKMAP_PDL=1 and SPARGE_BLOCKMAP_SELECT=pivot (alone and combined) and
#     must give the same bits as the default (a "differ under ... PDL=1 ... SELECT=pivot" line is a
#     failure of that switch).
#  2. "== timings": per variant, the profile line of the 128 x 64 shape ("scores" and "select"
#     stages: today 0.0238 / 0.0300 ms) and the bench median with the profile on; then the bench
#     median with the profile off (the honest number; the target is <= 0.27 ms at blkq128 blkk64).
#     Variants: default | PDL=1 | SELECT=pivot | PDL=1 + SELECT=pivot.
#  3. "== ncu" (if ncu is installed): duration, SM / issue throughput and warp stall reasons of
#     scores_stage_kernel and select_row_kernel (bits and pivot) at 128 x 64.
set -u
B=${B:?set B to the build directory}
T=$B/tests/sparge_gpu_tests
echo "== block map cases"
timeout 120 "$T" --filter='BLOCKMAP_GPU' 2>&1 | grep -E '^\[  (PASSED|FAILED)|FAILED|differ|Failure' | head -40
echo "== timings"
for v in X=0 SPARGE_BLOCKMAP_PDL=1 SPARGE_BLOCKMAP_SELECT=pivot "SPARGE_BLOCKMAP_PDL=1 SPARGE_BLOCKMAP_SELECT=pivot"; do
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
  for v in X=0 SPARGE_BLOCKMAP_SELECT=pivot; do
    echo "-- $v"
    env $v SPARGE_BENCH=1 SPARGE_BLOCKMAP_BENCH_QUICK=1 timeout 45 "$NCU" -k 'regex:select_row_kernel|scores_stage_kernel' \
      --launch-skip 26 --launch-count 2 --section SpeedOfLight --section WarpStateStats --section LaunchStats \
      --section Occupancy --section InstructionStats "$T" --filter=BLOCKMAP_GPU_BENCH 2>&1 |
      grep -E 'select_row_kernel|scores_stage_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc|Issue Slots Busy|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Stall|Executed Instructions  ' | head -60
  done
else
  echo "ncu not found"
fi
