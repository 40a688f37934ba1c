"""The fake (meta) implementations in sparge/_fake.py against the real ops, output by output.

torch.compile plans its buffers from the fake outputs; a fake that disagrees with the real op in
shape, dtype, stride or device lets compiled code read or write past a real buffer. Every op and
every optional output (lse with return_lse False and True) in both layouts is compared here, on
CPU tensors always (this runs without a GPU) and on CUDA when it is available. Error paths run after
the fakes were exercised must still raise (not crash).
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import sparge
from ref import devices, randn_qkv

DEVICES = devices()


def _skip_unless(device):
    if device not in DEVICES:
        pytest.skip(f"{device}: no CUDA device or sparge built without CUDA")


def _cases(device, layout):
    """(name, op, args) for every op, with both return_lse values where the op has one."""
    dtype = torch.float16 if device == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(7)
    q, k, v = randn_qkv(1, 4, 2, 130, 200, 64, dtype, device, layout, gen)
    ops = torch.ops.sparge
    lut, counts = sparge.block_map(q, k, topk=0.5, tensor_layout=layout)
    o, lse = sparge.dense_attn(q, k, v, tensor_layout=layout, return_lse=True)
    scores = torch.randn(6, 50, generator=gen).to(device)
    mask = torch.where(scores > 0, 0.0, float("-inf"))
    idx, cnt = sparge.topk_select(torch.randn(1, 4, 130, 200, generator=gen).to(device), 8)
    out = [
        ("block_map", ops.block_map, (q, k, [0.5], None, [-0.1], 64, 64, True, False, True, 0.0, layout)),
        ("block_map_128x64", ops.block_map, (q, k, None, [0.9], None, 128, 64, False, False, False, 0.0, layout)),
        ("topk_select", ops.topk_select, (scores, 10)),
        ("compact_mask", ops.compact_mask, (mask, 50)),
        ("merge_attn", ops.merge_attn, (o, lse, o, lse, layout)),
    ]
    # Varlen: two packed sequences ([total, H, D], 'HND' = [H, total, D]).
    cu = torch.tensor([0, 70, 200], dtype=torch.int32, device=device)
    qp, kp, vp = (torch.randn(200, h, 64, generator=gen).to(device=device, dtype=dtype) for h in (4, 2, 2))
    if layout == "HND":
        qp, kp, vp = (t.transpose(0, 1) for t in (qp, kp, vp))
    lut_v, counts_v = sparge.block_map_varlen(qp, kp, cu, cu, 130, 130, topk=0.5, blkq=64, blkk=64,
                                              tensor_layout=layout)
    out.append(("block_map_varlen", ops.block_map_varlen,
                (qp, kp, cu, cu, 130, 130, [0.5], None, [-0.1], 64, 64, True, False, True, 0.0, layout)))
    for want_lse in (False, True):
        tag = "lse" if want_lse else "nolse"
        out += [
            (f"dense_attn_varlen_{tag}", ops.dense_attn_varlen, (qp, kp, vp, cu, cu, 130, 130, True, 0.0, layout, want_lse)),
            (f"block_sparse_attn_varlen_{tag}", ops.block_sparse_attn_varlen,
             (qp, kp, vp, lut_v, counts_v, cu, cu, 130, 130, 64, 64, False, 0.0, None, layout, want_lse)),
        ]
    for want_lse in (False, True):
        tag = "lse" if want_lse else "nolse"
        out += [
            (f"block_sparse_attn_{tag}", ops.block_sparse_attn,
             (q, k, v, lut, counts, sparge.DEFAULT_BLKQ, sparge.DEFAULT_BLKK, False, 0.0, None, layout, want_lse)),
            (f"dense_attn_{tag}", ops.dense_attn, (q, k, v, True, 0.0, layout, want_lse)),
            (f"gather_attn_{tag}", ops.gather_attn, (q, k, v, idx, cnt, True, 0.0, False, 64, layout, want_lse, True)),
        ]
    return out


def _meta(t):
    return (tuple(t.shape), t.dtype, tuple(t.stride()), t.device)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_fake_outputs_match_real(device, layout):
    _skip_unless(device)
    for name, op, args in _cases(device, layout):
        real = op(*args)
        with FakeTensorMode(allow_non_fake_inputs=False) as mode:
            fake_args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
            fake = op(*fake_args)
        assert len(real) == len(fake), name
        for i, (r, f) in enumerate(zip(real, fake)):
            assert _meta(r) == _meta(f), f"{name} output {i}: real {_meta(r)} vs fake {_meta(f)}"
            assert r.is_contiguous(), f"{name} output {i} is not contiguous"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_opcheck_every_optional_output(device):
    """opcheck (schema, fake tensor, aot dispatch) on the cases test_compile's opcheck leaves out."""
    _skip_unless(device)
    for layout in ("HND", "NHD"):
        for name, op, args in _cases(device, layout):
            torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_errors_after_fake_and_compile():
    """The validation error of test_errors.py::test_bad_shapes, raised after fakes and a compile ran."""
    torch._dynamo.reset()
    q, k, v = randn_qkv(1, 2, 2, 128, 128, 64, torch.float32, "cpu", "HND", torch.Generator().manual_seed(0))

    def f(q, k, v):
        return sparge.dense_attn(q, k, v, return_lse=True)

    torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    _, k32, v32 = randn_qkv(1, 2, 2, 128, 128, 32, torch.float32, "cpu", "HND", torch.Generator().manual_seed(1))
    for _ in range(3):
        with pytest.raises(ValueError, match="k.shape"):
            sparge.dense_attn(q, k32, v32)
