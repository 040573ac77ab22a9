"""A workflow job's progress reaches Snakemake's terminal (npm.progress): the rules redirect the job's output to
their log, and the job's shell keeps Snakemake's stderr as descriptor 3 (common.smk's shell prefix) for its lines."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from npm import progress
from tests.conftest import save_tiny_bert
from tests.test_training import write_shard

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"progress train npm: (\d+)/4 step \(\d+%\), [0-9.e+-]+ step/s, (ETA \d\d:\d\d|done in \d\d:\d\d)")


def test_a_training_job_prints_progress_lines_to_the_terminal_and_its_bars_to_its_log(tmp_path):
    """Before: the rule's `> {log} 2>&1` sent everything to the log, and the terminal showed nothing for the whole
    pretraining. Now: the terminal gets `progress train npm: 1/4 step (25%), ... step/s, ETA ...` lines and the
    log the full bar."""
    encoder = save_tiny_bert(tmp_path / "encoder")
    (blocks, masked), = write_shard(tmp_path)
    log = tmp_path / "logs" / "pretrain" / "npm.log"
    log.parent.mkdir(parents=True)
    train = ["train", "--model", "npm", "--encoder", encoder, "--tokenizer", encoder,
             "--blocks", blocks, "--masked", masked, "--out", str(tmp_path / "model"), "--checkpoint-dir",
             str(tmp_path / "ckpt"), "--steps", "4", "--warmup-steps", "1", "--pool", "all", "--tracking", "none"]
    # a line at every step rather than every 30 s, so that 4 steps show them
    job = [sys.executable, "-c", "import sys; from npm import cli, progress; progress.SUMMARY_EVERY_S = 0;"
           " sys.exit(cli.main(sys.argv[1:]))", *train]
    # the pretrain rule's shell: common.smk's prefix, then `... > {log} 2>&1`, with the variable common.smk sets
    shell = f"set -euo pipefail; {progress.SHELL_PREFIX}{shlex.join(job)} > {shlex.quote(str(log))} 2>&1"
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True,
                          env={**os.environ, progress.FD_ENV: str(progress.TERMINAL_FD)})
    assert done.returncode == 0, log.read_text()
    lines = done.stderr.splitlines()
    assert lines and all(LINE.fullmatch(line) for line in lines), done.stderr
    assert lines[0].startswith("progress train npm: 1/4 step (25%)") and "ETA" in lines[0]
    assert lines[-1].startswith("progress train npm: 4/4 step (100%)") and "done in" in lines[-1]
    assert done.stdout == ""
    text = log.read_text()
    assert "train npm: 100%|" in text and "4/4" in text  # tqdm's bar, drawn though the log is not a terminal
    assert "progress train npm" not in text


def test_without_the_workflow_s_descriptor_a_job_prints_no_progress_lines(tmp_path):
    """`npm-repro` run by hand (no variable), or a variable naming a descriptor that is not open: no lines, no
    error."""
    for env in ({}, {progress.FD_ENV: "7"}):
        done = subprocess.run([sys.executable, "-c", "from npm import progress; progress.claim_terminal();"
                               "import sys; [None for _ in progress.bar(range(3), desc='x')];"
                               "print(progress._terminal)"], capture_output=True, text=True,
                              env={**os.environ, **env})
        assert done.returncode == 0 and done.stdout == "None\n", done.stderr


def test_the_workflow_opens_the_terminal_descriptor_in_every_job_s_shell(tmp_path):
    """Snakemake's own parse of the Snakefile: every job's shell starts with bash's strict mode and the prefix that
    keeps Snakemake's stderr as descriptor 3, and the jobs inherit the variable naming it."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings, StorageSettings
    from snakemake.shell import shell

    cwd, environ, prefix = os.getcwd(), dict(os.environ), shell._process_prefix
    try:
        with SnakemakeApi(OutputSettings(quiet=None)) as api:
            workflow = api.workflow(resource_settings=ResourceSettings(cores=1), config_settings=ConfigSettings(),
                                    storage_settings=StorageSettings(), snakefile=ROOT / "Snakefile",
                                    workdir=tmp_path)._workflow  # parse only
            assert "pretrain" in {rule.name for rule in workflow.rules}
            assert shell._process_prefix == "set -euo pipefail; " + progress.SHELL_PREFIX
            assert os.environ[progress.FD_ENV] == str(progress.TERMINAL_FD)
    finally:
        shell._process_prefix = prefix
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)


def test_the_readme_shows_the_line_a_job_prints():
    """The README's demo section shows a progress line in the format :func:`npm.progress.summary_line` writes."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shown = re.search(r"^(progress train npm: .*)$", readme, flags=re.M).group(1)
    numbers = re.match(r"progress train npm: (\d+)/(\d+) step \(\d+%\), ([0-9.]+) step/s", shown).groups()
    n, total, rate = map(float, numbers)
    line = progress.summary_line({"n": n, "total": total, "unit": "step", "elapsed": n / rate, "rate": rate,
                                  "prefix": "train npm", "unit_scale": False, "unit_divisor": 1000, "initial": 0})
    assert line == shown
