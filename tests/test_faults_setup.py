"""Issue 41, faults of the set-up a job starts from: the command line and config of the workflow, a `pypi:` source
path, the web page's config, a released corpus's arrays, a full disk under a checkpoint. Each is one line naming the
file and the cause, before any work (the other fault lists: tests/test_faults*.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workflow_api import ROOT

BIN = Path(sys.executable).parent


# ------------------------------------------------------------------------------------------- snakemake's command line

def snakemake(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """A dry run of this checkout's workflow in ``cwd`` (Snakemake finds profiles/default beside the Snakefile)."""
    return subprocess.run([str(BIN / "snakemake"), "-n", "-s", str(ROOT / "Snakefile"), *args], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "WANDB_MODE": "disabled"})


def one_error(out: subprocess.CompletedProcess) -> str:
    """The run's only error line (asserting exit 1, no traceback)."""
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stdout + out.stderr and "WorkflowError" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, out.stderr[-3000:]
    return errors[0]


@pytest.mark.parametrize("target,content", [("results/tables/table1.csv", "system,score\nnpm,81.2\n"),
                                            ("results/check/paper.txt", "all 12 cells within tolerance\n"),
                                            ("results/empty.txt", "")])
def test_an_existing_target_after_configfile_is_one_line(tmp_path, target, content):
    """Fault: `snakemake -n --configfile config/config.yaml results/tables/table1.csv` in a finished run: the target
    exists, so Snakemake read it as a second config file and said only "Config file must be given as JSON or YAML
    with keys at top level". Expected: one line naming the word read as a config file and the order that works."""
    (tmp_path / target).parent.mkdir(parents=True)
    (tmp_path / target).write_text(content, encoding="utf-8")
    line = one_error(snakemake(tmp_path, "--configfile", str(ROOT / "config/config.yaml"), target))
    assert line.startswith(f"npm-repro: error: snakemake read {target} as a config file"), line
    assert "is not one" in line and "snakemake [options] TARGET... --configfile FILE" in line


def test_a_config_file_that_is_no_mapping_is_one_line_naming_it(tmp_path):
    """A *.yaml after --configfile that is no YAML mapping (a list): one line naming it, not Snakemake's "Config file
    must be given as JSON or YAML with keys at top level" nor advice about targets."""
    (tmp_path / "list.yaml").write_text("- sources\n- models\n", encoding="utf-8")
    line = one_error(snakemake(tmp_path, "--configfile", "list.yaml"))
    assert line == ("npm-repro: error: config file list.yaml (--configfile) holds no YAML keys at its top level; a "
                    "config file maps keys (sources:, models:, ...) to values"), line


def test_a_missing_config_file_is_one_line_naming_it(tmp_path):
    """Fault: `snakemake -n --configfile config/paprer.yaml` (a typo). Expected: one line saying that config file does
    not exist (not advice about targets, not a FileNotFoundError traceback)."""
    line = one_error(snakemake(tmp_path, "--configfile", "config/paprer.yaml"))
    assert line == ("npm-repro: error: config file config/paprer.yaml (--configfile) does not exist; check its "
                    "path"), line


# ------------------------------------------------------------------------------------------- a `pypi:` source path

@pytest.mark.parametrize("path,cause", [
    ("pypi:gensim/test/test_data/no_such_file.bz2", "does not exist inside the installed package 'gensim'"),
    ("pypi:no_such_package_41/data.bz2", "the PyPI package 'no_such_package_41' is not installed")])
def test_a_pypi_source_path_that_does_not_exist_is_a_config_error_at_start_up(tmp_path, path, cause):
    """Fault: a typo in a `pypi:` source path (`sources.X.path: pypi:gensim/test/test_data/no_such_file.bz2`) of a
    source no target reads planned nothing and exited 0 (one a target reads failed in a job's input function).
    Expected: a config error before the DAG is built, naming the key, the package and the path."""
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(f"sources:\n  typo:\n    format: mediawiki\n    path: {path}\n", encoding="utf-8")
    out = snakemake(tmp_path, "--cores", "1", "--configfile", str(ROOT / "config/config.yaml"), str(overlay))
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    text = out.stdout + out.stderr
    assert f"config error: sources.typo.path: {path!r}: " in text and cause in text, text[-2000:]
    assert "Building DAG of jobs" not in text


def test_a_pypi_source_path_that_does_not_exist_is_one_line_from_the_cli(tmp_path, capsys):
    """The same typo given to the job's command (`npm-repro extract-documents --source pypi:...`): one line naming
    the package and the path inside it, before anything is written."""
    from npm.cli import main

    path = "pypi:gensim/test/test_data/no_such_file.bz2"
    assert main(["extract-documents", "--format", "mediawiki", "--source", path,
                 "--out", str(tmp_path / "docs.jsonl.gz")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"npm-repro extract-documents: error: {path!r}: ") and "installed package 'gensim'" in err
    assert len(err.splitlines()) == 1 and not list(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------- the web page's config

def test_a_yaml_error_in_the_served_config_names_file_line_and_column(tmp_path, capsys):
    """Fault: `npm-repro serve` with a YAML syntax error in config/config.yaml ended in a yaml ParserError traceback
    naming "<unicode string>". Expected: one line FILE:LINE:COL (npm.io.read_yaml, as the workflow reports it)."""
    from npm.cli import main

    config = tmp_path / "config.yaml"
    lines = (ROOT / "config" / "config.yaml").read_text(encoding="utf-8").splitlines()
    lines.insert(4, " : : [")
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["serve", "--config", str(config), "--port", "0"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"npm-repro serve: error: {config}:5:2: not valid YAML ("), err
    assert len(err.splitlines()) == 1
    from npm import Predictor

    with pytest.raises(ValueError, match=rf"^{re.escape(str(config))}:5:2: not valid YAML \("):
        Predictor.from_config("npm", "enwiki", config=config)  # the web page's NPM columns load through it


# ------------------------------------------------------------------------------------------- a released corpus

@pytest.mark.parametrize("bad", ["0.npy", "0_blocks.npy", "0.npy cut"])
def test_a_released_array_that_cannot_be_read_is_one_line_naming_it(tmp_path, capsys, bad):
    """Fault: an object array as X.npy of a released corpus (a pickled array, which np.load refuses) ended with
    "Array can't be memory-mapped: Python objects in dtype." and no file named; the same for X_blocks.npy ("Object
    arrays cannot be loaded when allow_pickle=False") and an .npy cut short. Expected: one line naming the file and
    the cause, before the tokenizer is loaded (no work done, nothing written)."""
    import numpy as np

    from npm.cli import main

    shard = tmp_path / "corpus" / "enwiki"
    shard.mkdir(parents=True)
    np.save(shard / "0.npy", np.arange(10, dtype=np.int32))
    np.save(shard / "0_blocks.npy", np.array([0, 5], dtype=np.int64))
    name = bad.split()[0]
    if bad.endswith("cut"):
        data = (shard / name).read_bytes()
        (shard / name).write_bytes(data[: len(data) - 7])
    else:
        np.save(shard / name, np.array([[1, 2], "three"], dtype=object), allow_pickle=True)
    out = tmp_path / "blocks" / "shard0.npz"
    assert main(["import-corpus", "--folder", str(tmp_path), "--stem", "enwiki/0", "--tokenizer", "no/such-tokenizer",
                 "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"npm-repro import-corpus: error: {shard / name}: "), err
    assert ("cut short" if bad.endswith("cut") else "Python objects") in err
    assert not out.parent.exists()
