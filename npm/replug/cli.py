"""``npm-repro replug texts | eval-lm | report``: REPLUG's language-modelling evaluation (Shi et al. 2023, 6.1,
Table 1 and Figure 4; docs/paper-map.md §R3). Register with ``add_cli(subparsers)``."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

log = logging.getLogger("npm-repro.replug")


def cmd_texts(args: argparse.Namespace) -> int:
    from npm.io import write_jsonl
    from npm.replug.texts import lm_eval_texts

    records = lm_eval_texts(args.articles, args.corpus, args.n_texts, args.max_chars, args.min_chars, args.seed)
    write_jsonl(args.out, records)
    log.info("%d texts (%d characters) -> %s", len(records), sum(len(r["text"]) for r in records), args.out)
    return 0


def cmd_eval_lm(args: argparse.Namespace) -> int:
    from npm.baselines.decoder import BlockTexts
    from npm.baselines.lm import load_causal_lm
    from npm.io import provenance, read_jsonl, write_json
    from npm.replug.lm_eval import score_texts, summarize
    from npm.threads import set_threads

    if not args.k or min(args.k) < 1:
        raise ValueError(f"--k takes positive document counts, got {args.k}")
    threads = set_threads(args.threads)
    texts = [r["text"] for r in read_jsonl(args.texts)]
    if not texts:
        raise ValueError(f"{args.texts}: no evaluation text")
    blocks = BlockTexts(args.blocks)
    if args.retriever == "dense":
        if not args.encoder:
            raise ValueError("--retriever dense needs --encoder (the retriever's encoder, whose tokenizer made the "
                             "blocks)")
        from npm.baselines.dense import DenseBlockSearcher

        searcher = DenseBlockSearcher(args.encoder, args.blocks, score=args.score)
    else:
        if not args.bm25:
            raise ValueError("--retriever bm25 needs --bm25 DIR (the corpus's BM25 index)")
        from npm.datastore.bm25 import Bm25Searcher

        searcher = Bm25Searcher(args.bm25, corpus_fingerprint=blocks.corpus_fingerprint, blocks=args.blocks)
    model, tokenizer = load_causal_lm(args.lm)
    start = time.perf_counter()
    k_max = max(args.k)
    scored = score_texts(model, tokenizer, texts, searcher.search, blocks, len(blocks), k_max,
                         context_len=args.context_len, pred_len=args.pred_len, doc_len=args.doc_len, seed=args.seed,
                         batch_size=args.batch_size)
    rows = summarize(scored, texts, sorted(set(args.k)), args.weighting, args.temperature, seed=args.seed)
    seconds = time.perf_counter() - start
    for r in rows:
        log.info("%-11s k=%-2d bits/byte %.4f [%.4f, %.4f]  gain %+.2f %%  perplexity %.2f", r["system"], r["k"],
                 r["bpb"], *r["bpb_ci95"], r["gain_pct"], r["perplexity"])
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}
    write_json(args.out, {"rows": rows, "lm": args.lm, "retriever": args.retriever, "corpus": args.corpus,
                          "texts": str(args.texts), "n_texts": len(texts), "n_windows": scored["n_windows"],
                          "n_bytes": scored["n_bytes"], "corpus_blocks": len(blocks), "seconds": round(seconds, 2),
                          "threads": threads, "provenance": provenance(settings)})
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from npm.replug.report import k_figure, lm_table
    from npm.report.tables import write_table

    log.info("table -> %s", write_table(lm_table(args.results), args.table))
    if args.figure:
        log.info("figure -> %s (%s)", args.figure, k_figure(args.results, args.figure))
    return 0


def add_cli(subparsers) -> argparse.ArgumentParser:
    """Register ``replug`` (with ``texts`` and ``eval-lm``) on an ``argparse`` subparsers object."""
    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = subparsers.add_parser("replug", help="REPLUG as its own system: language-modelling evaluation (bits per byte)",
                              description="REPLUG (Shi et al. 2023): the retrieve-and-ensemble LM evaluated on "
                                          "held-out text in bits per byte, against the plain LM and random "
                                          "documents (its Table 1 and Figure 4).", formatter_class=fmt)
    sub = p.add_subparsers(dest="replug_command", required=True, metavar="STEP")

    t = sub.add_parser("texts", help="evaluation texts: body sections of articles whose lead is in the corpus",
                       description="Writes JSONL {id, title, text, source}: one real body section per article of "
                                   "--articles whose title has a document in --corpus (npm.replug.texts).",
                       formatter_class=fmt)
    t.add_argument("--articles", type=Path, required=True, help="documents JSONL(.gz) with lead + body units")
    t.add_argument("--corpus", type=Path, required=True, help="documents JSONL(.gz) of the retrieval corpus")
    t.add_argument("--n-texts", type=int, default=8, help="texts to write")
    t.add_argument("--max-chars", type=int, default=2000, help="cut each section at a sentence end before this")
    t.add_argument("--min-chars", type=int, default=500, help="shortest body section that qualifies")
    t.add_argument("--seed", type=int, default=0, help="seed of the article choice")
    t.add_argument("--out", type=Path, required=True, help="texts JSONL to write")
    t.set_defaults(func=cmd_texts)

    e = sub.add_parser("eval-lm", help="bits per byte of the LM, REPLUG and random documents at each k",
                       description="Rolling windows over each text (query = the preceding --context-len tokens, one "
                                   "retrieval per --pred-len tokens); the plain LM, REPLUG's ensemble of the top k "
                                   "documents and k random documents (npm.replug.lm_eval).", formatter_class=fmt)
    e.add_argument("--lm", required=True, help="causal LM: folder, hub id, pypi:PACKAGE/PATH or .gguf")
    e.add_argument("--texts", type=Path, required=True, help="texts JSONL (npm-repro replug texts)")
    e.add_argument("--blocks", nargs="+", required=True, help="the retrieval corpus's blocks .npz files, in order")
    e.add_argument("--corpus", default=None, help="corpus name recorded in the output")
    e.add_argument("--retriever", choices=["dense", "bm25"], default="dense",
                   help="dense: mean-pooled --encoder (REPLUG 3.1); bm25: the corpus's pyserini index")
    e.add_argument("--encoder", default=None, help="dense retriever's encoder (the tokenizer of the blocks)")
    e.add_argument("--score", choices=["cosine", "ip"], default="cosine",
                   help="dense score: cosine (paper) or raw inner product (authors' code)")
    e.add_argument("--bm25", default=None, help="BM25 index folder (--retriever bm25)")
    e.add_argument("--k", type=int, nargs="+", default=[1, 2, 4, 8, 10],
                   help="documents per window (REPLUG: 10); the largest is retrieved, smaller k reuse its top")
    e.add_argument("--context-len", type=int, default=128, help="tokens of preceding context (the query)")
    e.add_argument("--pred-len", type=int, default=128, help="tokens predicted per window (retrieval stride)")
    e.add_argument("--doc-len", type=int, default=128, help="LM tokens kept of each prepended document")
    e.add_argument("--weighting", choices=["softmax", "uniform"], default="softmax",
                   help="softmax of the retrieval scores (paper) or uniform (older code)")
    e.add_argument("--temperature", type=float, default=1.0, help="softmax(score / temperature); paper: 1")
    e.add_argument("--seed", type=int, default=0, help="seed of the random documents and the bootstrap")
    e.add_argument("--batch-size", type=int, default=8, help="LM rows per forward pass")
    e.add_argument("--threads", type=int, default=None, help="CPU threads (default: SLURM_CPUS_PER_TASK or all)")
    e.add_argument("--out", type=Path, required=True, help="results JSON to write")
    e.set_defaults(func=cmd_eval_lm)

    r = sub.add_parser("report", help="the bits-per-byte table (CSV + MD) and the k figure (PDF + PNG)",
                       description="REPLUG's Table 1 (bits per byte, gain over the plain LM, the paper's GPT-2 Small "
                                   "row beside) and Figure 4 (bits per byte against k, random documents as control) "
                                   "from `eval-lm` results (npm.replug.report).", formatter_class=fmt)
    r.add_argument("--results", type=Path, required=True, help="results JSON of eval-lm")
    r.add_argument("--table", type=Path, required=True, help="X.csv (and X.md beside it)")
    r.add_argument("--figure", type=Path, default=None, help="X.pdf (and X.png beside it)")
    r.set_defaults(func=cmd_report)
    return p
