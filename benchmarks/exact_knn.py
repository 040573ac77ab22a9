"""Benchmark: the exact closed-set search alone (``npm.datastore.exact_knn``, issues 42-43) against FAISS Flat on the
CPU, k = 4096, on random fp16 vectors of about the embedded datastore's size: milliseconds per query vector at 1, 16
and 64 vectors per call, one thread by default, with FAISS as the original calls it (its own settings) and as
``npm.datastore.faiss_index.search`` does; on CUDA too when torch sees a GPU (no faiss-gpu needed). Every call's
neighbours are compared with FAISS's (``same``: queries with the same k rows; the order within a list can differ
where two scores are a rounding apart, which the Predictor's re-sort by exact score removes). Writes
results/benchmarks/exact_knn-<device>.json. It measures; it asserts nothing.

    .venv/bin/python benchmarks/exact_knn.py [--rows 200000] [--dim 384] [--threads 1] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import faiss
import numpy as np
import torch

from npm.datastore.exact_knn import ExactKnn
from npm.datastore.faiss_index import search
from npm.io import atomic_path


def _median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--queries", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out-dir", type=Path, default=Path("results/benchmarks"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.dim), dtype=np.float32).astype(np.float16)
    index = faiss.IndexFlatIP(args.dim)
    index.add(x.astype(np.float32))
    knns = {"cpu": ExactKnn([(0, x.astype(np.float32))])}
    if torch.cuda.is_available():
        knns["cuda"] = ExactKnn([(0, x)], device="cuda")
    out = {"rows": args.rows, "dim": args.dim, "k": args.k, "threads": args.threads, "ms_per_vector": {}}
    for nq in args.queries:
        q = rng.standard_normal((nq, args.dim), dtype=np.float32)
        _, expected = index.search(q, args.k)
        row = {"faiss_flat_default": _median_ms(lambda q=q: index.search(q, args.k), args.reps) / nq,
               "faiss_flat_search": _median_ms(lambda q=q: search(index, q, args.k), args.reps) / nq}
        for device, knn in knns.items():
            row[f"exact_{device}"] = _median_ms(lambda knn=knn, q=q: knn.search(q, args.k), args.reps) / nq
            same = sum(np.array_equal(np.sort(a), np.sort(b))
                       for a, b in zip(knn.search(q, args.k)[0], expected, strict=True))
            row[f"same_{device}"] = f"{same}/{nq}"
        out["ms_per_vector"][str(nq)] = {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}
        print(f"{nq} vectors: " + ", ".join(f"{k} {v}" for k, v in out["ms_per_vector"][str(nq)].items()))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with atomic_path(args.out_dir / f"exact_knn-{device}.json") as tmp:
        tmp.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
