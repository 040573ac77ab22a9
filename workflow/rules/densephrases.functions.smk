# Input functions and names of the rules in densephrases.smk (included at its top), out of its rules for `snakemake --lint`.
from npm.settings import DensePhrasesQueryFt, DensePhrasesTeacher, DensePhrasesTrain
from npm.densephrases.truecase import PACKAGE as TRUECASE_PACKAGE

# DensePhrases (config `densephrases`, its defaults filled in above; rules in densephrases.smk; absent = none
# of its targets, and the names below are empty).
DP = config.get("densephrases") or {}


def _slug(factory):
    """A FAISS factory string as a file name ("IVF256,SQ4" -> "IVF256_SQ4")."""
    return re.sub(r"[^A-Za-z0-9]+", "_", factory).strip("_")


def dp_generated():
    """Config rc.generated, the generated training questions, as an input ([] when none)."""
    generated = DP["rc"].get("generated") if isinstance(DP["rc"], dict) else None
    return [generated] if generated else []


if "densephrases" in evaluated_systems() and not DP:
    _config_error("evaluation lists the system densephrases but config has no `densephrases` section")
DP_ENCODER = DP_TEACHER_ENCODER = DP_CORPUS = DP_NEGATIVES = DP_INDEX = DP_COMPRESSED = None
DP_INDEXES = {}  # file name -> factory string: config `index` first, then `compare_indexes`
if DP:
    DP_ENCODER = DP["encoder"] or config["model"]["encoder"]
    DP_TEACHER_ENCODER = DP["teacher_encoder"] or DP_ENCODER
    DP_CORPUS = DP["corpus"]
    DP_NEGATIVES = DP["train"]["negatives"]
    DP_INDEXES = {_slug(f): f for f in [DP["index"], *DP["compare_indexes"]]}
    DP_INDEX = _slug(DP["index"])
    DP_COMPRESSED = _slug(DP["compressed"]) if DP["compressed"] else None  # file name of config `compressed`
    if DP["train"]["generated_first"] and not dp_generated():
        _config_error(
            "densephrases.train.generated_first trains on the generated questions first: give their file "
            "as densephrases.rc.generated"
        )
    if DP_CORPUS not in config["sources"]:
        _config_error(f"densephrases.corpus: {DP_CORPUS!r} is not a source; sources: {sorted(config['sources'])}")


def dp_truecase():
    """The truecasing statistics of config `truecase` as an input ([] when off or the truecase package's own)."""
    return [DP["truecase"]] if DP and DP["truecase"] not in (None, TRUECASE_PACKAGE) else []


# DensePhrases files placed by hand (config densephrases.rc's SQuAD files, query_ft's question files, the truecasing
# statistics): rule densephrases_manual_file plans them, so that `snakemake -n` lists the whole DAG, and fails with
# instructions.
DP_MANUAL = sorted(
    {
        path
        for path in ([] if not DP or DP["rc"] == "embedded" else list(DP["rc"].values()))
        + [(DP.get("query_ft") or {}).get(split) for split in ("train", "dev")]
        + dp_truecase()
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
        "truecase": dp_truecase(),
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
    if DP_COMPRESSED:
        files.append(f"results/densephrases/eval/{DP_NEGATIVES}/compressed.json")
    return files


def dp_compressed_inputs(wildcards):
    """Model, tasks, trimmed dump and compressed index (config `compressed`), and the RC files of D_small."""
    return {
        "model": f"results/densephrases/model_{wildcards.negatives}",
        "tasks": task_inputs(DP["eval_tasks"]),
        "dump": f"data/densephrases/trimmed/{wildcards.negatives}/{DP_CORPUS}/meta.json",
        "index": f"data/densephrases/index_trimmed/{wildcards.negatives}/{DP_CORPUS}/{DP_COMPRESSED}.faiss",
        "rc": dp_rc("test"),
        "pool": [dp_rc(split) for split in DP["d_small_pool"]],
        "truecase": dp_truecase(),
    }
