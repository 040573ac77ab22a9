"""Zero-shot evaluation of NPM / NPM-single on one task (paper 4-5; reference npm.md 4.1, 5.2).

* Closed set (reference 4.1): every datastore of the reference corpus is searched separately with k = 4096
  neighbours per query vector (start and end vectors for NPM); the neighbour token ids and exact scores
  q . e / sqrt(h) are **concatenated across datastores** (the original's ``DataStoreUnion``) and go through **one**
  softmax (``npm.inference.closed_set.label_scores``, tau = 5; ``tau_twice`` reproduces the original code's
  s / tau^2 for NPM). A label's score is the probability mass of its verbalizer tokens: the fuzzy verbalizer
  (Shi et al. 2022) when the registry names one and its file exists, else the single label word. Prediction =
  argmax; metric = accuracy (%).
* Open set (reference 3.7-3.8, 5.2): the top phrase of ``Predictor.predict(text, top=1, mode="restricted")``
  (BM25 top-3 blocks; system ``npm_faiss``: ``mode="faiss"``, the paper's 6.4 ablation without sparse retrieval);
  entity translation cuts it at its first punctuation character; metric = exact match (%)
  after normalisation, averaged as the registry says (macro over LAMA n-gram buckets / translation languages,
  micro otherwise). LAMA also reports its UHN and Hard subsets, macro-averaged the same way.

``run_evaluation`` is the body of ``npm-repro evaluate``: it builds the predictors, loads the task's examples,
evaluates and writes the predictions (JSONL) and metrics (JSON with provenance) atomically.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from npm.inference.closed_set import label_scores
from npm.tasks.metrics import aggregate, exact_match, translation_prediction
from npm.tasks.registry import (
    DEFAULT_REGISTRY,
    DEFAULT_TASKS_ROOT,
    Task,
    fuzzy_verbalizer_path,
    load_registry,
)
from npm.tasks.registry import SEED as SAMPLING_SEED
from npm.tasks.templates import LABEL_WORDS, YAHOO_TOPICS, read_fuzzy_verbalizer_json, read_fuzzy_verbalizer_txt

log = logging.getLogger("npm-repro.evaluate")

SYSTEMS = ("npm", "npm_single", "npm_faiss")
KIND = {"npm": "npm", "npm_single": "npm_single", "npm_faiss": "npm"}  # npm_faiss: NPM open set without BM25
OPEN_MODE = {"npm": "restricted", "npm_single": "restricted", "npm_faiss": "faiss"}
TRANSLATION_TASKS = frozenset({"entity_translation"})


def resolve_task(task: Task | str, registry: Mapping[str, Task] | str | os.PathLike | None = None) -> Task:
    """A ``Task`` as is, or the registry entry of a task name (unknown name -> KeyError listing the tasks)."""
    if isinstance(task, Task):
        return task
    tasks = registry if isinstance(registry, Mapping) else load_registry(registry or DEFAULT_REGISTRY)
    if task not in tasks:
        raise KeyError(f"unknown task {task!r}; the registry has {list(tasks)}")
    return tasks[task]


def _check_system(system: str) -> None:
    if system not in SYSTEMS:
        extra = " (the parametric MLM baseline is scored by npm.baselines, not here)" if system == "mlm" else ""
        raise ValueError(f"unknown system {system!r}: evaluation takes one of {list(SYSTEMS)}{extra}")


# ------------------------------------------------------------------------------------------------ verbalizers

def _single_token(word: str, tokenizer, label) -> int:
    pieces = tokenizer(" " + word.strip(), add_special_tokens=False)["input_ids"]
    if len(pieces) != 1:
        raise ValueError(f"label word {word!r} of label {label!r} encodes to {len(pieces)} tokens {pieces} with a "
                         "leading space; every verbalizer word must be exactly one token (reference 4.1 step 6)")
    return int(pieces[0])


def label_verbalizers(task: Task | str, tokenizer, tasks_root: str | os.PathLike = DEFAULT_TASKS_ROOT,
                      fuzzy: bool = True) -> list[np.ndarray]:
    """Token ids (int64 arrays, label-id order) of each label's verbalizer (reference 4.1 step 6).

    The fuzzy verbalizer ``{tasks_root}/fuzzy_verbalizers/{task.fuzzy}`` when ``fuzzy`` and the registry names one
    and the file exists; else the single label word of ``templates.LABEL_WORDS``. Every word must be one token
    after a leading space (a clear ValueError otherwise).
    """
    task = resolve_task(task)
    if not task.closed:
        raise ValueError(f"task {task.name} is open-set: it has no verbalizer")
    words = LABEL_WORDS[task.template]
    path = fuzzy_verbalizer_path(task, tasks_root) if fuzzy else None
    if path is not None and path.is_file():
        if path.suffix == ".json":
            topics = YAHOO_TOPICS if task.template == "yahoo" else None
            out = read_fuzzy_verbalizer_json(path, tokenizer, topics=topics)
        else:
            out = read_fuzzy_verbalizer_txt(path, tokenizer)
        if len(out) != len(words):
            raise ValueError(f"fuzzy verbalizer {path} has {len(out)} labels, task {task.name} has {len(words)}")
        log.info("task %s: fuzzy verbalizer %s (%s words per label)", task.name, path, [len(v) for v in out])
        return out
    if path is not None:
        log.warning("task %s: fuzzy verbalizer %s not found; using the single label words", task.name, path)
    return [np.array([_single_token(w, tokenizer, label)], dtype=np.int64) for label, w in enumerate(words)]


# ------------------------------------------------------------------------------------------------ closed set

def union_knn(predictors: Sequence, text: str) -> tuple[np.ndarray, np.ndarray]:
    """Neighbour token ids and exact scores of every datastore, concatenated (the original's DataStoreUnion)."""
    if not predictors:
        raise ValueError("closed-set scoring needs at least one datastore (predictor)")
    ids, sims = zip(*(p.knn(text) for p in predictors), strict=True)
    return np.concatenate(ids), np.concatenate(sims)


def closed_set_scores(predictors: Sequence, text: str, verbalizers: list[np.ndarray], tau: float = 5.0,
                      tau_twice: bool = False) -> np.ndarray:
    """Label scores float64 [n_labels] over the union of the predictors' datastores: one softmax over all their
    neighbours (reference 4.1 steps 2-5). ``tau_twice`` applies to NPM only (reference 4.1 step 3)."""
    kinds = {p.kind for p in predictors}
    if len(kinds) > 1:
        raise ValueError(f"predictors of different kinds {sorted(kinds)} cannot be scored together")
    ids, sims = union_knn(predictors, text)
    return label_scores(ids, sims, verbalizers, tau=tau, tau_twice=tau_twice and kinds == {"npm"})


# ------------------------------------------------------------------------------------------------ one task

def task_metrics(task: Task | str, system: str, examples: Sequence[dict], correct: Sequence[float],
                 average: str | None = None) -> dict:
    """The metrics record of one task (reference 5.2): the score in percent, micro or macro over the examples'
    ``group`` (LAMA n-gram buckets, translation languages), per-group scores, and LAMA's UHN / Hard subsets.
    Shared by every system (NPM, the MLM and LM baselines) so that all rows of a table are scored alike."""
    task = resolve_task(task)
    if len(correct) != len(examples):
        raise ValueError(f"{len(correct)} correctness values for {len(examples)} examples")
    average = average or task.average
    groups = [ex.get("group") for ex in examples]
    has_groups = task.group_by is not None and all(g is not None for g in groups)
    if average == "macro" and not has_groups:
        raise ValueError(f"task {task.name}: a macro average needs a `group` on every example")
    metrics = {
        "task": task.name,
        "system": system,
        "metric": task.metric,
        "score": _percent(correct, groups if average == "macro" else None, average),
        "n": len(examples),
        "average": average,
    }
    if has_groups:
        per_group: dict = {}
        for g, c in zip(groups, correct, strict=True):
            per_group.setdefault(g, []).append(c)
        metrics["groups"] = {str(g): 100.0 * float(np.mean(v)) for g, v in per_group.items()}
    if task.template == "lama":
        metrics["subsets"] = {}
        for name, key in (("uhn", "is_uhn"), ("hard", "is_hard")):
            keep = [i for i, ex in enumerate(examples) if ex.get(key)]
            if not keep:  # no such subset (Google-RE has no Hard list) or none sampled
                metrics["subsets"][name] = None
                continue
            sub_groups = [groups[i] for i in keep] if average == "macro" else None
            metrics["subsets"][name] = _percent([correct[i] for i in keep], sub_groups, average)
            metrics["subsets"][f"n_{name}"] = len(keep)
    return metrics


def _percent(scores: Sequence[float], groups: Sequence | None, average: str) -> float:
    return 100.0 * aggregate(scores, groups, average)


def evaluate_task(task: Task | str, system: str, examples: Sequence[dict], predictors: Sequence, tokenizer=None,
                  verbalizers: list[np.ndarray] | None = None, tasks_root: str | os.PathLike = DEFAULT_TASKS_ROOT,
                  tau: float = 5.0, tau_twice: bool = False, fuzzy: bool = True, average: str | None = None,
                  log_every: int = 100) -> tuple[list[dict], dict]:
    """Predict every example and score the task. Returns ``(predictions, metrics)``.

    Closed set: ``closed_set_scores`` over all ``predictors`` (one per datastore), argmax, accuracy.
    Open set: the top phrase of the single predictor (restricted mode; FAISS mode for npm_faiss), exact match.
    ``average`` overrides the registry's (``macro`` / ``micro``). Scores are percentages.
    """
    task = resolve_task(task)
    _check_system(system)
    if not examples:
        raise ValueError(f"task {task.name}: no examples to evaluate")
    if not predictors:
        raise ValueError(f"task {task.name}: no predictor (datastore) to evaluate with")
    if task.closed and verbalizers is None:
        if tokenizer is None:
            tokenizer = predictors[0].tokenizer
        verbalizers = label_verbalizers(task, tokenizer, tasks_root, fuzzy=fuzzy)
    if task.closed and system == "npm_faiss":
        raise ValueError("npm_faiss is NPM's open-set search without BM25; closed-set tasks always use FAISS: "
                         "evaluate them as system npm")
    if not task.closed and len(predictors) != 1:
        raise ValueError(f"open-set task {task.name} is evaluated on one datastore, got {len(predictors)}")

    predictions, correct = [], []
    t0 = time.perf_counter()
    for i, ex in enumerate(examples):
        rec = {"id": ex["id"], "input": ex["input"]}
        if task.closed:
            scores = closed_set_scores(predictors, ex["input"], verbalizers, tau=tau, tau_twice=tau_twice)
            pred = int(np.argmax(scores))
            ok = pred == int(ex["label"])
            rec.update(label=int(ex["label"]), prediction=pred, scores=[float(s) for s in scores])
        else:
            top = predictors[0].predict(ex["input"], top=1, mode=OPEN_MODE[system], is_question=task.is_question)
            raw = top[0]["text"] if top else ""
            pred = translation_prediction(raw) if task.name in TRANSLATION_TASKS else raw
            ok = exact_match(pred, ex["answers"])
            rec.update(answers=list(ex["answers"]), prediction=pred)
            if pred != raw:
                rec["raw_prediction"] = raw
        for key in ("group", "bucket", "lang", "relation", "is_uhn", "is_hard"):
            if key in ex:
                rec[key] = ex[key]
        rec["correct"] = bool(ok)
        predictions.append(rec)
        correct.append(float(ok))
        if log_every and (i + 1) % log_every == 0:
            log.info("%s/%s: %d/%d examples, running %.2f%%", task.name, system, i + 1, len(examples),
                     100.0 * np.mean(correct))
    seconds = time.perf_counter() - t0

    metrics = task_metrics(task, system, examples, correct, average)
    if task.closed:
        metrics["tau"], metrics["tau_twice"] = tau, bool(tau_twice and system == "npm")
    metrics["seconds"] = seconds
    metrics["queries_per_s"] = len(examples) / seconds if seconds > 0 else float("inf")
    return predictions, metrics


# ------------------------------------------------------------------------------------------------ entry point

def _as_list(value, n: int, what: str) -> list:
    if value is None:
        return [None] * n
    if isinstance(value, (str, os.PathLike)):
        value = [value]
    value = [str(v) for v in value]
    if len(value) != n:
        raise ValueError(f"{len(value)} {what} path(s) for {n} datastore(s): give one per datastore, in order")
    return value


def run_evaluation(task: str, system: str, model: str, datastores: Sequence[str],
                   tasks_root: str | os.PathLike = DEFAULT_TASKS_ROOT, bm25=None, faiss=None,
                   predictions_path: str | os.PathLike | None = None, metrics_path: str | os.PathLike | None = None,
                   n_samples: int | None = None, tau: float | None = None, tau_twice: bool = False,
                   span_score: str = "paper", open_set_tau: float = 1.0, closed_set_tau: float = 5.0, k: int = 4096,
                   fuzzy: bool = True, registry: Mapping[str, Task] | str | os.PathLike | None = None,
                   device=None, corpus: str | None = None) -> dict:
    """Evaluate ``system`` (npm | npm_single; ``model`` its checkpoint) on ``task`` with the union of
    ``datastores``; examples from ``{tasks_root}/{task}``. ``faiss``: one index per datastore (closed set);
    ``bm25``: one index per datastore (open set, restricted mode). ``tau`` overrides ``closed_set_tau`` /
    ``open_set_tau``. Writes the predictions JSONL and the metrics JSON (with provenance) when their paths are given
    and returns the metrics. ``corpus``: the reference corpus's name for the report (default: the datastore folder
    names joined by "+"). System ``mlm`` (the parametric baseline) is scored by npm.baselines.mlm without any
    datastore."""
    if system == "mlm":
        from npm.baselines.mlm import run_mlm_evaluation

        return run_mlm_evaluation(task, model, tasks_root=tasks_root, n_samples=n_samples,
                                  predictions_path=predictions_path, metrics_path=metrics_path, device=device,
                                  registry=registry)
    from npm.inference.predictor import Predictor
    from npm.io import write_jsonl, write_summary

    config = {k_: (str(v) if isinstance(v, os.PathLike) else v) for k_, v in locals().items()
              if k_ not in ("Predictor", "write_jsonl", "write_summary", "registry", "device")}
    config["datastores"] = [str(d) for d in datastores]
    config["sampling_seed"] = SAMPLING_SEED  # the registry's seed-0 example sample (reference 4.2, 5.2)
    spec = resolve_task(task, registry)
    _check_system(system)
    if isinstance(datastores, (str, os.PathLike)):
        datastores = [datastores]
    if not datastores:
        raise ValueError("no datastore given: the closed- and open-set evaluations read the reference corpus")
    for d in datastores:
        if not Path(d).exists():
            raise FileNotFoundError(f"datastore {d} does not exist; run the embed rule for it first")
    faiss_paths = _as_list(faiss, len(datastores), "FAISS index")
    bm25_paths = _as_list(bm25, len(datastores), "BM25 index")
    open_mode = OPEN_MODE[system]
    if spec.closed:
        if any(f is None for f in faiss_paths):
            raise ValueError(f"closed-set task {spec.name} needs a FAISS index per datastore (faiss=[...])")
        tau = closed_set_tau if tau is None else tau
    else:
        if len(datastores) != 1:
            raise ValueError(f"open-set task {spec.name} is evaluated on one datastore, got {len(datastores)}")
        if open_mode == "restricted" and bm25_paths[0] is None:
            raise ValueError(f"open-set task {spec.name} needs a BM25 index (restricted mode, reference 3.8)")
        if open_mode == "faiss" and faiss_paths[0] is None:
            raise ValueError(f"system {system} searches the whole datastore: it needs a FAISS index (faiss=...)")
        tau = open_set_tau if tau is None else tau
    for p in [*faiss_paths, *bm25_paths]:
        if p is not None and not Path(p).exists():
            raise FileNotFoundError(f"index {p} does not exist; run the index rule for it first")
    folder = Path(tasks_root) / spec.name
    if not folder.is_dir():
        raise FileNotFoundError(f"task folder {folder} does not exist; {spec.where()}")

    predictors = [
        Predictor(model, d, kind=KIND[system], bm25=b, faiss=f, tau=1.0 if spec.closed else tau,
                  l_max=spec.l_max or 10, form=span_score, open_set=not spec.closed, k=k, device=device)
        for d, f, b in zip(datastores, faiss_paths, bm25_paths, strict=True)
    ]
    tokenizer = predictors[0].tokenizer
    from npm.tasks.registry import task_examples

    examples = task_examples(spec.name, folder, tokenizer=tokenizer, n_samples=n_samples,
                             registry={spec.name: spec})
    log.info("task %s, system %s: %d examples, %d datastore(s)", spec.name, system, len(examples), len(datastores))
    predictions, metrics = evaluate_task(spec, system, examples, predictors, tokenizer, tasks_root=tasks_root,
                                         tau=tau, tau_twice=tau_twice, fuzzy=fuzzy)
    if not spec.closed:
        metrics["tau"] = tau
    metrics.update(
        model=str(model), datastores=[str(d) for d in datastores], k=k,
        corpus=corpus or "+".join(Path(d).name for d in datastores),
        corpus_tokens=sum(p.ds.n_tokens for p in predictors),
        parameters=sum(p.numel() for p in predictors[0].model.parameters()),
        retrieval="faiss" if spec.closed or open_mode == "faiss" else "bm25",
        device=str(next(predictors[0].model.parameters()).device),
    )
    if predictions_path is not None:
        write_jsonl(predictions_path, predictions)
    if metrics_path is not None:
        write_summary(metrics_path, metrics, config=config)
    log.info("%s/%s: %s = %.2f (n = %d)", spec.name, system, spec.metric, metrics["score"], metrics["n"])
    return metrics


__all__ = ["closed_set_scores", "evaluate_task", "label_verbalizers", "resolve_task", "run_evaluation",
           "task_metrics", "union_knn"]
