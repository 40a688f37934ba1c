#!/usr/bin/env bash
# Session 12 round 5: whole GPU suite at the session's final code; the Python extension built and its
# token / fake / compile / errors tests (check_lists and the CUDA graph capture).
TAG=s12r5; BUDGET=${BUDGET:-560}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B
unpack new $B/new
T=$B/new
step gpu 240 "$T 2>&1 | grep -vE '^\[ RUN|^\[       OK' | grep -vE 'gather profile'"
step pybuild 240 "cd ../python && MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps --no-index -q . 2>&1 | tail -20"
for f in test_token test_fake test_errors test_compile; do
  step py_$f 90 "cd .. && python3 -X faulthandler -m pytest -q -p no:cacheprovider python/tests/$f.py 2>&1 | tail -15"
done
cat $L/summary.txt; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/gpu.log | head -12; grep -B2 -A12 'Failure' $L/gpu.log | head -40
tail -3 $L/pybuild.log; for f in test_token test_fake test_errors test_compile; do echo "== $f"; tail -4 $L/py_$f.log; done
