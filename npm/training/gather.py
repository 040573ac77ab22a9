"""The cross-rank candidate pool of the contrastive loss (paper 3.2-3.3; paper-map §2.4, §9 item 18).

Every rank encodes its own batch lines; the unmasked target vectors of a group of consecutive ranks form one candidate
pool that every query of those ranks is scored against. The original gathers all ranks and, with
``contrastive_negative_selection=half``, keeps only the ranks of this rank's half of the world: on its 32 GPUs x 16
sequences a pool of 256 sequences (docs/paper-scale.md, "The paper's pool on fewer GPUs").

``pool`` names the group: "all" ranks, this rank's "half" of the world, or a whole number of **sequences**
(e.g. 256), which must be a multiple of the sequences one rank holds per micro-step (``lines_per_rank`` x the
sequences of a batch line) and whose number of ranks must divide the world (``ranks_per_pool``). With an integer
pool every rank must hold the same number of sequences (the training loop guarantees it: every batch line of the
training data has the data's batch size).

* The vectors are gathered **with gradient**: the backward pass sums the gradient of the pooled tensor over
  the ranks of the pool (all_reduce SUM) and hands each rank the slice of its own rows. Rank r's local
  gradient is then d(sum of the pool's per-rank losses)/d(its targets); DDP's averaging of parameter
  gradients over the world turns this into exactly the gradient of the mean of the per-rank losses.
* Token ids and valid flags travel as separate int64 / uint8 tensors, never inside the (possibly bf16/fp16)
  vector tensor: half precision cannot hold ids such as 50264 exactly (paper-map §2.4 caution, §9 item 18).
* Ranks may hold different row lengths (each batch is padded to its own longest row) and, with "all" or "half",
  different numbers of sequences: before gathering, every rank pads to the maximum over the pool (vectors 0, id 0,
  valid False), so padding never becomes a positive or a negative.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

POOLS = ("all", "half")  # or a positive int: sequences per pool
_GROUPS: dict = {}


def parse_pool(value: str | int) -> str | int:
    """A ``pool`` setting as given on the command line or in the config: "all", "half" or a positive integer."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if value in POOLS or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise ValueError(f"pool must be 'all', 'half' or a positive number of sequences (e.g. 256), not {value!r}; "
                     "set training.pool / train --pool")


def ranks_per_pool(pool: str | int, world: int, sequences_per_rank: int | None = None) -> int:
    """How many consecutive ranks form one candidate pool.

    "all": the world. "half": half of it (a world of 1 keeps its one rank). An integer pool of P sequences:
    P / ``sequences_per_rank`` (the sequences each rank holds per micro-step, lines_per_rank x sequences per batch
    line), which must be a whole number that divides the world.
    """
    pool = parse_pool(pool)
    if world < 1:
        raise ValueError(f"a world of {world} ranks cannot hold a pool")
    if pool == "all" or (pool == "half" and world == 1):
        return world
    if pool == "half":
        if world % 2:
            raise ValueError(f"pool='half' needs an even number of ranks, not {world}; use pool='all' or an even world")
        return world // 2
    if sequences_per_rank is None or sequences_per_rank < 1:
        raise ValueError(f"pool={pool} sequences needs the sequences each rank holds, not {sequences_per_rank!r}")
    fits = [sequences_per_rank * d for d in range(1, world + 1) if world % d == 0]
    if pool % sequences_per_rank or world % (pool // sequences_per_rank):
        raise ValueError(
            f"pool={pool} sequences is not a group of whole ranks that divides the world: each of the {world} ranks "
            f"holds {sequences_per_rank} sequences (lines_per_rank x the sequences of a batch line); pools of "
            f"{fits} sequences fit (training.pool / train --pool), or change lines_per_rank or the number of GPUs")
    return pool // sequences_per_rank


def pool_ranks(rank: int, world: int, pool: str | int, sequences_per_rank: int | None = None) -> list[int]:
    """Global ranks whose targets form rank ``rank``'s candidate pool (in rank order): the group
    [g*k, (g+1)*k) holding ``rank``, k = ``ranks_per_pool``. "half" gives [0, W/2) or [W/2, W), as the original with
    ``contrastive_negative_selection=half`` (paper-map §2.4)."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not inside a world of {world}")
    k = ranks_per_pool(pool, world, sequences_per_rank)
    first = rank // k * k
    return list(range(first, first + k))


def _group(rank: int, world: int, k: int, device: torch.device):
    """The process group of this rank's pool of ``k`` ranks (None: the default group, or no group for k = 1). On the
    first call every rank checks that all ask for the same k (else they would wait for each other forever), then the
    W/k groups are created once, by every rank in the same order (new_group is collective)."""
    key = (id(dist.group.WORLD), world, k)
    if key not in _GROUPS:
        ks = torch.tensor([k, -k], dtype=torch.int64, device=device)
        dist.all_reduce(ks, op=dist.ReduceOp.MAX)
        if int(ks[0]) != -int(ks[1]):
            raise ValueError(f"the ranks disagree on the pool's size (from {-int(ks[1])} to {int(ks[0])} ranks): with "
                             "an integer pool every rank must hold the same number of sequences")
        _GROUPS[key] = [dist.new_group(list(range(first, first + k))) for first in range(0, world, k)] \
            if 1 < k < world else None
    return None if _GROUPS[key] is None else _GROUPS[key][rank // k]


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
    targets: torch.Tensor, target_ids: torch.Tensor, target_valid: torch.Tensor, pool: str | int = "all"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The pool of target vectors this rank's queries are scored against.

    targets [B, L, h] (unmasked-view vectors of all this rank's sequences, with gradient), target_ids [B, L] int,
    target_valid [B, L] bool; ``pool`` as ``ranks_per_pool`` (an integer pool counts this rank's B sequences per rank).
    Returns pool_vectors [S, Lp, h], pool_ids [S, Lp] int64, pool_valid [S, Lp] bool and ``offset``, the index
    of this rank's first sequence in the pool (so a query of local sequence b belongs to pool row offset + b).
    A pool of one rank, or a single process (torch.distributed not initialised): the inputs themselves, offset 0.
    """
    ids, valid = target_ids.long(), target_valid.bool()
    distributed = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size() if distributed else 1
    k = ranks_per_pool(pool, world, targets.shape[0])
    if k == 1:
        if distributed and world > 1:
            _group(dist.get_rank(), world, k, targets.device)  # every rank checks that all pools are single ranks
        return targets, ids, valid, 0
    group = _group(dist.get_rank(), world, k, targets.device)
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
