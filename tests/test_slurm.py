"""Cluster execution: the profiles plan what they should, and the slurm executor really runs the workflow.

* The paper-scale profile ``profiles/slurm`` is found by NAME from the repository root (``--profile slurm``,
  through the top-level ``slurm`` symlink), selects config/paper.yaml only, and gives GPU rules GPUs, partitions,
  account and QoS from the NPM_SLURM_* environment variables (dry runs; no SLURM needed).
* ``profiles/local`` plans the embedded default on one workstation.
* Live (``@pytest.mark.slurm``): a private single-node SLURM (munged, slurmctld, slurmd; tests/slurm/cluster.py)
  runs the embedded default's data stages of two corpora through snakemake-executor-plugin-slurm, with the test
  variant of the profile (tests/slurm/profile). Skipped, with the reason, where SLURM cannot be started (not root,
  packages missing: ``apt-get install slurm-wlm munge``); NPM_REQUIRE_SLURM=1 turns that skip into a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.slurm.cluster import LocalSlurm, SlurmUnavailable
from tests.workflow_api import ROOT

BIN = Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")
TEST_PROFILE = ROOT / "tests" / "slurm" / "profile"
GPU_RULES = {"pretrain", "embed_shard", "build_faiss_index", "evaluate"}
SITE = {
    "NPM_SLURM_PARTITION": "cpu_part",
    "NPM_SLURM_GPU_PARTITION": "gpu_part",
    "NPM_SLURM_GPU_MODEL": "a100",
    "NPM_SLURM_ACCOUNT": "proj42",
    "NPM_SLURM_QOS": "normal",
}


def planned_resources(dry_run_stdout: str) -> dict[str, list[dict[str, str]]]:
    """rule -> the `resources:` of each planned job, from the output of `snakemake -n`."""
    jobs: dict[str, list[dict[str, str]]] = {}
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", dry_run_stdout):
        head = re.match(r"(?:local)?rule (\w+):", block)
        res = re.search(r"^\s+resources: (.*)$", block, re.M)
        if head and res:
            jobs.setdefault(head.group(1), []).append(dict(kv.split("=", 1) for kv in res.group(1).split(", ")))
    return jobs


def render_profile(path: Path, env: dict[str, str]) -> dict:
    """The profile as Snakemake's profile parser turns it into command-line settings, under ``env``, with a stub
    `conda` first on PATH (profiles/slurm stops when conda envs are asked for and no `conda` is there:
    tests/test_faults_clear.py)."""
    import tempfile

    from snakemake.profiles import ProfileConfigFileParser

    saved = dict(os.environ)
    with tempfile.TemporaryDirectory() as stub:
        (Path(stub) / "conda").write_text("#!/bin/sh\nexit 1\n")
        (Path(stub) / "conda").chmod(0o755)
        os.environ.clear()
        os.environ.update(env)
        os.environ["PATH"] = os.pathsep.join([stub, env.get("PATH", "")])
        try:
            with open(path) as stream:
                return dict(ProfileConfigFileParser().parse(stream))
        finally:
            os.environ.clear()
            os.environ.update(saved)


# -- profiles/slurm, dry -----------------------------------------------------------------------------------------
def test_slurm_profile_reads_site_settings_from_the_environment():
    bare = {k: v for k, v in os.environ.items() if not k.startswith("NPM_SLURM_")}
    plain = render_profile(ROOT / "profiles" / "slurm" / "config.yaml", bare)
    assert plain["executor"] == "slurm" and plain["configfile"] == "config/paper.yaml"
    assert not any(s.startswith(("slurm_partition", "slurm_account", "qos"))
                   for s in plain["default-resources"] + plain["set-resources"])
    assert not any("gpu_model" in s for s in plain["set-resources"])

    site = render_profile(ROOT / "profiles" / "slurm" / "config.yaml", {**bare, **SITE, "NPM_SLURM_JOBS": "7"})
    assert site["jobs"] == "7"
    assert {"slurm_partition=cpu_part", "slurm_account=proj42", "qos=normal"} <= set(site["default-resources"])
    for rule in GPU_RULES:
        assert {f"{rule}:slurm_partition=gpu_part", f"{rule}:gpu_model=a100"} <= set(site["set-resources"]), rule
    # A rule that passes --threads {threads} (npm.threads) gets as many threads as SLURM CPUs (inside a job the
    # jobstep executor runs with --cores all, so {threads} is the set-threads value).
    threads = dict(s.split("=") for s in plain["set-threads"])
    assert threads == {"evaluate": "8", "replug_eval_lm": "8", "replug_train_lsr": "8"}
    assert any(s.startswith("evaluate:") and "cpus_per_task=8" in s for s in plain["set-resources"]) or \
        "evaluate:cpus_per_task=8" in plain["set-resources"]
    # The GPU partition falls back to the CPU one.
    one = render_profile(ROOT / "profiles" / "slurm" / "config.yaml", {**bare, "NPM_SLURM_PARTITION": "all"})
    assert "pretrain:slurm_partition=all" in one["set-resources"]
    # The per-shard jobs go as job arrays; a partition file, when named, picks each job's partition.
    assert set(plain["slurm-array-jobs"].split(",")) == {"embed_shard", "densephrases_dump", "tokenize_blocks"}
    assert "slurm-partition-config" not in plain
    limits = render_profile(ROOT / "profiles" / "slurm" / "config.yaml",
                            {**bare, "NPM_SLURM_PARTITION_CONFIG": "/etc/partitions.yaml"})
    assert limits["slurm-partition-config"] == "/etc/partitions.yaml"


def test_slurm_profile_by_name_plans_the_paper_dag_with_gpus(tmp_path):
    link = ROOT / "slurm"
    assert link.is_dir() and link.resolve() == (ROOT / "profiles" / "slurm").resolve(), (
        "`snakemake --profile slurm` needs the top-level symlink slurm -> profiles/slurm")
    env = {**os.environ, **SITE, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    # The profile's conda envs need `conda` even for -n (Snakemake asks `conda info`); without it, the venv.
    env["NPM_SLURM_SOFTWARE"] = "conda" if shutil.which("conda", path=env["PATH"]) else "venv"
    out = subprocess.run([SNAKEMAKE, "--profile", "slurm", "-n", "results/tables/table1.csv",
                          "--directory", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert re.search(r"Using profiles? slurm ", out.stdout + out.stderr)  # (and the workflow profile profiles/default)
    # The profile's configfile replaces the embedded default (no deep merge of the two).
    assert f"Config file(s): [PosixPath('{ROOT / 'config' / 'paper.yaml'}')]" in out.stdout
    jobs = planned_resources(out.stdout)
    assert "download_source" in jobs and "prepare_embedded_wikipedia" not in jobs
    # CC-News is extracted from the CC-NEWS WARCs by hand (no URL): planned as a job that fails with instructions.
    assert "manual_source" in jobs
    assert GPU_RULES <= set(jobs)
    for rule, planned in jobs.items():
        for res in planned:
            assert res["slurm_account"] == "proj42" and res["qos"] == "normal", rule
            if rule in GPU_RULES:
                assert int(res["gpu"]) >= 1 and res["gpu_model"] == "a100", rule
                assert res["slurm_partition"] == "gpu_part", rule
            else:
                assert "gpu" not in res and "gpu_model" not in res, rule
                assert res["slurm_partition"] == "cpu_part", rule
            assert int(res["runtime"]) > 0 and int(res["mem_mb"]) > 0, rule
    assert {res["gpu"] for res in jobs["pretrain"]} == {"8"}  # training.gpus_per_node of config/paper.yaml


def test_local_profile_plans_the_embedded_default(tmp_path):
    out = subprocess.run([SNAKEMAKE, "--profile", str(ROOT / "profiles" / "local"), "-n", "results/tables/table1.csv",
                          "--directory", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    jobs = planned_resources(out.stdout)
    assert "prepare_embedded_wikipedia" in jobs and "pretrain" in jobs
    assert all("slurm_partition" not in res for planned in jobs.values() for res in planned)


# -- live SLURM ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slurm_cluster():
    cluster = LocalSlurm()
    try:
        cluster.start()
    except SlurmUnavailable as exc:
        shutil.rmtree(cluster.root, ignore_errors=True)
        if os.environ.get("NPM_REQUIRE_SLURM") == "1":
            pytest.fail(f"NPM_REQUIRE_SLURM=1 but no live SLURM: {exc}")
        pytest.skip(f"no live SLURM here: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.mark.slurm
def test_data_stages_run_as_slurm_jobs(slurm_cluster, tmp_path):
    targets = ["data/masked/cc_news/shard0.span.npz", "data/masked/enwiki_excerpt/shard0.span.npz"]
    env = slurm_cluster.env
    # Jobs inherit this environment (sbatch --export=ALL): `npm-repro` and `snakemake` must be on its PATH.
    env["PATH"] = os.pathsep.join([str(BIN), env["PATH"]])
    cmd = [SNAKEMAKE, "--profile", str(TEST_PROFILE), "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
           "--configfile", str(ROOT / "config" / "config.yaml"), str(ROOT / "tests" / "slurm" / "embedded_small.yaml"),
           "--", *targets]
    try:
        out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=480)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"snakemake did not finish in {exc.timeout}s\n{slurm_cluster.jobs()}\n{slurm_cluster.log_tail()}")
    log = out.stdout + out.stderr
    assert out.returncode == 0, f"{log[-6000:]}\n{slurm_cluster.jobs()}\n{slurm_cluster.log_tail()}"

    # The outputs are there and sound.
    for target in targets:
        masked = tmp_path / target
        summary = json.loads((tmp_path / target.replace(".npz", ".summary.json")).read_text())
        with np.load(masked) as z:
            assert summary["batches_kept"] == len(z["batches"]) > 0
            assert z["batches"].shape[1] == 8  # data.batch_size of the embedded default

    # Every job went through SLURM: submitted by sbatch under this run's ID, COMPLETED in slurmctld's job table
    # (squeue: there is no accounting database), its batch log written where the plugin keeps them.
    run_id = re.search(r"SLURM run ID: (\S+)", log).group(1)
    submitted = dict(re.findall(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: (.+?)\)\.", log))
    jobs = {job["id"]: job for job in slurm_cluster.jobs() if job["name"] == run_id}
    assert set(jobs) == set(submitted) and jobs, (submitted, slurm_cluster.jobs())
    rules = {job["comment"].removeprefix("rule_").split("_wildcards_")[0] for job in jobs.values()}
    assert rules == {"prepare_embedded_ccnews", "extract_documents", "shard_documents", "tokenize_blocks",
                     "batch_blocks", "mask_batches"}
    n_planned = int(re.search(r"^total\s+(\d+)", log, re.M).group(1))
    assert len(jobs) == n_planned == 11
    for slurm_id, job in jobs.items():
        assert job["state"] == "COMPLETED", job
        batch_log = Path(submitted[slurm_id])
        assert batch_log.is_relative_to(tmp_path / ".snakemake" / "slurm_logs")
        rule = job["comment"].removeprefix("rule_").split("_wildcards_")[0]
        assert f"rule {rule}:" in batch_log.read_text(), batch_log  # the job step's own Snakemake ran the rule
