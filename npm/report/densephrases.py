"""results/tables/densephrases.csv: the tables of the DensePhrases paper (Lee et al. 2021) that run here, from
``npm-repro densephrases evaluate`` results (``npm-repro report densephrases``; docs/paper-map.md §D2), the paper's
numbers beside ours.

One row per (part, row, column), in four parts:

* ``reading comprehension`` (its Table 2): EM / F1 of the query-agnostic model, the cross-attention teacher and a
  random span on the RC test split; paper: SQuAD dev, DensePhrases 78.3 / 86.3, SpanBERT-base (query-dependent)
  85.7 / 92.2;
* ``negatives`` (its Table 6): EM of the models trained with none / in-batch / + pre-batch negatives, each question
  over its own passage ({p}) and over all the test passages pooled (D_small); paper: NQ dev, {p} 70.4 / 70.3 / 71.9,
  D_small 35.3 / 54.2 / 60.4 (B = 48 for none, 84 for the others, C = 2);
* ``query-side fine-tuning`` (its Table 7): EM@1 per task before and after; paper: C_phrase = {NQ, SQuAD}, NQ
  28.9 -> 40.9, TriviaQA 31.9 -> 50.7;
* ``index`` (its Table 1 / A.1 and section 7.1): per FAISS factory string, bytes per stored vector (the index file
  over its vectors), build seconds, EM@1 per task and CPU queries/s, and, when the evaluation re-ranked the index's
  candidates by the dump (``--refine-factor``), the EM of the index's own ranking ("index only"); paper: IVF-SQ4
  over 60 GB of Wikipedia vectors, 320 GB, 13.6 questions/s on CPU.

Each EM has its binomial standard error (``±``, sqrt(p (1 - p) / n)).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from npm.io import read_json
from npm.report.tables import Table

NEGATIVES = {"none": "none", "in_batch": "in-batch", "pre_batch": "+ pre-batch"}
PAPER_RC = {"DensePhrases": (78.3, 86.3), "teacher (cross-attention)": (85.7, 92.2)}
PAPER_NEGATIVES = {"none": (70.4, 35.3), "in_batch": (70.3, 54.2), "pre_batch": (71.9, 60.4)}  # NQ dev: {p}, D_small
PAPER_QFT = {"nq": (28.9, 40.9), "triviaqa": (31.9, 50.7)}
PAPER_CPU_QPS = 13.6
COLUMNS = ["Part", "Row", "Column", "Ours", "±", "Paper", "Note"]


def _se(em: float, n: int) -> float:
    p = em / 100.0
    return round(100.0 * math.sqrt(max(p * (1 - p), 0.0) / max(n, 1)), 2)


def load_evaluations(paths: list[str | os.PathLike]) -> dict[tuple[str, str], dict]:
    """(variant, index file name or "rc") -> results, from paths results/densephrases/eval/{variant}/{index}.json
    (open-domain) and results/densephrases/eval/{negatives}/rc.json (reading comprehension)."""
    out = {}
    for path in map(Path, paths):
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist; run `npm-repro densephrases evaluate` (rule "
                                    "densephrases_evaluate) first")
        results = read_json(path, "run `npm-repro densephrases evaluate` again")
        if not isinstance(results, dict) or "model" not in results:
            raise ValueError(f"{path}: not a `densephrases evaluate` results file")
        out[(path.parent.name, path.stem)] = results
    return out


def _open_rows(part: str, row: str, results: dict, paper: dict | None = None, key: str = "open",
               suffix: str = "") -> list[dict]:
    """EM@1 per task of ``results[key]`` (``open``: as evaluated; ``open_index_only``: the index's own ranking, no
    re-ranking by the dump)."""
    rows = []
    for task, r in results.get(key, {}).items():
        refine = r.get("refine_factor", 1)
        note = f"n = {r['n']}" + (f"; the index's top {refine} k re-ranked by the fp16 dump" if refine > 1 else "")
        rows.append({"Part": part, "Row": row, "Column": f"EM@1 {task}{suffix}", "Ours": round(r["em"], 2),
                     "±": _se(r["em"], r["n"]), "Paper": (paper or {}).get(task), "Note": note})
    return rows


def densephrases_table(paths: list[str | os.PathLike]) -> Table:
    evals = load_evaluations(paths)
    rows: list[dict] = []
    rc = {v: r for (v, name), r in evals.items() if name == "rc"}
    main_rc = next((r for r in rc.values() if "rc_teacher" in r), next(iter(rc.values()), None))
    if main_rc is not None:
        n = main_rc["rc"]["n"]
        for name, part in (("DensePhrases", main_rc["rc"]), ("teacher (cross-attention)", main_rc.get("rc_teacher")),
                           ("random span", main_rc.get("rc_random_span"))):
            if part is None:
                continue
            paper = PAPER_RC.get(name, (None, None))
            rows.append({"Part": "reading comprehension", "Row": name, "Column": "EM", "Ours": round(part["em"], 2),
                         "±": _se(part["em"], n), "Paper": paper[0], "Note": f"RC test, n = {n}; paper: SQuAD dev"})
            rows.append({"Part": "reading comprehension", "Row": name, "Column": "F1", "Ours": round(part["f1"], 2),
                         "±": None, "Paper": paper[1], "Note": f"RC test, n = {n}"})
    for variant in [v for v in NEGATIVES if v in rc]:  # each trained variant: over its own passage and D_small
        r, paper = rc[variant], PAPER_NEGATIVES[variant]
        small = r.get("rc_d_small")  # absent when the evaluation had no --d-small-pool
        rows.append({"Part": "negatives", "Row": NEGATIVES[variant], "Column": "EM {p}",
                     "Ours": round(r["rc"]["em"], 2), "±": _se(r["rc"]["em"], r["rc"]["n"]), "Paper": paper[0],
                     "Note": f"RC test, each question over its own passage, n = {r['rc']['n']}"})
        if small:
            rows.append({"Part": "negatives", "Row": NEGATIVES[variant], "Column": "EM D_small",
                         "Ours": round(small["em"], 2), "±": _se(small["em"], small["n"]), "Paper": paper[1],
                         "Note": f"RC test, every question over all {small['passages']} passages, n = {small['n']}"})
    # config `index`: the index every variant is evaluated on
    variants_per_index = {i: sum(1 for _, j in evals if j == i) for _, i in evals if i != "rc"}
    main_index = max(variants_per_index, key=variants_per_index.get, default=None)
    for (variant, index), r in evals.items():
        if variant.endswith("_qft") and index == main_index:
            before = evals.get((variant.removesuffix("_qft"), index))
            if before:
                rows += _open_rows("query-side fine-tuning", "before", before,
                                   {t: p[0] for t, p in PAPER_QFT.items()})
            rows += _open_rows("query-side fine-tuning", "after", r, {t: p[1] for t, p in PAPER_QFT.items()})
    indexes_per_variant = {v: sum(1 for w, i in evals if w == v and i != "rc") for v, _ in evals if v in NEGATIVES}
    # the model of config train: evaluated over every index
    main = max(indexes_per_variant, key=indexes_per_variant.get, default=None)
    for (variant, name), r in evals.items():
        if variant != main or name == "rc" or "index" not in r:
            continue
        idx, d = r["index"], r.get("dump", {}).get("hidden_size")
        factory = idx.get("factory_effective") or idx.get("factory")
        qps = [o["queries_per_s"] for o in r.get("open", {}).values()]
        rows += [{"Part": "index", "Row": factory, "Column": "bytes per vector", "Ours": idx["bytes_per_vector"],
                  "±": None, "Paper": None, "Note": f"{idx['rows']} vectors; fp16: {2 * d if d else '2 d'} bytes"},
                 {"Part": "index", "Row": factory, "Column": "build seconds", "Ours": idx["build_seconds"], "±": None,
                  "Paper": None, "Note": "paper: 20 h for Wikipedia on 4 GPUs (Table A.1)"},
                 {"Part": "index", "Row": factory, "Column": "queries/s (CPU)",
                  "Ours": round(sum(qps) / len(qps), 1) if qps else None, "±": None, "Paper": PAPER_CPU_QPS,
                  "Note": "mean over the tasks; paper: 1,000 NQ questions over all of Wikipedia"}]
        rows += _open_rows("index", factory, r)
        rows += _open_rows("index", factory, r, key="open_index_only", suffix=" (index only)")
    notes = ["Ours: the embedded default unless the config says otherwise (see results/config.yaml); ± = binomial "
             "standard error of EM. Paper: Lee et al. 2021, Tables 1, 2, 6 and 7 (SQuAD / NQ over all of Wikipedia, "
             "so not the same data: compare the shapes, not the values)."]
    return Table(name="densephrases", title="DensePhrases: reading comprehension, negatives, query-side "
                 "fine-tuning and index compression", columns=COLUMNS, rows=rows, notes=notes)
