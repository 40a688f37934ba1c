#!/bin/bash
# Device round for issue #5 (gather_attention speed; helper h2). Run from the repo root after the
# Release build of sparge_gpu_tests (SPARGE_CUDA_ARCHS=90a) in $B:
#   B=build-dir scripts/round_gather.sh
# About 60 s of device time (the memcheck step last: drop it if time is short). What to look for:
#  1. "[  PASSED  ]" with no FAILED line: every GATHER correctness case, now with the
#     SPARGE_GATHER_PREFETCH=1 paths (wgmma64 / wgmma / ws prefetch: against the fp64 oracle and
#     bitwise against the same path without prefetch; relaunch determinism).
#  2. "[perf fast]" rows: median ms and TFLOPS on attended keys of default / ws / *prefetch paths
#     with both list layouts, "(bitwise)" = same bits as the default path; each followed by a
#     "[gather profile]" line (union ms / attention ms). The question: does prefetch cut the
#     attention part (today 0.146 ms wgmma64, 0.160 ms ws)? The "contiguous-window" rows: the same
#     work with every group's keys contiguous (if much faster: scattered rows are the wall).
#  3. memcheck "ERROR SUMMARY: 0 errors" on a small case (3 steps of 64 keys, hd64) that runs
#     every path, the prefetching ones included (their key copies read 16-byte chunks).
set -u
B=${B:?set B to the build directory}
T=$B/tests/sparge_gpu_tests
echo "== gather correctness (prefetch paths included)"
timeout 150 "$T" --filter='GATHER_GPU\(|GATHER_GPU_KV\(|GATHER_GPU_LONG\(|GATHER_GPU_LONG_RELAUNCH|GATHER_GPU_RELAUNCH|GATHER_GPU_KV_RELAUNCH' 2>&1 |
  grep -E 'FAILED|Failure|error|Expected|Which is|vs |PASSED|OK \]' | tail -80
echo "== gather timings"
timeout 90 "$T" --filter='GATHER_GPU_FAST_PERF' 2>&1 | grep -E '^\[perf fast\]|\[gather profile\]|FAILED|PASSED|Failure'
echo "== memcheck, small case, every path"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 99 "$T" --filter='GATHER_GPU\(b=1,hq=4,hk=2,sq=200' 2>&1 |
  grep -E 'ERROR SUMMARY|Invalid|PASSED|FAILED' | head -20
