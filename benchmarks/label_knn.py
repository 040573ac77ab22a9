"""Diagnostic: does a closed-set kNN scorer rank the labels, and what decides its prediction? (paper 3.3, A.3-A.4;
docs/paper-map.md §4.1; docs/expected-numbers.md "Why NPM's sentiment and Subj cells sit at chance".)

For each closed-set task and system (npm, npm_single) of a finished workflow (its config, models, datastores and
task files under ``--root``), the task's evaluated examples (``--all``: every example of the task file) are encoded
once and every datastore of the task's reference corpus is searched **exactly** (numpy inner products with every
stored vector, the Flat index of the embedded default) for the ``max(--k)`` nearest rows per query vector. Then, for
each k (the first k of those rows, per datastore and query vector, as the evaluation's search returns them) and each
tau, the evaluation's own label scores (``npm.inference.closed_set.label_scores``) give:

* ``accuracy`` and ``predicted``: the share of examples predicted as each label (all on one label = the prior won);
* ``auc`` (two-label tasks): the area under the ROC curve of log(s_1 / s_0) against the gold label, i.e. how well
  the scores *rank* the examples whatever the decision threshold (0.5 = no signal);
* ``label_mass``: the share of the neighbours' probability that falls on verbalizer tokens at all;
* ``datastore_share``: the share of the datastore's stored tokens that are each label's verbalizer tokens (the
  prior a context-blind query falls back to).

Writes results/benchmarks/label_knn-cpu.json and prints one line per setting. It measures; it asserts nothing.

    .venv/bin/python benchmarks/label_knn.py [--root .] [--tasks sst2 mr rt cr amazon subj] [--all]
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import numpy as np
import yaml

from npm.inference.closed_set import label_scores
from npm.inference.predictor import Predictor
from npm.io import write_summary
from npm.settings import Settings
from npm.tasks.registry import label_verbalizers, task_examples

SENTIMENT_AND_SUBJ = ("sst2", "mr", "rt", "cr", "amazon", "subj")


def auc(score: np.ndarray, gold: np.ndarray) -> float | None:
    """Area under the ROC curve of ``score`` for gold label 1 against 0 (ties count one half); None when the
    examples hold only one of the two labels."""
    pos, neg = score[gold == 1], score[gold == 0]
    if not len(pos) or not len(neg):
        return None
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (len(pos) * len(neg)))


def exact_knn(predictor, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and scores q . e / sqrt(h), both [n, m, k], of the k nearest stored rows of every query vector
    (``vectors`` float32 [n, m, h]), best first."""
    ds = predictor.ds
    stored = ds.vectors(np.arange(ds.n_rows)).astype(np.float32)
    n, m, h = vectors.shape
    sims = vectors.reshape(n * m, h) @ stored.T * predictor.scale
    k = min(k, ds.n_rows)
    top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    top = np.take_along_axis(top, np.argsort(-np.take_along_axis(sims, top, 1), axis=1), 1)
    ids = ds.row_token_ids(top.ravel()).reshape(n, m, k)
    return ids, np.take_along_axis(sims, top, 1).reshape(n, m, k)


def measure(task: str, model: str, corpora: list[str], root: Path, config: Path, ks: list[int],
            taus: list[float], n_samples: int | None) -> list[dict]:
    predictors = [Predictor.from_config(model, c, config=config, root=root) for c in corpora]
    tokenizer, settings = predictors[0].tokenizer, predictors[0].settings
    examples = task_examples(task, root / "data/tasks" / task, tokenizer, n_samples=n_samples)
    gold = np.array([ex["label"] for ex in examples])
    verbalizers = label_verbalizers(task, tokenizer, root / "data/tasks", fuzzy=settings.fuzzy_verbalizers)
    vectors = predictors[0].encode([ex["input"] for ex in examples])
    found = [exact_knn(p, vectors, max(ks)) for p in predictors]
    share = []
    for p in predictors:
        row_ids = p.ds.row_token_ids(np.arange(p.ds.n_rows))
        share.append([float(np.isin(row_ids, v).mean()) for v in verbalizers])
    rows = []
    for k in ks:
        for tau in taus:
            scores = np.array([
                label_scores(np.concatenate([ids[i, :, :k].ravel() for ids, _ in found]),
                             np.concatenate([s[i, :, :k].ravel() for _, s in found]), verbalizers, tau=tau,
                             tau_twice=settings.tau_twice and model == "npm")
                for i in range(len(examples))])
            pred = scores.argmax(axis=1)
            row = {"task": task, "system": model, "corpora": corpora, "n": len(examples), "k": k, "tau": tau,
                   "accuracy": float(100 * (pred == gold).mean()),
                   "predicted": [float((pred == label).mean()) for label in range(len(verbalizers))],
                   "label_mass": float(scores.sum(axis=1).mean()), "datastore_share": share}
            if len(verbalizers) == 2:
                row["auc"] = auc(np.log(scores[:, 1] + 1e-12) - np.log(scores[:, 0] + 1e-12), gold)
            rows.append(row)
            shown = "-" if row.get("auc") is None else f"{row['auc']:.3f}"
            print(f"{task:7s} {model:10s} k={k:5d} tau={tau:g}: accuracy {row['accuracy']:5.1f}  predicted "
                  f"{[round(x, 2) for x in row['predicted']]}  AUC {shown}  label mass {row['label_mass']:.3f}",
                  flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."), help="the workflow's folder (default: .)")
    parser.add_argument("--config", type=Path, default=Path("config/config.yaml"),
                        help="its config, relative to --root (default: config/config.yaml)")
    parser.add_argument("--tasks", nargs="+", default=list(SENTIMENT_AND_SUBJ),
                        help="closed-set tasks (default: the sentiment tasks and Subj)")
    parser.add_argument("--systems", nargs="+", choices=["npm", "npm_single"], default=["npm", "npm_single"])
    parser.add_argument("--k", nargs="+", type=int, default=[8, 32, 128, 512, 4096],
                        help="neighbours per query vector and datastore (default: 8 32 128 512 4096)")
    parser.add_argument("--tau", nargs="+", type=float, default=[1.0, Settings().closed_set_tau],
                        help="temperatures (default: 1 and the paper's closed-set tau)")
    parser.add_argument("--all", action="store_true",
                        help="every example of the task file, not the evaluated sample (evaluation.max_examples)")
    parser.add_argument("--out-dir", type=Path, default=Path("results/benchmarks"))
    args = parser.parse_args()
    cfg = yaml.safe_load((args.root / args.config).read_text(encoding="utf-8"))
    evaluation = cfg["evaluation"]
    n_samples = 0 if args.all else evaluation.get("max_examples")
    results, t0 = [], time.perf_counter()
    for task in args.tasks:
        corpora = evaluation.get("task_corpus", {}).get(task, evaluation["reference_corpora"])
        corpora = [corpora] if isinstance(corpora, str) else list(corpora)
        for model in args.systems:
            results += measure(task, model, corpora, args.root, args.config, sorted(args.k), args.tau, n_samples)
    out_path = args.out_dir / "label_knn-cpu.json"
    seconds = round(time.perf_counter() - t0, 1)  # the docs state no duration: this file has it, measured
    write_summary(out_path, {"benchmark": "label_knn", "device": "cpu", "seconds": seconds,
                             "machine": platform.processor() or platform.machine(), "results": results}, vars(args))
    print(f"wrote {out_path} ({seconds} s)")


if __name__ == "__main__":
    main()
