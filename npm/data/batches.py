"""Blocks -> batch lines of 16 blocks (paper section 4.1 and footnote 3; paper-map §2.1, §9 item 4).

A batch line is the unit of span masking and one GPU's share of a training step; its sequences are the
candidate pool for each other's positives, so the blocks of one line come from one document where possible.

* ``rollover=True`` (Wikipedia, ``process_wiki.py``): the blocks of consecutive articles are accumulated in
  order and every 16 form a line, so the leftovers of a short article roll over into the next line.
* ``rollover=False`` (CC-News, ``process_cc_news.py``): each document (one date) is cut into lines on its own
  and its tail of fewer than 16 blocks is dropped.

Either way a final partial line is dropped; ``build_batches`` reports how many blocks that left out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npm.data.blocks import load_blocks
from npm.io import save_npz

BATCH_SIZE = 16


def make_batches(block_doc: np.ndarray, batch_size: int = BATCH_SIZE, rollover: bool = True) -> np.ndarray:
    """Block indices int64 [n_batches, batch_size], in block order, from the document of each block."""
    block_doc = np.asarray(block_doc)
    n = len(block_doc)
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if rollover:
        keep = np.arange(n // batch_size * batch_size)
    else:
        # Runs of consecutive blocks of one document; each keeps a multiple of batch_size blocks.
        run_start = np.flatnonzero(np.r_[True, block_doc[1:] != block_doc[:-1]]) if n else np.zeros(0, np.int64)
        run_len = np.diff(np.r_[run_start, n])
        run = np.repeat(np.arange(len(run_start)), run_len)
        rank = np.arange(n) - run_start[run]
        keep = np.flatnonzero(rank < (run_len // batch_size * batch_size)[run])
    return keep.astype(np.int64).reshape(-1, batch_size)


def build_batches(blocks_path: str | Path, out_path: str | Path, batch_size: int = BATCH_SIZE,
                  rollover: bool = True) -> dict:
    """Cut a blocks file into batch lines and write ``batches`` [n_batches, batch_size] atomically; returns counts."""
    block_doc = load_blocks(blocks_path)["block_doc"]
    batches = make_batches(block_doc, batch_size, rollover)
    if len(batches) == 0:
        how = "in order" if rollover else "per document (rollover off)"
        raise ValueError(f"{blocks_path}: {len(block_doc)} blocks make no batch of {batch_size} blocks cut {how}; "
                         "give the shard more documents or use a smaller batch size")
    save_npz(out_path, batches=batches)
    return {"blocks": len(block_doc), "batches": len(batches), "blocks_dropped": len(block_doc) - batches.size}
