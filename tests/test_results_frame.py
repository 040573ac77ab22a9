"""``npm.report.results``: every number of the metrics files as one tidy DataFrame, and the tables pivoted from it
carry exactly the numbers of the JSON files (paper-map §7)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import npm.report
from npm.report import tables
from tests.test_report import read_csv, templama_files, write_metrics

ROOT = Path(__file__).resolve().parents[1]
KEY = ["source", "task", "system", "run", "metric", "subset", "group", "k"]


def knowledge_files(results: Path) -> list[Path]:
    return [write_metrics(results, "lama_trex", "npm", 30.0, stderr=4.5, ci95=[21.0, 39.0], n=40,
                          subsets={"uhn": 25.0, "hard": None, "n_uhn": 12, "n_hard": 0},
                          groups={"1": 40.0, "2": 20.0}),
            write_metrics(results, "lama_trex", "lm", 10.0, corpus=None,
                          subsets={"uhn": 5.0, "hard": 2.5, "n_uhn": 20, "n_hard": 8}),
            write_metrics(results, "nq", "npm", 8.0, stderr=2.0),
            write_metrics(results, "nq", "npm", 6.0, _at=True, corpus="enwiki_p10")]


def test_results_has_one_row_per_number_with_its_provenance(tmp_path):
    knowledge_files(tmp_path / "results")
    df = npm.report.results(tmp_path)
    assert not df.duplicated(KEY).any()
    main = df[(df["run"] == "npm") & (df["task"] == "lama_trex") & df["subset"].isna() & df["group"].isna()
              & (df["metric"] == "em")].iloc[0]
    assert (main["value"], main["stderr"], main["ci_low"], main["ci_high"], main["n"]) == (30.0, 4.5, 21.0, 39.0, 40)
    assert main["commit"] == "abc1234" and main["corpus"] == "enwiki" and main["model"] == "models/npm"
    uhn = df[(df["run"] == "npm") & (df["subset"] == "uhn")].iloc[0]
    assert (uhn["value"], uhn["n"]) == (25.0, 12)
    assert df[(df["run"] == "npm") & (df["group"] == "2")]["value"].tolist() == [20.0]
    ablation = df[(df["run"] == "npm@enwiki_p10") & (df["metric"] == "em")].iloc[0]
    assert ablation["system"] == "npm" and ablation["corpus"] == "enwiki_p10" and ablation["value"] == 6.0
    assert set(df["source"]) == {"metrics"} and len(df[df["metric"] == "queries_per_s"]) == 4


def test_results_reads_densephrases_and_replug_results(tmp_path):
    dp = tmp_path / "results" / "densephrases" / "eval" / "pre_batch"
    dp.mkdir(parents=True)
    (dp / "rc.json").write_text(json.dumps({"model": "m", "rc": {"em": 50.0, "f1": 60.0, "n": 4},
                                            "rc_teacher": {"em": 75.0, "f1": 80.0}}))
    (dp / "Flat.json").write_text(json.dumps({
        "model": "m", "index": {"factory": "Flat", "bytes_per_vector": 1536.0, "build_seconds": 2.5, "rows": 10},
        "open": {"nq": {"em": 25.0, "n": 8, "queries_per_s": 40.0}}, "open_index_only": {"nq": {"em": 12.5, "n": 8}}}))
    (tmp_path / "results" / "replug").mkdir()
    (tmp_path / "results" / "replug" / "lm_eval.json").write_text(json.dumps({"lm": "SmolLM2", "n_texts": 3, "rows": [
        {"system": "lm", "k": 0, "bpb": 1.05, "bpb_ci95": [0.9, 1.2], "gain_pct": 0.0, "gain_pct_ci95": [0.0, 0.0],
         "perplexity": 25.5},
        {"system": "replug", "k": 2, "bpb": 1.04, "bpb_ci95": [0.9, 1.1], "gain_pct": 0.9, "gain_pct_ci95": [0.1, 1.5],
         "perplexity": 25.0}]}))
    df = npm.report.results(tmp_path)
    assert not df.duplicated(KEY).any()
    by = df.set_index(KEY)["value"]
    assert by[("densephrases", "rc", "densephrases", "pre_batch/rc", "em", None, None, None)] == 50.0
    teacher = df[(df["task"] == "rc") & (df["subset"] == "teacher") & (df["metric"] == "f1")].iloc[0]
    assert (teacher["value"], teacher["n"]) == (80.0, 4)
    assert df[(df["task"] == "nq") & (df["subset"] == "index_only")]["value"].tolist() == [12.5]
    assert df[(df["metric"] == "bytes_per_vector")]["group"].tolist() == ["Flat"]
    gain = df[(df["source"] == "lm_eval") & (df["system"] == "replug") & (df["metric"] == "gain_pct")].iloc[0]
    assert (gain["value"], gain["ci_low"], gain["ci_high"], gain["k"], gain["n"]) == (0.9, 0.1, 1.5, 2, 3)


def test_tables_carry_the_numbers_of_the_json_files(tmp_path):
    """Every number of Tables 1, 2 and 8 built from the frame equals the one recomputed from the raw JSON with plain
    Python, and the CSV prints it with 2 decimals."""
    closed = [write_metrics(tmp_path, t, s, score, stderr=se) for t, s, score, se in
              [("agn", "npm", 70.125, 3.5), ("sst2", "npm", 81.0, 2.25), ("agn", "mlm", 61.0, 4.0),
               ("sst2", "mlm", 70, 1.0)]]
    raw = [json.loads(p.read_text()) for p in closed]
    table = tables.table1(closed)
    for rec in raw:
        label = tables.CLOSED_SET_TASKS[rec["task"]]
        row = table.row(rec["system"])
        assert row[label] == rec["score"] and row[f"{label} ±"] == rec["stderr"]
        assert row["#Params (M)"] == rec["parameters"] / 1e6
    for system in ("npm", "mlm"):
        scores = [r["score"] for r in raw if r["system"] == system]
        assert table.row(system)["Avg"] == sum(scores) / len(scores)
    csv_path, _ = tables.write_table(table, tmp_path / "t1.csv")
    npm_row = {r["System"]: r for r in read_csv(csv_path)}["NPM"]
    assert (npm_row["AGN"], npm_row["AGN ±"], npm_row["Avg"]) == ("70.12", "3.50", f"{(70.125 + 81.0) / 2:.2f}")

    files = knowledge_files(tmp_path / "k")[:3]
    raw = [json.loads(p.read_text()) for p in files]
    table8 = tables.table8(files)
    trex = {r["system"]: r for r in raw if r["task"] == "lama_trex"}
    for system, rec in trex.items():
        row = table8.row(system)
        assert row["T-REx All"] == rec["score"] and row["T-REx UHN"] == rec["subsets"]["uhn"]
        assert row["T-REx Hard"] == rec["subsets"]["hard"]
    assert table8.row("npm")["NQ"] == 8.0 and table8.row("npm")["NQ ±"] == 2.0 and table8.row("lm")["NQ"] is None

    templama = templama_files(tmp_path / "t")
    raw = [json.loads(p.read_text()) for p in templama]
    table2 = tables.table2(templama)
    for rec in raw:
        when = "outdated" if rec["corpus"] == "enwiki" else "updated"
        key = tables.TEMPLAMA_TASKS[rec["task"]].lower()
        assert table2.row(rec["system"])[f"{key}_{when}"] == rec["score"]


def test_report_package_imports_pandas_only_for_results():
    """`npm-repro` builds its parser (which imports npm.report) in envs without pandas: pandas loads only when
    ``npm.report.results`` or a table builder runs."""
    code = ("import sys; from npm.cli import build_parser; build_parser(); import npm.report; "
            "print('pandas' in sys.modules); npm.report.results; print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.split() == ["False", "True"]
