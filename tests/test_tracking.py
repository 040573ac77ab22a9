"""Experiment tracking (npm.tracking, config `tracking`): offline wandb runs read back from their own transaction logs.

A run needs no key and no network; a tiny training through `npm-repro train` logs its loss, learning rate, throughput,
checkpoint steps and run id, and writes the same weights as without tracking; `npm-repro evaluate` logs each task's
score with its interval and a table of them. The suite runs with WANDB_MODE=disabled (tests/conftest.py); each test
here turns tracking on with WANDB_MODE unset (the default: offline).
"""

import json
import re

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from npm import tracking
from npm.cli import main
from tests.conftest import save_tiny_bert
from tests.test_training import write_shard


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """Tracking as a user without a key gets it: WANDB_MODE unset, no WANDB_API_KEY, and a server address that
    refuses connections (anything that tried to reach one would fail); runs go to tmp_path/results/wandb."""
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def runs(root):
    return sorted((root / "results" / "wandb").glob("offline-run-*"))


def test_a_run_without_a_key_is_offline_under_results_and_reads_back(offline):
    with tracking.start("pretrain", "npm", {"lr": 0.001}, tracking="wandb", group="config-abc") as run:
        run.update(run_id="f00d")
        run.log(1, loss=2.5, lr=0.001)
        run.log(1, checkpoint_step=1)  # the same step: one row
        run.log(2, loss=2.0, lr=0.0005)
    (folder,) = runs(offline)
    assert run.folder is None and folder.name.startswith("offline-run-")
    got = tracking.read_run(folder)
    assert (got["group"], got["job_type"], got["name"]) == ("config-abc", "pretrain", "npm")
    assert got["config"] == {"lr": 0.001, "run_id": "f00d"}
    assert [(r["_step"], r["loss"], r.get("checkpoint_step")) for r in got["history"]] == [(1, 2.5, 1), (2, 2.0, None)]


def test_tracking_none_and_wandb_mode_disabled_write_nothing(offline, monkeypatch):
    with tracking.start("evaluate", "npm", {}, tracking="none") as run:
        run.log(0, score=1.0)
        run.log_table("metrics", [{"task": "sst2"}])
        assert not run.on
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with tracking.start("evaluate", "npm", {}, tracking="wandb") as run:
        run.log(0, score=1.0)
        assert not run.on
    assert not (offline / "results").exists()
    with pytest.raises(ValueError, match="tracking must be one of"):
        tracking.start("evaluate", "npm", {}, tracking="mlflow")


def test_log_table_of_rows_or_a_dataframe_is_a_wandb_table(offline):
    rows = [{"task": "sst2", "score": 81.5, "ci95": [79.0, 84.0]}, {"task": "rte", "score": 55.0, "n": 277}]
    with tracking.start("report", "table1", {}, tracking="wandb") as run:
        run.log_table("table1", rows)
        run.log_table("frame", pd.DataFrame({"system": ["npm", "mlm"], "score": [81.5, 70.25]}))
    got = tracking.read_run(runs(offline)[0])
    assert got["tables"]["table1"] == {"columns": ["task", "score", "ci95", "n"],
                                       "data": [["sst2", 81.5, "[79.0, 84.0]", None], ["rte", 55.0, None, 277]]}
    assert got["tables"]["frame"] == {"columns": ["system", "score"], "data": [["npm", 81.5], ["mlm", 70.25]]}


def _train(root, name, encoder, shards, tracking_args):
    (blocks, masked), = shards
    assert main(["train", "--model", "npm", "--encoder", encoder, "--tokenizer", encoder, "--blocks", blocks,
                 "--masked", masked, "--out", str(root / name), "--checkpoint-dir", str(root / f"{name}-ckpt"),
                 "--steps", "4", "--warmup-steps", "1", "--lr", "1e-3", "--pool", "all", "--checkpoint-every", "2",
                 "--summary", str(root / f"{name}.json"), *tracking_args]) == 0
    return load_file(root / name / "model.safetensors")


def test_training_logs_its_curves_and_checkpoints_and_writes_the_same_weights(offline):
    encoder = save_tiny_bert(offline / "encoder")
    shards = write_shard(offline)
    tracked = _train(offline, "tracked", encoder, shards, ["--tracking", "wandb", "--tracking-group", "config-1"])
    plain = _train(offline, "plain", encoder, shards, ["--tracking", "none"])
    assert tracked.keys() == plain.keys() and all(torch.equal(tracked[k], plain[k]) for k in tracked)
    (folder,) = runs(offline)  # only the tracked training made a run
    got = tracking.read_run(folder)
    summary = json.loads((offline / "tracked.json").read_text())
    assert (got["group"], got["job_type"], got["name"]) == ("config-1", "pretrain", "npm")
    assert got["config"]["run_id"] == summary["run_id"] and got["config"]["steps"] == 4
    assert got["config"]["model"] == "npm" and got["config"]["lr"] == 1e-3
    steps = {r["_step"]: r for r in got["history"]}
    assert sorted(steps) == [1, 2, 3, 4]
    for row in steps.values():
        assert {"loss", "lr", "tokens_per_s", "loss_start", "loss_end", "queries"} <= row.keys()
        assert row["tokens_per_s"] > 0
    assert [s for s, r in steps.items() if "checkpoint_step" in r] == [2, 4]
    assert steps[4]["lr"] == 0.0 and steps[1]["lr"] > steps[3]["lr"]  # linear decay to 0 at the last step


def test_evaluation_logs_each_tasks_score_and_interval(offline):
    from npm.data.blocks import build_blocks
    from npm.datastore.embed import embed_corpus
    from npm.datastore.faiss_index import build_faiss_index
    from npm.datastore.store import load_datastore
    from npm.io import write_jsonl
    from tests.conftest import WORDPIECE, lee_corpus_lines

    model = save_tiny_bert(offline / "model")
    write_jsonl(offline / "docs.jsonl", [{"id": str(i), "units": [t]} for i, t in enumerate(lee_corpus_lines()[:4])])
    build_blocks(offline / "docs.jsonl", offline / "blocks.npz", WORDPIECE, max_seq_length=64)
    embed_corpus(model, [offline / "blocks.npz"], offline / "ds", batch_blocks=8, progress=False)
    ds = load_datastore(offline / "ds")
    build_faiss_index(ds.vector_shards(), ds.hidden_size, offline / "flat.faiss", factory="Flat", datastore=ds)
    tasks = offline / "tasks"
    (tasks / "sst2").mkdir(parents=True)
    (tasks / "sst2" / "test.tsv").write_text("__label__5\ta great city\n__label__1\tthe plot is dull\n"
                                             "__label__4\ta fine film\n__label__2\tan awful waste of time\n")
    (tasks / "mr").mkdir()
    (tasks / "mr" / "test.csv").write_text("1,a moving film\n0,a tedious mess\n1,warm and funny\n")
    (tasks / "fuzzy_verbalizers").mkdir()
    (tasks / "fuzzy_verbalizers" / "sst2.txt").write_text("the, of, is\nand, in, to\n")
    assert main(["evaluate", "--task", "sst2", "mr", "--system", "npm_single", "--checkpoint", model,
                 "--datastore", str(offline / "ds"), "--faiss", str(offline / "flat.faiss"), "--tasks-root", str(tasks),
                 "--k", "30", "--metrics", "sst2.json", "mr.json", "--predictions", "sst2.jsonl", "mr.jsonl",
                 "--tracking", "wandb", "--tracking-group", "config-1"]) == 0
    got = tracking.read_run(runs(offline)[0])
    assert (got["group"], got["job_type"], got["name"]) == ("config-1", "evaluate", "npm_single@ds")
    (row,) = got["history"]
    for task in ("sst2", "mr"):
        metrics = json.loads((offline / f"{task}.json").read_text())
        assert row[f"{task}/score"] == pytest.approx(metrics["score"])
        assert [row[f"{task}/ci95_low"], row[f"{task}/ci95_high"]] == pytest.approx(metrics["ci95"])
        assert row[f"{task}/n"] == metrics["n"]
    table = got["tables"]["metrics"]
    assert [r[table["columns"].index("task")] for r in table["data"]] == ["sst2", "mr"]
    assert got["config"]["task"] == ["sst2", "mr"] and got["config"]["system"] == "npm_single"


def test_densephrases_and_replug_lsr_trainings_log_their_curves_and_checkpoints(offline):
    from npm.data.blocks import build_blocks
    from npm.densephrases.rc import write_squad
    from npm.densephrases.train import PhraseTrainConfig, TeacherConfig, train_densephrases, train_teacher
    from npm.io import write_jsonl
    from npm.replug.lsr import LsrConfig, train_lsr
    from tests.conftest import WORDPIECE
    from tests.test_baselines import save_tiny_llama
    from tests.test_densephrases_train import _examples
    from tests.test_replug_lm_eval import DOCS, TEXT

    encoder = save_tiny_bert(offline / "encoder")
    write_squad(offline / "train.json", _examples(), "test")
    lengths = dict(max_passage_tokens=64, max_question_tokens=24)
    with tracking.start("densephrases_teacher", "teacher", {}, tracking="wandb") as run:
        train_teacher(TeacherConfig(encoder=encoder, train=str(offline / "train.json"), out_dir=str(offline / "t"),
                                    checkpoint_dir=str(offline / "ck_t"), epochs=2, batch_size=4, **lengths),
                      progress=False, run=run)
    with tracking.start("densephrases_train", "in_batch", {}, tracking="wandb") as run:
        train_densephrases(PhraseTrainConfig(encoder=encoder, train=str(offline / "train.json"),
                                             out_dir=str(offline / "m"), checkpoint_dir=str(offline / "ck_m"),
                                             negatives="in_batch", epochs=1, pre_batch_epochs=0, batch_size=4,
                                             **lengths), progress=False, run=run)
    write_jsonl(offline / "docs.jsonl", [{"id": f"d{i // 2}", "units": [t]} for i, t in enumerate(DOCS)])
    build_blocks(offline / "docs.jsonl", offline / "blocks.npz", WORDPIECE, max_seq_length=64)
    write_jsonl(offline / "queries.jsonl", [{"id": "q0", "text": TEXT, "source_doc": "d0"}])
    with tracking.start("replug_lsr", "replug_lsr", {}, tracking="wandb") as run:
        train_lsr(LsrConfig(encoder=encoder, lm=save_tiny_llama(offline / "lm"), blocks=[str(offline / "blocks.npz")],
                            queries=str(offline / "queries.jsonl"), out_dir=str(offline / "lsr"),
                            checkpoint_dir=str(offline / "ck_lsr"), steps=2, batch_size=1, k=3, x_len=8, y_len=6,
                            doc_len=8, refresh_every=2, checkpoint_every=1), progress=False, run=run)
    got = {r["job_type"]: r for r in map(tracking.read_run, runs(offline))}
    assert sorted(got) == ["densephrases_teacher", "densephrases_train", "replug_lsr"]
    for kind, throughput, checkpoints in [("densephrases_teacher", "examples_per_s", [2, 4]),
                                          ("densephrases_train", "examples_per_s", [2]),
                                          ("replug_lsr", "queries_per_s", [1, 2])]:
        history = got[kind]["history"]
        assert len(got[kind]["config"]["run_id"]) == 64, kind
        assert all({"loss", "lr", throughput} <= row.keys() for row in history), kind
        assert [row["_step"] for row in history if "checkpoint_step" in row] == checkpoints, kind


def test_a_report_logs_its_table_as_a_wandb_table(offline):
    """The report rules' tables (npm-repro report tableN --tracking wandb): the same cells as the CSV."""
    from tests.test_report import write_metrics

    files = [str(write_metrics(offline, task, system, score))
             for task in ("sst2", "rte") for system, score in (("npm", 80.0), ("mlm", 60.5))]
    out = offline / "results" / "tables" / "table1.csv"
    assert main(["report", "table1", "--metrics", *files, "--out", str(out), "--tracking", "wandb",
                 "--tracking-group", "config-abc"]) == 0
    got = tracking.read_run(runs(offline)[0])
    assert (got["job_type"], got["name"], got["group"]) == ("report", "table1", "config-abc")
    csv = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert got["tables"]["table1"]["columns"] == list(csv.columns)
    assert got["tables"]["table1"]["data"] == csv.values.tolist()


# ------------------------------------------------------------------------------------------ faults (issue 41)

def one_warning(caplog) -> str:
    """The one warning tracking logged (asserted: exactly one, on one line)."""
    lines = [r.getMessage() for r in caplog.records if r.name == "npm-repro.tracking" and r.levelname == "WARNING"]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    return lines[0]


def logged_offline(root, caplog):
    """Start a run, log one row and finish it; the run is an offline run under results/wandb that reads back."""
    with caplog.at_level("INFO"), tracking.start("pretrain", "npm", {"lr": 0.001}, tracking="wandb") as run:
        run.log(1, loss=2.5)
    (folder,) = runs(root)
    assert [r["loss"] for r in tracking.read_run(folder)["history"]] == [2.5]
    return folder


@pytest.mark.parametrize("key", [True, False], ids=["unreachable-server", "no-key"])
def test_an_online_run_that_cannot_start_falls_back_to_offline_with_one_warning(offline, monkeypatch, caplog, key):
    """Fault: WANDB_MODE=online with the server unreachable (a closed port on 127.0.0.1) waited wandb's 90 s init
    timeout and then killed the job with a CommError traceback; without an API key, a UsageError traceback. Expected:
    one warning line saying why and where the offline run goes and how to upload it (`wandb sync`); the run is
    logged offline and the job goes on. WANDB_INIT_TIMEOUT (wandb's own variable) shortens the wait here."""
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("HOME", str(offline))  # no ~/.netrc key of this machine
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(offline / "wandb-config"))
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "5")
    if key:
        monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    folder = logged_offline(offline, caplog)
    warning = one_warning(caplog)
    assert warning.startswith("wandb: no online run (") and ("127.0.0.1:9" in warning if key else "API key" in warning)
    assert f"wandb sync {offline / 'results' / 'wandb'}/offline-run-*" in warning and folder.name.startswith("offline")


JOB = """
import logging
logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
from npm import tracking
with tracking.start("pretrain", "npm", {"lr": 0.001}, tracking="wandb") as run:
    for step in range(1, 4):
        run.log(step, loss=2.5, note="x" * 1_000_000)  # 3 MB of history: more than the file system holds
print("the job went on")
"""


@pytest.mark.parametrize("kib,fill,pattern", [
    (64, True, r"wandb: this job is not tracked: no space left in {results} \(0 bytes free; a run needs "),
    (1600, False, r"wandb: the run file {results}/wandb/offline-run-[^ ]+/run-\w+\.wandb is incomplete \([\d,]+ "
                  r"bytes; .*\): no space left on its file system")], ids=["full-before", "fills-during-the-run"])
def test_a_full_disk_under_the_run_folder_is_one_warning_and_the_job_goes_on(offline, kib, fill, pattern):
    """Fault: results/wandb on a full disk: the job exited 0 leaving a 0-byte run-*.wandb file that cannot be read
    back (or synced), and said nothing (with a logging traceback per line of wandb's debug.log). Expected: the job
    goes on (exit 0) and one warning line says that it is not tracked (no space at the start) or that its run file is
    incomplete (the disk filled up during the run). A real full file system: a tmpfs, filled up before the job or
    too small for what it logs (skipped where unshare/mount is not permitted)."""
    import os
    import sys

    from tests.test_faults import _in_small_filesystem

    results = offline / "results"
    job = (f"dd if=/dev/zero of={results}/filler bs=1k 2>/dev/null; " if fill else "") + 'exec "$@"'
    out = _in_small_filesystem(kib, results, ["sh", "-c", job, "sh", sys.executable, "-c", JOB], env=dict(os.environ))
    assert out.returncode == 0 and "the job went on" in out.stdout, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "Logging error" not in out.stderr, out.stderr[-3000:]
    warnings = [line for line in out.stderr.splitlines() if line.startswith("WARNING npm-repro.tracking:")]
    assert len(warnings) == 1, out.stderr[-3000:]
    assert re.search(pattern.format(results=re.escape(str(results))), warnings[0]), warnings[0]
