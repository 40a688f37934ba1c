"""Reference attention and the pass criterion shared by the tests.

Truth: float64 math on the upcast inputs with an explicit boolean mask (empty rows give O = 0 and
LSE = -inf, as sparge defines). Baseline: torch's SDPA in the input precision with the same mask.
A sparge result passes when its error against the truth is at most twice SDPA's error plus the
representational noise of the output dtype (the FlashAttention test criterion).
"""

import math

import torch
import torch.nn.functional as F

import sparge


def devices():
    out = ["cpu"]
    if torch.cuda.is_available() and sparge.cuda_available():
        out.append("cuda")
    return out


def to_hnd(t, layout):
    """The [B, H, S, D] view of a tensor stored in `layout`."""
    return t if layout == "HND" else t.transpose(1, 2)


def from_bshd(t_bhsd, layout):
    """Store a [B, H, S, D] tensor contiguously in `layout`."""
    return t_bhsd.contiguous() if layout == "HND" else t_bhsd.transpose(1, 2).contiguous()


def randn_qkv(b, hq, hk, sq, sk, d, dtype, device, layout, gen):
    def make(h, s):
        x = torch.randn(b, h, s, d, generator=gen, dtype=torch.float32).to(dtype)
        return from_bshd(x, layout).to(device)

    return make(hq, sq), make(hk, sk), make(hk, sk)


def _expand_kv(q, k, v):
    g = q.shape[1] // k.shape[1]
    return k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)


def ref_attention(q, k, v, mask, scale=None):
    """float64 attention on [B, H, S, D] inputs; mask [B|1, H|1, Sq, Sk] bool or None -> (o, lse)."""
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k, v = _expand_kv(q, k, v)
    q64, k64, v64 = q.double(), k.double(), v.double()
    s = (q64 @ k64.transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask.to(s.device), float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m_safe)
    l = p.sum(dim=-1, keepdim=True)
    o = torch.where(l > 0, (p @ v64) / l.clamp_min(1e-300), torch.zeros_like(q64))
    lse = torch.where(l > 0, m_safe + torch.log(l.clamp_min(1e-300)), torch.full_like(l, float("-inf")))
    return o, lse.squeeze(-1)


def sdpa_baseline(q, k, v, mask, scale=None):
    """SDPA in the input precision with the same boolean mask; empty rows (NaN) -> 0."""
    k, v = _expand_kv(q, k, v)
    m = None if mask is None else mask.to(q.device)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=scale)
    return torch.nan_to_num(o, nan=0.0)


def assert_close_to_ref(out, ref, baseline, name=""):
    """|out - ref| <= 2 |baseline - ref| + noise, elementwise maximum; NaN/Inf never allowed."""
    assert torch.isfinite(out).all(), f"{name}: non-finite values in the output"
    out64, base64 = out.double(), baseline.double()
    err = (out64 - ref).abs().max().item()
    base_err = (base64 - ref).abs().max().item()
    eps = torch.finfo(out.dtype).eps
    noise = 4 * eps * max(ref.abs().max().item(), 1.0)
    assert err <= 2 * base_err + noise, (
        f"{name}: max error {err:.3e} > 2 x SDPA's {base_err:.3e} + {noise:.3e}")


def assert_lse_close(lse, ref_lse, dtype, name=""):
    """LSE in fp32: equal -inf where the reference is -inf, close elsewhere."""
    ref_inf = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse.cpu()) & (lse.cpu() < 0), ref_inf.cpu()), f"{name}: -inf rows differ"
    fin = ~ref_inf
    if fin.any():
        tol = 1e-4 if dtype == torch.float32 else 1e-3
        err = (lse.double().cpu()[fin.cpu()] - ref_lse.cpu()[fin.cpu()]).abs().max().item()
        assert err <= tol, f"{name}: lse max error {err:.3e} > {tol}"
