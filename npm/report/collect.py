"""``npm.report.results``: every number the workflow wrote under a folder, as one tidy DataFrame. The rows of each
file kind are built by :mod:`npm.report.frame`; the metrics files are checked as the tables check them
(:func:`npm.report.tables.load_metrics`). Its own module, so that the frame's rows and the tables depend one way."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from npm.io import read_json
from npm.report.frame import _frame, densephrases_rows, lm_eval_rows, load_lm_eval, metrics_rows
from npm.report.tables import load_metrics


def results(root: str | os.PathLike = ".") -> pd.DataFrame:
    """Every metric the workflow wrote under ``root``/results, one row per number (see the module docstring)."""
    root = Path(root)
    if not (root / "results").is_dir():
        raise FileNotFoundError(f"{root / 'results'} does not exist: give the folder the workflow ran in (the one "
                                "holding results/)")
    rows: list[dict] = []
    for source, folder in (("metrics", "results/metrics"), ("control", "results/control/metrics")):
        files = sorted((root / folder).glob("*/*.json"))
        if files:
            rows += [row for rec in load_metrics(files, what=f"results({root})") for row in metrics_rows(rec, source)]
    for path in sorted((root / "results/densephrases/eval").glob("*/*.json")):
        rows += densephrases_rows(path, read_json(path, "run `npm-repro densephrases evaluate` again"))
    replug = root / "results/replug/lm_eval.json"
    if replug.is_file():
        rows += lm_eval_rows(replug, load_lm_eval(replug))
    return _frame(rows)
