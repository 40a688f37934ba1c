#!/usr/bin/env bash
# Session 15 round 8: the Python varlen tests on CUDA (round 7 ran pytest from python/, where the source
# package without _C shadowed the installed one).
TAG=s15r8; BUDGET=${BUDGET:-200}; source "$(dirname "$0")/common.sh"
step pybuild 175 "cd ../python && MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps --no-index -q . ; echo pybuild rc=\$?"
step pytest 20 "cd .. && python3 -m pytest -q python/tests/test_attention.py -k 'varlen' 2>&1 | tail -15"
{ cat $L/summary.txt; tail -2 $L/pybuild.log; cat $L/pytest.log; } > $L/all.txt
cat $L/all.txt
