"""How small can DensePhrases' phrase index get before it loses answers? (issue 42, item 3)

The DensePhrases paper keeps a filtered, quantised index of its phrase vectors and nothing else for the search. This
scans (a) which tokens the dump keeps and (b) the FAISS factory, and measures for each the index's size against
the unfiltered fp16 dump (rows x d x 2 bytes) and the open-domain EM@1 of the index alone: candidates retrieved
from the index AND scored from the index's own decoded codes (``npm.densephrases.search.IndexVectors``; no fp16 dump
read), beside EM@1 with the candidates scored from the fp16 dump (what the table's "index only" rows do). Two
question sets: the embedded NQ task over the corpus dump, and the RC test questions ("SQuAD") over a dump of the
passages of D_small (the test passages pooled with those of ``--rc-pool``, one block each).

Token filters: ``none``; ``edges``, the tokens that can begin or end a phrase (``PhraseTokens.word_start |
word_end``: a token that is neither is never a phrase's start or end, so dropping it loses no phrase and no score);
``head@q``, the model's filter head (``DensePhrases.filter_logits``) keeping the share q of the tokens with the
highest best logit, and ``head>t`` those whose best logit exceeds t (the dump's rule, without its token per passage);
``edges&head@q`` and ``edges&head>t`` the phrase edges among them (the head is trained only with
``train.lambda_filter`` > 0).
Every index is trained on a seeded sample of ``--train-sample`` of its kept rows, as ``npm-repro densephrases
index``; IVF indexes probe every list. It measures; it asserts nothing. Writes
results/benchmarks/densephrases_index.json.

Inputs are a workflow folder's DensePhrases model, phrase dump, RC files and nq task (the embedded default's make
demo outputs):

    .venv/bin/python benchmarks/densephrases_index.py --root /path/to/workflow-folder
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from npm.datastore.faiss_index import build_faiss_index
from npm.densephrases.dump import best_filter_logits, build_index, dump_phrases
from npm.densephrases.evaluate import d_small_blocks, task_questions
from npm.densephrases.rc import read_squad
from npm.densephrases.search import IndexVectors, search
from npm.densephrases.searcher import PhraseSearcher
from npm.io import write_summary
from npm.tasks.metrics import exact_match

FACTORIES = ["Flat", "SQ8", "SQ4", "IVF256,SQ4", "IVF256,PQ32", "PCA96,Flat", "PCA96,SQ4", "PCAR96,SQ4", "PCA112,SQ4",
             "PCA128,SQ4", "PCA96,SQ8", "PCA96,IVF256,SQ4"]  # OPQ and RQ: their training takes many minutes here
FILTERS = ["none", "edges"]


def rc_questions(rc_dir: Path, pool: list[str]) -> tuple[list[str], list[dict]]:
    """The D_small passages (each RC context once, the test split's first) and the test questions."""
    test = read_squad(rc_dir / "test.json")
    contexts = list(dict.fromkeys([ex["context"] for ex in test]
                                  + [ex["context"] for split in pool for ex in read_squad(rc_dir / f"{split}.json")]))
    return contexts, [{"id": ex["id"], "question": ex["question"], "answers": ex["answers"]} for ex in test]


def kept_rows(name: str, searcher: PhraseSearcher) -> np.ndarray:
    """The dump rows the token filter ``name`` keeps (see the module docstring)."""
    tokens, n = searcher.dump.tokens, len(searcher.dump.tokens)
    if name == "none":
        return np.arange(n)
    if name == "edges":
        everything = np.arange(n)
        return np.flatnonzero(tokens.word_start[everything] | tokens.word_end[everything])
    edges, head = name.split("&") if "&" in name else ("none", name)
    among = kept_rows(edges, searcher)
    layer = searcher.model.filter_head
    best = best_filter_logits(searcher.dump.vectors, among, layer.weight.detach().float().numpy(),
                              layer.bias.detach().float().numpy())
    if ">" in head:
        return among[best > float(head.split(">")[1])]
    share = float(head.split("@")[1])
    return np.sort(among[np.argsort(-best, kind="stable")[:max(1, int(round(share * n)))]])


def make_index(factory: str, vectors: np.ndarray, train_sample: int, seed: int, tmp: Path):
    """(the filled inner-product index of ``factory`` over ``vectors``, its file's bytes, build seconds), built as
    ``npm-repro densephrases index`` builds one (``build_faiss_index`` over an fp16 file of the rows: the same seeded
    training sample and settings); an IVF index probes every list."""
    import faiss

    path = tmp / "rows.f16"
    vectors.astype(np.float16).tofile(path)
    record = build_faiss_index([(path, len(vectors))], vectors.shape[1], tmp / "scan.faiss", factory, "ip",
                               train_sample, seed, use_gpu=False)
    index = faiss.read_index(str(tmp / "scan.faiss"))
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = ivf.nlist
    return index, (tmp / "scan.faiss").stat().st_size, record["build_seconds"]


def em_at_1(searcher, index, h, rows, questions, q, k, max_words) -> float:
    """EM@1 (percent) of the top phrase per question: candidates from ``index`` over the dump rows ``rows``,
    scored from ``h``."""
    tokens = searcher.dump.tokens.subset(rows)
    hits = []
    for (pairs, scores), question in zip(search(index, h, tokens, q[0], q[1], k, max_words, top_n=1), questions,
                                         strict=True):
        text = searcher.phrase(int(rows[pairs[0, 0]]), int(rows[pairs[0, 1]]), float(scores[0]))["text"] \
            if len(pairs) else ""
        hits.append(bool(exact_match(text, question["answers"])))
    return 100.0 * float(np.mean(hits))


def scan_set(name, searcher, questions, filters, factories, args, flat_bytes, tmp) -> list[dict]:
    """One row per (filter, factory) over one question set's dump."""
    q = searcher.encode([x["question"] for x in questions])
    rows_out = []
    for filt in filters:
        rows = kept_rows(filt, searcher)
        vectors = np.asarray(searcher.dump.vectors[rows], np.float32)
        for factory in factories:
            index, size, build = make_index(factory, vectors, args.train_sample, args.seed, tmp)
            row = {"set": name, "filter": filt, "factory": factory, "kept": len(rows),
                   "kept_share": round(len(rows) / len(searcher.dump.tokens), 4), "index_bytes": size,
                   "bytes_per_dump_vector": round(size / len(searcher.dump.tokens), 2),
                   "ratio": round(flat_bytes / size, 2), "build_seconds": round(build, 1), "n": len(questions)}
            for k in args.k:
                t0 = time.perf_counter()
                row[f"em_index_k{k}"] = em_at_1(searcher, index, IndexVectors(index), rows, questions, q, k,
                                                args.max_words)
                row[f"qps_index_k{k}"] = round(len(questions) / (time.perf_counter() - t0), 1)
                row[f"em_fp16_k{k}"] = em_at_1(searcher, index, searcher.dump.vectors[rows], rows, questions, q, k,
                                               args.max_words)
            print(json.dumps(row), flush=True)
            rows_out.append(row)
    return rows_out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=Path("."), help="the workflow folder (cwd for the dump's blocks)")
    p.add_argument("--model", default="results/densephrases/model_pre_batch")
    p.add_argument("--dump", default="data/densephrases/dump/pre_batch/enwiki")
    p.add_argument("--task", default="nq")
    p.add_argument("--rc-dir", default="data/densephrases/rc")
    p.add_argument("--rc-pool", nargs="*", default=["train", "dev"])
    p.add_argument("--filters", nargs="+", default=FILTERS)
    p.add_argument("--factories", nargs="+", default=FACTORIES)
    p.add_argument("--k", type=int, nargs="+", default=[10], help="starts and ends retrieved (config phrase_k: 10)")
    p.add_argument("--max-words", type=int, default=20)
    p.add_argument("--max-passage-tokens", type=int, default=256)
    p.add_argument("--train-sample", type=int, default=20000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sets", nargs="+", default=["task", "rc_d_small"], choices=["task", "rc_d_small"],
                   help="question sets: --task over the corpus dump, the RC test questions over D_small")
    p.add_argument("--out", type=Path, default=Path("results/benchmarks/densephrases_index.json"))
    args = p.parse_args(argv)
    import os

    os.chdir(args.root)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sets = {}
        build_index(args.dump, tmp / "nq.faiss", "Flat")
        searcher = PhraseSearcher(args.model, args.dump, tmp / "nq.faiss")
        sets[args.task] = (searcher, task_questions(args.task, "data/tasks", searcher.model.tokenizer))
        contexts, rc = rc_questions(Path(args.rc_dir), args.rc_pool)
        d_small_blocks(contexts, searcher.model.tokenizer, args.max_passage_tokens, tmp / "d_small.npz")
        dump_phrases(args.model, [str(tmp / "d_small.npz")], tmp / "d_small_dump", progress=False)
        build_index(tmp / "d_small_dump", tmp / "d_small.faiss", "Flat")
        sets["rc_d_small"] = (PhraseSearcher(args.model, tmp / "d_small_dump", tmp / "d_small.faiss"), rc)
        sets = {name: v for name, v in sets.items() if (name if name == "rc_d_small" else "task") in args.sets}
        for name, (s, questions) in sets.items():
            flat_bytes = len(s.dump.tokens) * s.dump.meta["hidden_size"] * 2
            rows += scan_set(name, s, questions, args.filters, args.factories, args, flat_bytes, tmp)
    write_summary(args.out, {"rows": rows, "settings": {k: str(v) for k, v in vars(args).items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
