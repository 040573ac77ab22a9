"""npm-repro check: expected-number bands per evaluation cell, OK / FAIL (docs/expected-numbers.md)."""

import json

import pytest

from npm.cli import main
from npm.report.check import EXPECTED_DIR, band, check, load_expected, record


def _metrics(root, task, run, score, n=40, ci95=None):
    path = root / task / f"{run}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"task": task, "system": run.split("@")[0], "score": score, "n": n,
                                "ci95": ci95 if ci95 is not None else [score - 10, score + 10]}))
    return path


def test_record_then_check_ok_fail_and_missing(tmp_path, capsys):
    """A recorded run passes its own bands; a score outside a band or a missing file FAILs, with exit status 1."""
    runs = tmp_path / "metrics"
    files = [_metrics(runs, "agn", "npm", 60.0, ci95=[45.0, 75.0]), _metrics(runs, "nq", "npm@enwiki", 10.0, n=50)]
    expected = tmp_path / "expected.yaml"
    cells = record(files, expected, header="test run\nsecond line")
    assert cells["agn/npm"] == {"expected": 60.0, "band": [42.5, 77.5], "n": 40}  # one example (2.5) each side
    assert expected.read_text().startswith("# test run\n# second line\ncells:")
    assert all(v.ok for v in check(load_expected(expected), runs))
    assert main(["check", "--expected", str(expected), "--metrics-root", str(runs)]) == 0
    assert "2 OK, 0 FAIL" in capsys.readouterr().out

    _metrics(runs, "agn", "npm", 25.0)  # a broken NPM at chance
    (runs / "nq" / "npm@enwiki.json").unlink()
    with pytest.raises(SystemExit) as failed:
        main(["check", "--expected", str(expected), "--metrics-root", str(runs)])
    assert failed.value.code == 1
    out = capsys.readouterr().out
    assert "FAIL agn/npm" in out and "FAIL nq/npm@enwiki" in out and "no metrics file" in out
    assert "0 OK, 2 FAIL of 2 cells" in out


def test_band_needs_the_interval_and_stays_in_percent():
    assert band({"task": "x", "system": "y", "n": 10, "ci95": [0.0, 100.0]}) == [0.0, 100.0]
    with pytest.raises(ValueError, match="lack `ci95`"):
        band({"task": "x", "system": "y", "n": 10, "score": 1.0})


def test_bad_expected_files_are_clear_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cells:\n  agn/npm: {expected: 60, band: [70, 50]}\n")
    with pytest.raises(ValueError, match="LOW <= HIGH"):
        load_expected(bad)
    bad.write_text("cells: {}\n")
    with pytest.raises(ValueError, match="non-empty"):
        load_expected(bad)
    with pytest.raises(FileNotFoundError, match=str(EXPECTED_DIR)):
        load_expected(tmp_path / "none.yaml")


def test_the_packaged_embedded_bands_are_valid():
    cells = load_expected(EXPECTED_DIR / "embedded.yaml")
    assert "agn/npm" in cells and all(c["band"][0] <= c["expected"] <= c["band"][1] for c in cells.values())


def test_negative_control_mode_fails_only_when_everything_passes(tmp_path, capsys):
    runs = tmp_path / "metrics"
    files = [_metrics(runs, "agn", "npm", 60.0, ci95=[45.0, 75.0]), _metrics(runs, "agn", "lm", 90.0)]
    expected = tmp_path / "expected.yaml"
    record(files, expected, header="x")
    argv = ["check", "--expected", str(expected), "--metrics-root", str(runs), "--runs", "npm", "--expect-fail"]
    with pytest.raises(SystemExit) as passed:  # the control scored like the real run: the check cannot tell
        main(argv)
    assert passed.value.code == 1 and "1 OK, 0 FAIL of 1 cells" in capsys.readouterr().out
    _metrics(runs, "agn", "npm", 25.0)
    assert main(argv) == 0 and "FAIL, as they must" in capsys.readouterr().out
    (runs / "agn" / "npm.json").unlink()  # a control that did not run proves nothing
    with pytest.raises(SystemExit):
        main(argv)
    assert "have no score (agn/npm)" in capsys.readouterr().out
