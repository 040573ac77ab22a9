"""Benchmark: the datastore writer's parts on this machine (docs/paper-scale.md §7): sha256 (the ``parts-sha256``
checksum's hash, ``npm.checksums.WriteDigest``), positioned writes into a preallocated file (``os.pwrite``, as
``npm.datastore.embed._write_rows``), and the same writes with an ``fdatasync`` every ``SYNC_BYTES`` (as the embedding
writer thread), in GB/s over --megabytes in 2 MB pieces, plus the final fsync. On a GPU machine these say whether
the writer thread can keep up with the encoder (one 256-block pass of Wikipedia leads writes about 1.9 KB of fp16
vectors per token). Writes results/benchmarks/write_path-<host>.json. It measures; it asserts nothing.

    .venv/bin/python benchmarks/write_path.py [--folder /tmp] [--megabytes 825]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from npm.datastore.embed import SYNC_BYTES
from npm.io import atomic_path, preallocate

PIECE = 2 << 20


def _writes(path: Path, buf: bytes, pieces: int, sync: bool) -> tuple[float, float]:
    """(seconds of the writes, seconds of the final fsync) of ``pieces`` copies of ``buf`` into a fresh file."""
    with open(path, "wb") as handle:
        preallocate(handle.fileno(), pieces * len(buf))
    fd = os.open(path, os.O_WRONLY)
    try:
        start, unsynced = time.perf_counter(), 0
        for i in range(pieces):
            os.pwrite(fd, buf, i * len(buf))
            unsynced += len(buf)
            if sync and unsynced >= SYNC_BYTES:
                os.fdatasync(fd)
                unsynced = 0
        written = time.perf_counter() - start
        os.fsync(fd)
        return written, time.perf_counter() - start - written
    finally:
        os.close(fd)
        path.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=Path(tempfile.gettempdir()),
                        help="where the test file goes (the datastore's file system)")
    parser.add_argument("--megabytes", type=int, default=825, help="bytes written, in MiB")
    parser.add_argument("--out-dir", type=Path, default=Path("results/benchmarks"))
    args = parser.parse_args()
    pieces = max(1, (args.megabytes << 20) // PIECE)
    total = pieces * PIECE
    buf = np.random.default_rng(0).integers(0, 255, PIECE, dtype=np.uint8).tobytes()
    start = time.perf_counter()
    for _ in range(pieces):
        hashlib.sha256(buf).digest()
    out = {"bytes": total, "folder": str(args.folder), "sha256_gb_per_s": round(total / (time.perf_counter() - start)
                                                                                / 1e9, 2)}
    for name, sync in (("pwrite", False), ("pwrite_fdatasync", True)):
        written, fsync = _writes(args.folder / f"write_path-{os.getpid()}.bin", buf, pieces, sync)
        out[f"{name}_gb_per_s"], out[f"{name}_final_fsync_s"] = round(total / written / 1e9, 2), round(fsync, 2)
    print(", ".join(f"{k} {v}" for k, v in out.items()))
    with atomic_path(args.out_dir / f"write_path-{platform.node() or 'host'}.json") as tmp:
        tmp.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
