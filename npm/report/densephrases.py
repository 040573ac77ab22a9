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
* ``query-side fine-tuning`` (its Table 7): EM@1 per task before and after; paper: C_phrase = {SQuAD} (the phrase
  model of config/paper.yaml, trained on SQuAD alone), NQ 12.3 -> 31.2 (fine-tuned on NQ, as here), TriviaQA 34.6
  before (its 53.6 after comes from fine-tuning on TriviaQA, not on NQ: no paper number);
* ``index`` (its Table 1 / A.1 and section 7.1): per FAISS factory string, bytes per stored vector (the index file
  over its vectors), build seconds, EM@1 per task and CPU queries/s, and, when the evaluation re-ranked the index's
  candidates by the dump (``--refine-factor``), the EM of the index's own top k without that re-ranking ("not
  re-ranked": the spans still scored from the dump's vectors), and, for an index searched and scored from its own
  codes (``--vectors index``), EM "index only"; paper: IVF-SQ4
  over 60 GB of Wikipedia vectors, 320 GB, 13.6 questions/s on CPU.

Each EM has its binomial standard error (``±``, sqrt(p (1 - p) / n)). A metric the table shows that a results file
lacks (``REQUIRED``) is an error naming the file, the metric and the step that writes it, never an empty cell.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

from npm.io import read_json
from npm.report.frame import densephrases_frame, plain
from npm.report.tables import Table, columns_note

NEGATIVES = {"none": "none", "in_batch": "in-batch", "pre_batch": "+ pre-batch"}
PAPER_RC = {"DensePhrases": (78.3, 86.3), "teacher (cross-attention)": (85.7, 92.2)}
PAPER_NEGATIVES = {"none": (70.4, 35.3), "in_batch": (70.3, 54.2), "pre_batch": (71.9, 60.4)}  # NQ dev: {p}, D_small
PAPER_QFT = {"nq": (12.3, 31.2), "triviaqa": (34.6, None)}  # C_phrase = {SQuAD}; query side fine-tuned on NQ
PAPER_CPU_QPS = 13.6
COLUMNS = ["Part", "Row", "Column", "Ours", "±", "Paper", "Note"]
# What each column holds: the footer's "Columns:" line (npm.report.tables.columns_note).
COLUMN_DOCS = {"Part": "which of the DensePhrases paper's tables the row follows",
               "Row": "the model, negatives setting, fine-tuning stage or FAISS index of the row",
               "Column": "the measure (EM / F1 in %, EM@1 per task, bytes, seconds, queries/s)",
               "Ours": "our number", "±": "binomial standard error of an EM (empty for other measures)",
               "Paper": "Lee et al. 2021's number for the same row and measure (empty: none)",
               "Note": "how ours was measured (n, passages, re-ranking)"}
_RC = "`npm-repro densephrases evaluate --rc`, rule densephrases_evaluate_rc"
_OPEN = "`npm-repro densephrases evaluate --questions / --task`, rule densephrases_evaluate"
# The metrics the table shows, per part of a results file (a part may be absent: not evaluated), and the step that
# writes them; the index's are those of `densephrases index`, copied from the index's sidecar by `evaluate`.
REQUIRED = {"rc": (("em", "f1", "n"), _RC), "rc_teacher": (("em", "f1"), _RC), "rc_random_span": (("em", "f1"), _RC),
            "rc_d_small": (("em", "f1", "n", "passages"), _RC),
            "index": (("bytes_per_vector", "build_seconds", "rows"),
                      "`npm-repro densephrases index`, rule densephrases_index, copied by rule densephrases_evaluate")}
REQUIRED_PER_TASK = {"open": (("em", "n", "queries_per_s"), _OPEN), "open_index_only": (("em", "n"), _OPEN)}


def _se(em: float, n: int) -> float:
    p = em / 100.0
    return round(100.0 * math.sqrt(max(p * (1 - p), 0.0) / max(n, 1)), 2)


def load_evaluations(paths: list[str | os.PathLike]) -> dict[Path, dict]:
    """path -> results, from paths results/densephrases/eval/{variant}/{index}.json (open-domain) and
    results/densephrases/eval/{negatives}/rc.json (reading comprehension)."""
    out = {}
    for path in map(Path, paths):
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist; run `npm-repro densephrases evaluate` (rule "
                                    "densephrases_evaluate) first")
        results = read_json(path, "run `npm-repro densephrases evaluate` again")
        if not isinstance(results, dict) or "model" not in results:
            raise ValueError(f"{path}: not a `densephrases evaluate` results file")
        missing = _missing(results)
        if missing:
            steps = {step: [key for key, s in missing if s == step] for _, step in missing}
            raise ValueError(f"{path}: " + "; ".join(f"missing {', '.join(keys)} (written by {step})"
                                                     for step, keys in steps.items())
                             + ". The file is from an older version or was edited: run those steps again")
        out[path] = results
    return out


def _missing(results: dict) -> list[tuple[str, str]]:
    """(part.metric, the step that writes it) of each metric of ``REQUIRED`` / ``REQUIRED_PER_TASK`` that a present
    part of ``results`` lacks (or holds as null)."""
    parts = {key: results.get(key) for key in REQUIRED}
    parts |= {f"{key}.{task}": r for key in REQUIRED_PER_TASK for task, r in (results.get(key) or {}).items()}
    out = []
    for name, part in parts.items():
        metrics, step = REQUIRED.get(name) or REQUIRED_PER_TASK[name.split(".")[0]]
        out += [(f"{name}.{m}", step) for m in metrics if part and part.get(m) is None]
    return out


def _pick(rows: pd.DataFrame, metric: str, subset: str | None = None, task: str | None = None) -> pd.DataFrame:
    """The rows of one metric and subset (None: the plain setting), of one task when given."""
    keep = (rows["metric"] == metric) & (rows["subset"].isna() if subset is None else rows["subset"] == subset)
    return rows[keep & (rows["task"] == task)] if task else rows[keep]


def _one(rows: pd.DataFrame) -> tuple[float | None, int | None]:
    """(value, n) of the first row; (None, None) when there is none."""
    return (plain(rows["value"].iloc[0]), plain(rows["n"].iloc[0])) if len(rows) else (None, None)


def _open_rows(part: str, row: str, rows: pd.DataFrame, results: dict, paper: dict | None = None,
               subset: str | None = None, suffix: str = "") -> list[dict]:
    """EM@1 per task of one evaluation's open-domain rows (subset None: as evaluated; ``index_only``: the index's own
    top k, not re-ranked by the dump, though its spans are scored from the dump's vectors); ``results``: its file, for
    the re-ranking factor of the note."""
    out = []
    settings = results.get("open" if subset is None else f"open_{subset}") or {}
    for task, em, n in _pick(rows[rows["task"] != "rc"], "em", subset)[["task", "value", "n"]].itertuples(index=False):
        em, n = plain(em), plain(n)
        refine = settings.get(task, {}).get("refine_factor", 1)
        note = f"n = {n}" + (f"; the index's top {refine} k re-ranked by the fp16 dump" if refine > 1 else "")
        alone = settings.get(task, {}).get("vectors") == "index"  # scored from the index's codes: index only
        note += "; retrieved and scored from the index's codes alone (no fp16 dump)" if alone else ""
        note += "; the index's own top k, spans scored from the fp16 dump" if subset == "index_only" else ""
        if settings.get(task, {}).get("search_form") == "code":
            note += "; answered as the original code searches (its best search_phrase group, in whole words)"
        if settings.get(task, {}).get("truecased"):
            note += f"; lowercased questions truecased: {settings[task]['truecased']}"
        out.append({"Part": part, "Row": row, "Column": f"EM@1 {task}{' (index only)' if alone else suffix}",
                    "Ours": round(em, 2),
                    "±": _se(em, n), "Paper": (paper or {}).get(task), "Note": note})
    return out


def _index_rows(size: pd.DataFrame, rows: pd.DataFrame, results: dict) -> list[dict]:
    """The index part's rows of one evaluation of the model of config train (``size``: its bytes_per_vector row):
    size, build seconds, queries/s, EM@1 per task (as evaluated, not re-ranked where the evaluation re-ranked,
    index only where it scored from the codes) and the RC EM of ``--d-small-index``. Over a trimmed dump
    (``npm-repro densephrases trim``: only the tokens that can begin or end a phrase, and those the filter head keeps
    where it filters) the row is "FACTORY, phrase edges" ("..., filter > t") and its size is counted against the
    untrimmed dump, the fp16 vectors it replaces."""
    factory, (bytes_per_vector, vectors) = size["group"].iloc[0], _one(size)
    dump, index = results.get("dump") or {}, results.get("index") or {}
    d = dump.get("hidden_size")
    fp16 = f"fp16: {2 * d if d else '2 d'} bytes"
    out = []
    if (dump.get("token_filter") or "").startswith("edges") and "index_bytes" in index and d:
        factory, tokens = f"{factory}, phrase {dump['token_filter']}", dump["tokens"]
        out += [{"Part": "index", "Row": factory, "Column": "bytes per vector",
                 "Ours": round(index["index_bytes"] / tokens, 1), "±": None, "Paper": None,
                 "Note": f"index bytes over the {tokens} tokens of the untrimmed dump ({vectors} kept); {fp16}"},
                {"Part": "index", "Row": factory, "Column": "times smaller than the fp16 dump",
                 "Ours": round(2 * d * tokens / index["index_bytes"], 2), "±": None, "Paper": None,
                 "Note": f"the untrimmed dump's {2 * d * tokens} bytes over the index file's"}]
    else:
        out.append({"Part": "index", "Row": factory, "Column": "bytes per vector", "Ours": bytes_per_vector,
                    "±": None, "Paper": None, "Note": f"{vectors} vectors; {fp16}"})
    qps = [plain(q) for q in _pick(rows, "queries_per_s")["value"]]
    out += [{"Part": "index", "Row": factory, "Column": "build seconds", "Ours": _one(_pick(rows, "build_seconds"))[0],
             "±": None, "Paper": None, "Note": "paper: 20 h for Wikipedia on 4 GPUs (Table A.1)"},
            {"Part": "index", "Row": factory, "Column": "queries/s (CPU)",
             "Ours": round(sum(qps) / len(qps), 1) if qps else None, "±": None, "Paper": PAPER_CPU_QPS,
             "Note": "mean over the tasks; paper: 1,000 NQ questions over all of Wikipedia"}]
    out += _open_rows("index", factory, rows, results)
    out += _open_rows("index", factory, rows, results, subset="index_only", suffix=" (not re-ranked)")
    return out + _d_small_index_rows(factory, results.get("rc_d_small_index"))


def _d_small_index_rows(row: str, part: dict | None) -> list[dict]:
    """The RC (SQuAD-style) EM of the compressed index: ``evaluate --d-small-index``'s D_small through the index of
    the trimmed dump of its passages, scored from the codes, beside the Flat index of the same dump."""
    if not part:
        return []
    return [{"Part": "index", "Row": row, "Column": "EM RC D_small (index only)", "Ours": round(part["em"], 2),
             "±": _se(part["em"], part["n"]), "Paper": None,
             "Note": f"RC test, every question over a phrase dump of all {part['passages']} passages ({part['kept']} "
                     f"of {part['tokens']} tokens kept; index {part['ratio']}x smaller than its fp16 dump); its Flat "
                     f"index: {part['flat_em']:.1f}; n = {part['n']}"}]


def densephrases_table(paths: list[str | os.PathLike]) -> Table:
    """The table from the rows of ``npm.report.results`` (:func:`npm.report.frame.densephrases_rows`, one run
    ``{variant}/{index}`` per file); the files give only what the notes say of the setting (re-ranking factor,
    D_small's passages, the dump's width)."""
    evaluations = load_evaluations(paths)
    frame = densephrases_frame(evaluations)
    files = {f"{p.parent.name}/{p.stem}": r for p, r in evaluations.items()}
    runs = {run: frame[frame["run"] == run] for run in files}
    rows: list[dict] = []
    rc = {run.split("/")[0]: r for run, r in runs.items() if run.endswith("/rc")}
    main_rc = next((v for v, r in rc.items() if (r["subset"] == "teacher").any()), next(iter(rc), None))
    if main_rc is not None:
        n = _one(_pick(rc[main_rc], "em", task="rc"))[1]
        for name, subset in (("DensePhrases", None), ("teacher (cross-attention)", "teacher"),
                             ("random span", "random_span")):
            em, f1 = (_one(_pick(rc[main_rc], m, subset, "rc"))[0] for m in ("em", "f1"))
            if em is None:
                continue
            paper = PAPER_RC.get(name, (None, None))
            rows.append({"Part": "reading comprehension", "Row": name, "Column": "EM", "Ours": round(em, 2),
                         "±": _se(em, n), "Paper": paper[0], "Note": f"RC test, n = {n}; paper: SQuAD dev"})
            rows.append({"Part": "reading comprehension", "Row": name, "Column": "F1", "Ours": round(f1, 2),
                         "±": None, "Paper": paper[1], "Note": f"RC test, n = {n}"})
    for variant in [v for v in NEGATIVES if v in rc]:  # each trained variant: over its own passage and D_small
        paper = PAPER_NEGATIVES[variant]
        (em, n), (small, n_small) = (_one(_pick(rc[variant], "em", s, "rc")) for s in (None, "d_small"))
        rows.append({"Part": "negatives", "Row": NEGATIVES[variant], "Column": "EM {p}", "Ours": round(em, 2),
                     "±": _se(em, n), "Paper": paper[0],
                     "Note": f"RC test, each question over its own passage, n = {n}"})
        if small is not None:  # absent when the evaluation had no --d-small-pool
            passages = files[f"{variant}/rc"]["rc_d_small"]["passages"]
            rows.append({"Part": "negatives", "Row": NEGATIVES[variant], "Column": "EM D_small",
                         "Ours": round(small, 2), "±": _se(small, n_small), "Paper": paper[1],
                         "Note": f"RC test, every question over all {passages} passages, n = {n_small}"})
    open_runs = [run.split("/") for run in runs if not run.endswith("/rc")]
    # config `index`: the index every variant is evaluated on
    variants_per_index = {i: sum(1 for _, j in open_runs if j == i) for _, i in open_runs}
    main_index = max(variants_per_index, key=variants_per_index.get, default=None)
    for variant, index in open_runs:
        if variant.endswith("_qft") and index == main_index:
            before = f"{variant.removesuffix('_qft')}/{index}"
            if before in runs:
                rows += _open_rows("query-side fine-tuning", "before", runs[before], files[before],
                                   {t: p[0] for t, p in PAPER_QFT.items()})
            run = f"{variant}/{index}"
            rows += _open_rows("query-side fine-tuning", "after", runs[run], files[run],
                               {t: p[1] for t, p in PAPER_QFT.items()})
    variants = dict.fromkeys(run.split("/")[0] for run in runs)
    indexes_per_variant = {v: sum(1 for w, _ in open_runs if w == v) for v in variants if v in NEGATIVES}
    # the model of config train: evaluated over every index
    main = max(indexes_per_variant, key=indexes_per_variant.get, default=None)
    for variant, index in open_runs:
        run = f"{variant}/{index}"
        size = _pick(runs[run], "bytes_per_vector")
        if variant != main or size.empty:
            continue
        rows += _index_rows(size, runs[run], files[run])
    notes = [columns_note("densephrases", COLUMNS, docs=COLUMN_DOCS),
             "EM@1 asks all of each task's questions (n in Note); the knowledge tables' DensePhrases row (Table 8) "
             "answers the seeded sample of evaluation.max_examples of them, so the same model's numbers differ "
             "between the two by that sampling.",
             "Ours: the embedded default unless the config says otherwise (see results/config.yaml); ± = binomial "
             "standard error of EM. Paper: Lee et al. 2021, Tables 1, 2, 6 and 7 (SQuAD / NQ over all of Wikipedia, "
             "so not the same data: compare the shapes, not the values)."]
    return Table(name="densephrases", title="DensePhrases: reading comprehension, negatives, query-side "
                 "fine-tuning and index compression", columns=COLUMNS, rows=rows, notes=notes)
