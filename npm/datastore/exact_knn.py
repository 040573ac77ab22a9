"""Exact top-k inner-product search over the datastore's vectors, in torch, on the CPU or a GPU (closed-set kNN,
paper-map §4.1; the search a Flat FAISS index makes, without FAISS and without faiss-gpu).

The rows go through in blocks of ``BLOCK_ROWS``: one matrix product per block gives the fp32 scores ``q . e`` of
every query against the block; the block's rows that beat the running k-th score (all of them until k are held) are
kept aside, and merged with the running top k once they number k (``torch.topk``'s k-th value, then a mask) instead
of going through a heap. FAISS Flat keeps a heap (a reservoir at k >= 100) per query and, below its BLAS threshold,
scans the rows once per query; at NPM's k = 4096 that is the slow part of closed-set inference on a CPU.

* Precision: on the CPU the vectors are held in fp32 (a Flat index's own storage, no copy; fp16 blocks are widened
  once, when the search is built: widening at every search cost more than the product for one query); on a GPU
  they are held in fp16 and widened on the device one block at a time (fp16 in, fp32 scores out). Queries stay
  fp32 and TF32 is off during a search, so a score is the fp32 inner product FAISS Flat (which holds the same
  vectors widened) ranks by, up to the summation order of the product. Callers that need the score exactly as
  elsewhere recompute it (``faiss_index.exact_scores``).
* Ties, which FAISS Flat leaves unspecified (at k >= 100 its reservoir keeps any of the rows tied at the k-th
  score): the k rows of highest score, equal scores at the k-th place going to the **lower row id**. The list
  comes in FAISS's order: score descending, equal scores by row id descending.
* ``k`` larger than the datastore is clamped to its row count (as ``faiss_index.search``). A NaN score (a
  vector that overflowed fp16) ranks below every number.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator

import numpy as np
import torch

BLOCK_ROWS = 1 << 15  # rows per matrix product: 48 MB of fp32 at h = 384, a few ms of work per block


class ExactKnn:
    """The rows of a datastore, held for exact search on ``device``: ``blocks`` yields ``(first_row, float16 or
    float32 [rows, h])`` in row order without gaps (``Datastore.iter_vectors``, or the fp32 storage of a Flat FAISS
    index, ``faiss_index.flat_vectors``). On the CPU fp32 blocks are used where they are (no copy) and fp16 ones
    widened once, here; on a GPU the blocks are copied there once as fp16 (2 bytes per value) and widened on the
    device one block at a time. ``block_rows``: rows per matrix product."""

    def __init__(self, blocks: Iterable[tuple[int, np.ndarray]], device: str | torch.device = "cpu",
                 block_rows: int = BLOCK_ROWS):
        self.device = torch.device(device)
        self.blocks: list[tuple[int, torch.Tensor]] = []
        n_rows, dim = 0, None
        for first, block in blocks:
            if first != n_rows or block.ndim != 2 or (dim is not None and block.shape[1] != dim):
                raise ValueError(f"block at row {first} of shape {block.shape} does not follow {n_rows} rows of "
                                 f"width {dim}")
            n_rows, dim = n_rows + len(block), block.shape[1]
            dtype = np.float32 if self.device.type == "cpu" else np.float16
            for a in range(0, len(block), block_rows):
                self.blocks.append((first + a, _tensor(block[a:a + block_rows], dtype).to(self.device)))
        if not n_rows:
            raise ValueError("exact kNN over an empty datastore")
        self.n_rows, self.dim = n_rows, dim

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(rows int64 [q, k'], scores float32 [q, k'])``, ``k' = min(k, n_rows)``: the k' rows of highest
        ``q . e`` per query (float32 [q, h]), in FAISS Flat's order (module docstring)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"queries must be [q, {self.dim}], got shape {queries.shape}")
        k = min(int(k), self.n_rows)
        q = torch.from_numpy(queries).to(self.device)
        best_s = torch.empty((len(q), 0), dtype=torch.float32, device=self.device)
        best_i = torch.empty((len(q), 0), dtype=torch.int64, device=self.device)
        pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # candidates above the k-th score, not merged yet
        with torch.inference_mode(), _exact_fp32(self.device):
            for first, block in self.blocks:
                s = (block.float() @ q.T).T.contiguous().nan_to_num_(nan=-torch.inf)
                pending.append(_candidates(s, first, best_s, k, self.n_rows))
                if sum(c.shape[1] for c, _ in pending) >= k or best_s.shape[1] < k:  # merged like a reservoir
                    best_s, best_i = _merge(torch.cat([best_s, *(c for c, _ in pending)], 1),
                                            torch.cat([best_i, *(i for _, i in pending)], 1), k)
                    pending = []
            best_s, best_i = _merge(torch.cat([best_s, *(c for c, _ in pending)], 1),
                                    torch.cat([best_i, *(i for _, i in pending)], 1), k)
            # FAISS's order: ids descending within equal scores (flip), then a stable sort by score.
            best_s, best_i = best_s.flip(1), best_i.flip(1)
            order = torch.sort(best_s, dim=1, descending=True, stable=True).indices
            best_s, best_i = best_s.gather(1, order), best_i.gather(1, order)
        return best_i.cpu().numpy(), best_s.cpu().numpy()


def _tensor(part: np.ndarray, dtype) -> torch.Tensor:
    """``part`` as a CPU tensor of ``dtype``, sharing its memory where it already is one (a read-only memmap or
    index storage: the tensors are only ever read, so torch's warning about non-writable arrays does not apply)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.ascontiguousarray(part, dtype=dtype))


def _candidates(s: torch.Tensor, first: int, best_s: torch.Tensor, k: int, pad_id: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The scores of a block ``s`` [q, m] (rows ``first``..) that can still enter the top k, with their ids,
    ascending per query: all of them until ``best_s`` holds k, then only those above its k-th score (an equal one
    loses to the lower id already held), laid left and padded with ``-inf`` / ``pad_id`` to the longest query's
    count. The filter keeps the selection to a compare over most of the datastore, as FAISS's threshold does."""
    q, m = s.shape
    if best_s.shape[1] < k:
        return s, torch.arange(first, first + m, device=s.device).expand(q, -1)
    enter = s > best_s.min(dim=1, keepdim=True).values
    count = enter.sum(dim=1)
    width = int(count.max())
    row, col = enter.nonzero(as_tuple=True)  # row-major: per query, ascending column
    slot = torch.arange(len(row), device=s.device) - (torch.cumsum(count, 0) - count)[row]
    out_s = torch.full((q, width), -torch.inf, device=s.device)
    out_i = torch.full((q, width), pad_id, dtype=torch.int64, device=s.device)
    out_s[row, slot] = s[row, col]
    out_i[row, slot] = col + first
    return out_s, out_i


def _merge(scores: torch.Tensor, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best of each row of ``scores`` [q, m] with their ``ids`` (ascending along each row), ties at the k-th
    score to the lower id; returned with ids still ascending. Every row keeps exactly k, so the masks reshape."""
    if scores.shape[1] <= k:
        return scores, ids
    kth = torch.topk(scores, k, dim=1, sorted=False).values.min(dim=1, keepdim=True).values
    above = scores > kth
    tied = scores == kth
    need = k - above.sum(dim=1, keepdim=True)
    keep = above | (tied & (torch.cumsum(tied, dim=1) <= need))
    return scores[keep].view(len(scores), k), ids[keep].view(len(scores), k)


@contextlib.contextmanager
def _exact_fp32(device: torch.device) -> Iterator[None]:
    """fp32 matrix products on a GPU without TF32 (10-bit mantissas would reorder near neighbours), restored after."""
    if device.type != "cuda":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


__all__ = ["BLOCK_ROWS", "ExactKnn"]
