"""The paper's tables from our metrics files, with the paper's number beside each of ours (paper 5-6; paper-map
§7.1-§7.5).

* ``table1``: zero-shot closed-set accuracy (paper Table 1, paper-map §7.1).
* ``table2``: TempLAMA, outdated (2019) -> updated (2022) corpus (paper Table 2, paper-map §7.3).
* ``table3``: entity translation, w/o and w/ BM25, per language (paper Tables 3 and 10, paper-map §7.4).
* ``table4``: inference speed (paper Table 4, paper-map §7.5).
* ``table8``: knowledge tasks, LAMA with its UHN / Hard subsets (paper Table 8, paper-map §7.2).

Each builder reads metrics JSON files (the contract of ``npm-repro evaluate``: task, system, metric, score, n, ...;
the path is never parsed), turns them into the tidy rows of ``npm.report.results`` (:func:`metrics_frame`), pivots
them with pandas and returns a :class:`Table`; :func:`write_table` writes it as CSV (pandas ``to_csv``, 2 decimals)
and Markdown (1 decimal, same basename, ``.md``, with a provenance footer), both atomically. Which paper row each of
our systems is compared with is data (``paper_values.yaml``, ``mapping``). A cell we have no number for is empty:
nothing is filled in or carried over from another setting. :func:`paper_cells` lists the same comparisons cell by
cell, for the paper check (``npm.report.check``, docs/expected-numbers.md).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from npm.evaluation.systems import SYSTEMS
from npm.io import atomic_path, read_yaml
from npm.tasks.registry import DEFAULT_REGISTRY, Task, load_registry, task_names

PAPER_VALUES = Path(__file__).resolve().parent / "paper_values.yaml"

# Table 3's columns and the paper's key of each.
TABLE3_COLUMNS = {"w/o BM25": "wo_bm25", "w/ BM25": "w_bm25"}


@dataclass(frozen=True)
class TaskLayout:
    """Which task is which column of the report, derived from config/tasks.yaml (``label``, ``report``): a new task
    is a new column by its registry entry alone. Columns are in the paper's order (the key order of the packaged
    ``paper_values.yaml`` rows), then in the registry's order (a task the paper lacks)."""

    closed: dict[str, str]  # Table 1: task -> column (paper-map §7.1)
    knowledge: dict[str, str]  # Table 8: task -> the paper's key of its "All" column
    templama: dict[str, str]  # Table 2: task -> column
    translation: str | None  # Table 3's task
    table8_columns: tuple[tuple[str, str, str | None, str], ...]  # (label, task, subset or None, paper key)
    labels: dict[str, str]  # figures: task -> its name
    paper_keys: dict[str, str | None]  # task -> the key of its number in paper_values.yaml

    @property
    def open_set(self) -> tuple[str, ...]:
        return (*self.knowledge, *self.templama, *([self.translation] if self.translation else []))

    @property
    def known(self) -> tuple[str, ...]:
        return (*self.closed, *self.open_set)


def task_layout(registry: str | os.PathLike = DEFAULT_REGISTRY) -> TaskLayout:
    """The :class:`TaskLayout` of a task registry (config/tasks.yaml: :data:`LAYOUT`)."""
    tasks = load_registry(registry)
    paper = read_yaml(PAPER_VALUES)

    def in_table(table: str) -> list[Task]:
        keys = list(next(iter(paper[table].values()))) if table in paper else []
        return sorted((tasks[n] for n in task_names(tasks, table=table)),
                      key=lambda t: keys.index(t.report.paper_key) if t.report.paper_key in keys else len(keys))

    knowledge = in_table("table8")  # not named table8: the function of that name draws the table
    columns = tuple(column for t in knowledge for column in (
        (t.report.column, t.name, None, t.report.paper_key),
        *((label, t.name, subset, key) for subset, (label, key) in t.report.subsets.items())))
    return TaskLayout(closed={t.name: t.report.column for t in in_table("table1")},
                      knowledge={t.name: t.report.paper_key for t in knowledge},
                      templama={t.name: t.report.column for t in in_table("table2")},
                      translation=next(iter(task_names(tasks, table="table3")), None), table8_columns=columns,
                      labels={name: t.label for name, t in tasks.items()},
                      paper_keys={name: t.report.paper_key for name, t in tasks.items()})


LAYOUT = task_layout()


def _layout(registry: str | os.PathLike | None) -> TaskLayout:
    return LAYOUT if registry is None else task_layout(registry)


CLOSED_SET_TASKS = LAYOUT.closed
KNOWLEDGE_TASKS = LAYOUT.knowledge
TEMPLAMA_TASKS = LAYOUT.templama
TRANSLATION_TASK = LAYOUT.translation
OPEN_SET_TASKS = LAYOUT.open_set
KNOWN_TASKS = LAYOUT.known
LAMA_TASKS = tuple(dict.fromkeys(task for _, task, subset, _ in LAYOUT.table8_columns if subset))
TABLE8_COLUMNS = LAYOUT.table8_columns

# Our systems (rows) and their labels come from the registry, in its (display) order.

REQUIRED_FIELDS = ("task", "system", "metric", "score", "n")
STDERR_NOTE = ("± = bootstrap standard error over the examples (1,000 seeded resamples; metrics `stderr`, 95 % "
               "interval `ci95`): differences within about two of them are noise. A mean shown without ± comes from "
               "a metrics file written before that standard error was recorded: re-run its evaluation.")

CLOSED_DOC = "accuracy (%) on the task (n in the last line)"  # every Table 1 task column
PAPER = " (paper)"  # the suffix of a column holding the paper's number beside ours
# What each column of the tables holds: the footer's "Columns:" line (:func:`columns_note`) explains every header from
# here, never by prose per table. A key "table/column" holds where one header means something else in one table;
# "X (paper)" is explained with X (PAPER_DOC). A column this mapping lacks is an error, not an unexplained header.
COLUMN_DOCS = {
    "System": "our system (its registry label; a decoder baseline with its LM's name)",
    "table3/System": "our system; one row joins a system without BM25 and the same LM with BM25 (both names)",
    "Task": "the task of the row's metrics file",
    "Paper row": "the paper's row beside ours (paper_values.yaml `mapping`; empty: none)",
    "#Params (M)": "our model's parameters in millions (retrieval indexes and corpora excluded)",
    **{label: CLOSED_DOC for label in CLOSED_SET_TASKS.values()},
    "Avg": "mean of the row's task columns (empty where one is missing); its ± from theirs, tasks taken as independent",
    "Unchanged": "EM (%) on TempLAMA's facts that did not change between 2019 and 2022 (a→b: see below)",
    "Changed": "EM (%) on TempLAMA's facts that changed between 2019 and 2022 (a→b: see below)",
    "AVG": "mean of Unchanged and Changed on the updated corpus; its ± from theirs, the two taken as independent",
    **{f"{key}_{when}": f"{label} EM (%) on the {when} corpus alone, the {when} side of the a→b cell"
       for label, key in (("Unchanged", "unchanged"), ("Changed", "changed")) for when in ("outdated", "updated")},
    "w/o BM25": "EM (%) without retrieval, macro over the languages",
    "w/ BM25": "EM (%) with the top BM25 passages of the translation corpus, macro over the languages",
    "FAISS": "✓ = dense retrieval over a FAISS index",
    "Sparse": "✓ = sparse (BM25) retrieval",
    "Corpus": "the reference corpus the row's run answered from (empty: none)",
    "table8/Corpus": "✓ = the system answers from a reference corpus (retrieval); empty = from its parameters alone",
    "|C| (M tokens)": "tokens of that corpus, millions",
    "|C| (paper, M tokens)": "the paper's corpus for the Paper row, millions of tokens",
    "Acc": "the task's score (%) in that run: accuracy (closed set) or EM (open set)",
    "#Q/sec": "examples answered per second (query encoding, retrieval, scoring; loading excluded)",
    "Device": "where the run answered (its speed is only comparable between rows of one device)",
    "T-REx All": "EM (%) on LAMA T-REx, macro over the 1/2/3/4+ n-gram buckets of the answer",
    "T-REx UHN": "the same on LAMA-UHN's T-REx facts (answer not guessable from the subject's name)",
    "T-REx Hard": "the same on T-REx's hard subset (hard.txt)",
    "G-RE All": "EM (%) on LAMA Google-RE, macro over the n-gram buckets",
    "G-RE UHN": "the same on LAMA-UHN's Google-RE facts",
    "KML": "EM (%) on KAMEL",
    "TQA": "EM (%) on TriviaQA",
    "NQ": "EM (%) on Natural Questions",
}
PAPER_DOC = "the paper's number for the column before it, in the Paper row (empty or –: the paper has none)"
LANGUAGE_DOC = "EM (%) on that language's examples (ISO 639-1 code) of the run the row's languages come from"


def columns_note(table: str, columns: Sequence[str], languages: Sequence[str] = (),
                 docs: Mapping[str, str] = COLUMN_DOCS) -> str:
    """The footer line explaining every column, from ``docs`` (a table of another module passes its own mapping):
    each header in bold, headers with the same explanation joined ("**AGN** / **SST-2**: accuracy ..."), the paper's
    columns last. ``languages``: Table 3's per-language columns."""
    groups: dict[str, list[str]] = {}
    for column in columns:
        doc = docs.get(f"{table}/{column}", docs.get(column))
        if doc is None and column.endswith(PAPER) and column.removesuffix(PAPER) in columns:
            continue  # "X (paper)": explained last, with X
        doc = LANGUAGE_DOC if doc is None and column in languages else doc
        if doc is None:
            raise KeyError(f"{table}: column {column!r} has no explanation (npm.report.tables.COLUMN_DOCS or the "
                           "table's own mapping)")
        groups.setdefault(doc, []).append(column)
    paper = [c for c in columns if c.endswith(PAPER) and c.removesuffix(PAPER) in columns and c not in docs]
    if paper:
        groups[PAPER_DOC] = paper
    return "Columns: " + "; ".join(" / ".join(f"**{c}**" for c in cols) + f": {doc}" for doc, cols in groups.items()) \
        + "."


# ------------------------------------------------------------------------------------------------ values and tables

@dataclass(frozen=True)
class Arrow:
    """The paper's "a→b" cell (Table 2): ``before`` on the outdated corpus, ``after`` on the updated one."""

    before: float | None
    after: float | None


@dataclass
class Table:
    """Rows (dicts keyed by column label) ready to write. ``notes`` become the Markdown footer; ``md_digits`` lets a
    column keep more than one decimal in Markdown (Table 4's #Q/sec, 0.12 vs 0.18 in the paper); the columns of
    ``stderr`` print "score ± standard error" in Markdown and have a "± " column in the CSV."""

    name: str
    title: str
    columns: list[str]
    rows: list[dict]
    notes: list[str] = field(default_factory=list)
    md_digits: dict[str, int] = field(default_factory=dict)
    stderr: tuple[str, ...] = ()  # columns whose cells have a bootstrap standard error in row[f"{column} ±"]

    def csv_columns(self) -> list[str]:
        """The columns of the CSV: each column of ``stderr`` followed by its "± " column."""
        return [c for col in self.columns for c in ((col, f"{col} ±") if col in self.stderr else (col,))]

    def column(self, label: str) -> list:
        """The values of one column, row order."""
        return [row.get(label) for row in self.rows]

    def row(self, system: str) -> dict:
        """The row of one system (by its registry name, e.g. ``npm``)."""
        for row in self.rows:
            if row.get("_system") == system:
                return row
        raise KeyError(f"{self.name} has no row for system {system!r}; rows: {[r.get('_system') for r in self.rows]}")


# ------------------------------------------------------------------------------------------------ reading

def load_paper_values(path: str | os.PathLike | None = None) -> dict:
    """The paper's numbers and the system -> paper row mapping (``paper_values.yaml``; paper-map §7)."""
    path = Path(path) if path is not None else PAPER_VALUES
    if not path.exists():
        raise FileNotFoundError(f"paper values file {path} does not exist (the packaged one is {PAPER_VALUES})")
    values = read_yaml(path)
    for key in ("params_base", "mapping", "table1", "table2", "table3", "table3_layout", "table4", "table8",
                "table10_npm"):
        if not isinstance(values, dict) or key not in values:
            raise ValueError(f"paper values file {path} lacks the key {key!r} (compare with {PAPER_VALUES})")
    return values


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_metrics(paths: Iterable[str | os.PathLike], tasks: Sequence[str] | None = None, what: str = "report",
                 require: Sequence[str] = (), registry: str | os.PathLike | None = None) -> list[dict]:
    """Read metrics JSON files and check them.

    Every file needs ``task``, ``system``, ``metric``, ``score`` (finite, percent) and ``n``, plus the fields in
    ``require``; its task must be a known one (of the task ``registry``; None: config/tasks.yaml) and, when ``tasks``
    is given, one of them (``what`` names the table in the error). Each record gets ``_file`` (its path) for error
    messages.
    """
    layout = _layout(registry)
    records = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise FileNotFoundError(f"metrics file {p} does not exist; run the evaluation rule that writes it first")
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"metrics file {p}: not JSON ({e.msg}, line {e.lineno})") from None
        if not isinstance(rec, dict):
            raise ValueError(f"metrics file {p}: expected one JSON object, got {type(rec).__name__}")
        for key in (*REQUIRED_FIELDS, *require):
            if key not in rec:
                raise ValueError(f"metrics file {p} lacks the field {key!r} that {what} needs; re-run the rule that "
                                 "wrote it (npm-repro evaluate / the baseline rules write every field)")
        if not _number(rec["score"]):
            raise ValueError(f"metrics file {p}: score must be a finite number (percent), got {rec['score']!r}")
        if not isinstance(rec["n"], int) or isinstance(rec["n"], bool) or rec["n"] < 0:
            raise ValueError(f"metrics file {p}: n must be the number of examples (an integer), got {rec['n']!r}")
        task = rec["task"]
        if task not in layout.known:
            raise ValueError(f"metrics file {p}: unknown task {task!r}; known tasks: {list(layout.known)}")
        if tasks is not None and task not in tasks:
            raise ValueError(f"metrics file {p}: task {task!r} is not part of {what}, which takes {list(tasks)}")
        expected = "accuracy" if task in layout.closed else "em"
        if rec["metric"] != expected:
            raise ValueError(f"metrics file {p}: task {task} is scored by {expected!r}, the file says "
                             f"{rec['metric']!r}")
        rec = dict(rec)
        rec["_file"] = str(p)
        records.append(rec)
    if not records:
        raise ValueError(f"{what}: no metrics files given")
    return records


def index_by_task_system(records: Sequence[dict], what: str) -> dict[tuple[str, str], dict]:
    """``{(system, task): record}``; two files for the same pair is an error (pass the default-corpus one)."""
    cells: dict[tuple[str, str], dict] = {}
    for rec in records:
        key = (rec["system"], rec["task"])
        if key in cells:
            other = cells[key]
            raise ValueError(f"{what}: two metrics files for system {key[0]!r} on task {key[1]!r}: {other['_file']} "
                             f"(corpus {other.get('corpus')!r}) and {rec['_file']} (corpus {rec.get('corpus')!r}); "
                             "pass only the evaluation on the task's default reference corpus")
        cells[key] = rec
    return cells


def ordered_systems(systems: Iterable[str]) -> list[str]:
    """Known systems in display order, then any others alphabetically."""
    systems = set(systems)
    return [s for s in SYSTEMS if s in systems] + sorted(systems - set(SYSTEMS))


def short_model_name(model: str | None) -> str | None:
    """``HuggingFaceTB/SmolLM2-135M`` / ``models/SmolLM2-135M`` / ``pypi:pkg/SmolLM2-135M`` -> ``SmolLM2-135M``."""
    if not model:
        return None
    return str(model).rstrip("/").replace(":", "/").split("/")[-1] or None


def display_name(system: str, model: str | None = None) -> str:
    """The row label: the paper-style system name, with the LM's name for the decoder baselines."""
    if system not in SYSTEMS:
        return system
    return SYSTEMS[system].display_name(short_model_name(model))


def metrics_frame(records: Sequence[dict]):
    """The checked records as the tidy rows of ``npm.report.results`` (:mod:`npm.report.frame`: one per number, the
    task's score, each subset, each group, the queries per second), which the builders pivot. pandas is imported
    here, not at the top: every ``npm-repro`` command imports this module to build its parser, in envs without it."""
    from npm.report.frame import metrics_frame as frame  # deferred: loads pandas

    return frame(records)


def _scores(frame):
    """The rows of the tasks' scores (one per metrics file: no subset, group or speed row)."""
    return frame[frame["subset"].isna() & frame["group"].isna() & (frame["metric"] != "queries_per_s")]


def _plain(value):
    """A pandas / numpy cell as a plain Python value; None where it is missing (NaN or None)."""
    value = value.item() if hasattr(value, "item") else value
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _cell(pivot, row, column):
    """``pivot.at[row, column]`` as a plain value; None where the pivot has no such row, column or value."""
    if row not in pivot.index or column not in pivot.columns:
        return None
    return _plain(pivot.at[row, column])


def _about(frame):
    """Per system: its model and its parameter count, each the first one its files give (file order)."""
    return frame.groupby("system", sort=False)[["model", "parameters"]].first()


def _params(about, system: str) -> float | None:
    """The system's parameters in millions."""
    params = _cell(about, system, "parameters")
    return params / 1e6 if params is not None else None


# The settings where the paper and the original code differ (docs/paper-map.md, "Paper versus original code"), as each
# metrics file records them: the run's `inference` settings, and its NPM datastore's embedding precision and FAISS
# metric (``npm.inference.scoring.NpmScorer.info``).
SWITCHES = ("tau_twice", "span_score", "passages", "passage_text", "kamel_prompt", "mlm_max_length", "translation_cut",
            "lama_average")
DATASTORE_SWITCHES = ("embedding_precision", "faiss_metric")


def settings_note(scores) -> str | None:
    """One footer line naming the value of each switch in the metrics files behind ``scores`` (a value that differs
    between files is listed with its files' count), or None when no file records them."""
    values: dict[str, dict] = {}
    for path in sorted(set(scores["file"].dropna().astype(str))):
        try:
            rec = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        settings = ((rec.get("provenance") or {}).get("config") or {}).get("settings") or {}
        for key in SWITCHES:
            if key in settings:
                values.setdefault(key, {}).setdefault(json.dumps(settings[key]), 0)
                values[key][json.dumps(settings[key])] += 1
        for key in DATASTORE_SWITCHES:
            if rec.get(key) is not None:
                values.setdefault(key, {}).setdefault(json.dumps(rec[key]), 0)
                values[key][json.dumps(rec[key])] += 1
    if not values:
        return None
    def plain_value(text: str) -> str:
        value = json.loads(text)
        return value if isinstance(value, str) else text  # a string unquoted; true / false / null / numbers as JSON

    parts = [f"{key} {plain_value(next(iter(found)))}" if len(found) == 1
             else f"{key} " + " / ".join(f"{plain_value(v)} ({n} files)" for v, n in found.items())
             for key, found in values.items()]
    return ("Paper-vs-code settings of these metrics (config inference / datastore; docs/paper-map.md): "
            + ", ".join(parts) + ".")


def footer(scores) -> list[str]:
    """Provenance lines: the git commit(s) of the metrics, the paper-vs-code settings they were computed with
    (``settings_note``) and the number of examples per task (``scores``: the score rows of a metrics frame)."""
    commits = sorted(set(scores["commit"].fillna("unknown").astype(str)))
    by_task = scores.groupby("task")
    parts = []
    for task in [t for t in KNOWN_TASKS if t in by_task.groups]:
        ns = by_task.get_group(task).groupby("n")["system"].agg(lambda s: sorted(set(s)))
        if len(ns) == 1:
            parts.append(f"{task} {int(ns.index[0]):,}")
        else:
            parts.append(f"{task} " + ", ".join(f"{int(n):,} ({', '.join(s)})" for n, s in ns.items()))
    note = settings_note(scores)
    return ([f"Metrics from git commit(s): {', '.join(commits)}."] + ([note] if note else [])
            + [f"Examples per task (n): {'; '.join(parts)}."] + system_notes(scores["system"]))


def system_notes(systems: Iterable[str]) -> list[str]:
    """The registry's ``note`` of each system with a row (e.g. DensePhrases' in-distribution training), display
    order: every table where the row appears says it."""
    return [SYSTEMS[s].note for s in ordered_systems(systems) if s in SYSTEMS and SYSTEMS[s].note]


def _paper_row(paper: Mapping, table: str, key: str) -> str | None:
    return (paper["mapping"].get(table) or {}).get(key)


def _paper_vals(paper: Mapping, table: str, name: str | None) -> dict:
    if not name:
        return {}
    if name not in paper[table]:
        raise ValueError(f"paper values: the mapping names row {name!r} but {table} has no such row")
    return paper[table][name]


def _mean(values: Sequence[float | None]) -> float | None:
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)


def _mean_stderr(stderrs: Sequence[float | None]) -> float | None:
    """The standard error of the mean of independent numbers with these standard errors (an average over tasks: their
    examples are disjoint); None where one is missing."""
    if not stderrs or any(v is None for v in stderrs):
        return None
    return math.sqrt(sum(v * v for v in stderrs)) / len(stderrs)


# ------------------------------------------------------------------------------------------------ Table 1

def table1(paths: Iterable[str | os.PathLike], paper: Mapping | None = None,
           registry: str | os.PathLike | None = None) -> Table:
    """Paper Table 1 (paper-map §7.1): zero-shot closed-set accuracy, rows = systems, columns = the Table 1 tasks
    present in the files (paper order) and Avg over them; each cell followed by the mapped paper row's value.

    Avg is empty unless the system has every column. Avg (paper) is the paper's own Avg when all nine tasks are
    shown, else the mean of the paper row's cells over the shown tasks (empty if one of them is "–"). The columns
    are the closed-set tasks of the task ``registry`` (None: config/tasks.yaml; :class:`TaskLayout`).
    """
    paper = paper or load_paper_values()
    layout = _layout(registry)
    closed, keys = layout.closed, layout.paper_keys
    records = load_metrics(paths, tasks=tuple(closed), what="table1", registry=registry)
    index_by_task_system(records, "table1")
    frame = metrics_frame(records)
    scores = _scores(frame)
    score = scores.pivot(index="system", columns="task", values="value")
    stderr = scores.pivot(index="system", columns="task", values="stderr")
    about = _about(frame)
    tasks = [t for t in closed if t in score.columns]
    columns = ["System", "Paper row", "#Params (M)"]
    for t in tasks:
        columns += [closed[t], f"{closed[t]} (paper)"]
    columns += ["Avg", "Avg (paper)"]
    rows = []
    for system in ordered_systems(score.index):
        paper_name = _paper_row(paper, "table1", system)
        paper_vals = _paper_vals(paper, "table1", paper_name)
        row = {"_system": system, "System": display_name(system, _cell(about, system, "model")),
               "Paper row": paper_name, "#Params (M)": _params(about, system)}
        ours, theirs = [], []
        for t in tasks:
            label = closed[t]
            row[label], row[f"{label} ±"] = _cell(score, system, t), _cell(stderr, system, t)
            row[f"{label} (paper)"] = paper_vals.get(keys[t])
            ours.append(row[label])
            theirs.append(paper_vals.get(keys[t]))
        row["Avg"], row["Avg ±"] = _mean(ours), _mean_stderr([row[f"{closed[t]} ±"] for t in tasks])
        paper_avg = len(tasks) == len(closed) and all(keys[t] in paper_vals for t in tasks)
        row["Avg (paper)"] = (paper_vals.get("avg") if paper_avg else _mean(theirs)) if paper_vals else None
        rows.append(row)
    docs = {**COLUMN_DOCS, **{label: CLOSED_DOC for label in closed.values()}}
    notes = [columns_note("table1", columns, docs=docs),
             f"Avg over the {len(tasks)} task(s) shown; empty where a system lacks one.", STDERR_NOTE]
    if len(tasks) != len(closed):
        notes.append("Avg (paper) is the mean of the paper row's cells over the tasks shown, not the paper's Avg.")
    return Table("table1", "Table 1: zero-shot closed-set accuracy (%)", columns, rows, notes + footer(scores),
                 stderr=(*(closed[t] for t in tasks), "Avg"))


# ------------------------------------------------------------------------------------------------ Table 2

def _pair(value) -> Arrow | float | None:
    if isinstance(value, (list, tuple)):
        return Arrow(*value)
    return value


def table2(paths: Iterable[str | os.PathLike], outdated_corpus: str = "enwiki", paper: Mapping | None = None) -> Table:
    """Paper Table 2 (paper-map §7.3): TempLAMA EM. A system with a reference corpus shows "a→b": ``a`` from its file
    whose ``corpus`` is ``outdated_corpus`` (the 2019 Wikipedia), ``b`` from its other file (the task's default,
    updated 2022 corpus). A system without retrieval has one number (in the ``*_updated`` column). AVG = the mean of
    the unchanged and changed scores on the updated corpus (the paper's NPM 18.5 = (19.5 + 17.5) / 2).
    """
    paper = paper or load_paper_values()
    records = load_metrics(paths, tasks=tuple(TEMPLAMA_TASKS), what="table2")
    slots: dict[tuple[str, str, str], dict] = {}  # (system, task, "outdated" | "updated") -> record
    for rec in records:
        when = "outdated" if rec.get("corpus") == outdated_corpus else "updated"
        key = (rec["system"], rec["task"], when)
        if key in slots:
            raise ValueError(f"table2: two metrics files for system {key[0]!r} on task {key[1]!r} on the {when} corpus:"
                             f" {slots[key]['_file']} (corpus {slots[key].get('corpus')!r}) and {rec['_file']} (corpus "
                             f"{rec.get('corpus')!r}); the outdated corpus is {outdated_corpus!r}")
        slots[key] = rec
    frame = metrics_frame(records)
    scores = _scores(frame)
    scores = scores.assign(when=["outdated" if c == outdated_corpus else "updated" for c in scores["corpus"]])
    score = scores.pivot(index="system", columns=["task", "when"], values="value")
    stderr = scores.pivot(index="system", columns=["task", "when"], values="stderr")
    retrieving = set(scores.loc[scores["corpus"].notna() | scores["retrieval"].notna(), "system"])
    about = _about(frame)
    columns = ["System", "Paper row", "#Params (M)", "Unchanged", "Unchanged (paper)", "Changed", "Changed (paper)",
               "AVG", "AVG (paper)", "unchanged_outdated", "unchanged_updated", "changed_outdated", "changed_updated"]
    rows = []
    for system in ordered_systems(score.index):
        paper_name = _paper_row(paper, "table2", system)
        paper_vals = _paper_vals(paper, "table2", paper_name)
        row = {"_system": system, "System": display_name(system, _cell(about, system, "model")),
               "Paper row": paper_name, "#Params (M)": _params(about, system)}
        for task, label in TEMPLAMA_TASKS.items():
            key = label.lower()
            for when in ("outdated", "updated"):
                row[f"{key}_{when}"] = _cell(score, system, (task, when))
                row[f"{key}_{when} ±"] = _cell(stderr, system, (task, when))
            if system in retrieving:
                both = (row[f"{key}_outdated"], row[f"{key}_updated"])
                row[label] = Arrow(*both) if any(v is not None for v in both) else None
                row[f"{label} ±"] = Arrow(row[f"{key}_outdated ±"], row[f"{key}_updated ±"])
            else:
                row[label], row[f"{label} ±"] = row[f"{key}_updated"], row[f"{key}_updated ±"]
            row[f"{label} (paper)"] = _pair(paper_vals.get(key))
        row["AVG"] = _mean([row["unchanged_updated"], row["changed_updated"]])
        row["AVG ±"] = _mean_stderr([row["unchanged_updated ±"], row["changed_updated ±"]])
        row["AVG (paper)"] = paper_vals.get("avg")
        rows.append(row)
    notes = [columns_note("table2", columns),
             f"a→b: EM on the outdated corpus ({outdated_corpus}) → on the task's updated (2022) corpus; – = not "
             "evaluated. AVG = mean of Unchanged and Changed on the updated corpus.",
             "Systems without retrieval have one number (no corpus).", STDERR_NOTE]
    return Table("table2", "Table 2: TempLAMA exact match (%)", columns, rows, notes + footer(scores),
                 stderr=("Unchanged", "Changed", "AVG", "unchanged_outdated", "unchanged_updated", "changed_outdated",
                         "changed_updated"))


# ------------------------------------------------------------------------------------------------ Table 3

def table3_column(retrieval: str | None) -> str:
    """Table 3's column of a run by its metrics ``retrieval``: "w/ BM25" for BM25, else "w/o BM25"."""
    return "w/ BM25" if retrieval == "bm25" else "w/o BM25"


def table3(paths: Iterable[str | os.PathLike], paper: Mapping | None = None) -> Table:
    """Paper Table 3 and Table 10 (paper-map §7.4): entity translation EM (macro over languages).

    A file goes to "w/ BM25" when its ``retrieval`` is ``bm25``, else to "w/o BM25"; ``lm`` and ``bm25_lm`` share
    the LM row. The per-language columns come from ``groups``: of the row's w/ BM25 file when it has one (the
    setting of the paper's Table 10), else of its w/o BM25 file. Paper columns: the mapped Table 3 row, and the
    Table 10 per-language numbers for NPM.
    """
    paper = paper or load_paper_values()
    layout = paper["table3_layout"]  # the paper's row order; LM w/o and w/ BM25 share one row
    records = load_metrics(paths, tasks=(TRANSLATION_TASK,), what="table3", require=("retrieval",))
    slots: dict[tuple[str, str], dict] = {}
    for rec in records:
        row_key = layout["same_row"].get(rec["system"], rec["system"])
        col = table3_column(rec.get("retrieval"))
        if (row_key, col) in slots:
            other = slots[(row_key, col)]
            raise ValueError(f"table3: two metrics files for the {row_key!r} row, column {col!r}: {other['_file']} "
                             f"(system {other['system']!r}) and {rec['_file']} (system {rec['system']!r})")
        slots[(row_key, col)] = rec
    frame = metrics_frame(records)
    frame = frame.assign(row=[layout["same_row"].get(s, s) for s in frame["system"]],
                         column=[table3_column(r) for r in frame["retrieval"]])
    scores = _scores(frame)
    cell = {what: scores.pivot(index="row", columns="column", values=what)
            for what in ("value", "stderr", "system", "model", "parameters")}
    groups = frame[frame["group"].notna()]
    by_lang = groups.pivot(index=["row", "column"], columns="group", values="value")
    by_lang_se = groups.pivot(index=["row", "column"], columns="group", values="stderr")
    langs = sorted(set(groups["group"]))
    columns = ["System", "Paper row", "#Params (M)", "w/o BM25", "w/o BM25 (paper)", "w/ BM25", "w/ BM25 (paper)"]
    for lang in langs:
        columns += [lang, f"{lang} (paper)"]
    row_keys = set(scores["row"])
    order = [k for k in layout["rows"] if k in row_keys] + ordered_systems(row_keys - set(layout["rows"]))
    rows = []
    for key in order:
        w_first = ("w/ BM25", "w/o BM25")  # the w/ BM25 run's model, parameters and languages where there is one
        systems = [s for s in (_cell(cell["system"], key, c) for c in reversed(w_first)) if s]
        model = next((m for m in (_cell(cell["model"], key, c) for c in w_first) if m), None)
        params = next((p for p in (_cell(cell["parameters"], key, c) for c in w_first) if p is not None), None)
        paper_name = next((p for p in (_paper_row(paper, "table3", s) for s in systems) if p), None)
        paper_vals = _paper_vals(paper, "table3", paper_name)
        # a shared row names each of its systems (LM / BM25 + LM), w/o BM25 first: the label says what each column ran
        label = " / ".join(display_name(s, _cell(cell["model"], key, c)) for c in reversed(w_first)
                           if (s := _cell(cell["system"], key, c))) if len(systems) > 1 else display_name(key, model)
        row = {"_system": key, "System": label, "Paper row": paper_name,
               "#Params (M)": params / 1e6 if params is not None else None,
               "w/o BM25 (paper)": paper_vals.get(TABLE3_COLUMNS["w/o BM25"]),
               "w/ BM25 (paper)": paper_vals.get(TABLE3_COLUMNS["w/ BM25"])}
        for column in TABLE3_COLUMNS:
            row[column], row[f"{column} ±"] = _cell(cell["value"], key, column), _cell(cell["stderr"], key, column)
        source = next(c for c in w_first if (key, c) in slots)
        per_lang = paper["table10_npm"] if paper_name == "NPM" else {}
        for lang in langs:
            row[lang], row[f"{lang} ±"] = _cell(by_lang, (key, source), lang), _cell(by_lang_se, (key, source), lang)
            row[f"{lang} (paper)"] = per_lang.get(lang)
        rows.append(row)
    notes = [columns_note("table3", columns, languages=langs),
             "LM and BM25 + LM share a row (w/o / w/ BM25); per-language EM is of the w/ BM25 run where there is "
             "one. Paper per-language numbers: NPM's Table 10.", STDERR_NOTE]
    return Table("table3", "Table 3: entity translation exact match (%)", columns, rows, notes + footer(scores),
                 stderr=(*TABLE3_COLUMNS, *langs))


# ------------------------------------------------------------------------------------------------ Table 4

def table4(paths: Iterable[str | os.PathLike], paper: Mapping | None = None) -> Table:
    """Paper Table 4 (paper-map §7.5): inference speed, one row per (system, task) file. FAISS / Sparse come from
    ``retrieval`` (faiss / bm25); Acc is ``score``; #Q/sec is ``queries_per_s``; the paper row is the mapping's
    ``system/task`` entry (e.g. ``npm/subj`` -> "NPM (Subj)")."""
    paper = paper or load_paper_values()
    records = load_metrics(paths, what="table4", require=("retrieval", "queries_per_s", "device"))
    index_by_task_system(records, "table4")
    frame = metrics_frame(records)
    scores = _scores(frame).set_index(["system", "task"])
    qps = frame[frame["metric"] == "queries_per_s"].set_index(["system", "task"])["value"]
    columns = ["System", "Task", "Paper row", "#Params (M)", "FAISS", "FAISS (paper)", "Sparse", "Sparse (paper)",
               "Corpus", "|C| (M tokens)", "|C| (paper, M tokens)", "Acc", "Acc (paper)", "#Q/sec", "#Q/sec (paper)",
               "Device"]
    rows = []
    for system in ordered_systems(scores.index.get_level_values("system")):
        for task in [t for t in KNOWN_TASKS if (system, t) in scores.index]:
            rec = {k: _plain(v) for k, v in scores.loc[(system, task)].items()}
            paper_name = _paper_row(paper, "table4", f"{system}/{task}")
            pv = _paper_vals(paper, "table4", paper_name)
            params, tokens = rec["parameters"], rec["corpus_tokens"]
            rows.append({
                "_system": system, "System": display_name(system, rec["model"]), "Task": task,
                "Paper row": paper_name, "#Params (M)": params / 1e6 if params is not None else None,
                "FAISS": rec["retrieval"] == "faiss", "FAISS (paper)": pv.get("faiss") if pv else None,
                "Sparse": rec["retrieval"] == "bm25", "Sparse (paper)": pv.get("sparse") if pv else None,
                "Corpus": rec["corpus"], "|C| (M tokens)": tokens / 1e6 if tokens is not None else None,
                "|C| (paper, M tokens)": pv["corpus_tokens"] / 1e6 if pv.get("corpus_tokens") else None,
                "Acc": rec["value"], "Acc ±": rec["stderr"], "Acc (paper)": pv.get("acc"),
                "#Q/sec": _plain(qps.get((system, task))), "#Q/sec (paper)": pv.get("queries_per_s"),
                "Device": rec["device"],
            })
    notes = [columns_note("table4", columns), STDERR_NOTE,
             "The paper timed one Quadro GP100 GPU; ours ran on the device shown, so only the ratios between rows "
             "compare.", "#Q/sec: examples answered per second by the evaluation (query encoding, retrieval and "
             "scoring; loading the model and indexes excluded), the rate `npm-repro evaluate` logs as examples/s; "
             "empty where the run was too short to time."]
    return Table("table4", "Table 4: inference speed", columns, rows, notes + footer(scores.reset_index()),
                 md_digits={"#Q/sec": 2, "#Q/sec (paper)": 2}, stderr=("Acc",))


# ------------------------------------------------------------------------------------------------ Table 8

def table8(paths: Iterable[str | os.PathLike], paper: Mapping | None = None) -> Table:
    """Paper Table 8 (paper-map §7.2): open-set EM on the knowledge tasks. T-REx and Google-RE "All" are the task's
    score (macro over n-gram buckets), UHN / Hard its ``subsets`` (same macro average); KML, TQA and NQ the score.
    Each cell is followed by the mapped paper row's value."""
    paper = paper or load_paper_values()
    records = load_metrics(paths, tasks=tuple(KNOWLEDGE_TASKS), what="table8")
    for rec in records:
        if rec["task"] in LAMA_TASKS and not isinstance(rec.get("subsets"), dict):
            raise ValueError(f"metrics file {rec['_file']} lacks the field 'subsets' (UHN / Hard) that table8 needs "
                             f"for {rec['task']}; re-run its evaluation")
    index_by_task_system(records, "table8")
    frame = metrics_frame(records)
    scores = _scores(frame)
    score = scores.pivot(index="system", columns="task", values="value")
    stderr = scores.pivot(index="system", columns="task", values="stderr")
    subsets = frame[frame["subset"].notna()].pivot(index="system", columns=["task", "subset"], values="value")
    subsets_se = frame[frame["subset"].notna()].pivot(index="system", columns=["task", "subset"], values="stderr")
    with_corpus = set(scores.loc[scores["corpus"].notna(), "system"])
    about = _about(frame)
    columns = ["System", "Paper row", "#Params (M)", "Corpus"]
    for label, *_ in TABLE8_COLUMNS:
        columns += [label, f"{label} (paper)"]
    rows = []
    for system in ordered_systems(score.index):
        paper_name = _paper_row(paper, "table8", system)
        pv = _paper_vals(paper, "table8", paper_name)
        row = {"_system": system, "System": display_name(system, _cell(about, system, "model")),
               "Paper row": paper_name, "#Params (M)": _params(about, system), "Corpus": system in with_corpus}
        for label, task, subset, key in TABLE8_COLUMNS:
            if subset is None:
                row[label], row[f"{label} ±"] = _cell(score, system, task), _cell(stderr, system, task)
            else:
                row[label], row[f"{label} ±"] = (_cell(subsets, system, (task, subset)),
                                                 _cell(subsets_se, system, (task, subset)))
            row[f"{label} (paper)"] = pv.get(key)
        rows.append(row)
    notes = [columns_note("table8", columns),
             "LAMA columns are macro over the 1/2/3/4+ n-gram buckets; UHN / Hard are the same average over the "
             "filtered subsets (empty where a subset has no example).", STDERR_NOTE]
    return Table("table8", "Table 8: open-set exact match (%)", columns, rows, notes + footer(scores),
                 stderr=tuple(label for label, *_ in TABLE8_COLUMNS))


# ------------------------------------------------------------------------------------------------ paper cells

@dataclass(frozen=True)
class PaperCell:
    """One number of the paper and the metrics cell of ours that our tables print it beside."""

    table: str  # table1 | table2 | table3 | table8
    paper_row: str
    column: str  # the column of our table
    cell: str  # "{task}/{run}" (results/metrics/{task}/{run}.json) or "{task}/{run}#{subset}" (its `subsets`)
    value: float
    source: str = ""  # where the paper prints the number: "Table 1", or the row's `source` ("Table 9" for NPM-single)


def paper_cells(paper: Mapping | None, outdated_corpus: str) -> list[PaperCell]:
    """Every number of the paper's Tables 1, 2, 3 and 8 that one of our metrics cells is compared with, by the
    tables' own mapping (``paper_values.yaml`` ``mapping``) and columns: Table 1 ``{task}/{system}``; Table 8 the
    same, UHN / Hard as ``{task}/{system}#{subset}``; Table 2 "a→b" as ``{task}/{system}@{outdated_corpus}`` (a) and
    ``{task}/{system}`` (b, the task's default, updated corpus), a single number as ``{task}/{system}``; Table 3 the
    column of the system's retrieval (registry: an open-set system reading ``bm25`` is "w/ BM25"). A paper cell that
    is null ("–") is left out, and so are the averages, which have no metrics file of their own. ``paper`` None: the
    packaged values; ``outdated_corpus``: TempLAMA's 2019 corpus (config/tasks.yaml ``outdated_corpus``)."""
    paper = paper or load_paper_values()
    cells: list[PaperCell] = []

    def add(table: str, system: str, column: str, cell: str, value) -> None:
        if _number(value):
            source = row(table, system).get("source") or table.replace("table", "Table ")
            cells.append(PaperCell(table, _paper_row(paper, table, system), column, cell, float(value), source))

    def row(table: str, system: str) -> dict:
        return _paper_vals(paper, table, _paper_row(paper, table, system))

    for system in paper["mapping"]["table1"]:
        for task, label in CLOSED_SET_TASKS.items():
            add("table1", system, label, f"{task}/{system}", row("table1", system).get(LAYOUT.paper_keys[task]))
    for system in paper["mapping"]["table8"]:
        for label, task, subset, key in TABLE8_COLUMNS:
            cell = f"{task}/{system}" + (f"#{subset}" if subset else "")
            add("table8", system, label, cell, row("table8", system).get(key))
    for system in paper["mapping"]["table2"]:
        for task, label in TEMPLAMA_TASKS.items():
            value = _pair(row("table2", system).get(LAYOUT.paper_keys[task]))
            if isinstance(value, Arrow):
                add("table2", system, f"{label} (outdated)", f"{task}/{system}@{outdated_corpus}", value.before)
                add("table2", system, label, f"{task}/{system}", value.after)
            else:
                add("table2", system, label, f"{task}/{system}", value)
    for system in paper["mapping"]["table3"]:
        column = table3_column("bm25" if system in SYSTEMS and "bm25" in (SYSTEMS[system].open or ()) else None)
        add("table3", system, column, f"{TRANSLATION_TASK}/{system}", row("table3", system).get(TABLE3_COLUMNS[column]))
    return cells


# ------------------------------------------------------------------------------------------------ writers

def format_cell(value, digits: int) -> str:
    """A cell as text: empty for None, ✓ / empty for booleans, ``digits`` decimals for numbers, "a→b" for arrows."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "✓" if value else ""
    if isinstance(value, Arrow):
        def side(v):
            return "–" if v is None else f"{v:.{digits}f}"

        return f"{side(value.before)}→{side(value.after)}"
    if isinstance(value, (int, float)):  # a JSON score may be an integer (50 -> "50.0")
        return f"{value:.{digits}f}" if math.isfinite(value) else ""
    return str(value)


def with_stderr(value, stderr, digits: int) -> str:
    """A Markdown cell: "score ± se" (1 decimal for the se); an "a→b" cell with an Arrow of standard errors gives each
    side its own ("18.0 ± 2.5→19.0 ± 2.4"); without a standard error the plain cell."""
    if isinstance(value, Arrow) and isinstance(stderr, Arrow):
        def side(v, se):
            return "–" if v is None else with_stderr(v, se, digits)

        return f"{side(value.before, stderr.before)}→{side(value.after, stderr.after)}"
    text = format_cell(value, digits)
    return f"{text} ± {format_cell(stderr, 1)}" if text and stderr is not None and not isinstance(stderr, Arrow) \
        else text


def table_frame(table: Table, digits: int = 2):
    """The table's CSV columns as a pandas DataFrame of cell texts (:func:`format_cell`, ``digits`` decimals)."""
    import pandas as pd

    columns = table.csv_columns()
    return pd.DataFrame([[format_cell(row.get(c), digits) for c in columns] for row in table.rows], columns=columns,
                        dtype=object)


def write_csv(table: Table, path: str | os.PathLike) -> Path:
    """The table as CSV (2 decimals), atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        table_frame(table).to_csv(tmp, index=False, encoding="utf-8")
    return path


def write_markdown(table: Table, path: str | os.PathLike) -> Path:
    """The table as Markdown (1 decimal unless ``md_digits`` says otherwise) with the notes as a footer, atomically."""
    path = Path(path)

    def esc(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [f"# {table.title}", "", "| " + " | ".join(esc(c) for c in table.columns) + " |",
             "|" + "|".join("---" for _ in table.columns) + "|"]
    for row in table.rows:
        cells = []
        for c in table.columns:
            text = with_stderr(row.get(c), row.get(f"{c} ±") if c in table.stderr else None,
                               table.md_digits.get(c, 1))
            cells.append(esc(text))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"{note}  " for note in table.notes]
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return path


def write_table(table: Table, out: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``out`` (CSV) and the Markdown with the same basename and ``.md``. Returns both paths."""
    out = Path(out)
    if out.suffix == ".md":
        raise ValueError(f"--out {out}: give the CSV path; the Markdown is written beside it with .md")
    return write_csv(table, out), write_markdown(table, out.with_suffix(".md"))


TABLES = {"table1": table1, "table2": table2, "table3": table3, "table4": table4, "table8": table8}
