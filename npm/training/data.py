"""Training data: the masked batch lines of every training shard, in a seeded order, resumable.

One item is one batch line (B sequences of one document group; paper-map §2.1/§2.3: one line per GPU per step).
The order is a permutation per epoch seeded with (seed, epoch); rank r of a world of W takes items r, r+W, ...
The position (epoch, cursor) is part of the training state, so a resumed run continues with the next line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npm.io import load_npz


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

    def order(self, seed: int, epoch: int, rank: int = 0, world: int = 1) -> np.ndarray:
        """This rank's item order for ``epoch`` (a seeded permutation dealt round-robin to ranks)."""
        perm = np.random.default_rng([seed, epoch]).permutation(len(self.items))
        usable = len(perm) - len(perm) % world
        if usable == 0:
            raise ValueError(f"{len(self.items)} batch lines cannot feed {world} ranks")
        return perm[rank:usable:world]
