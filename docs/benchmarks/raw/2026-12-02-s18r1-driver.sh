#!/usr/bin/env bash
# Session 18 round 1: the sm90 epilogue's 16-byte stores and the consumers' next-tile look-ahead.
# Per-tile trace A/B (base = HEAD 80035cb's harness), the whole GPU suite, a memcheck of the persistent /
# split / varlen LUT cases, then compare.py (time-based warm-up, new) with the A/B pairs.
TAG=s18r1; BUDGET=${BUDGET:-590}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
( cd ../python && MAX_JOBS=12 python3 -m pip install --no-build-isolation --no-deps --no-index -q . > $L/pybuild.log 2>&1; echo "pybuild rc=$?" >> $L/pybuild.log ) &
PB=$!
chmod +x pack/sparge_sm90_trace pack/sparge_sm90_trace_base
step trace 60 "for d in 1.0 0.4 0.1; do for b in base new; do x=pack/sparge_sm90_trace; [ \$b = base ] && x=pack/sparge_sm90_trace_base; echo \"== \$b\"; \$x \$d 128 20; done; done"
step trace_v 40 "for d in 0.4 0.1; do for v in 2048 3072; do echo \"== new v=\$v\"; SPARGE_SM90_VARIANT=\$v pack/sparge_sm90_trace \$d 128 20; done; done"
step suite 330 "$B/new --filter='^(?!BENCH)'"
step sanitize 90 "compute-sanitizer --tool memcheck --error-exitcode 99 $B/new --filter='PERSISTENT|SPLIT|VARLEN' 2>&1 | tail -4"
step bench 60 "SPARGE_BENCH=1 $B/new --filter=BENCH_ATTENTION 2>&1 | grep -E '^BENCH'"
wait $PB
step compare 300 "cd .. && python3 bench/compare.py --d 128 --topk 0.4,0.1 --pv-ab --fp8 --ab 20 --out $L --tag s18r1"
{ cat $L/summary.txt; tail -1 $L/pybuild.log; grep -E "FAILED|Failure" $L/suite.log | head -20; grep -E "tests ran|PASSED  \]|SKIPPED \]" $L/suite.log; cat $L/sanitize.log; cat $L/bench.log; grep -E "^==|density|epilogue|walk|to next|Q wait|tile \(|per key|tile - n" $L/trace.log $L/trace_v.log; sed -n '/^Targets/,$p' $L/compare.log; grep -E "A/B x" $L/compare.log; } > $L/all.txt
cat $L/all.txt
