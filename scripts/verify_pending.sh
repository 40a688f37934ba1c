#!/usr/bin/env bash
# Runs, on a GPU machine, everything that was written after the last device round of 2026-11-30
# (session 4) and is compiled and CPU-tested only: correctness first, then the timings that decide
# the defaults. Assumes `scripts/gpu_check.sh build` ran (build dir build-gpu, or BUILD_DIR).
# Prints a short table last. About 4 minutes on one H200.
#   scripts/verify_pending.sh [phase...]   phases: fp8 quant blockmap gather sanitize bench (default: all)
set -uo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build-gpu}
T=$B/tests/sparge_gpu_tests
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
phases=${*:-fp8 quant blockmap gather sanitize bench}
has() { [[ " $phases " == *" $1 "* ]]; }
summary=()
note() { summary+=("$1"); echo "== $1"; }
verdict() { grep -E '^\[  (PASSED|FAILED)' "$1" | tr '\n' ' '; }

if has fp8; then
  # The fp8 recipe's kernel, including the persistent-CTA cases (v=16 / v=32) added after its first run,
  # and the prepass's opt-in `stream` variant feeding it.
  timeout 150 "$T" --filter='FP8' >"$OUT/pending_fp8.log" 2>&1
  note "fp8 kernel cases: $(verdict "$OUT/pending_fp8.log")"
  SPARGE_QUANT_VARIANT=stream timeout 150 "$T" --filter='FP8\(' >"$OUT/pending_fp8_stream.log" 2>&1
  note "fp8 cases on the stream prepass: $(verdict "$OUT/pending_fp8_stream.log")"
  # The tool's fp8 path, validated against the CPU specification.
  timeout 120 "$B/bin/sparge" bench -backend=cuda -b=1 -h=4 -s=2048 -d=128 -topk=0.4 -recipe=fp8 -v=1 \
    >"$OUT/pending_tool_fp8.log" 2>&1
  note "sparge bench -recipe=fp8 -v=1: rc=$? $(grep -E '^validation' "$OUT/pending_tool_fp8.log")"
fi

if has quant; then
  timeout 150 "$T" --filter='QUANT_GPU|E4M3' >"$OUT/pending_quant.log" 2>&1
  note "prepass cases (every variant bitwise): $(verdict "$OUT/pending_quant.log")"
fi

if has blockmap; then
  # Every block-map switch bitwise against the default (the K mean rewrite is on the default path).
  timeout 200 "$T" --filter='BLOCKMAP' >"$OUT/pending_blockmap.log" 2>&1
  note "block map cases: $(verdict "$OUT/pending_blockmap.log")"
fi

if has gather; then
  # The opt-in warp-specialized gather kernel (SPARGE_GATHER_PATH=ws) is in the gather cases' path loops.
  timeout 200 "$T" --filter='GATHER' >"$OUT/pending_gather.log" 2>&1
  note "gather cases (ws path included): $(verdict "$OUT/pending_gather.log")"
fi

if has sanitize; then
  for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 99 "$T" \
      --filter='FP8.*(sq=203|v=32)|QUANT_GPU\(b=1,hq=2|negramp.*sk=1000|d=72,.*switches|sq=113|sq=203' \
      >"$OUT/pending_sanitize_$tool.log" 2>&1
    note "compute-sanitizer $tool rc=$?: $(grep -E 'ERROR SUMMARY' "$OUT/pending_sanitize_$tool.log" | tail -1)"
  done
fi

if has bench; then
  {
    echo "## prepass variants"
    SPARGE_BENCH=1 timeout 120 "$T" --filter='QUANT_GPU_BENCH' 2>&1 | grep -E 'QUANT_GPU_BENCH variant'
    echo "## fp8 recipe, default and stream prepass"
    SPARGE_BENCH=1 timeout 120 "$T" --filter='FP8_BENCH' 2>&1 | grep -E '^\[ bench \]'
    SPARGE_BENCH=1 SPARGE_QUANT_VARIANT=stream timeout 120 "$T" --filter='FP8_BENCH' 2>&1 | grep -E 'recipe fp8'
    echo "## block map, default vs the session-4 kernels"
    for v in X=0 "SPARGE_BLOCKMAP_SCORES=stage SPARGE_BLOCKMAP_SELECT=load1st" SPARGE_BLOCKMAP_SELECT=load1st12 \
             "SPARGE_BLOCKMAP_TICKET=1 SPARGE_BLOCKMAP_KFIRST=1" SPARGE_BLOCKMAP_POOL=async3 SPARGE_BLOCKMAP_POOL=stream4x4; do
      echo "-- $v"
      env $v SPARGE_BENCH=1 SPARGE_BLOCKMAP_BENCH_QUICK=1 SPARGE_BLOCKMAP_PROFILE=1 timeout 60 "$T" --filter=BLOCKMAP_GPU_BENCH 2>&1 |
        grep -E 'blkq128 blkk64|profile.*blkq 128 blkk 64' | cut -c1-300 | tail -2
    done
    echo "## gather, every path"
    SPARGE_BENCH=1 timeout 120 "$T" --filter='GATHER_GPU_PERF_PATHS|GATHER_GPU_KV_PERF' 2>&1 |
      grep -E '\[perf\].*path=(ws|wgmma64)|\[gather profile\].*\(ws'
  } >"$OUT/pending_bench.log" 2>&1
  note "bench: see pending_bench.log"
fi

echo
echo "==================== pending verification ===================="
for s in "${summary[@]}"; do echo "$s"; done | tee "$OUT/pending_summary.txt"
