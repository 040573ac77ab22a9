"""Training data: the masked batch lines of every training shard, in a seeded order, resumable.

One item is one batch line (B sequences of one document group; paper-map §2.1/§2.3: one line per GPU per step in
the original). The order is a permutation per epoch seeded with (seed, epoch), cut into micro-steps of W x
lines_per_rank consecutive lines: rank r of a world of W takes the lines_per_rank consecutive lines
[r * lines_per_rank, (r+1) * lines_per_rank) of each (with one line per rank: items r, r+W, ..., as before). A step
is ``accumulate`` consecutive micro-steps, and a pool of P sequences is P / B consecutive lines of a micro-step
(``npm.training.gather``), so the lines of a step and their grouping into pools depend only on the seed, the epoch,
the lines per step (W x lines_per_rank x accumulate) and the pool's size, not on how a step is split into ranks,
lines per rank and micro-steps (docs/paper-scale.md, "The paper's pool on fewer GPUs"). Each epoch drops the
permutation's last lines that do not fill a whole step. The position (epoch, cursor) is part of the training state,
so a resumed run continues with the next line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npm.io import load_npz
from npm.settings import TrainingSettings


def check_spans(masked: dict[str, np.ndarray], block_offsets: np.ndarray, path) -> None:
    """Every span (sequence, start, length) of a masked batches file (docs/data-contracts.md) lies inside its
    sequence: 0 <= sequence < B, start >= 0, length >= 1, start + length <= the block's length. Vectorised."""
    batches, offsets, spans = masked["batches"], masked["span_offsets"].astype(np.int64), masked["spans"]
    n = len(batches)
    if spans.ndim != 2 or spans.shape[1] != 3 or len(offsets) != n + 1 or offsets[0] != 0 \
            or offsets[-1] != len(spans) or (np.diff(offsets) < 0).any():
        raise ValueError(f"{path}: span_offsets {len(offsets)} and spans {spans.shape} do not fit {n} batch lines "
                         "(span_offsets [n+1] from 0 to len(spans), spans [n_spans, 3]); re-run mask_batches")
    line = np.repeat(np.arange(n), np.diff(offsets))
    seq, start, length = (spans[:, i].astype(np.int64) for i in range(3))
    in_line = (seq >= 0) & (seq < batches.shape[1])
    tokens = np.diff(block_offsets)[batches[line, np.where(in_line, seq, 0)]]
    bad = ~in_line | (start < 0) | (length < 1) | (start + length > tokens)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        has = f"it has {int(tokens[k])} tokens" if in_line[k] else f"the line has {batches.shape[1]} sequences"
        raise ValueError(f"{path}: batch line {int(line[k])}, span {k} (sequence {seq[k]}, start {start[k]}, length "
                         f"{length[k]}) lies outside its sequence ({has}); re-run mask_batches with the blocks and "
                         "batches files of this shard")


class BatchLines:
    """All masked batch lines of a list of (blocks, masked) shard files, as flat arrays."""

    def __init__(self, pairs: list[tuple[str | Path, str | Path]]):
        if not pairs:
            raise ValueError("no training shards given")
        self.shards = []
        items = []
        for k, (blocks_path, masked_path) in enumerate(pairs):
            blocks, masked = load_npz(blocks_path), load_npz(masked_path)
            for key in ("batches", "span_offsets", "spans"):
                if key not in masked:
                    raise ValueError(f"{masked_path}: not a masked batch file (no '{key}' array)")
            n = len(masked["batches"])
            spans_per_line = np.diff(masked["span_offsets"])
            if n and (spans_per_line == 0).any():
                bad = int(np.flatnonzero(spans_per_line == 0)[0])
                raise ValueError(f"{masked_path}: batch line {bad} has no masked span")
            if masked["batches"].size and (masked["batches"].max() >= len(blocks["block_offsets"]) - 1
                                           or masked["batches"].min() < 0):
                raise ValueError(f"{masked_path}: refers to blocks missing from {blocks_path}")
            check_spans(masked, blocks["block_offsets"], masked_path)
            self.shards.append((blocks["input_ids"], blocks["block_offsets"], masked, str(masked_path)))
            items.append(np.stack([np.full(n, k), np.arange(n)], axis=1))
        self.items = np.concatenate(items)
        if len(self.items) == 0:
            raise ValueError(f"the training shards hold no batch line: {[str(m) for _, m in pairs]}")

    def __len__(self) -> int:
        return len(self.items)

    def line(self, index: int) -> tuple[list[np.ndarray], np.ndarray, str]:
        """Sequences and spans (sequence, start, length) of item ``index``; the last value names it for errors."""
        shard, row = self.items[index]
        ids, offsets, masked, path = self.shards[shard]
        blocks = masked["batches"][row]
        sequences = [ids[offsets[b] : offsets[b + 1]].astype(np.int64) for b in blocks]
        spans = masked["spans"][masked["span_offsets"][row] : masked["span_offsets"][row + 1]]
        return sequences, spans, f"{path} line {row}"

    def sequences_per_line(self) -> int:
        """The sequences of every batch line (the batch size of the batches files; one for all shards)."""
        sizes = {path: masked["batches"].shape[1] for _, _, masked, path in self.shards}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"the training shards hold batch lines of different sizes {sizes}; an integer pool counts "
                             "sequences: re-make the batches with one data.batch_size, or use pool 'all' or 'half'")
        return next(iter(sizes.values()))

    def order(self, seed: int, epoch: int, rank: int = 0, world: int = 1,
              lines_per_rank: int = TrainingSettings.lines_per_rank,
              accumulate: int = TrainingSettings.accumulate) -> np.ndarray:
        """This rank's items for ``epoch``, in the order it takes them: per micro-step its ``lines_per_rank``
        consecutive lines of the next W x lines_per_rank of a seeded permutation (module docstring)."""
        perm = np.random.default_rng([seed, epoch]).permutation(len(self.items))
        per_step = world * lines_per_rank * accumulate
        usable = len(perm) - len(perm) % per_step
        if usable == 0:
            raise ValueError(f"{len(self.items)} batch lines cannot feed one step of {world} ranks x {lines_per_rank} "
                             f"lines per rank x {accumulate} micro-steps ({per_step} lines): give more training data "
                             "or lower lines_per_rank / accumulate")
        return perm[:usable].reshape(-1, world, lines_per_rank)[:, rank].ravel()
