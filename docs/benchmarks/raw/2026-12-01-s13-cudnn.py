# cuDNN SDPA reference timings (same method as bench/compare.py: warmup, median of CUDA events).
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
def t(b, h, s, d, causal, reps=10):
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
    f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(3): f()
        ts = []
        for _ in range(reps):
            a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); f(); e.record(); e.synchronize(); ts.append(a.elapsed_time(e))
    ts.sort(); ms = ts[len(ts) // 2]
    fl = 4 * b * h * s * s * d / (2 if causal else 1)
    print(f"CUDNN d={d} causal={int(causal)} median {ms:.3f} ms min {ts[0]:.3f} -> {fl / ms / 1e9:.1f} TFLOPS", flush=True)
for d, c in ((128, False), (128, True), (64, False)):
    t(2, 32, 16384, d, c)
