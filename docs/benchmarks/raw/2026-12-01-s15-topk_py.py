# Where the Python call of topk_select spends its time (session 15): CUDA-event medians of the
# default call, the call with SPARGE_TOPK_NO_SYNC=1, each variant, a tiny call (fixed costs), and
# torch.topk, all in one process.
import os, statistics, time, torch, sparge
def med(fn, iters=30, warm=5):
    for _ in range(warm): fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    wall = []
    for a, b in ev:
        t = time.perf_counter(); a.record(); fn(); b.record(); wall.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev), 1e3 * statistics.median(wall)
for dt in (torch.float32, torch.float16):
    x = torch.randn(512, 131072, device="cuda", dtype=dt)
    tiny = torch.randn(1, 64, device="cuda", dtype=dt)
    rows = []
    for v in ("0", "6"):
        os.environ["SPARGE_TOPK_VARIANT"] = v
        rows.append((f"sparge v={v}", med(lambda: sparge.topk_select(x, 2048))))
        os.environ["SPARGE_TOPK_NO_SYNC"] = "1"
        rows.append((f"sparge v={v} NO_SYNC", med(lambda: sparge.topk_select(x, 2048))))
        del os.environ["SPARGE_TOPK_NO_SYNC"]
    os.environ.pop("SPARGE_TOPK_VARIANT", None)
    rows.append(("sparge tiny 1x64 k=8", med(lambda: sparge.topk_select(tiny, 8))))
    rows.append(("torch.ops raw", med(lambda: torch.ops.sparge.topk_select(x, 2048))))
    rows.append(("torch.topk", med(lambda: torch.topk(x, 2048, dim=-1))))
    for name, (ev, wall) in rows:
        print(f"{str(dt):14s} {name:24s} events {ev:.3f} ms  host wall {wall:.3f} ms")

# Where the host time goes: torch.profiler over 50 calls (CPU ops and CUDA runtime calls).
from torch.profiler import profile, ProfilerActivity
x = torch.randn(512, 131072, device="cuda", dtype=torch.float32)
for _ in range(5): sparge.topk_select(x, 2048)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(50): sparge.topk_select(x, 2048)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
import cProfile, pstats
pr = cProfile.Profile(); pr.enable()
for _ in range(200): sparge.topk_select(x, 2048)
pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(12)
