#!/usr/bin/env python3
"""Power and SM clock of a kernel held in steady state (development probe, session 26).

Runs each workload back to back for a few seconds while nvidia-smi samples the board every 50 ms, and prints
per workload its time per launch, the median SM clock and board power over the middle half of the samples,
and the share of samples with the software power cap active. The question it answers: at a given density,
are the sm90 LUT kernel and FlexAttention on the same kind of block mask limited by the board's power cap
(then a kernel's speed is its energy per tile) or by their cycles?

  power_probe.py TRACE_BINARY [--density 0.1,0.4] [--seconds 3]

Workloads: `sparge_sm90_trace DENSITY 128 5 4` with SPARGE_TRACE_STEADY (the fp16 128 x 128 LUT kernel on a random
LUT with exactly round(density x 128) blocks per row, HND as compare.py) and FlexAttention (torch.compile, as
bench/compare.py) on a random 128 x 128 block mask with the same number of blocks per row, b2 h32 s16384 d128 fp16.
"""
import argparse
import os
import statistics
import subprocess
import time

import torch

B, H, S, D, BLK = 2, 32, 16384, 128, 128


def sampler_fields():
    """The query fields this driver knows (the power-cap reason was renamed from clocks_throttle_reasons)."""
    for reason in ("clocks_event_reasons.sw_power_cap", "clocks_throttle_reasons.sw_power_cap"):
        fields = f"clocks.sm,power.draw,{reason}"
        r = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", "0"],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return fields
    return "clocks.sm,power.draw"


class Sampler:
    FIELDS = None

    def __enter__(self):
        if Sampler.FIELDS is None:
            Sampler.FIELDS = sampler_fields()
        self.p = subprocess.Popen(["nvidia-smi", f"--query-gpu={self.FIELDS}", "--format=csv,noheader,nounits",
                                   "-i", "0", "-lms", "50"], stdout=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc):
        self.p.terminate()
        out, _ = self.p.communicate()
        rows = []
        for line in out.splitlines():
            parts = [x.strip() for x in line.split(",")]
            try:
                rows.append((float(parts[0]), float(parts[1]), len(parts) > 2 and parts[2].lower() == "active"))
            except (ValueError, IndexError):
                pass
        mid = rows[len(rows) // 4: max(len(rows) // 4 + 1, 3 * len(rows) // 4)]
        self.summary = {
            "samples": len(mid),
            "sm_mhz": statistics.median(r[0] for r in mid) if mid else float("nan"),
            "watts": statistics.median(r[1] for r in mid) if mid else float("nan"),
            "capped": sum(r[2] for r in mid) / len(mid) if mid else float("nan"),
        }


def flex_steady(n_blocks, seconds):
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
    flex = torch.compile(flex_attention, dynamic=False)
    g = torch.Generator(device="cuda").manual_seed(1)
    nq = S // BLK
    idx = torch.rand(B, H, nq, nq, device="cuda", generator=g).argsort(dim=-1)[..., :n_blocks].sort(dim=-1).values
    lut = torch.zeros(B, H, nq, nq, dtype=torch.int32, device="cuda")
    lut[..., :n_blocks] = idx.to(torch.int32)
    cnt = torch.full((B, H, nq), n_blocks, dtype=torch.int32, device="cuda")
    empty = torch.zeros_like(cnt)
    mask = BlockMask.from_kv_blocks(empty, torch.zeros_like(lut), cnt, lut, BLOCK_SIZE=(BLK, BLK), seq_lengths=(S, S))
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
    for _ in range(3):
        flex(q, k, v, block_mask=mask)
    torch.cuda.synchronize()
    t0 = time.time()
    while time.time() - t0 < 1.0:  # settle at the steady clock before sampling
        flex(q, k, v, block_mask=mask)
        torch.cuda.synchronize()
    with Sampler() as smp:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n = 0
        e0.record()
        t0 = time.time()
        while time.time() - t0 < seconds:
            for _ in range(20):
                flex(q, k, v, block_mask=mask)
            n += 20
            e1.record()
            e1.synchronize()
        ms = e0.elapsed_time(e1) / n
    return ms, smp.summary


def trace_steady(binary, density, seconds, est_ms):
    launches = max(50, int(seconds * 1000 / est_ms))
    env = dict(os.environ, SPARGE_TRACE_STEADY=str(launches), SPARGE_TRACE_HND="1")
    with Sampler() as smp:
        out = subprocess.run([binary, str(density), "128", "5", "4"], env=env, capture_output=True, text=True).stdout
    ms = float("nan")
    for line in out.splitlines():
        if line.startswith("steady:"):
            ms = float(line.split()[1])
    return ms, smp.summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--density", default="0.1,0.4")
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    rows = []
    for dens in (float(x) for x in a.density.split(",")):
        n = max(1, round(dens * S / BLK))
        # The trace harness rounds its density to blocks per row the same way (n / 128 blocks).
        ms_s, s_s = trace_steady(a.trace, n / (S // BLK), a.seconds, 14.7 * dens + 0.3)
        ms_f, s_f = flex_steady(n, a.seconds)
        useful = 4.0 * B * H * S * (n * BLK) * D
        rows.append((dens, n, "sparge 128x128", ms_s, useful / ms_s / 1e9, s_s))
        rows.append((dens, n, "flex 128x128", ms_f, useful / ms_f / 1e9, s_f))
    print(f"{'density':>7} {'blocks':>6} {'kernel':<15} {'ms':>7} {'TFLOPS':>7} {'SM MHz':>7} {'W':>6} {'capped':>6}")
    for dens, n, name, ms, tf, s in rows:
        print(f"{dens:7.2f} {n:6d} {name:<15} {ms:7.3f} {tf:7.1f} {s['sm_mhz']:7.0f} {s['watts']:6.0f} "
              f"{s['capped']:6.2f}")


if __name__ == "__main__":
    main()
