"""Benchmark: queries/s of NPM (BM25-restricted), NPM (FAISS) and NPM-single (FAISS) on a built datastore, and the
RAM / disk the datastore takes per corpus token (vectors and everything else separately).

Queries are cloze sentences cut from the corpus itself (the first words of random blocks, then "<mask>."), so
retrieval has something to find. Needs the outputs of `make demo` (or of the same rules at paper scale); writes
results/benchmarks/predict-<device>.json. It measures; it asserts nothing.

    .venv/bin/python benchmarks/predict.py [--corpus enwiki] [--queries 100]
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np
import torch

from npm.inference.predictor import Predictor
from npm.io import atomic_path, provenance


def cloze_queries(predictor: Predictor, n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for b in rng.permutation(predictor.ds.n_blocks):
        words = predictor.block_text(int(b)).split()
        if len(words) >= 14:
            out.append(" ".join(words[:12]) + " <mask>.")
        if len(out) == n:
            break
    return out


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def timed(predictor: Predictor, queries: list[str], mode: str) -> dict:
    predictor.predict(queries[0], mode=mode)  # warm-up: model, index and JVM loading
    start = time.perf_counter()
    for q in queries:
        predictor.predict(q, mode=mode)
    seconds = time.perf_counter() - start
    return {"queries": len(queries), "seconds": seconds, "queries_per_s": len(queries) / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="enwiki")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--out-dir", type=Path, default=Path("results/benchmarks"))
    args = parser.parse_args()

    result = {"corpus": args.corpus, "k": args.k, "torch_threads": torch.get_num_threads(), "systems": {}}
    for kind, modes in (("npm", ("restricted", "faiss")), ("npm_single", ("faiss",))):
        ds_path = Path(f"data/datastore/{kind}/{args.corpus}")
        p = Predictor(f"results/models/{kind}", str(ds_path), kind=kind, bm25=f"data/bm25/{args.corpus}",
                      faiss=f"data/index/{kind}/{args.corpus}.faiss", k=args.k)
        queries = cloze_queries(p, args.queries)
        for mode in modes:
            result["systems"][f"{kind}-{mode}"] = timed(p, queries, mode)
        if kind == "npm":
            ds = p.ds
            vectors = sum(a.nbytes for a in ds.shards)
            result["datastore"] = {
                "tokens": ds.n_tokens, "rows": ds.n_rows, "hidden_size": ds.hidden_size,
                "vector_bytes_per_token": vectors / ds.n_tokens,
                "non_vector_ram_bytes_per_token": ds.nbytes_non_vector / ds.n_tokens,
                "disk_bytes_per_token_without_vectors": (disk_bytes(ds_path) - vectors) / ds.n_tokens,
                "faiss_index_bytes_per_token": Path(f"data/index/npm/{args.corpus}.faiss").stat().st_size
                / ds.n_tokens,
                "bm25_index_bytes_per_token": disk_bytes(Path(f"data/bm25/{args.corpus}")) / ds.n_tokens,
            }
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result["provenance"] = provenance({k: str(v) for k, v in vars(args).items()})
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with atomic_path(args.out_dir / f"predict-{device}.json") as tmp:
        tmp.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "provenance"}, indent=2))


if __name__ == "__main__":
    main()
