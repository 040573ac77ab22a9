"""The released route run for real against a local mirror (issue: the rehearsal of config/released.yaml).

A mirror on 127.0.0.1 (npm.data.mirror, the server behind `npm-repro mirror`) serves every download of the route in
the original's layouts (tests/released_mirror.py): tiny roberta-architecture checkpoints in the hub's legacy layout
standing in for facebook/npm, facebook/npm-single and roberta-large, the corpus tarballs, the task files and archives,
the verbalizer zip; the checkpoints carry roberta-large's own vocabulary (tests/data/roberta-large), so the original's
stop-word list applies. Snakemake then runs config/released.yaml with one overlay, `mirror:` plus what keeps the run
small (fewer Wikipedia shards, a few examples per task, the tasks that have public files: the HF-only sets and
Google-RE's UHN filter need the hub's datasets and bert-base-cased, the decoder baselines OPT 2.7B) — download ->
unpack -> import -> per-shard embedding -> FAISS and BM25 -> evaluation -> tables -> check_paper.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROBERTA_VOCAB, lee_corpus_lines
from tests.cpus import whole_machine
from tests.released_mirror import build_mirror

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
CLOSED = ["agn", "subj", "sst2", "mr", "cr"]
OPEN = ["lama_trex", "kamel", "nq", "templama_changed", "templama_unchanged", "entity_translation"]
RELEASED_SYSTEMS = {"npm": "NPM", "npm_single": "NPM-single"}


def rehearsal_config(mirror: str) -> dict:
    """The overlay on config/released.yaml: the mirror, and the sizes that keep the rehearsal to minutes: one
    embedding job per datastore and one evaluation job per system and corpus (the multi-shard and per-task paths run
    in tests/test_faults_workflow.py and the .test run)."""
    return {
        "mirror": mirror,
        "sources": {"enwiki": {"shards": 2}, "enwiki_2022": {"shards": 2}},
        "evaluation": {"closed_set_tasks": CLOSED, "open_set_tasks": OPEN,
                       "closed_set_systems": ["npm", "npm_single", "mlm"], "open_set_systems": ["npm"],
                       "max_examples": 6, "group_jobs": True},
        "ablation": {"tasks": ["nq"], "percents": [50, 100]},
        # the original's IVF-PQ with its metric (released.yaml's faiss_metric: l2), at the mirror's size
        "datastore": {"batch_blocks": 16, "shards": 1, "faiss_factory": "IVF4,PQ4x4", "faiss_train_sample": 1000},
        "inference": {"lm_precision": "fp32"},
    }


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    from npm.data.mirror import base_url, serve
    from npm.embedded.tasks import prepare_embedded_tasks

    work = tmp_path_factory.mktemp("rehearsal")
    lines = lee_corpus_lines()
    registry = yaml.safe_load((ROOT / "config" / "tasks.yaml").read_text(encoding="utf-8"))
    prepare_embedded_tasks(work / "tasks", max_articles=300, max_per_task=12, seed=2022)
    verbalizers = (registry.get("fuzzy_verbalizers") or {}).get("url")
    root = build_mirror(work / "www", ROBERTA_VOCAB, lines, work / "tasks",
                        shards={"enwiki": 2, "new-enwiki": 2}, verbalizers_url=verbalizers)
    server = serve(root)
    yield {"root": root, "url": base_url(server), "work": work}
    server.shutdown()


def run_snakemake(workdir: Path, overlay: Path, *targets: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "HF_HUB_OFFLINE": "0", "WANDB_MODE": "offline"}
    return subprocess.run([SNAKEMAKE, *targets, "--cores", "2", "--directory", str(workdir),
                           "-s", str(ROOT / "Snakefile"),
                           "--configfile", str(ROOT / "config" / "released.yaml"), str(overlay)],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout,
                          preexec_fn=whole_machine)  # its jobs side by side (tests/cpus.py)


@pytest.mark.slow
def test_the_released_route_runs_for_real_against_a_local_mirror(mirror, tmp_path):
    overlay = tmp_path / "rehearsal.yaml"
    overlay.write_text(yaml.safe_dump(rehearsal_config(mirror["url"])), encoding="utf-8")
    work = tmp_path / "run"
    out = run_snakemake(work, overlay, "results/check/paper.txt")
    logs = "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted((work / "logs").rglob("*.log"))
                     if "Error" in p.read_text(errors="replace")) if (work / "logs").exists() else ""
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-8000:] + logs

    # every download went through the mirror, and the checkpoints are the served ones
    for repo in ("facebook/npm", "facebook/npm-single", "roberta-large"):
        record = yaml.safe_load((work / "data" / "checkpoints" / repo / "download.json").read_text())
        assert record["endpoint"] == f"{mirror['url']}/huggingface.co"
        assert (work / "data" / "checkpoints" / repo / "pytorch_model.bin").is_file()
    # every released shard imported, every datastore complete
    for corpus, shards in (("enwiki", 2), ("enwiki_2022", 2), ("enwiki_0", 1), ("cc_news", 1), ("subj", 1)):
        for s in range(shards):
            assert (work / "data" / "blocks" / corpus / f"shard{s}.npz").is_file()
    assert (work / "data" / "datastore" / "npm" / "enwiki" / "meta.json").is_file()
    assert not (work / "data" / "datastore" / "npm_single" / "enwiki").exists()  # NPM-single is closed-set only

    # every job tracked as a user's is: offline wandb runs under results/wandb
    assert len(list((work / "results" / "wandb").glob("offline-run-*"))) >= 10

    # every table written, with a row for each released system that it holds
    for n, systems in ((1, ["npm", "npm_single"]), (2, ["npm"]), (3, ["npm"]), (8, ["npm"])):
        with open(work / "results" / "tables" / f"table{n}.csv", newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        assert rows, f"table{n}.csv is empty"
        text = (work / "results" / "tables" / f"table{n}.csv").read_text(encoding="utf-8")
        for system in systems:
            assert RELEASED_SYSTEMS[system] in text, f"table{n}.csv has no {RELEASED_SYSTEMS[system]} row:\n{text}"

    # the check prints a verdict for every paper cell
    from npm.report.check import PAPER, load_expected

    report = (work / "results" / "check" / "paper.txt").read_text(encoding="utf-8")
    cells = load_expected(PAPER).cells
    verdicts = {line.split()[1] if line.startswith(("OK", "FAIL")) else line.split()[2]: line
                for line in report.splitlines() if line.startswith(("OK ", "FAIL ", "not run "))}
    assert set(verdicts) == set(cells), report
    assert f"of {len(cells)} cells" in report.strip().splitlines()[-1], report
    # the cells of the released NPM rows that the rehearsal evaluates are scored (OK or FAIL), not "not run"
    for cell in ("agn/npm", "sst2/npm_single", "nq/npm", "templama_changed/npm"):
        if cell in cells:
            assert not verdicts[cell].startswith("not run"), verdicts[cell]
