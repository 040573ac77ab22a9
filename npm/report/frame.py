"""The tidy rows of every number the workflow writes, for one DataFrame (paper 5-6; docs/paper-map.md §7, §R3, §D2).

``npm.report.results(root)`` reads, under ``root``:

* ``results/metrics/{task}/{run}.json`` (source ``metrics``) and ``results/control/metrics/...`` (``control``, the
  negative control): the task's score (``metric`` em / accuracy), LAMA's UHN / Hard ``subsets``, the per-group
  scores (``groups``: entity translation's languages, LAMA's n-gram buckets) and ``queries_per_s``;
* ``results/densephrases/eval/{variant}/{index}.json`` (``densephrases``): reading-comprehension EM / F1 (task
  ``rc``), open-domain EM@1 and queries/s per task, the index's bytes per vector and build seconds;
* ``results/replug/lm_eval.json`` (``lm_eval``, REPLUG's language modelling): bits per byte, gain over the plain LM
  and perplexity per system and k.

One row per number: ``source, task, system, run, model, corpus, retrieval, metric, subset, group, k`` tell the rows
apart (``run``: the file's name, ``npm@enwiki_p10``, or ``{variant}/{index}`` for DensePhrases; ``subset``: a LAMA
subset or a DensePhrases setting such as ``teacher`` / ``index_only``; ``group``: one group of ``groups``; ``k``:
REPLUG's documents), then ``value, stderr`` (a subset's or group's own from ``subsets_stderr`` / ``groups_stderr``),
``ci_low, ci_high, n`` and ``commit`` (the metrics' provenance git
commit), ``parameters``, ``corpus_tokens``, ``device`` and ``file``. A field a file lacks is empty (None / NaN).
The tables (``npm.report.tables``) pivot the same rows (:func:`metrics_frame`). ``npm.report.results``
(:mod:`npm.report.collect`) gathers them from every file under a folder::

    from npm.report import results
    df = results(".")                                            # every number under ./results
    scores = df.query("source == 'metrics' and run == system and subset.isna() and group.isna() and metric == 'em'")
    scores.pivot(index="system", columns="task", values="value")  # each system's EM per task, default corpus
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from npm.io import read_json

COLUMNS = ["source", "task", "system", "run", "model", "corpus", "retrieval", "metric", "subset", "group", "k",
           "value", "stderr", "ci_low", "ci_high", "n", "commit", "parameters", "corpus_tokens", "device", "file"]


def _num(value) -> float | None:
    """A finite number as itself, anything else (None, NaN, a string) as None."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return value if ok else None


def plain(value):
    """A cell of the frame as a plain Python value (for the tables' writers): None when missing (None, NaN, pd.NA),
    a numpy number as int / float, anything else as itself."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def _frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame = frame.astype({c: object for c in ("model", "corpus", "retrieval", "subset", "group", "commit", "device")})
    return frame.astype({"n": "Int64", "k": "Int64"})  # counts stay integers where some are missing


def metrics_rows(rec: dict, source: str = "metrics") -> list[dict]:
    """The rows of one metrics record (the contract of ``npm-repro evaluate``; ``_file`` its path)."""
    path = Path(rec.get("_file", ""))
    ci = rec.get("ci95") if isinstance(rec.get("ci95"), (list, tuple)) and len(rec["ci95"]) == 2 else (None, None)
    base = {"source": source, "task": rec["task"], "system": rec["system"], "run": path.stem or rec["system"],
            "model": rec.get("model") or None, "corpus": rec.get("corpus") or None,
            "retrieval": rec.get("retrieval") or None, "metric": rec["metric"], "subset": None, "group": None,
            "k": None, "commit": (rec.get("provenance") or {}).get("git_commit") or None,
            "parameters": _num(rec.get("parameters")), "corpus_tokens": _num(rec.get("corpus_tokens")),
            "device": rec.get("device"), "file": str(path) if rec.get("_file") else None}
    rows = [{**base, "value": rec["score"], "stderr": _num(rec.get("stderr")), "ci_low": _num(ci[0]),
             "ci_high": _num(ci[1]), "n": rec["n"]}]
    subsets = rec.get("subsets") if isinstance(rec.get("subsets"), dict) else {}
    subsets_se = rec.get("subsets_stderr") if isinstance(rec.get("subsets_stderr"), dict) else {}
    for name, value in subsets.items():
        if not name.startswith("n_"):
            rows.append({**base, "subset": name, "value": _num(value), "stderr": _num(subsets_se.get(name)),
                         "n": subsets.get(f"n_{name}")})
    groups_se = rec.get("groups_stderr") if isinstance(rec.get("groups_stderr"), dict) else {}
    for group, value in (rec.get("groups") or {}).items():
        rows.append({**base, "group": str(group), "value": _num(value), "stderr": _num(groups_se.get(str(group)))})
    if "queries_per_s" in rec:
        rows.append({**base, "metric": "queries_per_s", "value": _num(rec["queries_per_s"]), "n": rec["n"]})
    return rows


def metrics_frame(records: Sequence[dict], source: str = "metrics") -> pd.DataFrame:
    """The rows of metrics records (``npm.report.tables.load_metrics``), in record order."""
    return _frame([row for rec in records for row in metrics_rows(rec, source)])


def densephrases_rows(path: str | os.PathLike, results: dict) -> list[dict]:
    """The rows of one ``npm-repro densephrases evaluate`` results file (results/densephrases/eval/{variant}/
    {index}.json)."""
    path = Path(path)
    base = {"source": "densephrases", "system": "densephrases", "run": f"{path.parent.name}/{path.stem}",
            "model": results.get("model"), "file": str(path)}
    rows = []
    rc = results.get("rc")
    for key, subset in (("rc", None), ("rc_teacher", "teacher"), ("rc_random_span", "random_span"),
                        ("rc_d_small", "d_small")):
        part = results.get(key)
        if part:
            n = part.get("n", rc["n"] if rc else None)
            rows += [{**base, "task": "rc", "metric": m, "subset": subset, "value": part[m], "n": n}
                     for m in ("em", "f1") if m in part]
    for key, subset in (("open", None), ("open_index_only", "index_only")):
        for task, r in (results.get(key) or {}).items():
            rows.append({**base, "task": task, "metric": "em", "subset": subset, "value": r["em"], "n": r["n"]})
            if "queries_per_s" in r:
                rows.append({**base, "task": task, "metric": "queries_per_s", "subset": subset,
                             "value": r["queries_per_s"], "n": r["n"]})
    index = results.get("index") or {}
    for metric in ("bytes_per_vector", "build_seconds"):
        if metric in index:
            rows.append({**base, "metric": metric, "group": index.get("factory_effective") or index.get("factory"),
                         "value": index[metric], "n": index.get("rows")})
    return rows


def densephrases_frame(evaluations: dict[Path, dict]) -> pd.DataFrame:
    """The rows of ``npm-repro densephrases evaluate`` results files (path -> results), in path order."""
    return _frame([row for path, results in evaluations.items() for row in densephrases_rows(path, results)])


def load_lm_eval(path: str | os.PathLike) -> dict:
    """The results JSON of ``npm-repro replug eval-lm``, checked for its rows."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; run `npm-repro replug eval-lm` (rule replug_eval_lm) first")
    results = read_json(path, "run `npm-repro replug eval-lm` again")
    rows = results.get("rows") if isinstance(results, dict) else None
    if not rows or not all({"system", "k", "bpb", "bpb_ci95", "gain_pct"} <= set(r) for r in rows):
        raise ValueError(f"{path}: not a `replug eval-lm` results file (rows with system, k, bpb, bpb_ci95, gain_pct)")
    return results


def lm_eval_rows(path: str | os.PathLike, results: dict) -> list[dict]:
    """The rows of ``npm-repro replug eval-lm``'s results file: bits per byte (with its 95 % interval), the gain over
    the plain LM in percent (with its paired interval) and the perplexity, per system and k."""
    base = {"source": "lm_eval", "task": "lm", "model": results.get("lm"), "corpus": results.get("corpus"),
            "retrieval": results.get("retriever"), "run": Path(path).stem, "file": str(path),
            "n": results.get("n_texts")}
    rows = []
    for r in results["rows"]:
        for metric, ci in (("bpb", "bpb_ci95"), ("gain_pct", "gain_pct_ci95"), ("perplexity", None)):
            if metric in r:
                low, high = r[ci] if ci and r.get(ci) else (None, None)
                rows.append({**base, "system": r["system"], "k": r["k"], "metric": metric, "value": r[metric],
                             "ci_low": low, "ci_high": high})
    return rows


def lm_eval_frame(path: str | os.PathLike, results: dict) -> pd.DataFrame:
    """The rows of ``npm-repro replug eval-lm``'s results file (:func:`lm_eval_rows`), in file order."""
    return _frame(lm_eval_rows(path, results))
