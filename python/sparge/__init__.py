"""sparge: SpargeAttn-style block-sparse attention and token-level sparse attention for PyTorch.

    import sparge
    o = sparge.sparge_attn(q, k, v, topk=0.4, is_causal=True)        # q, k, v: [B, H, S, D]

See docs/python.md for the build command, the API and the differences from upstream SpargeAttn.
"""

import torch  # noqa: F401  (loads libc10 / libtorch before the extension)

try:
    from . import _C  # registers torch.ops.sparge.*
except ImportError as e:  # pragma: no cover - depends on the build
    raise ImportError(
        "sparge: the compiled extension sparge._C could not be imported "
        f"({e}). Build it from the repository root with `python3 python/setup.py build_ext --inplace` "
        "(then put python/ on PYTHONPATH) or `pip install --no-build-isolation -v ./python`."
    ) from e

from . import _fake  # noqa: F401  (fake implementations for torch.compile)
from . import utils
from . import dist  # context parallelism (sparge.dist.sparge_attn, shard, unshard)
from .api import (
    CDF_API_DEFAULTS,
    DEFAULT_BLKK,
    DEFAULT_BLKQ,
    TOPK_API_DEFAULTS,
    block_map,
    block_map_varlen,
    block_sparse_attn,
    block_sparse_attn_varlen,
    compact_mask,
    dense_attn,
    dense_attn_varlen,
    gather_attn,
    merge_attn,
    sparge_attn,
    sparge_attn_varlen,
    sparsity_of,
    spas_sage2_attn_meansim_cuda,
    spas_sage2_attn_meansim_topk_cuda,
    topk_select,
)

__version__ = "0.1.0"


def built_with_cuda() -> bool:
    """Whether this build of the extension contains the CUDA backend."""
    return bool(_C.built_with_cuda)


def cuda_available() -> bool:
    """Whether the CUDA backend is built and a CUDA device is visible."""
    return bool(_C.cuda_available())


__all__ = [
    "sparge_attn", "block_map", "block_sparse_attn", "dense_attn", "topk_select", "compact_mask",
    "gather_attn", "merge_attn", "sparsity_of", "dense_attn_varlen", "block_map_varlen", "block_sparse_attn_varlen",
    "sparge_attn_varlen", "spas_sage2_attn_meansim_topk_cuda",
    "spas_sage2_attn_meansim_cuda", "built_with_cuda", "cuda_available", "utils", "dist",
    "DEFAULT_BLKQ", "DEFAULT_BLKK", "TOPK_API_DEFAULTS", "CDF_API_DEFAULTS",
]
