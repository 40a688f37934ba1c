"""Context parallelism: SpargeAttn over one long sequence sharded across the ranks of a process group.

    import torch.distributed as dist, sparge.dist
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    q_l, k_l, v_l = (sparge.dist.shard(t, dim=2) for t in (q, k, v))   # [B, H, L, D] zigzag shards
    o_l = sparge.dist.sparge_attn(q_l, k_l, v_l, topk=0.4, is_causal=True)
    o = sparge.dist.unshard(o_l, dim=2)                                 # the full [B, H, S, D]

Every rank of the group must make the same calls in the same order (the same parameters, and the
same global seq_len). The result equals single-GPU block_map + block_sparse_attn (pvthreshd=None)
on the whole sequence: the block map bit for bit, O and LSE up to fp32 merge rounding.

Communicator: sparge uses its own NCCL communicator per (group, device), created on first use
(non-blocking, from a unique id broadcast over the group) through the libnccl.so.2 torch loaded;
not the group's own, because after a failure sparge aborts (frees) the communicator it ran on,
which torch would later touch again. Failure: every wait of a call ends after `timeout` seconds;
on a timeout or NCCL error the call raises RuntimeError on that rank, the communicator is aborted
and dropped, and the next call creates a fresh one (all ranks must call again). Design:
docs/context_parallel.md; API: docs/python.md.
"""

import atexit
import math
import threading

import torch

from . import _C
from .api import DEFAULT_BLKK, DEFAULT_BLKQ, _check_block, _layout, _per_head, _scale, _selection, assemble

__all__ = ["sparge_attn", "shard", "unshard", "shard_of", "available", "release", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 300.0

_ops = torch.ops.sparge


def available() -> bool:
    """Whether this build has context parallelism (a CUDA build that found NCCL)."""
    return bool(_C._dist_available())


def shard_of(seq_len, world, rank):
    """The rows rank `rank` of `world` holds of a sequence of seq_len rows (zigzag, dist::shard_of):
    a list of two (global_begin, length) pieces, in shard order (the second may be empty)."""
    pieces, _ = _C._dist_shard_of(int(seq_len), int(world), int(rank))
    return [(int(gb), int(n)) for gb, n, _lb in pieces]


def _group_info(group):
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("sparge.dist: torch.distributed is not initialized (call init_process_group first)")
    g = group if group is not None else dist.group.WORLD
    return g, dist.get_rank(g), dist.get_world_size(g)


def _index(seq_len, world, rank, device):
    return torch.cat([torch.arange(gb, gb + n, device=device) for gb, n in shard_of(seq_len, world, rank)])


def shard(x, dim=2, group=None, rank=None, world=None):
    """This rank's zigzag shard of a full sequence tensor along `dim` (2 for HND [B, H, S, D], 1 for
    NHD). rank / world default to the group's; a contiguous copy."""
    if rank is None or world is None:
        _, r, w = _group_info(group)
        rank = r if rank is None else rank
        world = w if world is None else world
    idx = _index(x.shape[dim], world, rank, x.device)
    return x.index_select(dim, idx).contiguous()


def unshard(x_local, dim=2, seq_len=None, group=None):
    """The full sequence from every rank's shard (an all-gather over the group; every rank gets it).
    seq_len: the global length (default: the sum of the shard lengths)."""
    import torch.distributed as dist
    g, rank, world = _group_info(group)
    lens = _gather_lengths(x_local.shape[dim], g, world, x_local.device)
    s = sum(lens) if seq_len is None else int(seq_len)
    want = [sum(n for _, n in shard_of(s, world, r)) for r in range(world)]
    if lens != want:
        raise ValueError(f"sparge.dist.unshard: shard lengths {lens} do not match seq_len = {s} on {world} ranks "
                         f"(expected {want})")
    lmax = max(lens)
    pad = list(x_local.shape)
    pad[dim] = lmax
    buf = x_local.new_zeros(pad)
    buf.narrow(dim, 0, x_local.shape[dim]).copy_(x_local)
    parts = [torch.empty_like(buf) for _ in range(world)]
    dist.all_gather(parts, buf.contiguous(), group=g)
    shape = list(x_local.shape)
    shape[dim] = s
    out = x_local.new_empty(shape)
    for r in range(world):
        idx = _index(s, world, r, x_local.device)
        out.index_copy_(dim, idx, parts[r].narrow(dim, 0, lens[r]))
    return out


def _gather_lengths(length, group, world, device):
    import torch.distributed as dist
    t = torch.zeros(world, dtype=torch.int64, device=device)
    t[dist.get_rank(group)] = int(length)
    dist.all_reduce(t, group=group)
    return [int(x) for x in t.tolist()]


# ---- the communicators ---------------------------------------------------------------------------

_lock = threading.Lock()
_comms = {}  # (group name, device index) -> (comm handle, world, rank)


def _key(group, device):
    return (getattr(group, "group_name", None) or id(group), device)


def _comm(group, rank, world, device, timeout):
    import torch.distributed as dist
    key = _key(group, device)
    with _lock:
        got = _comms.get(key)
    if got is not None:
        return got[0]
    # Rank 0 of the group makes the unique id; the group broadcasts it (over its own backend, under
    # the group's timeout); then every rank joins the new communicator (bounded by `timeout`).
    uid = [_C._nccl_unique_id() if rank == 0 else None]
    with torch.cuda.device(device):
        dist.broadcast_object_list(uid, src=dist.get_global_rank(group, 0), group=group)
    handle = _C._nccl_comm_init(uid[0], world, rank, device, float(timeout))
    with _lock:
        _comms[key] = (handle, world, rank)
    return handle


def release(group=None, abort=False, timeout=60.0):
    """Destroys sparge's communicator of the group on the current device (every rank of the group
    must call it, unless abort=True: ncclCommAbort is local). The next call creates a new one."""
    g, _, _ = _group_info(group)
    key = _key(g, torch.cuda.current_device())
    with _lock:
        got = _comms.pop(key, None)
    if got is not None:
        _C._nccl_comm_release(got[0], key[1], bool(abort), float(timeout))


def _drop(key):
    with _lock:
        _comms.pop(key, None)


@atexit.register
def _release_all():  # local aborts only: peers may be gone at exit
    with _lock:
        items = list(_comms.items())
        _comms.clear()
    for (_, device), (handle, _, _) in items:
        try:
            _C._nccl_comm_release(handle, device, True, 0.0)
        except Exception:  # pragma: no cover - best effort at exit
            pass


# ---- the operation -------------------------------------------------------------------------------

def sparge_attn(q, k, v, group=None, topk=None, cdfthreshd=None, simthreshd1=None, is_causal=False,
                attention_sink=False, smooth_k=True, tensor_layout="HND", scale=None, return_lse=False,
                return_block_map=False, *, seq_len=None, blkq=DEFAULT_BLKQ, blkk=DEFAULT_BLKK,
                timeout=DEFAULT_TIMEOUT):
    """SpargeAttn over a sequence sharded across `group` (default: the world group; NCCL backend,
    one CUDA device per rank: the tensors' device).

    q, k, v: this rank's shard (shard() / shard_of(): zigzag order), [B, H, L, D] (HND) or
    [B, L, H, D] (NHD), fp16 or bf16; Hq a multiple of Hk. seq_len: the global length (default: the
    sum of the shard lengths, one small all-reduce over the group). Selection as sparge.sparge_attn
    (topk or cdfthreshd, simthreshd1 default -0.1 / 0.6); no pvthreshd (the ring cannot apply it).

    Returns o (this rank's rows, the input layout), then lse [B, Hq, L] fp32 if return_lse, then
    (lut [B, Hq, NQL, NK], counts [B, Hq, NQL]) if return_block_map: this rank's rows of the global
    block map, global key-block indices. Raises RuntimeError when a peer fails or does not call
    within `timeout` seconds (each wait of the call is bounded by it).
    """
    op = "sparge.dist.sparge_attn"
    _layout(tensor_layout, op)
    if not available():
        raise NotImplementedError(f"{op}: this build of the sparge extension has no NCCL (rebuild with CUDA and "
                                  "NCCL, SPARGE_NCCL=on)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{op}: {name} must be a 4-D tensor")
        if not t.is_cuda:
            raise ValueError(f"{op}: {name} is on {t.device} (expected CUDA tensors, one GPU per rank)")
    topk, cdfthreshd, simthreshd1 = _selection(topk, cdfthreshd, simthreshd1, op)
    t = float(timeout)
    if not math.isfinite(t) or t <= 0.0:
        raise ValueError(f"{op}: timeout = {timeout!r} (expected a finite number of seconds > 0)")
    g, rank, world = _group_info(group)
    device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    s_dim = 2 if tensor_layout == "HND" else 1
    if seq_len is None:
        seq_len = sum(_gather_lengths(q.shape[s_dim], g, world, q.device))
    seq_len = int(seq_len)
    comm = _comm(g, rank, world, device, t)
    key = _key(g, device)
    try:
        o, lse, lut, counts = _ops.dist_sparse_attn(
            q, k, v, comm, rank, world, seq_len, _per_head(topk, op, "topk"),
            _per_head(cdfthreshd, op, "cdfthreshd"), _per_head(simthreshd1, op, "simthreshd1"),
            _check_block(blkq, op, "blkq"), _check_block(blkk, op, "blkk"), bool(is_causal),
            bool(attention_sink), bool(smooth_k), _scale(scale, op), tensor_layout, bool(return_lse),
            bool(return_block_map), t)
    except RuntimeError as e:
        # After communication started, sparse_attention aborted (freed) the communicator.
        if "ncclCommAbort" in str(e):
            _drop(key)
        raise
    return assemble(o, lse if return_lse else None, (lut, counts) if return_block_map else None)
