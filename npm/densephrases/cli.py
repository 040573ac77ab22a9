"""``npm-repro densephrases rc | train-teacher | filter | train | dump | combine | trim | index | query-ft | evaluate |
search``: DensePhrases (Lee et al. 2021) as its own system (its table: ``npm-repro report densephrases``);
docs/paper-map.md §D. Its command is ``commands(rc)`` (npm.options); step ``rc`` builds the embedded default's demo data
(``npm.embedded.rc``), so its handler is the caller's (npm.cli): this package never imports the demo-data
builders."""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from npm import tracking
from npm.densephrases.evaluate import (
    TEACHER_ANSWER_TOKENS,
    d_small_evaluate,
    d_small_index,
    open_domain,
    random_span_baseline,
    rc_evaluate,
    task_questions,
    teacher_filter,
)
from npm.densephrases.rc import read_squad, write_squad
from npm.densephrases.truecase import truecase_records
from npm.io import provenance, read_json, read_jsonl, write_json
from npm.model import load_tokenizer, torch_device
from npm.options import DEVICE, MEM_MB, OUT, SEED, TASKS_ROOT, Command, option, section
from npm.settings import (
    DensePhrasesQueryFt,
    DensePhrasesSettings,
    DensePhrasesTeacher,
    DensePhrasesTrain,
    Settings,
    from_args,
    nonneg_int,
    options,
    positive_int,
)

log = logging.getLogger("npm-repro.densephrases")


def _questions(path: Path) -> list[dict]:
    """{question, answers} records of a SQuAD JSON file or a JSONL file of {question, answers}."""
    if path.suffix == ".json":
        return [{"id": e["id"], "question": e["question"], "answers": e["answers"]} for e in read_squad(path)]
    out = []
    for n, r in enumerate(read_jsonl(path)):
        if not str(r.get("question", "")).strip() or not r.get("answers"):
            raise ValueError(f"{path}: record {n + 1} needs a non-empty 'question' and 'answers'")
        out.append({"id": str(r.get("id", n)), "question": r["question"], "answers": list(r["answers"])})
    return out


def cmd_train_teacher(args) -> int:
    from npm.densephrases.train import TeacherConfig, train_teacher  # deferred: loads torch

    cfg = TeacherConfig(encoder=args.encoder, train=str(args.train), out_dir=str(args.out),
                        checkpoint_dir=str(args.checkpoint_dir), **from_args(args, DensePhrasesTeacher).as_dict(),
                        **_step_settings(args, "train-teacher"), seed=args.seed, device=args.device)
    with tracking.from_args(args, "densephrases_teacher", "teacher") as run:
        log.info("teacher: %s", train_teacher(cfg, run=run))
    return 0


def cmd_filter(args) -> int:
    from npm.densephrases.train import load_teacher  # deferred: loads torch

    examples = read_squad(args.train)
    kept, counts = teacher_filter(examples, load_teacher(str(args.teacher)).to(torch_device(args.device)),
                                  load_tokenizer(str(args.teacher)), args.max_passage_tokens, args.max_question_tokens,
                                  args.precision, args.doc_stride)
    write_squad(args.out, kept, f"npm-repro: {args.train} filtered by the teacher {args.teacher}")
    log.info("%d of %d generated questions answered exactly by the teacher; %d examples -> %s", counts["kept"],
             counts["generated"], counts["total"], args.out)
    return 0


def cmd_train(args) -> int:
    from npm.densephrases.train import PhraseTrainConfig, train_densephrases  # deferred: loads torch

    cfg = PhraseTrainConfig(encoder=args.encoder, train=str(args.train), out_dir=str(args.out),
                            checkpoint_dir=str(args.checkpoint_dir),
                            teacher=str(args.teacher) if args.teacher else None,
                            generated=str(args.generated) if args.generated else None,
                            **from_args(args, DensePhrasesTrain).as_dict(), **_step_settings(args, "train"),
                            seed=args.seed, device=args.device)
    with tracking.from_args(args, "densephrases_train", args.negatives) as run:
        log.info("DensePhrases: %s", train_densephrases(cfg, run=run))
    return 0


def cmd_dump(args) -> int:
    from npm.densephrases.dump import DumpPassages, dump_phrases, dump_shard, shard_dir  # deferred: loads torch

    dump_passages = DumpPassages(args.dump_passages, args.dump_max_tokens, args.dump_stride)
    if args.shard is None:
        meta = dump_phrases(args.checkpoint, [str(b) for b in args.blocks], args.out, args.filter_threshold,
                            args.batch_blocks, precision=args.precision, device=args.device,
                            dump_passages=dump_passages)
        out = args.out
    else:
        if len(args.blocks) != 1:
            raise ValueError(f"--shard {args.shard} dumps one blocks file (the corpus's shard {args.shard}); got "
                             f"{len(args.blocks)}")
        out = shard_dir(args.out, args.shard)
        meta = dump_shard(args.checkpoint, args.blocks[0], out, args.filter_threshold, args.batch_blocks,
                          precision=args.precision, device=args.device, dump_passages=dump_passages)
    log.info("%d of %d tokens kept (%.1f %%) -> %s", meta["rows"], meta["tokens"],
             100 * meta["rows"] / max(1, meta["tokens"]), out)
    return 0


def cmd_combine(args) -> int:
    from npm.densephrases.dump import combine_shards  # deferred: loads torch

    meta = combine_shards(args.dump, args.shards)
    log.info("phrase dump of %d shards: %d vectors (%.1f GB) -> %s", args.shards, meta["rows"], meta["bytes"] / 1e9,
             args.dump / "meta.json")
    return 0


def cmd_trim(args) -> int:
    from npm.densephrases.dump import trim_dump  # deferred: loads torch

    meta = trim_dump(args.dump, args.out, args.compressed_filter_threshold, args.checkpoint)
    log.info("%s: %d of %d tokens kept (%.1f %%) -> %s", meta["token_filter"], meta["rows"], meta["tokens"],
             100 * meta["kept_share"], args.out)
    return 0


def cmd_index(args) -> int:
    from npm.densephrases.dump import build_index  # deferred: loads torch

    record = build_index(args.dump, args.out, args.factory, args.nprobe, args.seed, args.index_train_sample,
                         mem_mb=args.mem_mb or None)
    log.info("%s over %d vectors: %.1f bytes per vector, %.1f s -> %s", record["factory_effective"], record["rows"],
             record["bytes_per_vector"], record["build_seconds"], args.out)
    return 0


def cmd_query_ft(args) -> int:
    from npm.densephrases.query_ft import query_finetune  # deferred: loads torch

    with tracking.from_args(args, "densephrases_query_ft", f"{Path(args.checkpoint).name}_qft") as run:
        summary = query_finetune(args.checkpoint, args.dump, args.index, _questions(args.train), args.out,
                                 dev=_questions(args.dev) if args.dev else None, max_words=args.max_words,
                                 **_step_settings(args, "query-ft", DensePhrasesQueryFt),
                                 **_step_settings(args, "query-ft"), seed=args.seed, device=args.device, run=run,
                                 provenance=provenance({k: v for k, v in vars(args).items() if k != "func"}))
    log.info("query-side fine-tuning: dev EM %s -> %s", summary["dev_em_before"], summary["dev_em_best"])
    return 0


def cmd_evaluate(args) -> int:
    """RC EM/F1 on SQuAD examples (--rc; with --d-small-index, D_small through phrase indexes instead), open-domain
    EM@1 and queries/s over the index (--questions, --task)."""
    from npm.densephrases.model import DensePhrases  # deferred: loads torch

    out: dict = {"model": str(args.checkpoint)}
    device = torch_device(args.device)
    if args.rc and args.d_small_index:  # D_small through indexes only: rule densephrases_evaluate_rc has the rest
        out["rc_d_small_index"] = _d_small_index(args)
    elif args.rc:
        examples = read_squad(args.rc)
        model = DensePhrases.load(args.checkpoint).to(device)
        lengths = (args.max_passage_tokens, args.max_question_tokens)
        out["rc"] = {"data": str(args.rc), **rc_evaluate(model, examples, *lengths, args.rc_answer_tokens,
                                                         precision=args.precision, doc_stride=args.doc_stride,
                                                         filter_threshold=args.rc_filter_threshold)}
        pool = [ex for path in args.d_small_pool for ex in read_squad(path)]
        out["rc_d_small"] = {"pool": [str(p) for p in args.d_small_pool],
                             **d_small_evaluate(model, examples, *lengths, args.rc_answer_tokens,
                                                precision=args.precision, pool=pool)}
        out["rc_random_span"] = random_span_baseline(examples, model.tokenizer, args.max_passage_tokens,
                                                     args.rc_answer_tokens)
        if args.teacher:
            from npm.densephrases.train import load_teacher  # deferred: loads torch

            teacher = load_teacher(str(args.teacher)).to(device)
            out["rc_teacher"] = rc_evaluate(model, examples, *lengths, TEACHER_ANSWER_TOKENS, teacher=teacher,
                                            precision=args.precision, doc_stride=args.doc_stride)
        log.info("RC EM %.1f F1 %.1f, D_small EM %.1f over %d passages (random span %.1f; teacher %s)",
                 out["rc"]["em"], out["rc"]["f1"], out["rc_d_small"]["em"], out["rc_d_small"]["passages"],
                 out["rc_random_span"]["em"], f"{out['rc_teacher']['em']:.1f}" if args.teacher else "-")
    sets = {Path(q).stem: ("file", q) for q in args.questions} | {t: ("task", t) for t in args.task}
    if sets:
        from npm.densephrases.searcher import PhraseSearcher  # deferred: loads torch

        if not (args.dump and args.index):
            raise ValueError("--questions / --task need --dump and --index (open-domain search)")
        searcher = PhraseSearcher(args.checkpoint, args.dump, args.index, device=args.device, precision=args.precision,
                                  vectors=args.vectors)
        out["index"] = read_json(Path(str(args.index) + ".json"), "rebuild the index")
        out["dump"] = {k: searcher.dump.meta[k] for k in ("rows", "tokens", "hidden_size", "bytes", "token_filter",
                                                          "dump_passages") if k in searcher.dump.meta}
        out["open"] = {}
        for name, (kind, where) in sets.items():
            questions, truecased = truecase_records(args.truecase, _questions(where) if kind == "file" else
                                                    task_questions(where, args.tasks_root, searcher.model.tokenizer))
            out["open"][name] = {"source": str(where), "refine_factor": args.refine_factor, "vectors": args.vectors,
                                 "search_form": args.search_form, "truecase": args.truecase, "truecased": truecased,
                                 **open_domain(searcher, questions, args.k, args.max_words, args.refine_factor,
                                               args.search_form)}
            if args.refine_factor > 1:  # what the index alone ranks
                out.setdefault("open_index_only", {})[name] = open_domain(searcher, questions, args.k, args.max_words)
            log.info("%s: open-domain EM@1 %.1f on %d questions; %.1f questions/s of question encoding and phrase "
                     "search, model and index load excluded", name, out["open"][name]["em"],
                     out["open"][name]["n"], out["open"][name]["queries_per_s"])
    if len(out) == 1:
        raise ValueError("nothing to evaluate: give --rc, --questions and/or --task")
    settings = {k: v for k, v in vars(args).items() if k != "func"}
    write_json(args.out, {**out, "provenance": provenance(settings)}, default=str)  # paths as strings
    with tracking.from_args(args, "densephrases_evaluate", Path(args.checkpoint).name) as run:  # every number of --out
        run.log(0, **tracking.numbers(out))
    return 0


def _d_small_index(args) -> dict:
    """``evaluate --rc --d-small-index``: the --rc questions over all D_small passages through phrase indexes
    (``npm.densephrases.evaluate.d_small_index``), built in a folder beside --out that is removed after."""
    examples = read_squad(args.rc)
    pool = [ex for path in args.d_small_pool for ex in read_squad(path)]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=Path(args.out).parent) as work:
        result = d_small_index(args.checkpoint, examples, args.d_small_index, work, pool, args.max_passage_tokens,
                               args.k, args.max_words, args.precision, args.compressed_filter_threshold)
    log.info("D_small over its phrase index: %s %.1fx smaller, EM %.1f (Flat: %.1f) on %d questions",
             args.d_small_index, result["ratio"], result["em"], result["flat_em"], result["n"])
    return result


def cmd_search(args) -> int:
    from npm.densephrases.searcher import PhraseSearcher  # deferred: loads torch

    searcher = PhraseSearcher(args.checkpoint, args.dump, args.index, device=args.device, precision=args.precision)
    for question, phrases in zip(args.question, searcher.search(args.question, args.k, args.max_words, args.top),
                                 strict=True):
        print(question)
        for rank, p in enumerate(phrases, 1):
            print(f"  {rank}. {p['text']}  ({p['score']:.2f}; {p['doc']}, passage {p['passage']})")
            if args.evidence:
                print("     " + json.dumps(p["context"][:300], ensure_ascii=False))
    return 0


def _step_settings(args, step: str, cls=DensePhrasesSettings) -> dict:
    """The parsed settings of ``cls`` that ``step`` takes, as keywords (their names are the code's)."""
    return {f.name: getattr(args, f.name) for f in options(cls, step)}


# ------------------------------------------------------------------------------------------------ the command line

def _settings(step: str) -> tuple:
    """The options of config `densephrases` that ``step`` reads (``npm.settings.DensePhrasesSettings``), and
    --device where the step runs an encoder."""
    encoder = any(f.name == "precision" for f in options(DensePhrasesSettings, step))
    return (section(DensePhrasesSettings, step), *((DEVICE,) if encoder else ()))


CHECKPOINT = option("--checkpoint", type=Path, required=True, help="DensePhrases model folder (train / query-ft)")
DUMP = option("--dump", type=Path, required=True, help="phrase dump folder (dump)")
INDEX = option("--index", type=Path, required=True, help="FAISS index of the dump (index)")
ENCODER = option("--encoder", required=True, help="checkpoint of the three encoders (paper: SpanBERT-base-cased)")
TRAIN = option("--train", type=Path, required=True, help="SQuAD v1.1 JSON")
TEACHER = option("--teacher", type=Path, default=None, help="teacher folder (train-teacher); none = no distillation")
GENERATED = option("--generated", type=Path, default=None,
                   help="SQuAD v1.1 JSON of generated training questions (config rc.generated; the code's "
                        "question-generation file); none = none")
CHECKPOINT_DIR = option("--checkpoint-dir", type=Path, required=True, help="run folders with per-epoch checkpoints")
# the search options, with the defaults of npm.settings.Settings (config inference.phrase_k and .phrase_max_words);
# query-ft's k is config densephrases.query_ft.k
K = option("--k", type=positive_int, default=Settings().phrase_k, help="starts and ends retrieved per question")
MAX_WORDS = option("--max-words", type=positive_int, default=Settings().phrase_max_words,
                   help="longest phrase L in words (paper 20; code 10)")

RC = Command(  # its handler is the caller's (commands(rc)): it builds the embedded default's demo data
    "rc", "the embedded RC set: SQuAD v1.1 files by distant supervision (train/dev/test)",
    description="Real facts whose object occurs in the real lead of a subject outside the demo corpus; GENERATED "
                "template questions; split by subject (npm.embedded.rc). Also cloze_train.jsonl / cloze_dev.jsonl: "
                "the same facts as LAMA-style cloze questions, for query-side fine-tuning.",
    options=(option("--max-articles", type=nonneg_int, default=2000,
                    help="leads in the demo corpus (embedded.max_articles; 0 = all): their subjects are never used"),
             option("--max-subjects", type=nonneg_int, default=0,
                    help="subjects whose facts make the set, a seeded choice (embedded.max_rc_subjects; 0 = all)"),
             SEED(help="seed of the subject split"),
             option("--out-dir", type=Path, required=True, help="folder for train.json, dev.json, test.json")))

STEPS = (
    Command("train-teacher", "the cross-attention reader (distillation target)", cmd_train_teacher,
            description="Fine-tunes AutoModelForQuestionAnswering on [CLS] q [SEP] p [SEP] (resumable).",
            options=(ENCODER(help="starting checkpoint (paper: SpanBERT-base QA)"), TRAIN,
                     OUT(help="teacher folder (save_pretrained)"), CHECKPOINT_DIR, section(DensePhrasesTeacher),
                     _settings("train-teacher"), SEED, tracking.OPTIONS)),
    Command("filter", "keep the generated questions the teacher answers exactly (paper 4.1)", cmd_filter,
            description="Question generation's filter: a generated question (\"question_generated\": true) is kept "
                        "only if the cross-attention teacher reads its answer exactly; other questions are kept "
                        "(npm.densephrases.evaluate.teacher_filter).",
            options=(TEACHER(required=True, help="teacher folder (train-teacher)"),
                     TRAIN(help="SQuAD v1.1 JSON with generated questions"), OUT(help="filtered SQuAD v1.1 JSON"),
                     _settings("filter"))),
    Command("train", "the phrase and question encoders (eq. 9), resumable", cmd_train,
            description="L = lambda_single L_single + lambda_distill L_distill + lambda_neg L_neg (+ lambda_filter "
                        "L_filter); pre-batch negatives in the last epochs; generated questions joined to the "
                        "training set, or trained first as a stage of their own with --generated-first "
                        "(npm.densephrases.train).",
            options=(ENCODER, TRAIN, GENERATED, TEACHER, OUT(help="model folder"), CHECKPOINT_DIR,
                     section(DensePhrasesTrain), _settings("train"), SEED, tracking.OPTIONS)),
    Command("dump", "the phrase dump: fp16 token vectors of every passage", cmd_dump,
            description="Encodes every block of the corpus, or each text unit alone in the original code's "
                        "windows (--dump-passages units), with the phrase encoder (npm.densephrases.dump).",
            options=(CHECKPOINT(help="DensePhrases model folder"),
                     option("--blocks", nargs="+", required=True, help="the corpus's blocks .npz files, in order"),
                     OUT(help="dump folder"),
                     option("--shard", type=nonneg_int, default=None,
                            help="write only the folder of this shard of the dump (shard{K}, from the one --blocks "
                                 "file); `densephrases combine` then writes the dump's meta.json. Default: the whole "
                                 "dump"),
                     option("--batch-blocks", type=positive_int, default=32,
                            help="blocks (units windows) per forward pass"),
                     _settings("dump"))),
    Command("combine", "the dump's meta.json over its shards (after `dump --shard` of each)", cmd_combine,
            description="Checks that one phrase encoder and filter made the shards shard0 ... shard{N-1} of the dump "
                        "folder and writes its meta.json, which readers need (npm.densephrases.dump.combine_shards).",
            options=(DUMP(help="dump folder"),
                     option("--shards", type=positive_int, required=True,
                            help="shards of the dump (blocks files of the corpus)"))),
    Command("trim", "the dump's tokens that can begin or end a phrase (the compressed index's filter)", cmd_trim,
            description="A dump folder of the rows of --dump whose token begins or ends a word that may begin or end "
                        "a phrase; the others are never a phrase's start or end, so no phrase is lost. With "
                        "--compressed-filter-threshold, only those the model's trained filter head keeps "
                        "(npm.densephrases.dump.trim_dump).",
            options=(DUMP(help="dump folder"), OUT(help="trimmed dump folder"),
                     CHECKPOINT(required=False, default=None,
                                help="the DensePhrases model that made the dump (its filter head; with "
                                     "--compressed-filter-threshold)"),
                     _settings("trim"))),
    Command("index", "FAISS index of a dump from a factory string", cmd_index,
            description="Flat (exact), the paper's IVF{n},SQ4, the code's OPQ{M},IVF{n},PQ{M}; inner product "
                        "(npm.densephrases.dump.build_index).",
            options=(DUMP(help="dump folder"), OUT(help="index file (sidecar <out>.json beside it)"),
                     option("--factory", default="Flat", help="FAISS factory string"), _settings("index"),
                     SEED(default=1, help="seed of the training sample"), MEM_MB)),
    Command("query-ft", "query-side fine-tuning against the frozen index", cmd_query_ft,
            description="Marginal likelihood of the answer-matching phrases among the top k "
                        "(npm.densephrases.query_ft); the phrase side, dump and index stay unchanged.",
            options=(CHECKPOINT, DUMP, INDEX, TRAIN(help="questions: SQuAD .json or JSONL {question, answers}"),
                     option("--dev", type=Path, default=None, help="dev questions: the best epoch by EM is kept"),
                     OUT(help="fine-tuned model folder"), MAX_WORDS, section(DensePhrasesQueryFt), SEED,
                     _settings("query-ft"), tracking.OPTIONS)),
    Command("evaluate", "RC EM/F1 (vs a random span and the teacher) and open-domain EM@1", cmd_evaluate,
            description="--rc: reading comprehension on SQuAD examples; --questions: top-1 phrase EM over the index, "
                        "with queries/s (npm.densephrases.evaluate).",
            options=(CHECKPOINT(help="DensePhrases model folder"),
                     option("--rc", type=Path, default=None, help="SQuAD JSON for reading comprehension"),
                     TEACHER(help="teacher folder: its RC EM/F1 beside"),
                     option("--d-small-pool", type=Path, nargs="*", default=[],
                            help="SQuAD JSON files whose passages join the --rc passages in D_small (Table 6's "
                                 "semi-open setting: every --rc question over all pooled passages)"),
                     option("--d-small-index", default=None, metavar="FACTORY",
                            help="with --rc: D_small through phrase indexes instead, the pooled passages dumped: "
                                 "the Flat index of the dump (fp16 scores) and this FAISS factory's index of its "
                                 "trimmed dump, scored from its codes (npm.densephrases.evaluate.d_small_index)"),
                     option("--questions", type=Path, nargs="+", default=[],
                            help="open-domain question files (SQuAD .json or JSONL {question, answers}), each named "
                                 "by its stem"),
                     option("--task", nargs="+", default=[],
                            help="open-set tasks of config/tasks.yaml, asked as questions "
                                 "(npm.densephrases.evaluate.task_question)"),
                     TASKS_ROOT,
                     DUMP(required=False, default=None, help="dump folder (--questions, --task)"),
                     INDEX(required=False, default=None, help="index file (--questions, --task)"),
                     K, MAX_WORDS,
                     OUT(help="results JSON"), _settings("evaluate"), tracking.OPTIONS)),
    Command("search", "print the top phrases of questions with their passages", cmd_search,
            description="npm-repro densephrases search --checkpoint M --dump D --index I \"What is the capital of "
                        "Greece?\"",
            options=(CHECKPOINT, DUMP, INDEX, option("question", nargs="+", help="question(s)"), K, MAX_WORDS,
                     option("--top", type=positive_int, default=5, help="phrases printed per question"),
                     option("--evidence", action=argparse.BooleanOptionalAction, default=True,
                            help="print the passage"),
                     _settings("search"))),
)


def commands(rc: Callable | None = None) -> tuple[Command, ...]:
    """``densephrases`` and its steps; ``rc`` is the handler of step ``rc`` (npm.cli's: it builds demo data)."""
    return (Command("densephrases", "DensePhrases: phrase retrieval with start/end token vectors",
                    description="DensePhrases (Lee et al. 2021): train the phrase and question encoders on reading "
                                "comprehension, dump and index the corpus's token vectors, search phrases, fine-tune "
                                "the query side (npm.densephrases).",
                    steps=(replace(RC, func=rc), *STEPS), dest="densephrases_command"),)
