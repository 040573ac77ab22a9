# Input functions and names of the rules in evaluate.smk (included at its top), out of its rules for `snakemake --lint`.
from types import SimpleNamespace

from npm.report.tables import LAYOUT as REPORT_TASKS

# TempLAMA's tasks of Table 2 (evaluated on the updated and the outdated corpus), in the table's column order.
TEMPLAMA_TASKS = [t for t in REPORT_TASKS.templama if t in EVAL["open_set_tasks"]]


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
        inputs["truecase"] = dp_truecase()
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


def evaluate_settings(wildcards):
    """The settings options of one evaluation: config `inference`, and for DensePhrases how it searches (config
    densephrases: search_form, vectors, truecase, refine_factor, precision, as its own table's evaluations)."""
    settings = to_args(config.get("inference"))
    return f"{settings} {dp_args('registry')}" if "phrase_dump" in run_needs(wildcards)[1] else settings


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


# The metrics files that the tables and figures read (report.smk), planned above as rule evaluate's outputs.
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


def ablation_corpus(percent):
    """The reference corpus of one point of Figure 7 (100 % = the base corpus itself)."""
    base = config["ablation"]["corpus"]
    return base if percent == 100 else f"{base}_p{percent}"
