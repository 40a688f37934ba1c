#!/usr/bin/env python3
# A model of the K/V ring of attention_ws.cuh (the warp-specialized gather attention kernel), run
# by hand: `python3 src/cuda/gather/ws_ring_model.py` prints "ok N runs" or raises.
# Not the kernel: one process for the producer warpgroup (its 128 threads move in step: their
# copies of a stage are one unit, landing in issue order at random later times), one per consumer
# warpgroup, random interleavings. mbarriers as in PTX (a phase completes at its count; a wait for
# parity P passes once the phase of parity P has completed, so on a fresh barrier a wait for 1
# passes), named barriers as tokens (bar.arrive adds one, bar.sync takes one). Checked: no deadlock,
# every wgmma read finds its step's data landed, no copy lands in a buffer a wgmma may still read
# (between issue and the wait that retires it), the pingpong barriers balanced at exit -- for both
# producer modes (noinc, wait), 2..8 stages, 0..17 steps, 1 or 2 consumer warpgroups, pingpong on
# and off. Mutations that fail it (tried 2026-11-30): the producer waiting for the empty barrier's
# own parity instead of its complement (deadlock), a consumer releasing V before its PV retired
# (WAR), the wait mode arriving the last V before its copies landed (stale read).
import random, sys

class Bar:
    def __init__(s, count): s.count, s.arr, s.ph = count, 0, 0
    def arrive(s, n=1):
        s.arr += n
        assert s.arr <= s.count
        if s.arr == s.count: s.arr, s.ph = 0, s.ph + 1
    def ready(s, parity): return (s.ph & 1) != parity

def run(stages, nblk, C, mode, pingpong, seed):
    rnd = random.Random(seed)
    kf = [Bar(1) for _ in range(stages)]; vf = [Bar(1) for _ in range(stages)]
    ke = [Bar(C) for _ in range(stages)]; ve = [Bar(C) for _ in range(stages)]
    kbuf = [None]*stages; vbuf = [None]*stages      # step whose data has LANDED
    kread = [0]*stages; vread = [0]*stages          # readers in flight
    pending = []  # in-flight copies: (kind, b, step)
    tokens = {2: 0, 3: 0}
    def land_some():
        # copies complete in order per thread (conservative: random subset, in order)
        while pending and rnd.random() < 0.5:
            kind, b, step, arrive_bar = pending.pop(0)
            buf = kbuf if kind == 'k' else vbuf
            rd = kread if kind == 'k' else vread
            assert rd[b] == 0, f"WAR: {kind}{b} written while read (step {step})"
            buf[b] = step
            if arrive_bar is not None: arrive_bar.arrive()
    def producer():
        b, phase, bprev = 0, 0, 0
        for blk in range(nblk):
            while not ke[b].ready(phase ^ 1): yield
            pending.append(('k', b, blk, kf[b] if mode == 'noinc' else None))
            if mode == 'wait' and blk > 0:
                # wait_group 1: everything but the newest group (K_blk) landed
                while len(pending) > 1: yield
                vf[bprev].arrive()
            while not ve[b].ready(phase ^ 1): yield
            pending.append(('v', b, blk, vf[b] if mode == 'noinc' else None))
            if mode == 'wait':
                while len(pending) > 1: yield
                kf[b].arrive()
            bprev = b
            b += 1
            if b == stages: b, phase = 0, phase ^ 1
            yield
        if mode == 'wait' and nblk > 0:
            while pending: yield
            vf[bprev].arrive()
    def consumer(cw):
        pp = C == 2 and pingpong
        def turn_begin():
            if pp:
                while tokens[2 + cw] == 0: yield
                tokens[2 + cw] -= 1
        def turn_end():
            if pp: tokens[2 + (cw ^ 1)] += 1
        if pp and cw == 1: tokens[2] += 1
        if nblk > 0:
            while not kf[0].ready(0): yield
            assert kbuf[0] == 0
            yield from turn_begin()
            kread[0] += 1            # S_0 issued
            turn_end(); yield
            kread[0] -= 1; ke[0].arrive()   # wait<0>, release
            bprev, phprev = 0, 0
            b, ph = 1, 0
            for blk in range(1, nblk):
                while not kf[b].ready(ph): yield
                while not vf[bprev].ready(phprev): yield
                assert kbuf[b] == blk, (kbuf[b], blk)
                assert vbuf[bprev] == blk - 1
                yield from turn_begin()
                kread[b] += 1; vread[bprev] += 1
                turn_end(); yield
                kread[b] -= 1; ke[b].arrive(); yield
                vread[bprev] -= 1; ve[bprev].arrive()
                bprev, phprev = b, ph
                b += 1
                if b == stages: b, ph = 0, ph ^ 1
            while not vf[bprev].ready(phprev): yield
            assert vbuf[bprev] == nblk - 1
            yield from turn_begin()
            vread[bprev] += 1
            turn_end(); yield
            vread[bprev] -= 1; ve[bprev].arrive()
        if pp and cw == 0:
            while tokens[2] == 0: yield
            tokens[2] -= 1
    procs = [producer()] + [consumer(c) for c in range(C)]
    alive = list(procs); idle = 0
    while alive:
        p = rnd.choice(alive)
        land_some()
        try:
            next(p)
        except StopIteration:
            alive.remove(p)
        idle += 1
        if idle > 200000: raise RuntimeError(f"deadlock stages={stages} nblk={nblk} C={C} mode={mode} pp={pingpong}")
    assert tokens[2] == 0 and tokens[3] == 0, tokens

n = 0
for stages in range(2, 9):
    for nblk in [0, 1, 2, 3, 5, 9, 17]:
        for C in (1, 2):
            for mode in ('noinc', 'wait'):
                for pp in (True, False):
                    for seed in range(20):
                        run(stages, nblk, C, mode, pp, seed); n += 1
print("ok", n, "runs")
