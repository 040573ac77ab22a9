"""config/tasks.yaml is the one home of a task: a new closed-set task is its registry entry plus its data file, and it
runs through the evaluation harness (what `npm-repro evaluate` runs) and into Table 1 as a new column, with no code
changed. The lists of tasks elsewhere (tables, figures, workflow, config defaults) are derived from the registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from npm.evaluation.harness import evaluate
from npm.evaluation.systems import Inputs
from npm.report import figures, tables
from npm.settings import Settings
from npm.tasks.registry import DEFAULT_REGISTRY, RegistryError, config_task_lists, load_registry, task_names
from tests.conftest import build_tiny_corpus, lee_corpus_lines, save_tiny_bert

# A polarity task the paper does not have: LM-BFF's CSV layout (label,text), the sentiment template, its own words.
POLAR = {
    "family": "closed", "loader": "load_label_text_csv", "files": ["test.csv"], "template": "mr",
    "verbalizer": {"words": [" bad", " good"], "fuzzy": None, "premise": "It was"},
    "metric": "accuracy", "label": "Polar", "report": {"table": "table1", "paper_key": "polar"},
    "average": "micro", "sampling": {"n_samples": 3000}, "reference_corpus": ["enwiki"], "is_question": False,
    "l_max": None, "url": None, "source": "written by tests/test_tasks_home.py",
}
ROWS = ["1,a good film about a great city", "0,a bad plot and a dull waste of time", "1,she meets her brother",
        "0,he goes to Greece", "1,the best of the year"]


def registry_with(tmp_path: Path, **tasks) -> Path:
    """A copy of config/tasks.yaml with ``tasks`` added: the only file a new task needs, besides its data."""
    raw = yaml.safe_load(DEFAULT_REGISTRY.read_text(encoding="utf-8"))
    raw["tasks"].update(tasks)
    path = tmp_path / "tasks.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def test_a_new_closed_set_task_is_one_registry_entry_through_evaluation_and_table1(tmp_path):
    registry = registry_with(tmp_path, polar=POLAR)
    (tmp_path / "tasks" / "polar").mkdir(parents=True)
    (tmp_path / "tasks" / "polar" / "test.csv").write_text("\n".join(ROWS) + "\n", encoding="utf-8")
    save_tiny_bert(tmp_path / "model", seed=0)
    corpus = build_tiny_corpus(tmp_path / "corpus", str(tmp_path / "model"), lee_corpus_lines()[:4])
    inputs = Inputs(checkpoint=str(tmp_path / "model"), datastore=[corpus["ds"]], faiss=[corpus["faiss"]],
                    tasks_root=str(tmp_path / "tasks"))
    metrics_path = tmp_path / "metrics" / "polar" / "npm_single.json"
    metrics = evaluate("polar", "npm_single", inputs, Settings(k=30), registry=registry,
                       predictions_path=tmp_path / "predictions" / "polar" / "npm_single.jsonl",
                       metrics_path=metrics_path)
    assert metrics["n"] == len(ROWS) and metrics["metric"] == "accuracy"
    preds = [json.loads(line) for line in (tmp_path / "predictions" / "polar" / "npm_single.jsonl").open()]
    assert all(p["input"].endswith(" It was<mask>.") and len(p["scores"]) == 2 for p in preds)

    sst2 = tmp_path / "metrics" / "sst2" / "npm_single.json"  # a paper task beside it
    sst2.parent.mkdir(parents=True)
    sst2.write_text(json.dumps({**json.loads(metrics_path.read_text()), "task": "sst2", "score": 60.0}))
    table = tables.table1([metrics_path, sst2], registry=registry)
    assert [c for c in table.columns if c not in ("System", "Paper row", "#Params (M)")] == [
        "SST-2", "SST-2 (paper)", "Polar", "Polar (paper)", "Avg", "Avg (paper)"]  # the paper's tasks first
    row = table.row("npm_single")
    assert row["Polar"] == pytest.approx(metrics["score"]) and row["Polar (paper)"] is None
    assert row["SST-2 (paper)"] == 86.8 and row["Avg (paper)"] is None  # the paper has no Polar number to average
    csv_path, md_path = tables.write_table(table, tmp_path / "table1.csv")
    assert "Polar" in csv_path.read_text().splitlines()[0] and "**Polar**" in md_path.read_text()

    with pytest.raises(ValueError, match=r"unknown task 'polar'; known tasks: \['agn'"):
        tables.table1([metrics_path])  # the shipped registry does not have it


def test_the_lists_of_tasks_are_the_registrys():
    reg = load_registry()
    assert list(tables.CLOSED_SET_TASKS) == task_names(family="closed") == task_names(table="table1")
    assert set(tables.OPEN_SET_TASKS) == set(task_names(family="open"))
    assert tables.CLOSED_SET_TASKS == {n: reg[n].label for n in task_names(family="closed")}
    assert figures.TASK_LABELS == {n: t.label for n, t in reg.items()}
    assert [key for *_, key in tables.TABLE8_COLUMNS][:3] == ["trex", "trex_uhn", "trex_hard"]  # the paper's order
    config = config_task_lists({"evaluation": {"open_set_tasks": ["nq"]}})
    assert config["evaluation"] == {"open_set_tasks": ["nq"], "closed_set_tasks": task_names(family="closed")}
    assert config["ablation"]["tasks"] == task_names(table="table8")


@pytest.mark.parametrize("report,match", [
    ({"table": "table8", "paper_key": "polar"}, "table one of \\['table1'\\]"),
    ({"table": "table1"}, "needs \\['paper_key'\\]"),
    ({"table": "table1", "paper_key": "polar", "subsets": {}}, "may have \\['column'\\]"),
])
def test_a_bad_report_entry_names_the_task_and_the_key(tmp_path, report, match):
    with pytest.raises(RegistryError, match=f"task 'polar', key 'report': .*{match}"):
        load_registry(registry_with(tmp_path, polar={**POLAR, "report": report}))


def test_the_workflow_names_an_unknown_configured_task_and_the_known_ones(tmp_path):
    """The config schema names no task: the workflow checks the configured ones against config/tasks.yaml."""
    from tests.test_systems import _dry_run

    out = _dry_run(tmp_path, {"evaluation": {"closed_set_tasks": ["agn", "polar"]}})
    known = sorted(load_registry())
    assert out.returncode != 0
    assert f"task 'polar' is not in config/tasks.yaml; known tasks: {known}" in out.stdout + out.stderr
