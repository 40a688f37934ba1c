#!/usr/bin/env bash
# Session 13 round 8 (final): compare.py at HEAD (d128, fp8 rows, pv A/B, token section).
TAG=s13r8; BUDGET=${BUDGET:-480}; source "$(dirname "$0")/common.sh"
step pybuild 240 "cd ../python && MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps --no-index -q ."
step compare 230 "cd .. && python3 bench/compare.py --d 128 --fp8 --pv-ab --token --out $L --tag s13r8"
cat $L/summary.txt
grep -E "^==|cuDNN SDPA  |sparge dense  |FAIL|PASS|gather|topk_select" $L/compare.log | head -70
