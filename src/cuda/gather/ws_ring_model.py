#!/usr/bin/env python3
# A model of the K/V ring of attention_ws.cuh (the warp-specialized gather attention kernel), run
# by ctest (test ws_ring_model) and by hand: `python3 src/cuda/gather/ws_ring_model.py` prints "ok N runs" or raises.
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
# run_persistent (2026-12-01, session 12): the protocol planned for a persistent ws kernel (tiles in
# sequence, the ring continuing across them, Q gated by a q_empty barrier), with three mutations that
# must fail it (checked at the end of a run).
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


# ---- the persistent variant (planned, docs/token_sparse.md "Session 12"; no kernel yet) ----------
# One CTA walks a sequence of tiles (nblks[i] steps each, 0 allowed). The K/V ring's stage and parity
# counters continue across tiles in both roles. Q: the producer copies tile i's Q after tile i's K_0
# has been issued and after waiting for q_empty of tile i - 1 (each consumer warpgroup arrives once
# its staged epilogue, which writes through the Q tile, is done); the copy arrives on q_full when it
# lands (noinc). Consumers wait q_full with parity i & 1. Pingpong turns open and close per tile.
# Checked as above plus: every QK^T reads its own tile's Q, no Q copy lands while a QK^T or an
# epilogue of the previous tile still uses the buffer, and both named barriers balanced at exit.
def run_persistent(stages, nblks, C, pingpong, seed, mutation=None):
    rnd = random.Random(seed)
    kf = [Bar(1) for _ in range(stages)]; vf = [Bar(1) for _ in range(stages)]
    ke = [Bar(C) for _ in range(stages)]; ve = [Bar(C) for _ in range(stages)]
    qf, qe = Bar(1), Bar(C)
    kbuf = [None]*stages; vbuf = [None]*stages
    kread = [0]*stages; vread = [0]*stages
    qbuf = [None]; qread = [0]
    pending = []
    tokens = {2: 0, 3: 0}
    def land_some():
        while pending and rnd.random() < 0.5:
            kind, b, step, arrive_bar = pending.pop(0)
            if kind == 'q':
                assert qread[0] == 0, f"WAR: Q of tile {step} written while the buffer is in use"
                qbuf[0] = step
            else:
                buf = kbuf if kind == 'k' else vbuf
                rd = kread if kind == 'k' else vread
                assert rd[b] == 0, f"WAR: {kind}{b} written while read (step {step})"
                buf[b] = step
            arrive_bar.arrive()
    def producer():
        b, phase = 0, 0
        for i, nblk in enumerate(nblks):
            def load_q():
                if i > 0 and mutation != 'q_no_wait':
                    while not qe.ready((i - 1) & 1): yield
                pending.append(('q', 0, i, qf))
            if nblk == 0:
                yield from load_q()
            for blk in range(nblk):
                while not ke[b].ready(phase ^ 1): yield
                pending.append(('k', b, (i, blk), kf[b]))
                if blk == 0:
                    yield from load_q()
                while not ve[b].ready(phase ^ 1): yield
                pending.append(('v', b, (i, blk), vf[b]))
                b += 1
                if b == stages: b, phase = 0, phase ^ 1
                yield
    def consumer(cw):
        pp = C == 2 and pingpong
        def turn_begin():
            if pp:
                while tokens[2 + cw] == 0: yield
                tokens[2 + cw] -= 1
        def turn_end():
            if pp: tokens[2 + (cw ^ 1)] += 1
        b, ph = 0, 0  # the ring position of the next step, across tiles
        for i, nblk in enumerate(nblks):
            if mutation == 'ring_reset': b, ph = 0, 0
            if pp and cw == 1: tokens[2] += 1
            while not qf.ready(i & 1): yield
            assert qbuf[0] == i, (qbuf[0], i)
            if nblk > 0:
                while not kf[b].ready(ph): yield
                assert kbuf[b] == (i, 0)
                yield from turn_begin()
                kread[b] += 1; qread[0] += 1
                turn_end(); yield
                kread[b] -= 1; qread[0] -= 1; ke[b].arrive()
                bprev, phprev = b, ph
                b += 1
                if b == stages: b, ph = 0, ph ^ 1
                for blk in range(1, nblk):
                    while not kf[b].ready(ph): yield
                    while not vf[bprev].ready(phprev): yield
                    assert kbuf[b] == (i, blk), (kbuf[b], i, blk)
                    assert vbuf[bprev] == (i, blk - 1)
                    yield from turn_begin()
                    kread[b] += 1; vread[bprev] += 1; qread[0] += 1
                    turn_end(); yield
                    kread[b] -= 1; qread[0] -= 1; ke[b].arrive(); yield
                    vread[bprev] -= 1; ve[bprev].arrive()
                    bprev, phprev = b, ph
                    b += 1
                    if b == stages: b, ph = 0, ph ^ 1
                while not vf[bprev].ready(phprev): yield
                assert vbuf[bprev] == (i, nblk - 1)
                yield from turn_begin()
                vread[bprev] += 1
                turn_end(); yield
                vread[bprev] -= 1; ve[bprev].arrive()
            if pp and cw == 0:
                while tokens[2] == 0: yield
                tokens[2] -= 1
            if mutation == 'q_early_release':
                qe.arrive(); qread[0] += 1; yield
                qread[0] -= 1
            else:
                qread[0] += 1; yield   # the staged epilogue writes through the Q tile
                qread[0] -= 1; qe.arrive()
    procs = [producer()] + [consumer(c) for c in range(C)]
    alive = list(procs); idle = 0
    while alive or pending:
        land_some()
        if not alive: continue
        p = rnd.choice(alive)
        try:
            next(p)
        except StopIteration:
            alive.remove(p)
        idle += 1
        if idle > 400000: raise RuntimeError(f"deadlock stages={stages} nblks={nblks} C={C} pp={pingpong}")
    assert tokens[2] == 0 and tokens[3] == 0, tokens

m = 0
for stages in range(2, 7):
    for C in (1, 2):
        for pp in (True, False):
            for seed in range(40):
                rnd = random.Random(seed * 131 + stages)
                nblks = [rnd.choice([0, 1, 2, 3, 5, 9]) for _ in range(rnd.randint(1, 5))]
                run_persistent(stages, nblks, C, pp, seed); m += 1
print("ok", m, "persistent runs")

# Mutations that must fail: the producer's Q copy without waiting for q_empty, a consumer releasing
# the Q tile before its staged epilogue, the consumers restarting the ring at every tile.
for mutation in ('q_no_wait', 'q_early_release', 'ring_reset'):
    failed = 0
    for seed in range(200):
        rnd = random.Random(seed)
        nblks = [rnd.choice([0, 1, 2, 3, 5]) for _ in range(rnd.randint(2, 5))]
        try:
            run_persistent(rnd.randint(2, 4), nblks, rnd.choice((1, 2)), True, seed, mutation)
        except (AssertionError, RuntimeError):
            failed += 1
    assert failed > 0, f"the mutation {mutation} was not caught"
    print("mutation", mutation, "caught in", failed, "of 200 runs")
