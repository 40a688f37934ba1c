"""torch.compile(fullgraph=True) over the ops (exercises the fake implementations) and opcheck."""

import pytest
import torch

import sparge
from sparge import utils
from ref import devices, randn_qkv

DEVICES = devices()


def _skip_unless(device):
    if device not in DEVICES:
        pytest.skip(f"{device}: no CUDA device or sparge built without CUDA")


def _backend(device):
    # Inductor on CUDA (the configuration users run); aot_eager on CPU keeps the test fast while
    # still tracing every op through its fake implementation.
    return "inductor" if device == "cuda" else "aot_eager"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_compile_sparge_attn(device, layout):
    _skip_unless(device)
    torch._dynamo.reset()
    dtype = torch.float16 if device == "cuda" else torch.float32
    q, k, v = randn_qkv(1, 4, 2, 256, 256, 64, dtype, device, layout, torch.Generator().manual_seed(0))

    def f(q, k, v):
        o, lse, sp = sparge.sparge_attn(q, k, v, topk=0.5, is_causal=True, tensor_layout=layout,
                                        return_lse=True, return_sparsity=True)
        return o * 2.0, lse, sp

    compiled = torch.compile(f, fullgraph=True, backend=_backend(device))
    o, lse, sp = compiled(q, k, v)
    o_e, lse_e, sp_e = sparge.sparge_attn(q, k, v, topk=0.5, is_causal=True, tensor_layout=layout,
                                          return_lse=True, return_sparsity=True)
    assert torch.equal(o, o_e * 2.0) and torch.equal(lse, lse_e)
    assert abs(float(sp) - sp_e) < 1e-6


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_compile_sparge_attn_varlen(device):
    """sparge_attn_varlen under torch.compile(fullgraph) equals the eager call bitwise."""
    _skip_unless(device)
    torch._dynamo.reset()
    dtype = torch.float16 if device == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(300, h, 64, generator=gen).to(device=device, dtype=dtype) for h in (4, 2, 2))
    cu = torch.tensor([0, 100, 300], dtype=torch.int32, device=device)

    def f(q, k, v):
        o, lse = sparge.sparge_attn_varlen(q, k, v, cu, cu, 200, 200, topk=0.5, is_causal=True, return_lse=True,
                                           blkq=64, blkk=64)
        return o * 2.0, lse

    o, lse = torch.compile(f, fullgraph=True, backend=_backend(device))(q, k, v)
    o_e, lse_e = sparge.sparge_attn_varlen(q, k, v, cu, cu, 200, 200, topk=0.5, is_causal=True, return_lse=True,
                                           blkq=64, blkk=64)
    assert torch.equal(o, o_e * 2.0) and torch.equal(lse, lse_e)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_compile_block_sparse_attn_and_merge(device):
    _skip_unless(device)
    torch._dynamo.reset()
    dtype = torch.float16 if device == "cuda" else torch.float32
    q, k, v = randn_qkv(2, 2, 2, 192, 192, 128, dtype, device, "HND", torch.Generator().manual_seed(1))
    bm = torch.rand(2, 2, 3, 3, generator=torch.Generator().manual_seed(2)) < 0.5
    lut_a, cnt_a = (t.to(device) for t in utils.lut_from_block_mask(bm))
    lut_b, cnt_b = (t.to(device) for t in utils.lut_from_block_mask(~bm))

    def f(q, k, v):
        oa, la = sparge.block_sparse_attn(q, k, v, lut_a, cnt_a, blkq=64, blkk=64, return_lse=True)
        ob, lb = sparge.block_sparse_attn(q, k, v, lut_b, cnt_b, blkq=64, blkk=64, return_lse=True)
        return sparge.merge_attn(oa, la, ob, lb)

    o, lse = torch.compile(f, fullgraph=True, backend=_backend(device))(q, k, v)
    o_e, lse_e = f(q, k, v)
    assert torch.equal(o, o_e) and torch.equal(lse, lse_e)
    o_d, lse_d = sparge.dense_attn(q, k, v, return_lse=True)
    assert (o.float() - o_d.float()).abs().max().item() < 1e-2


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_compile_token_ops(device):
    _skip_unless(device)
    torch._dynamo.reset()
    dtype = torch.float16 if device == "cuda" else torch.float32
    q, k, v = randn_qkv(1, 2, 2, 128, 128, 64, dtype, device, "HND", torch.Generator().manual_seed(3))

    def f(q, k, v):
        scores = (q.float() @ k.float().transpose(-1, -2))
        idx, cnt = sparge.topk_select(scores, 16)
        return sparge.gather_attn(q, k, v, idx, cnt, is_causal=True)

    o = torch.compile(f, fullgraph=True, backend=_backend(device))(q, k, v)
    assert torch.equal(o, f(q, k, v))


def _opcheck_cases(device):
    dtype = torch.float16 if device == "cuda" else torch.float32
    q, k, v = randn_qkv(1, 2, 1, 128, 192, 64, dtype, device, "NHD", torch.Generator().manual_seed(4))
    lut, counts = sparge.block_map(q, k, topk=0.5, tensor_layout="NHD")
    o, lse = sparge.dense_attn(q, k, v, tensor_layout="NHD", return_lse=True)
    scores = torch.randn(8, 100, device=device)
    idx, cnt = sparge.topk_select(torch.randn(1, 2, 128, 192, device=device), 8)
    ops = torch.ops.sparge
    return [
        (ops.block_map, (q, k, [0.5], None, [-0.1], 64, 64, True, False, True, 0.0, "NHD")),
        (ops.block_sparse_attn, (q, k, v, lut, counts, sparge.DEFAULT_BLKQ, sparge.DEFAULT_BLKK, False, 0.0, [50.0],
                                 "NHD", True)),
        (ops.block_sparse_attn, (q, k, v, lut, counts, sparge.DEFAULT_BLKQ, sparge.DEFAULT_BLKK, False, 0.0, None,
                                 "NHD", False)),
        (ops.dense_attn, (q, k, v, True, 0.0, "NHD", True)),
        (ops.topk_select, (scores, 10)),
        (ops.compact_mask, (torch.where(scores > 0, 0.0, float("-inf")), 100)),
        (ops.gather_attn, (q, k, v, idx, cnt, False, 0.0, False, 64, "NHD", True, True)),
        (ops.merge_attn, (o, lse, o, lse, "NHD")),
    ]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_opcheck(device):
    _skip_unless(device)
    for op, args in _opcheck_cases(device):
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
