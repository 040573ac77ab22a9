"""Does indexing the units' ``<s>``/``</s>`` markers change BM25's top-3 blocks? (paper-map §3.8, issue 29 item 5)

The original indexes each block decoded with its special tokens (its ``X.jsonl``); ``datastore.bm25_markers``
switches between those contents and the surface text alone. This builds both Lucene indexes of every reference corpus
of the configured open-set tasks (``npm.datastore.bm25.block_documents`` with and without markers, the markers placed
where the blocks' ids hold the begin/end tokens) and searches each evaluated example's BM25 query (``bm25_query``, the
``max_examples`` examples of each task, seed 0, as the demo evaluates them) in both. It counts the queries whose top-3
blocks differ: as a set (what NPM's restricted search reads), as an ordered list (the passages of BM25 + LM and
REPLUG) and at top-1. Writes results/benchmarks/bm25_markers.json. It measures; it asserts nothing.

Inputs are a workflow folder's data/blocks/{corpus} and data/tasks (the embedded default's: rules tokenize_blocks and
prepare_embedded_tasks, a few seconds each):

    snakemake -c1 data/blocks/enwiki/shard0.npz data/blocks/enwiki/shard1.npz data/blocks/enwiki_2022/shard0.npz \\
        data/blocks/translation_passages/shard0.npz data/tasks
    .venv/bin/python benchmarks/bm25_markers.py [--root .] [--config config/config.yaml]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from npm.datastore.bm25 import Bm25Searcher, block_documents, bm25_query, build_bm25_index, marker_ids
from npm.io import read_yaml, write_summary
from npm.model import load_tokenizer
from npm.tasks.registry import config_task_lists, resolve_task, task_examples

K = 3


def corpus_of(task: str, config: dict) -> str:
    """The reference corpus the demo searches for an open-set task (config task_corpus, else the task's own)."""
    override = config["evaluation"].get("task_corpus", {}).get(task)
    corpora = [override] if isinstance(override, str) else list(override or resolve_task(task).reference_corpus)
    if len(corpora) != 1:
        raise ValueError(f"task {task}: {corpora} reference corpora; this measurement takes one")
    return corpora[0]


def compare(root: Path, config: dict, max_examples: int) -> dict:
    tokenizer = load_tokenizer(config["model"]["tokenizer"])
    tasks = config["evaluation"]["open_set_tasks"]
    by_corpus: dict[str, list[str]] = {}
    for task in tasks:
        by_corpus.setdefault(corpus_of(task, config), []).append(task)
    rows, totals = {}, {"queries": 0, "top3_set_changed": 0, "top3_list_changed": 0, "top1_changed": 0}
    with tempfile.TemporaryDirectory(prefix="bm25_markers.") as work:
        for corpus, corpus_tasks in by_corpus.items():
            blocks = sorted((root / "data" / "blocks" / corpus).glob("shard*.npz"),
                            key=lambda p: int(p.stem.removeprefix("shard")))
            if not blocks:
                raise FileNotFoundError(f"no blocks under {root}/data/blocks/{corpus}; build them first (module doc)")
            searchers = {}
            for name, markers in (("plain", None), ("markers", marker_ids(tokenizer))):
                start = time.perf_counter()
                out = Path(work) / f"{corpus}-{name}"
                build_bm25_index(block_documents(blocks, markers=markers), out)
                searchers[name] = Bm25Searcher(out, markers=markers is not None)
                print(f"{corpus}: {name} index in {time.perf_counter() - start:.1f} s", file=sys.stderr)
            for task in corpus_tasks:
                spec = resolve_task(task)
                examples = task_examples(task, root / "data" / "tasks" / task, tokenizer, n_samples=max_examples)
                queries = [bm25_query(ex["input"], spec.is_question) for ex in examples]
                plain = searchers["plain"].batch_search(queries, K)
                marked = searchers["markers"].batch_search(queries, K)
                row = {"corpus": corpus, "queries": len(queries),
                       "top3_set_changed": sum(set(a[0].tolist()) != set(b[0].tolist())
                                               for a, b in zip(plain, marked, strict=True)),
                       "top3_list_changed": sum(a[0].tolist() != b[0].tolist()
                                                for a, b in zip(plain, marked, strict=True)),
                       "top1_changed": sum(a[0][:1].tolist() != b[0][:1].tolist()
                                           for a, b in zip(plain, marked, strict=True))}
                rows[task] = row
                for key in totals:
                    totals[key] += row[key]
            for s in searchers.values():
                s.close()
    return {"k": K, "tokenizer": config["model"]["tokenizer"], "max_examples": max_examples, "tasks": rows,
            "total": totals}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path("."), help="workflow folder with data/blocks and data/tasks")
    ap.add_argument("--config", type=Path, default=Path("config/config.yaml"))
    ap.add_argument("--max-examples", type=int, help="examples per task (default: the config's max_examples)")
    ap.add_argument("--out", type=Path, default=Path("results/benchmarks/bm25_markers.json"))
    args = ap.parse_args(argv)
    config = config_task_lists(read_yaml(args.config))  # the task lists it leaves out: config/tasks.yaml's
    summary = compare(args.root, config, args.max_examples or config["evaluation"]["max_examples"])
    write_summary(args.out, summary)
    print(summary["total"])


if __name__ == "__main__":
    main()
