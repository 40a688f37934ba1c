#!/bin/bash
# Device round for issue #5 (gather_attention speed; helper h2). Run from the repo root after the
# Release build of sparge_gpu_tests (SPARGE_CUDA_ARCHS=90a) in $B:
#   B=build-dir scripts/round_gather.sh
# About 60-80 s of device time without steps 3-4; the ncu steps (optional, drop them if time is short) run the
# whole perf test under ncu and take up to 150 s each (session 5 cut the first at 60 s).
# Defaults since session 11 (2026-12-01): attention by the warp-specialized ws kernel for hd128 groups
# of >= 128 rows on sm_90 (wgmma BM 128 with prefetch for hd64), union clusters of >= 32 lists per CTA
# (kv-head lists: 2 CTAs per group); expected at PERF.md's shape with kv-head lists: whole call
# ~0.155 ms, union ~0.043 + attention ~0.090 in its [gather profile] line (docs/benchmarks/
# 2026-12-01-h200.md; GATHER_GPU_KV_PERF has the same shape with more rows). The figures in the
# list below are session 5's. What to look for:
#  1. "[  PASSED  ]" and no FAILED line: every GATHER correctness case under the new defaults,
#     each prefetch / L2 / PDL / wgmma-stages=4 path vs the fp64 oracle and bitwise vs the path
#     without it, relaunch determinism, bad lists under every union variant.
#  2. "[perf fast]" rows (kv-head lists first, then per-query-head): "default" should be
#     ~0.20 ms with kv-head lists (union ~0.047 + attention ~0.133 in its [gather profile] line)
#     against "wgmma64 no prefetch (default before)" + "union_ctas=4" (~0.230); "wgmma stages=4"
#     and "wgmma pdl" are the opt-in candidates; "(bitwise)" = same bits as the default.
#  2b. "[tma probe]": swizzle mismatches 0 = a TMA box of 64 columns x 1 row lands in the wgmma
#     layout (TMA row gathers are possible); cp.async vs TMA GB/s of the same scattered rows
#     (both with 3-4 steps in flight, no compute) -- is TMA the way past the cp.async gathers?
#  3. ncu of the default attention kernel and the union kernel (kv-head lists): SM / memory
#     throughput, warp stall reasons -- what bounds the gather kernel (not needed to pass).
#  4. ncu of the ws kernel (producer / consumer warp specialization), same sections.
set -u
B=${B:?set B to the build directory}
T=$B/tests/sparge_gpu_tests
echo "== gather correctness (new defaults; prefetch / pdl / stages paths bitwise)"
timeout 150 "$T" --filter='GATHER_GPU\(|GATHER_GPU_KV\(|GATHER_GPU_LONG|GATHER_GPU_RELAUNCH|GATHER_GPU_KV_RELAUNCH|GATHER_GPU_WS_|GATHER_GPU_BADLIST|GATHER_GPU_KV_BADLIST|GATHER_KV_VALIDATION' 2>&1 |
  grep -E 'FAILED|Failure|error|Expected|Which is|vs |PASSED|OK \]' | tail -80
echo "== gather timings"
timeout 90 "$T" --filter='GATHER_GPU_FAST_PERF' 2>&1 | grep -E '^\[perf fast\]|\[gather profile\]|FAILED|PASSED|Failure'
echo "== TMA row-gather probe (own process)"
SPARGE_TMA_PROBE=1 timeout 30 "$T" --filter='GATHER_GPU_TMA_PROBE' 2>&1 | grep -E '^\[tma probe\]|FAILED|PASSED|SKIPPED|error' | head -5
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
if [ -n "$NCU" ]; then
  SECT="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats"
  PAT='attention_wgmma_kernel|attention_ws_kernel|union_kernel|Duration|Throughput|Hit Rate|Stall|Warp Cycles Per Issued|Issued Warp|Eligible|Achieved Occupancy|Registers Per|Shared Memory Config|Grid Size|Block Size'
  echo "== ncu: default union + attention (kv-head lists, 6th call)"
  SPARGE_TEST_GATHER_FAST=none timeout 150 "$NCU" -k 'regex:attention_wgmma_kernel|union_kernel' --launch-skip 10 --launch-count 2 $SECT \
    "$T" --filter='GATHER_GPU_FAST_PERF' 2>&1 | grep -E "$PAT" | head -90
  echo "== ncu: ws attention (kv-head lists)"
  SPARGE_TEST_GATHER_FAST=ws timeout 150 "$NCU" -k 'regex:attention_ws_kernel' --launch-skip 5 --launch-count 1 $SECT \
    "$T" --filter='GATHER_GPU_FAST_PERF' 2>&1 | grep -E "$PAT" | head -50
else
  echo "ncu not found"
fi
