#!/usr/bin/env bash
# Session 10 final round for #3 (ORDER=sums the default): whole GPU suite (seed kept), memcheck + racecheck on
# block-map cases that take the scores tile and the vector LUT stores, BLOCKMAP_GPU_BENCH (s-scaling), the tool's
# block map / device copy / device read at three block sizes against the r7 binary.
TAG=s10r7; BUDGET=${BUDGET:-585}; source "$(dirname "$0")/common.sh"
B=/tmp/bb; mkdir -p $B/bin $B/tests
xz -dc bins/sparge.xz > $B/bin/sparge; xz -dc bins/sparge_old.xz > $B/bin/sparge_old; xz -dc bins/sparge_r5.xz > $B/bin/sparge_r5; chmod +x $B/bin/sparge_r5; xz -dc bins/sparge_gpu_tests.xz > $B/tests/sparge_gpu_tests
chmod +x $B/bin/sparge $B/bin/sparge_old $B/tests/sparge_gpu_tests
T=$B/tests/sparge_gpu_tests; S=$B/bin/sparge; O=$B/bin/sparge_old
A="-b=2 -h=32 -s=16384 -d=128 -topk=0.4 -seed=7"
F='BLOCKMAP.*sq=129,sk=257|BLOCKMAP_GPU.b=1,hq=2,hk=2,sq=16384,sk=16384|BLOCKMAP_GPU.b=1,hq=2,hk=1,sq=8256,sk=8320'
step gpu 290 "$T 2>&1 | grep -vE '^\[ RUN|^\[       OK'"
step memcheck 80 "compute-sanitizer --tool memcheck --error-exitcode 9 $T --filter='$F' 2>&1 | tail -5"
step racecheck 80 "compute-sanitizer --tool racecheck --error-exitcode 9 $T --filter='$F' 2>&1 | tail -5"
step bmbench 60 "SPARGE_BENCH=1 $T --filter='BLOCKMAP_GPU_BENCH' 2>&1 | grep -E 'bench \]|FAILED' | head -40"
step tool 60 "for r in 1 2; do for x in $O $B/bin/sparge_r5 $S; do for bk in '-blkq=128 -blkk=64' '-blkq=64 -blkk=128' '-blkq=64 -blkk=64'; do echo \"== \$x \$bk\"; \$x bench $A \$bk 2>&1 | grep -E '^sparge bench|^block map|^device copy|^device read'; done; done; done"
cat $L/summary.txt; grep -E 'seed =|PASSED|FAILED|SKIPPED \]' $L/gpu.log | head -20; grep -B2 -A12 'Failure' $L/gpu.log | head -40
cat $L/memcheck.log $L/racecheck.log; cat $L/bmbench.log
echo "#### tool (ratio block map / copy)"; python3 - $L/tool.log <<'PY'
import sys,re,collections
cur=None; d=collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith('== '): cur=line[3:].strip().replace('/tmp/bb/bin/','')
    m=re.match(r'block map / device copy of Q and K = ([0-9.]+)',line)
    if m and cur: d[cur].append(float(m.group(1)))
    m=re.match(r'block map\s+([0-9.]+)',line)
    if m and cur: d[cur+' ms'].append(float(m.group(1)))
for k,v in d.items(): print(f"{k:62s} {' '.join(f'{x:.3f}' for x in v)}")
PY
(cd $OUT && tar czf $TAG.tar.gz r && rm -rf r)
