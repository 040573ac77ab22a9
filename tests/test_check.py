"""npm-repro check: expected-number bands per evaluation cell, OK / FAIL / not run (docs/expected-numbers.md)."""

import json

import pytest

from npm.cli import main
from npm.report.check import EXPECTED_DIR, PAPER, band, check, load_expected, record, record_paper, tolerance, wilson
from npm.report.tables import PAPER_VALUES
from npm.tasks.registry import load_registry
from tests.test_workflow import dry_run_jobs


def _metrics(root, task, run, score, n=40, ci95=None, **fields):
    path = root / task / f"{run}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"task": task, "system": run.split("@")[0], "score": score, "n": n,
                                "ci95": ci95 if ci95 is not None else [score - 10, score + 10], **fields}))
    return path


def test_record_then_check_ok_fail_and_missing(tmp_path, capsys):
    """A recorded run passes its own bands; a score outside a band or a missing file FAILs, with exit status 1."""
    runs = tmp_path / "metrics"
    files = [_metrics(runs, "agn", "npm", 60.0, ci95=[45.0, 75.0]), _metrics(runs, "nq", "npm@enwiki", 10.0, n=50)]
    expected = tmp_path / "expected.yaml"
    cells = record(files, expected, header="test run\nsecond line")
    # Wilson's [44.6, 73.7] joined with the bootstrap's [45, 75], then one example (2.5) each side
    assert cells["agn/npm"] == {"expected": 60.0, "band": [42.1, 77.5], "n": 40}
    assert expected.read_text().startswith("# test run\n# second line\ncells:")
    assert all(v.ok for v in check(load_expected(expected), runs))
    assert main(["check", "--expected", str(expected), "--metrics-root", str(runs)]) == 0
    assert "2 OK, 0 FAIL, 0 not run" in capsys.readouterr().out

    _metrics(runs, "agn", "npm", 25.0)  # a broken NPM at chance
    (runs / "nq" / "npm@enwiki.json").unlink()
    with pytest.raises(SystemExit) as failed:
        main(["check", "--expected", str(expected), "--metrics-root", str(runs)])
    assert failed.value.code == 1
    out = capsys.readouterr().out
    assert "FAIL    agn/npm" in out and "FAIL    nq/npm@enwiki" in out and "no metrics file" in out
    assert "0 OK, 2 FAIL, 0 not run of 2 cells" in out  # the embedded default: a missing cell is a FAIL


def test_wilson_interval_is_the_binomial_score_interval():
    """Wilson's 95 % score interval in percent: at 0 of 40 it reaches 3.84 / 43.84 (the bootstrap's is [0, 0])."""
    assert wilson(0.0, 40) == pytest.approx([0.0, 100 * 1.96**2 / (40 + 1.96**2)], abs=1e-3)
    assert wilson(100.0, 40) == pytest.approx([100 - 100 * 1.96**2 / (40 + 1.96**2), 100.0], abs=1e-3)
    low, high = wilson(62.5, 40)
    assert 46.5 < low < 47.5 and 75.5 < high < 76.5


def test_band_at_a_count_of_zero_allows_a_retrained_model_s_sampling_noise():
    """A cell expected at 0 of 40 has a degenerate bootstrap interval [0, 0]; 2 of 40 (5.0), as an fp32-trained
    demo gave where the bands came from a bf16 one, is inside its band; 5 of 40 (12.5) is not."""
    low, high = band({"task": "nq", "system": "npm", "score": 0.0, "n": 40, "ci95": [0.0, 0.0]})
    assert low == 0.0 and 5.0 <= high < 12.5
    low, high = band({"task": "x", "system": "y", "score": 100.0, "n": 40, "ci95": [100.0, 100.0]})
    assert high == 100.0 and 87.5 < low <= 95.0


def test_band_needs_the_interval_and_stays_in_percent():
    assert band({"task": "x", "system": "y", "score": 50.0, "n": 10, "ci95": [0.0, 100.0]}) == [0.0, 100.0]
    with pytest.raises(ValueError, match="lack `ci95`"):
        band({"task": "x", "system": "y", "n": 10, "score": 1.0})


def test_bad_expected_files_are_clear_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cells:\n  agn/npm: {expected: 60, band: [70, 50]}\n")
    with pytest.raises(ValueError, match="LOW <= HIGH"):
        load_expected(bad)
    bad.write_text("missing: skip\ncells:\n  agn/npm: {expected: 60, band: [50, 70]}\n")
    with pytest.raises(ValueError, match="must be one of"):
        load_expected(bad)
    bad.write_text("cells: {}\n")
    with pytest.raises(ValueError, match="non-empty"):
        load_expected(bad)
    with pytest.raises(FileNotFoundError, match=str(EXPECTED_DIR)):
        load_expected(tmp_path / "none.yaml")


def test_the_packaged_embedded_bands_are_valid():
    expected = load_expected(EXPECTED_DIR / "embedded.yaml")
    cells = expected.cells
    assert expected.missing == "fail" and "agn/npm" in cells
    assert all(c["band"][0] <= c["expected"] <= c["band"][1] for c in cells.values())
    for cell, c in cells.items():  # every band holds its cell's binomial interval widened by one example
        one = 100.0 / c["n"]
        low, high = wilson(c["expected"], c["n"])
        assert c["band"][0] <= max(0.0, low - one) + 0.01 and c["band"][1] >= min(100.0, high + one) - 0.01, cell
    # and still tells the negative control (shuffled datastore vectors) from the real run on its two cells
    assert not cells["agn/npm"]["band"][0] <= 25.0 and not cells["entity_translation/npm"]["band"][0] <= 0.0


def test_negative_control_mode_fails_only_when_everything_passes(tmp_path, capsys):
    runs = tmp_path / "metrics"
    files = [_metrics(runs, "agn", "npm", 60.0, ci95=[45.0, 75.0]), _metrics(runs, "agn", "lm", 90.0)]
    expected = tmp_path / "expected.yaml"
    record(files, expected, header="x")
    argv = ["check", "--expected", str(expected), "--metrics-root", str(runs), "--runs", "npm", "--expect-fail"]
    with pytest.raises(SystemExit) as passed:  # the control scored like the real run: the check cannot tell
        main(argv)
    assert passed.value.code == 1 and "1 OK, 0 FAIL, 0 not run of 1 cells" in capsys.readouterr().out
    _metrics(runs, "agn", "npm", 25.0)
    assert main(argv) == 0 and "FAIL, as they must" in capsys.readouterr().out
    (runs / "agn" / "npm.json").unlink()  # a control that did not run proves nothing
    with pytest.raises(SystemExit):
        main(argv)
    assert "have no score (agn/npm)" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ the paper check

def _paper_copy(tmp_path, rule_edit=None):
    """A copy of the packaged paper file, its hand-kept part edited by ``rule_edit(text) -> text``."""
    copy = tmp_path / "paper.yaml"
    text = PAPER.read_text()
    copy.write_text(rule_edit(text) if rule_edit else text)
    return copy


def test_paper_file_is_generated_from_paper_values_and_up_to_date(tmp_path):
    """Regenerating the packaged file from paper_values.yaml gives the file as committed; every cell is the paper's
    number with its band (expected ± the rule's tolerance); null paper cells and cells we cannot run are absent."""
    copy = _paper_copy(tmp_path)
    cells = record_paper(copy)
    assert copy.read_text() == PAPER.read_text(), "paper.yaml is stale: run npm-repro check --record-paper"
    expected = load_expected(PAPER)
    assert expected.missing == "not_run" and expected.cells == cells
    npm = cells["agn/npm"]  # Table 1, NPM, AGN: 74.5 over the paper's 3,000 examples
    half = 1.96 * 100 * (0.745 * 0.255 / 3000) ** 0.5
    assert npm["expected"] == 74.5 and npm["n"] == 3000 and "model" not in npm
    assert npm["band"] == [round(74.5 - half, 2), round(74.5 + half, 2)] == [72.94, 76.06]
    assert cells["sst2/npm_single"]["expected"] == 86.8  # NPM-single: the two cells the paper gives
    assert "yahoo/npm_single" not in cells  # null in the paper
    assert cells["rte/lm"]["expected"] == 53.1 and cells["rte/lm_pmi"]["expected"] == 54.2  # RTE's causal form
    assert cells["templama_changed/npm@enwiki"]["expected"] == 2.9 and cells["templama_changed/npm"]["expected"] == 17.5
    assert cells["lama_trex/npm#uhn"]["expected"] == 29.0 and cells["lama_trex/lm"]["model"] == "opt-2.7b"
    assert cells["entity_translation/bm25_lm"]["expected"] == 22.3 and "entity_translation/npm_faiss" not in cells
    assert cells["agn/lm"]["model"] == "gpt2-large" and cells["agn/mlm"]["model"] == "roberta-large"
    tasks = load_registry()  # n is never more than the task's sample (config/tasks.yaml)
    for cell, spec in cells.items():
        task = tasks[cell.split("/")[0]]
        assert spec["n"] <= (task.n_samples or task.per_group * 15), cell
        assert spec["band"][0] <= spec["expected"] <= spec["band"][1] and spec["tolerance"] >= 1.0, cell


def test_paper_cells_follow_paper_values(tmp_path):
    """A changed paper number changes its cell, a null one removes it: the cells are data from paper_values.yaml."""
    values = PAPER_VALUES.read_text()
    row = "{params_x: 1.0, agn: 74.5, yahoo: 53.9,"
    assert row in values
    edited = tmp_path / "paper_values.yaml"
    edited.write_text(values.replace(row, "{params_x: 1.0, agn: 80.0, yahoo: null,"))
    copy = _paper_copy(tmp_path)
    assert main(["check", "--record-paper", "--expected", str(copy), "--paper-values", str(edited)]) == 0
    cells = load_expected(copy).cells
    assert cells["agn/npm"]["expected"] == 80.0 and "yahoo/npm" not in cells
    assert copy.read_text().startswith(PAPER.read_text().split("\ncells:")[0])  # the hand-kept part is kept


def test_tolerance_rule_and_overrides(tmp_path):
    assert tolerance(0.0, 3000, 1.0, 1.96) == 1.0  # the floor
    assert tolerance(50.0, 277, 1.0, 1.96) == pytest.approx(1.96 * 50 / 277 ** 0.5)
    copy = _paper_copy(tmp_path, lambda t: t.replace(
        "overrides: {}", "overrides:\n    agn/npm: {tolerance: 3.0, reason: the paper's AGN sample is unknown}"))
    cells = record_paper(copy)
    assert cells["agn/npm"]["band"] == [71.5, 77.5] and cells["agn/npm"]["override"] is True
    stale = _paper_copy(tmp_path, lambda t: t.replace("overrides: {}", "overrides:\n    agn/nope: {tolerance: 3.0, "
                                                                       "reason: x}"))
    with pytest.raises(ValueError, match=r"overrides of cells the paper check has not.*agn/nope"):
        record_paper(stale)
    no_reason = _paper_copy(tmp_path, lambda t: t.replace("overrides: {}", "overrides:\n    agn/npm: {tolerance: 3}"))
    with pytest.raises(ValueError, match="needs `tolerance: POINTS` and a `reason: TEXT`"):
        record_paper(no_reason)
    no_n = _paper_copy(tmp_path, lambda t: t.replace("    rte: 277\n", ""))
    with pytest.raises(ValueError, match="n has no entry for rte"):
        record_paper(no_n)
    no_model = _paper_copy(tmp_path, lambda t: t.replace("    OPT 2.7B: opt-2.7b\n", ""))
    with pytest.raises(ValueError, match="models has no entry for the paper row 'OPT 2.7B'"):
        record_paper(no_model)


def test_paper_check_ok_fail_not_run_and_exit_status(tmp_path, capsys):
    """OK inside the band, FAIL outside, "not run" without a metrics file or with another model's; exit 1 only on a
    FAIL (and not with --report-only)."""
    runs = tmp_path / "metrics"
    _metrics(runs, "agn", "npm", 74.0, n=3000, model="facebook/npm")
    _metrics(runs, "sst2", "npm", 60.0, n=1821, model="results/models/npm")  # far below 87.2
    _metrics(runs, "lama_trex", "npm", 34.0, n=2983, subsets={"uhn": 28.5, "n_uhn": 2375, "hard": 20.0},
             model="facebook/npm")  # All and UHN in their bands, Hard (32.1) not
    _metrics(runs, "agn", "mlm", 71.0, n=3000, model="results/models/mlm")  # not roberta-large: not run
    _metrics(runs, "agn", "lm", 67.0, n=3000, model="openai-community/gpt2-large")  # the paper row's model
    argv = ["check", "--paper", "--metrics-root", str(runs)]
    with pytest.raises(SystemExit) as failed:
        main(argv)
    assert failed.value.code == 1
    out = capsys.readouterr().out
    scored = {line.split()[1]: line.split()[0] for line in out.splitlines() if line.startswith(("OK", "FAIL"))}
    assert scored == {"agn/npm": "OK", "sst2/npm": "FAIL", "lama_trex/npm": "OK", "lama_trex/npm#uhn": "OK",
                     "lama_trex/npm#hard": "FAIL", "agn/lm": "OK"}
    assert "not run agn/mlm" in out and "is a run of mlm; the paper's row is roberta-large" in out
    assert "not run yahoo/npm" in out and "no metrics file" in out
    assert "4 OK, 2 FAIL, 70 not run of 76 cells" in out

    assert main([*argv, "--report-only"]) == 0 and "2 FAIL" in capsys.readouterr().out
    (runs / "sst2" / "npm.json").unlink()
    _metrics(runs, "lama_trex", "npm", 34.0, n=2983, subsets={"uhn": 28.5, "hard": 32.0}, model="facebook/npm")
    assert main(argv) == 0  # only OK and not run: exit 0
    assert "5 OK, 0 FAIL, 71 not run of 76 cells" in capsys.readouterr().out
    assert main([*argv, "--runs", "npm"]) == 0 and "4 OK, 0 FAIL, 16 not run of 20 cells" in capsys.readouterr().out


def test_paper_and_expected_together_is_an_error(tmp_path, capsys):
    assert main(["check", "--paper", "--expected", str(PAPER)]) == 1
    assert "give --paper or --expected FILE, not both" in capsys.readouterr().err


def test_workflow_plans_check_paper_after_the_tables(tmp_path):
    rules = dry_run_jobs(tmp_path, "results/check/paper.txt")
    assert {"check_paper", "table1", "table2", "table3", "table8"} <= rules and "table4" not in rules


def test_check_saves_its_verdicts_beside_the_metrics_root(tmp_path, capsys):
    """Every run of check writes its table of verdicts with provenance to check/{expected file's stem}.json beside the
    metrics root (results/check/embedded.json after `make demo`), also when a cell FAILs."""
    runs = tmp_path / "results" / "metrics"
    files = [_metrics(runs, "agn", "npm", 60.0, ci95=[45.0, 75.0]), _metrics(runs, "nq", "npm@enwiki", 10.0, n=50)]
    expected = tmp_path / "bands.yaml"
    record(files, expected, header="test run")
    assert main(["check", "--expected", str(expected), "--metrics-root", str(runs)]) == 0
    out = capsys.readouterr().out
    saved_path = tmp_path / "results" / "check" / "bands.json"
    assert f"verdicts -> {saved_path}" in out
    assert out.strip().splitlines()[-1].startswith("2 OK, 0 FAIL, 0 not run of 2 cells")  # the summary stays last
    saved = json.loads(saved_path.read_text())
    assert saved["summary"] == "2 OK, 0 FAIL, 0 not run of 2 cells" and saved["expected_file"] == str(expected)
    assert saved["metrics_root"] == str(runs) and saved["provenance"]["git_commit"]
    assert [(c["cell"], c["state"], c["score"]) for c in saved["cells"]] == [("agn/npm", "OK", 60.0),
                                                                           ("nq/npm@enwiki", "OK", 10.0)]
    assert saved["cells"][0]["band"] == [42.1, 77.5] and saved["cells"][0]["expected"] == 60.0

    _metrics(runs, "agn", "npm", 25.0)  # a FAIL is saved too, and the file is replaced, not appended to
    out_file = tmp_path / "elsewhere.json"
    with pytest.raises(SystemExit):
        main(["check", "--expected", str(expected), "--metrics-root", str(runs), "--out", str(out_file)])
    assert json.loads(out_file.read_text())["cells"][0]["state"] == "FAIL"
    with pytest.raises(SystemExit):
        main(["check", "--expected", str(expected), "--metrics-root", str(runs)])
    saved = json.loads(saved_path.read_text())
    assert saved["summary"].startswith("1 OK, 1 FAIL") and saved["cells"][0]["problem"] is None
