"""Bad input gets a Python exception that names the parameter and the value, never a crash."""

import pytest
import torch

import sparge
from ref import devices, randn_qkv

DEVICES = devices()


def _qkv(device="cpu", dtype=None, **kw):
    dtype = dtype or (torch.float16 if device == "cuda" else torch.float32)
    shape = dict(b=1, hq=2, hk=2, sq=128, sk=128, d=64)
    shape.update(kw)
    return randn_qkv(shape["b"], shape["hq"], shape["hk"], shape["sq"], shape["sk"], shape["d"], dtype, device,
                     "HND", torch.Generator().manual_seed(0))


def test_bad_layout_string():
    q, k, v = _qkv()
    for fn in (lambda: sparge.sparge_attn(q, k, v, tensor_layout="BHSD"),
               lambda: sparge.dense_attn(q, k, v, tensor_layout="nhd"),
               lambda: torch.ops.sparge.dense_attn(q, k, v, False, 0.0, "XYZ", False)):
        with pytest.raises(ValueError, match="tensor_layout"):
            fn()


def test_unsupported_dtype():
    q, k, v = (t.double() for t in _qkv())
    with pytest.raises(ValueError, match="dtype"):
        sparge.dense_attn(q, k, v)
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="dtype"):
        sparge.dense_attn(q, k.half(), v)


def test_bad_shapes():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="dimensions"):
        sparge.sparge_attn(q[0], k[0], v[0])
    _, k64, v64 = _qkv(d=32)
    with pytest.raises(ValueError, match="k.shape"):
        sparge.dense_attn(q, k64, v64)
    _, k3, v3 = _qkv(hk=3, hq=3)
    with pytest.raises(ValueError, match="Hk"):
        sparge.dense_attn(q, k3, v3)


def test_bad_selection_parameters():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="not both"):
        sparge.sparge_attn(q, k, v, topk=0.5, cdfthreshd=0.9)
    with pytest.raises(ValueError, match="topk"):
        sparge.sparge_attn(q, k, v, topk=1.5)
    with pytest.raises(ValueError, match="topk"):
        sparge.block_map(q, k, topk=[0.5, 0.5, 0.5])  # 3 values for Hq = 2
    with pytest.raises(ValueError, match="exactly one"):
        sparge.block_map(q, k)
    with pytest.raises(NotImplementedError, match="blkq"):
        sparge.block_map(q, k, topk=0.5, blkq=96)
    with pytest.raises(ValueError, match="scale"):
        sparge.sparge_attn(q, k, v, scale=-1.0)
    with pytest.raises(ValueError, match="attn_mask"):
        sparge.spas_sage2_attn_meansim_topk_cuda(q, k, v, attn_mask=torch.ones(128, 128, dtype=torch.bool))


def test_bad_lut():
    q, k, v = _qkv()
    lut, counts = sparge.block_map(q, k, topk=0.5)
    with pytest.raises(ValueError, match="lut"):
        sparge.block_sparse_attn(q, k, v, lut[:, :, :, :1], counts)  # NK = 1 instead of 2
    with pytest.raises(ValueError):
        sparge.block_sparse_attn(q, k, v, lut.float(), counts)
    bad = lut.clone()
    bad[0, 0, 0, 0] = 99  # a key block that does not exist
    with pytest.raises(ValueError, match="lut"):
        sparge.block_sparse_attn(q, k, v, bad, counts)


def test_token_op_errors():
    with pytest.raises(ValueError, match="k = "):
        sparge.topk_select(torch.randn(4, 10), 11)
    with pytest.raises(ValueError, match="n_max"):
        sparge.compact_mask(torch.zeros(4, 10), 0)
    q, k, v = _qkv()
    idx = torch.full((1, 2, 128, 4), 200, dtype=torch.int32)  # key 200 >= Sk = 128
    cnt = torch.full((1, 2, 128), 4, dtype=torch.int32)
    with pytest.raises(ValueError):
        sparge.gather_attn(q, k, v, idx, cnt)


@pytest.mark.skipif("cuda" not in DEVICES, reason="no CUDA device or sparge built without CUDA")
def test_cuda_errors():
    q, k, v = _qkv("cuda")
    with pytest.raises(ValueError, match="device"):
        sparge.dense_attn(q, k.cpu(), v)
    with pytest.raises(ValueError, match="dtype"):
        sparge.dense_attn(q.float(), k.float(), v.float())  # fp32 is CPU-only
    lut, counts = sparge.block_map(q, k, topk=0.5)
    with pytest.raises(ValueError, match="device"):
        sparge.block_sparse_attn(q, k, v, lut.cpu(), counts)
