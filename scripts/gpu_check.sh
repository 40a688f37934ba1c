#!/usr/bin/env bash
# Build, check and benchmark on a GPU machine in one go; prints a short table last.
#   scripts/gpu_check.sh [phase...]   phases: build cpu gpu sanitize bench cpuscale python compare dist
#   (default: all but dist, which needs two or more GPUs: nvidia-h200-x2)
# Logs go to $OUT (the device tool's output folder) or ./gpu-out.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
B=${BUILD_DIR:-build-gpu}
phases=${*:-build cpu gpu sanitize bench cpuscale python compare}
summary=()
note() { summary+=("$1"); echo "== $1"; }
has() { [[ " $phases " == *" $1 "* ]]; }
stamp=$(date -u +%Y-%m-%d)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

{ nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; nproc; cmake --version | head -1; } 2>&1 | tee "$OUT/machine.txt"

if has build; then
  t0=$(date +%s)
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARGE_CUDA=ON -DSPARGE_CUDA_ARCHS="${ARCHS:-90a}" >"$OUT/build.log" 2>&1 &&
    cmake --build "$B" -j "$(nproc)" >>"$OUT/build.log" 2>&1
  rc=$?
  note "build rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc -ne 0 ] && tail -40 "$OUT/build.log"
fi

if has cpu; then
  "$B/tests/sparge_tests" >"$OUT/cpu_tests.log" 2>&1; rc=$?
  note "cpu tests rc=$rc: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cpu_tests.log" | tr '\n' ' ')"
fi

if has gpu; then
  timeout 400 "$B/tests/sparge_gpu_tests" ${GPU_FILTER:+--filter=$GPU_FILTER} >"$OUT/gpu_tests.log" 2>&1; rc=$?
  note "gpu tests rc=$rc: $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/gpu_tests.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$OUT/gpu_tests.log" | head -30
fi

if has sanitize; then
  for tool in memcheck racecheck; do
    timeout ${SAN_TIMEOUT:-150} compute-sanitizer --tool $tool --error-exitcode 99 "$B/tests/sparge_gpu_tests" --filter="${SAN_FILTER:-sq=113|sq=203|r=7|n=1000}" >"$OUT/sanitize_$tool.log" 2>&1; rc=$?
    note "compute-sanitizer $tool rc=$rc: $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
  done
fi

if has bench; then
  {
    echo "# sparge bench on $(nvidia-smi --query-gpu=name --format=csv,noheader), $stamp"
    for args in "-d=128 -topk=1.0" "-d=128 -topk=0.5" "-d=128 -topk=0.4" "-d=128 -topk=0.2" "-d=128 -topk=0.1" "-d=128 -topk=0.4 -causal=1" "-d=128 -topk=1.0 -blkq=128 -blkk=128" "-d=64 -topk=1.0"; do
      echo "## sparge bench -backend=cuda -b=2 -h=32 -s=16384 $args"
      timeout 120 "$B/bin/sparge" bench -backend=cuda -b=2 -h=32 -s=16384 -simthreshd1=0.001 $args
    done
    echo "## validation, smaller shape"
    timeout 120 "$B/bin/sparge" bench -backend=cuda -b=1 -h=4 -s=2048 -d=128 -topk=0.4 -v=1
    timeout 120 "$B/bin/sparge" bench -backend=cuda -b=1 -h=4 -s=2048 -d=128 -topk=0.4 -causal=1 -v=1
    timeout 120 "$B/bin/sparge" bench -backend=cuda -b=1 -h=4 -s=2048 -d=128 -topk=0.4 -recipe=fp8 -v=1
    echo "## varlen (16 mixed-length sequences, 8 x 4096 against the fixed-length batch), sm90 vs portable path"
    SPARGE_BENCH=varlen timeout 120 "$B/tests/sparge_gpu_tests" --filter='BENCH_ATTENTION' 2>&1 | grep -E '^BENCH'
    echo "## causal LUTs shaped like the block map's rows (sm90 path; bit 131072 = the launch before the causal pairs)"
    SPARGE_BENCH=causal_lut timeout 120 "$B/tests/sparge_gpu_tests" --filter='BENCH_ATTENTION' 2>&1 | grep -E '^BENCH'
    echo "## fp8 recipe: prepass variants, fp16 vs fp8 kernel on the same LUTs (prepass included), folded pipeline"
    SPARGE_BENCH=1 timeout 120 "$B/tests/sparge_gpu_tests" --filter='FP8_BENCH|QUANT_GPU_BENCH|FOLD_BENCH' 2>&1 | grep -E 'bench|QUANT_GPU_BENCH'
    echo "## block-map scaling, b*h*s fixed"
    for s in 16384 65536 262144; do
      timeout 60 "$B/bin/sparge" bench -backend=cuda -b=1 -h=$(( 64 * 16384 / s )) -s=$s -d=128 -topk=0.4 -blkk=64
    done
  } >"$OUT/bench.log" 2>&1
  note "bench: see bench.log ($(grep -c PASS "$OUT/bench.log") PASS, $(grep -c FAIL "$OUT/bench.log") FAIL)"
fi

if has python; then
  t0=$(date +%s)
  (cd python && MAX_JOBS=$(nproc) python3 -m pip install --no-build-isolation --no-deps --no-index -q . ) >"$OUT/python_build.log" 2>&1; rc=$?
  note "python build rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc -ne 0 ] && tail -30 "$OUT/python_build.log"
  # One process per test file, so that a crash in one file does not hide the results of the others.
  for f in python/tests/test_*.py; do
    timeout 240 python3 -X faulthandler -m pytest -q -p no:cacheprovider "$f" >>"$OUT/pytest.log" 2>&1; rc=$?
    note "pytest $(basename "$f") rc=$rc: $(grep -E '(passed|failed|error)' "$OUT/pytest.log" | tail -1)"
  done
fi

if has compare; then
  timeout 400 python3 bench/compare.py --out "$OUT" ${COMPARE_ARGS:---fp8 --pv-ab} >"$OUT/compare.log" 2>&1; rc=$?
  note "compare rc=$rc"
  tail -40 "$OUT/compare.log"
fi

if has dist; then
  timeout ${DIST_TIMEOUT:-150} "$B/tests/sparge_dist_tests" >"$OUT/dist_tests.log" 2>&1; rc=$?
  note "dist tests rc=$rc: $(grep -E '^(PASS|FAIL|ok|SKIP)|passed|failed' "$OUT/dist_tests.log" | tail -3 | tr '\n' ' ')"
  tail -25 "$OUT/dist_tests.log"
  SPARGE_DIST_PROFILE=1 timeout ${DIST_TIMEOUT:-150} "$B/tests/sparge_dist_tests" --timing >"$OUT/dist_timing.log" 2>&1; rc=$?
  note "dist timing rc=$rc"
  grep -v '^dist profile' "$OUT/dist_timing.log" | tail -12
fi

if has cpuscale; then
  # CPU backend scaling; run last, alone, so that nothing else competes for the cores.
  for t in ${CPUSCALE_THREADS:-16 8 4 2 1}; do
    s0=$(date +%s.%N)
    timeout 300 "$B/bin/sparge" bench -backend=cpu -b=1 -h=2 -s=8192 -d=128 -topk=0.4 -v=1 -threads=$t -repeat=1 -warmup=0 >>"$OUT/cpuscale.log" 2>&1
    echo "threads=$t rc=$? wall=$(awk "BEGIN{print $(date +%s.%N) - $s0}") s" >>"$OUT/cpuscale.log"
  done
  note "cpu scaling: $(grep -E '^threads=' "$OUT/cpuscale.log" | tr '\n' ' ')"
fi

echo
echo "==================== summary ($stamp) ===================="
for s in "${summary[@]}"; do echo "$s"; done | tee "$OUT/summary.txt"
# The device tool returns at most 8 files: the logs travel as one archive (logs.tar.gz).
(cd "$OUT" && tar czf logs.tar.gz --remove-files $(ls *.log *.txt 2>/dev/null | grep -v '^summary.txt$')) 2>/dev/null || true
