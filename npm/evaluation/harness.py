"""The evaluation harness: one task, one system, one file of predictions and one of metrics (paper 4-6;
docs/paper-map.md §4.1, §5.2).

``evaluate`` alone resolves the task (config/tasks.yaml), checks the system applies and has what it needs, loads
the system's scorer (``npm.evaluation.systems``), samples the task's examples (seed 0, paper-map §5.2), runs the
scorer over all of them, scores with the task's metric, adds timing and provenance, and writes the predictions JSONL
and the metrics JSON atomically. Every system goes through it, so every row of a table is sampled and scored alike:

* closed set: prediction = argmax of the scorer's label scores; accuracy in percent;
* open set: the scorer's answer, cut at its first punctuation character for entity translation (every system's, or
  with ``inference.translation_cut: decoders`` only the decoder baselines', as the original code); exact match after
  SQuAD normalisation; macro over LAMA n-gram buckets (``inference.lama_average``) and translation languages, micro
  otherwise; LAMA also reports its UHN and Hard subsets, averaged the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from npm.evaluation.systems import Inputs, Output, get
from npm.io import check_finite, write_jsonl, write_summary
from npm.model import load_tokenizer
from npm.progress import bar as progress_bar
from npm.settings import Settings
from npm.tasks.metrics import SAMPLING_SEED, aggregate, bootstrap, exact_match, translation_prediction
from npm.tasks.registry import Task, resolve_task, task_examples
from npm.threads import threads

log = logging.getLogger("npm-repro.evaluate")

EXAMPLE_KEYS = ("group", "bucket", "lang", "relation", "is_uhn", "is_hard")  # copied into each predictions record


# ------------------------------------------------------------------------------------------------ scoring a task

def task_metrics(task: Task | str, system: str, examples: Sequence[dict], correct: Sequence[float],
                 average: str | None = None) -> dict:
    """The metrics record of one task (paper-map §5.2): the score in percent, micro or macro over the examples'
    ``group`` (LAMA n-gram buckets, translation languages), its bootstrap standard error and 95 % interval
    (``npm.tasks.metrics.bootstrap``), per-group scores, and LAMA's UHN / Hard subsets, each of these with its own
    bootstrap standard error (``groups_stderr``, ``subsets_stderr``: every mean a table shows has its ±).
    ``average`` overrides the registry's."""
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
    interval = bootstrap(correct, groups if average == "macro" else None, average)
    metrics.update(stderr=100.0 * interval["stderr"], ci95=[100.0 * x for x in interval["ci95"]])
    if has_groups:
        per_group: dict = {}
        for g, c in zip(groups, correct, strict=True):
            per_group.setdefault(g, []).append(c)
        metrics["groups"] = {str(g): 100.0 * float(np.mean(v)) for g, v in per_group.items()}
        metrics["groups_stderr"] = {str(g): 100.0 * bootstrap(v)["stderr"] for g, v in per_group.items()}
    if task.template == "lama":
        metrics["subsets"], metrics["subsets_stderr"] = {}, {}
        for name, key in (("uhn", "is_uhn"), ("hard", "is_hard")):
            keep = [i for i, ex in enumerate(examples) if ex.get(key)]
            if not keep:  # no such subset (Google-RE has no Hard list) or none sampled
                metrics["subsets"][name] = metrics["subsets_stderr"][name] = None
                continue
            sub_groups = [groups[i] for i in keep] if average == "macro" else None
            sub_correct = [correct[i] for i in keep]
            metrics["subsets"][name] = _percent(sub_correct, sub_groups, average)
            metrics["subsets_stderr"][name] = 100.0 * bootstrap(sub_correct, sub_groups, average)["stderr"]
            metrics["subsets"][f"n_{name}"] = len(keep)
    return metrics


def _percent(scores: Sequence[float], groups: Sequence | None, average: str) -> float:
    return 100.0 * aggregate(scores, groups, average)


def score_examples(task: Task, examples: Sequence[dict], output, cut_translation: bool = True
                   ) -> tuple[list[dict], list[float]]:
    """Predictions records and correctness of a scorer's ``Output`` (closed set: argmax of ``scores``; open set:
    ``answers`` through the task's answer rule: entity translation's first-punctuation cut unless
    ``cut_translation`` is False)."""
    extras = output.records or [{}] * len(examples)
    n_out = len(output.scores) if task.closed else len(output.answers)
    if n_out != len(examples) or len(extras) != len(examples):
        raise ValueError(f"task {task.name}: the system answered {n_out} of {len(examples)} examples")
    records, correct = [], []
    for i, ex in enumerate(examples):
        rec = {"id": ex["id"], "input": ex["input"]}
        if task.closed:
            row = np.asarray(output.scores[i], dtype=np.float64)
            if not np.all(np.isfinite(row)):
                raise ValueError(f"task {task.name}, example {ex['id']}: non-finite label scores {row.tolist()}")
            pred = int(np.argmax(row))
            ok = pred == int(ex["label"])
            rec.update(label=int(ex["label"]), prediction=pred, scores=[float(s) for s in row])
        else:
            raw = output.answers[i]
            pred = translation_prediction(raw) if cut_translation and task.prompt_family == "translation" else raw
            ok = exact_match(pred, ex["answers"])
            rec.update(answers=list(ex["answers"]), prediction=pred)
            if pred != raw:
                rec["raw_prediction"] = raw
        rec.update(extras[i])
        rec.update({key: ex[key] for key in EXAMPLE_KEYS if key in ex})
        rec["correct"] = bool(ok)
        records.append(rec)
        correct.append(float(ok))
    return records, correct


# ------------------------------------------------------------------------------------------------ inputs

def check_inputs(task: Task, system, inputs: Inputs, settings: Settings) -> None:
    """A clear error unless ``inputs`` hold exactly what ``system`` needs for ``task`` (and those paths exist)."""
    needs = system.needs(task.closed, settings.retriever)
    if not system.applies(task.closed, task.template):
        raise ValueError(f"system {system.name} cannot answer task {task.name}: its template puts text after the "
                         "mask and has no causal form (npm.tasks.templates.CAUSAL_TEMPLATES), so a left-to-right LM "
                         "cannot score it")
    if not inputs.checkpoint:
        raise ValueError(f"system {system.name} needs its {system.model} checkpoint (--checkpoint)")
    for name in ("datastore", "faiss", "bm25", "blocks"):
        given = getattr(inputs, name)
        if name in needs and not given:
            raise ValueError(f"system {system.name} on {'closed' if task.closed else 'open'}-set task {task.name} "
                             f"needs --{name} (it reads {', '.join(needs)})")
        if given and name not in needs:
            log.warning("system %s on task %s does not read --%s: ignored", system.name, task.name, name)
            setattr(inputs, name, [])
        for path in getattr(inputs, name):
            if not Path(path).exists():
                raise FileNotFoundError(f"{name} {path} does not exist; run the workflow rule that builds it first")
    if inputs.control is not None and "datastore" not in needs:
        raise ValueError(f"negative control {inputs.control!r} shuffles datastore vectors; system {system.name} on "
                         f"task {task.name} reads no datastore")
    if "encoder" in needs and not inputs.encoder:
        raise ValueError(f"system {system.name} with retriever 'dense' needs the NPM encoder (--encoder)")
    if "datastore" in needs:
        n = len(inputs.datastore)
        if not task.closed and n != 1:
            raise ValueError(f"open-set task {task.name} is evaluated on one datastore, got {n}")
        for name in ("faiss", "bm25"):
            if name in needs and len(getattr(inputs, name)) != n:
                raise ValueError(f"{len(getattr(inputs, name))} --{name} path(s) for {n} datastore(s): give one per "
                                 "datastore, in the same order")
    elif "bm25" in needs and len(inputs.bm25) != 1:
        raise ValueError(f"system {system.name} reads one corpus: give one --bm25 index, got {len(inputs.bm25)}")


def _bucket_tokenizer(task: Task, tokenizer: str | None, scorer, system):
    """The tokenizer that counts LAMA answers' n-gram buckets (paper-map §5.1: the NPM model's), or None."""
    if task.group_by != "bucket":
        return scorer.tokenizer
    if tokenizer:
        return load_tokenizer(tokenizer)
    if system.model == "lm":
        log.warning("task %s: LAMA n-gram buckets counted with the LM's tokenizer; pass the NPM tokenizer "
                    "(--tokenizer) to sample and group exactly as the NPM rows do", task.name)
    return scorer.tokenizer


# ------------------------------------------------------------------------------------------------ tasks

def evaluate(task: str | Task, system: str, inputs: Inputs, settings: Settings | None = None, *,
             n_samples: int | None = None, tokenizer: str | None = None,
             predictions_path: str | os.PathLike | None = None, metrics_path: str | os.PathLike | None = None,
             registry: Mapping[str, Task] | str | os.PathLike | None = None) -> dict:
    """Evaluate ``system`` (a name of ``npm.evaluation.systems.SYSTEMS``) on ``task`` with ``inputs`` (its checkpoint
    and the reference corpus's artefacts) under ``settings`` (default: the paper's): ``evaluate_tasks`` with one
    task. Returns its metrics."""
    return evaluate_tasks([task], system, inputs, settings, n_samples=n_samples, tokenizer=tokenizer,
                          predictions_paths=[predictions_path], metrics_paths=[metrics_path], registry=registry)[0]


def evaluate_tasks(tasks: Sequence[str | Task], system: str, inputs: Inputs, settings: Settings | None = None, *,
                   n_samples: int | None = None, tokenizer: str | None = None,
                   predictions_paths: Sequence[str | os.PathLike | None] | None = None,
                   metrics_paths: Sequence[str | os.PathLike | None] | None = None,
                   registry: Mapping[str, Task] | str | os.PathLike | None = None) -> list[dict]:
    """Evaluate ``system`` on each of ``tasks`` with one loaded scorer (the model, datastores and indexes are read
    once). Every task must read the same artefacts of ``inputs`` (all are checked before anything is loaded).
    Examples come from ``{inputs.tasks_root}/{task}``, sampled as the registry says (seed 0; ``n_samples``
    overrides, 0 keeps all); ``tokenizer`` names the tokenizer of LAMA's n-gram buckets (default: the system's).
    Writes each task's predictions JSONL and metrics JSON (with provenance: every argument, the git commit, package
    versions) when their paths are given, as soon as the task is done; a task listed twice is answered once and
    written to both paths. Returns the metrics, task order."""
    n = len(tasks)
    predictions_paths = list(predictions_paths) if predictions_paths is not None else [None] * n
    metrics_paths = list(metrics_paths) if metrics_paths is not None else [None] * n
    if not n or len(predictions_paths) != n or len(metrics_paths) != n:
        raise ValueError(f"{n} task(s), {len(predictions_paths)} predictions path(s) and {len(metrics_paths)} "
                         "metrics path(s): give one of each per task, in the same order")
    settings = settings or Settings()
    entry = get(system)
    specs = [resolve_task(t, registry) for t in tasks]
    checked = None
    for spec in specs:  # every task's inputs, before the scorer loads
        given = dataclasses.replace(inputs, **{k: [str(p) for p in getattr(inputs, k)]
                                               for k in ("datastore", "faiss", "bm25", "blocks")})
        check_inputs(spec, entry, given, settings)
        if checked is not None and given != checked:
            raise ValueError(f"tasks {specs[0].name} and {spec.name} read different artefacts of system {system}: "
                             "evaluate them in separate runs")
        checked = given
        if not (Path(given.tasks_root) / spec.name).is_dir():
            raise FileNotFoundError(f"task folder {Path(given.tasks_root) / spec.name} does not exist; {spec.where()}")


    t0 = time.perf_counter()
    scorer = entry.load(entry, checked, settings)
    load_seconds = time.perf_counter() - t0
    results, done = [], {}
    for spec, predictions_path, metrics_path in zip(specs, predictions_paths, metrics_paths, strict=True):
        config = {"task": spec.name, "system": system, "inputs": dataclasses.asdict(checked),
                  "settings": settings.as_dict(), "n_samples": n_samples, "sampling_seed": SAMPLING_SEED,
                  "tokenizer": tokenizer, "tasks_in_run": [s.name for s in specs],
                  "predictions_path": None if predictions_path is None else str(predictions_path),
                  "metrics_path": None if metrics_path is None else str(metrics_path)}
        if spec.name not in done:  # a task listed twice (Figure 7's 100 % point is the task's own corpus) runs once
            done[spec.name] = _run_task(spec, entry, scorer, checked, settings, n_samples, tokenizer)
        metrics, records = dict(done[spec.name][0]), done[spec.name][1]
        metrics["load_seconds"] = load_seconds
        if metrics_path is not None:  # a NaN / inf score is an error naming the key, before either file is written
            check_finite(metrics, str(metrics_path))
        if predictions_path is not None:
            write_jsonl(predictions_path, records)
        if metrics_path is not None:
            write_summary(metrics_path, metrics, config=config)
        results.append(metrics)
    return results


def _run_task(spec: Task, entry, scorer, inputs: Inputs, settings: Settings, n_samples: int | None,
              tokenizer: str | None) -> tuple[dict, list[dict]]:
    """One task through a loaded scorer: sample, answer, score, time. Returns (metrics, predictions records)."""

    folder = Path(inputs.tasks_root) / spec.name
    examples = task_examples(spec.name, folder, tokenizer=_bucket_tokenizer(spec, tokenizer, scorer, entry),
                             n_samples=n_samples, registry={spec.name: spec})
    if not examples:
        raise ValueError(f"task {spec.name}: no examples to evaluate in {folder}")
    log.info("task %s, system %s: %d examples, checkpoint %s, corpus %s", spec.name, entry.name, len(examples),
             inputs.checkpoint, scorer.info.get("corpus"))
    run = scorer.closed_set if spec.closed else scorer.open_set
    t0 = time.perf_counter()
    with progress_bar(total=len(examples), desc=f"{spec.name}/{entry.name}", unit="ex", disable=False,
                      mininterval=5) as bar:
        output = Output(**run(spec, examples, progress=bar.update))
    seconds = time.perf_counter() - t0
    # inference.translation_cut: every system's answer (all), or only the decoders' (the original code)
    records, correct = score_examples(spec, examples, output,
                                      cut_translation=settings.translation_cut == "all" or entry.model == "lm")

    average = settings.lama_average if spec.group_by == "bucket" else None
    metrics = task_metrics(spec, entry.name, examples, correct, average)
    metrics.update(seconds=seconds, queries_per_s=len(examples) / seconds if seconds > 0 else None)
    metrics.update(scorer.info)
    metrics.update(output.metrics)
    metrics["threads"], metrics["torch_threads"] = _threads()
    log.info("%s/%s: %s = %.2f [%.2f, %.2f] (n = %d; %.2f examples/s answered: encoding, retrieval and scoring, "
             "model and index load excluded)", spec.name, entry.name, spec.metric,
             metrics["score"], *metrics["ci95"], metrics["n"], metrics["queries_per_s"] or 0.0)
    return metrics, records


def _threads() -> tuple[int, int | None]:
    """The thread policy's count (``npm.threads``) and torch's threads in force."""
    import sys


    torch = sys.modules.get("torch")
    return threads(), torch.get_num_threads() if torch is not None else None


__all__ = ["check_inputs", "evaluate", "evaluate_tasks", "score_examples", "task_metrics"]
