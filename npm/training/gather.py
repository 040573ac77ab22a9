"""The cross-rank candidate pool of the contrastive loss (paper 3.2-3.3; paper-map §2.4, §9 item 18).

Every rank encodes its own batch line; the unmasked target vectors of several ranks form one candidate pool
that every query of those ranks is scored against. The original gathers all ranks and, with
``contrastive_negative_selection=half``, keeps only the ranks of this rank's half of the world.

* The vectors are gathered **with gradient**: the backward pass sums the gradient of the pooled tensor over
  the ranks of the pool (all_reduce SUM) and hands each rank the slice of its own rows. Rank r's local
  gradient is then d(sum of the pool's per-rank losses)/d(its targets); DDP's averaging of parameter
  gradients over the world turns this into exactly the gradient of the mean of the per-rank losses.
* Token ids and valid flags travel as separate int64 / uint8 tensors, never inside the (possibly bf16/fp16)
  vector tensor: half precision cannot hold ids such as 50264 exactly (paper-map §2.4 caution, §9 item 18).
* Ranks may hold different row lengths (each batch is padded to its own longest row) and even different
  numbers of sequences: before gathering, every rank pads to the maximum over the pool (vectors 0, id 0,
  valid False), so padding never becomes a positive or a negative.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

POOLS = ("all", "half")
_HALF_GROUPS: dict = {}


def pool_ranks(rank: int, world: int, pool: str) -> list[int]:
    """Global ranks whose targets form rank ``rank``'s candidate pool (in rank order).

    "all": every rank. "half": the ranks of this rank's half of the world, [0, W/2) or [W/2, W), as the
    original with ``contrastive_negative_selection=half`` (paper-map §2.4). With a world of 1, "half" == "all".
    """
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {POOLS}, not {pool!r}")
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not inside a world of {world}")
    if pool == "all" or world == 1:
        return list(range(world))
    if world % 2:
        raise ValueError(f"pool='half' needs an even number of ranks, not {world}; use pool='all' or an even world")
    half = world // 2
    first = 0 if rank < half else half
    return list(range(first, first + half))


def _group(rank: int, world: int, pool: str):
    """The process group of this rank's pool (None = the default group). Created once, by every rank."""
    ranks = pool_ranks(rank, world, pool)
    if len(ranks) == world:
        return None
    key = (id(dist.group.WORLD), world)
    if key not in _HALF_GROUPS:
        # new_group is collective: every rank creates both halves, in the same order.
        half = world // 2
        _HALF_GROUPS[key] = (dist.new_group(list(range(half))), dist.new_group(list(range(half, world))))
    return _HALF_GROUPS[key][0 if rank < world // 2 else 1]


class _GatherWithGrad(torch.autograd.Function):
    """all_gather along dim 0 whose backward sums the gradient over the group and returns this rank's slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group):
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        size = dist.get_world_size(group)
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        ctx.rows = x.shape[0]
        return torch.cat(parts, 0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        start = ctx.rank * ctx.rows
        return grad[start : start + ctx.rows], None


def _gather_plain(x: torch.Tensor, group) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, 0)


def candidate_pool(
    targets: torch.Tensor, target_ids: torch.Tensor, target_valid: torch.Tensor, pool: str = "all"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The pool of target vectors this rank's queries are scored against.

    targets [B, L, h] (unmasked-view vectors, with gradient), target_ids [B, L] int, target_valid [B, L] bool.
    Returns pool_vectors [S, Lp, h], pool_ids [S, Lp] int64, pool_valid [S, Lp] bool and ``offset``, the index
    of this rank's first sequence in the pool (so a query of local sequence b belongs to pool row offset + b).
    Single process (torch.distributed not initialised, or a world of 1): the inputs themselves, offset 0.
    """
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {POOLS}, not {pool!r}")
    ids, valid = target_ids.long(), target_valid.bool()
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return targets, ids, valid, 0
    group = _group(dist.get_rank(), dist.get_world_size(), pool)
    size = dist.get_world_size(group)
    if size == 1:  # "half" of a world of 2: every rank pools only its own batch
        return targets, ids, valid, 0
    rows, length = targets.shape[:2]
    shape = torch.tensor([rows, length], dtype=torch.int64, device=targets.device)
    dist.all_reduce(shape, op=dist.ReduceOp.MAX, group=group)
    max_rows, max_len = (int(v) for v in shape.tolist())
    pad_rows, pad_len = max_rows - rows, max_len - length
    if pad_rows or pad_len:
        targets = F.pad(targets, (0, 0, 0, pad_len, 0, pad_rows))  # differentiable; the pad gets no gradient
        ids = F.pad(ids, (0, pad_len, 0, pad_rows), value=0)
        valid = F.pad(valid.to(torch.uint8), (0, pad_len, 0, pad_rows), value=0).bool()
    pool_vectors = _GatherWithGrad.apply(targets, group)
    pool_ids = _gather_plain(ids, group)
    pool_valid = _gather_plain(valid.to(torch.uint8), group).bool()  # gloo has no bool collectives
    return pool_vectors, pool_ids, pool_valid, dist.get_rank(group) * max_rows
