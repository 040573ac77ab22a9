"""Benchmark of the FAISS kNN index: recall@k of HNSW and IVF-PQ against the exact flat index, build time, queries/s.

Vectors come as raw fp16 shards, the datastore's layout (npm/datastore/faiss_index.py). By default they are synthetic:
clustered vectors of dim 384 (MiniLM's h, the embedded default), ~200k rows in 4 shards. The row norms vary
log-normally (--norm-sigma), so inner-product and L2 rankings differ, as they do for transformer hidden states.
Queries are fresh draws from the same mixture. Alternatively:

* ``--datastore PATH`` reads ``PATH/meta.json`` ("hidden_size") and ``PATH/embeddings/shard{k}.f16``;
* ``--shards GLOB --dim H`` reads any raw fp16 shard files, in sorted order.

In both cases the row counts come from the file sizes. The queries are then --queries stored rows, drawn with --seed,
so each query finds itself.

Every index is built with the real ``build_faiss_index`` and searched with ``search`` on CPU. recall@k =
|approximate top-k ∩ exact top-k| / k, averaged over the queries. The exact top-k comes from the "Flat" IP index.
``valid`` is the fraction of the k slots FAISS filled (IVF pads with -1 when the probed lists hold fewer than k
vectors). k is capped at ntotal // 10. Writes results/benchmarks/faiss_recall-<device>.json. It measures; it asserts
nothing.

    .venv/bin/python benchmarks/faiss_recall.py [--rows 200000] [--factories HNSW32 IVF4096,PQ64] [--nprobe 8 64]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np

from npm.datastore.faiss_index import build_faiss_index, load_faiss_index, memmap_vectors, search, shards_from_files
from npm.io import write_summary


def synthetic_shards(folder: Path, rows: int, dim: int, n_shards: int, clusters: int, norm_sigma: float,
                     n_queries: int, seed: int) -> tuple[list[tuple[Path, int]], np.ndarray]:
    """Clustered fp16 vectors written as raw shards, and fresh fp32 queries from the same mixture."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(clusters, dim)).astype(np.float32)

    def draw(n: int) -> np.ndarray:
        x = centers[rng.integers(0, clusters, n)] + 0.7 * rng.normal(size=(n, dim)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x * rng.lognormal(np.log(10.0), norm_sigma, size=(n, 1)).astype(np.float32)

    shards = []
    for k, n in enumerate(np.diff(np.linspace(0, rows, n_shards + 1).astype(int))):
        path = folder / f"shard{k}.f16"
        draw(int(n)).astype(np.float16).tofile(path)
        shards.append((path, int(n)))
    return shards, draw(n_queries)


def stored_queries(shards, dim: int, n: int, seed: int) -> np.ndarray:
    ntotal = sum(r for _, r in shards)
    rows = np.random.default_rng(seed).choice(ntotal, size=min(n, ntotal), replace=False)
    return memmap_vectors(shards, dim)(np.sort(rows))


def datastore_shards(path: Path) -> tuple[list[tuple[Path, int]], int]:
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    dim = int(meta["hidden_size"])
    files = sorted((path / "embeddings").glob("shard*.f16"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    if not files:
        raise SystemExit(f"{path}/embeddings has no shard*.f16 files")
    return shards_from_files(files, dim), dim


def timed_search(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, float]:
    start = time.perf_counter()
    rows, valid = search(index, queries, k)
    return rows, valid, time.perf_counter() - start


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(np.intersect1d(f[f >= 0], e)) / len(e) for f, e in zip(found, exact, strict=True)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="synthetic rows")
    parser.add_argument("--dim", type=int, default=384, help="synthetic dim, or the dim of --shards files")
    parser.add_argument("--n-shards", type=int, default=4, help="synthetic shard files")
    parser.add_argument("--clusters", type=int, default=1000, help="synthetic mixture components")
    parser.add_argument("--norm-sigma", type=float, default=0.2, help="log-normal sigma of synthetic row norms")
    parser.add_argument("--datastore", type=Path, help="a datastore folder (meta.json + embeddings/shard{k}.f16)")
    parser.add_argument("--shards", help="glob of raw fp16 shard files (with --dim)")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, nargs="+", default=[10, 100, 4096])
    parser.add_argument("--factories", nargs="+", default=["HNSW32", "IVF4096,PQ64"])
    parser.add_argument("--metric", default="ip")
    parser.add_argument("--nprobe", type=int, nargs="+", default=[8, 64], help="IVF nprobe values to search with")
    parser.add_argument("--ef-search", type=int, default=128)
    parser.add_argument("--ef-construction", type=int, default=200)
    parser.add_argument("--train-sample", type=int, default=1_000_000)
    parser.add_argument("--threads", type=int, default=None, help="FAISS OpenMP threads (default: all)")
    parser.add_argument("--use-gpu", action=argparse.BooleanOptionalAction, default=None,
                        help="build IVF indexes on GPU (default: when FAISS sees one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=Path("results/benchmarks"))
    args = parser.parse_args()
    if args.threads:
        faiss.omp_set_num_threads(args.threads)
    load_start = os.getloadavg()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.datastore:
            shards, dim = datastore_shards(args.datastore)
            queries, source = stored_queries(shards, dim, args.queries, args.seed), f"datastore {args.datastore}"
        elif args.shards:
            files = sorted(glob.glob(args.shards))
            if not files:
                raise SystemExit(f"no file matches {args.shards}")
            dim = args.dim
            shards = shards_from_files(files, dim)
            queries, source = stored_queries(shards, dim, args.queries, args.seed), f"shards {args.shards}"
        else:
            dim = args.dim
            t = time.perf_counter()
            shards, queries = synthetic_shards(tmp, args.rows, dim, args.n_shards, args.clusters, args.norm_sigma,
                                               args.queries, args.seed)
            source = f"synthetic clustered fp16 ({time.perf_counter() - t:.1f}s to generate)"
        ntotal = sum(r for _, r in shards)
        ks = sorted({min(k, max(1, ntotal // 10)) for k in args.k})
        print(f"{source}: {ntotal} rows x {dim}, {len(queries)} queries, k={ks}", flush=True)

        common = dict(metric=args.metric, train_sample=args.train_sample, ef_search=args.ef_search,
                      ef_construction=args.ef_construction, use_gpu=args.use_gpu)
        exact_info = build_faiss_index(shards, dim, tmp / "flat.faiss", factory="Flat", **common)
        flat = load_faiss_index(tmp / "flat.faiss")
        exact, exact_runs = {}, {}
        for k in ks:
            rows, _, secs = timed_search(flat, queries, k)
            exact[k] = rows
            exact_runs[k] = {"search_seconds": secs, "queries_per_s": len(queries) / secs}
        results = [{"factory": "Flat", "build_seconds": exact_info["build_seconds"], "search": exact_runs}]
        print(json.dumps(results[0]), flush=True)

        for factory in args.factories:
            out = tmp / f"{re.sub(r'[^A-Za-z0-9]+', '_', factory)}.faiss"
            info = build_faiss_index(shards, dim, out, factory=factory, nprobe=args.nprobe[0], **common)
            settings = [{"nprobe": n} for n in args.nprobe] if "nlist" in info else [{}]
            for setting in settings:
                index = load_faiss_index(out, **setting)
                runs = {}
                for k in ks:
                    rows, valid, secs = timed_search(index, queries, k)
                    runs[k] = {
                        f"recall@{k}": recall(rows, exact[k]),
                        "valid": float(valid.mean()),
                        "search_seconds": secs,
                        "queries_per_s": len(queries) / secs,
                    }
                record = {
                    "factory": factory,
                    "factory_effective": info["factory_effective"],
                    "build_seconds": info["build_seconds"],
                    "built_on": info["built_on"],
                    "train_sample": info["train_sample"],
                    "params": {**info["params"], **({"nprobe": setting["nprobe"]} if setting else {})},
                    "search": runs,
                }
                results.append(record)
                print(json.dumps(record), flush=True)

    device = "cuda" if any(r.get("built_on") == "gpu" for r in results) else "cpu"
    summary = {
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "faiss_threads": faiss.omp_get_max_threads(),
            "gpus_seen_by_faiss": faiss.get_num_gpus(),
            "loadavg_start": load_start,
            "loadavg_end": os.getloadavg(),
        },
        "faiss_version": faiss.__version__,
        "source": source,
        "ntotal": ntotal,
        "dim": dim,
        "queries": len(queries),
        "k": ks,
        "metric": args.metric,
        "note": "search on CPU; HNSW searches use efSearch=max(efSearch, k); recall is set overlap with Flat IP",
        "results": results,
    }
    out_path = args.out_dir / f"faiss_recall-{device}.json"
    write_summary(out_path, summary, vars(args))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
