# Evaluation sets at paper scale (paper 4.2 and 5.1; docs/task-formats.md, docs/paper-scale.md section 2): each
# task's public files are downloaded once into data/raw/tasks (rule download_task_file, however many tasks read one
# archive), then turned into its task folder and validated by its loader (rule download_task; config/tasks.yaml
# `fetch`). The fuzzy verbalizers' zip is one more such download, unpacked and checked by rule
# download_fuzzy_verbalizers. The evaluations take a task's folder (and, where they read one, the fuzzy verbalizers)
# through task_inputs (below); with the embedded default, rule prepare_embedded_tasks makes all of data/tasks
# instead and these rules are never planned.
from npm.tasks.fetch import COMPLETE as TASK_COMPLETE
from npm.tasks.fetch import cache_path
from npm.tasks.registry import download_checksums, fuzzy_verbalizer_info, load_registry


def embedded_task_targets():
    """The embedded default's evaluation sets (built from PyPI data); at paper scale data/tasks is downloaded."""
    uses_embedded = any(src.get("embedded") for src in config["sources"].values())
    return ["data/tasks"] if uses_embedded else []


FUZZY_VERBALIZERS = f"data/tasks/fuzzy_verbalizers/{TASK_COMPLETE}"  # rule download_fuzzy_verbalizers (below)


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
    each task's folder, downloaded by rule download_task (below; its marker file), and, when ``system`` reads a
    fuzzy verbalizer on one of them, the fuzzy verbalizers' folder (its marker), so a missing file stops the
    workflow before any evaluation starts."""
    embedded = embedded_task_targets()
    if embedded:
        return embedded
    inputs = [f"data/tasks/{task}/{TASK_COMPLETE}" for task in dict.fromkeys(tasks)]
    if system is not None and any(reads_fuzzy_verbalizer(task, system) for task in tasks):
        inputs.append(FUZZY_VERBALIZERS)
    return inputs


TASK_REGISTRY_FILE = Path(REPO, "config", "tasks.yaml")
TASK_REGISTRY = load_registry(TASK_REGISTRY_FILE)  # every entry validated at start-up
TASK_CHECKSUMS = download_checksums(TASK_REGISTRY_FILE)
FUZZY_URL = fuzzy_verbalizer_info(TASK_REGISTRY_FILE)["url"]
TASK_DOWNLOADS = {str(cache_path(url)): url for task in TASK_REGISTRY.values() for url in task.urls}
TASK_DOWNLOADS |= {str(cache_path(FUZZY_URL)): FUZZY_URL} if FUZZY_URL else {}


rule download_task_file:
    """One public file of the evaluation sets into the download cache (resumable; sha256-checked where
    config/tasks.yaml `checksums` knows it; a later download is checked against the task folder's SOURCE.json)."""
    output:
        "{task_download}",
    log:
        "logs/download_task_file/{task_download}.log",
    wildcard_constraints:
        task_download="|".join(re.escape(path) for path in TASK_DOWNLOADS) or "(?!)",
    conda:
        "../envs/data.yaml"
    params:
        url=lambda wc: TASK_DOWNLOADS[wc.task_download],
        sha256=lambda wc: TASK_CHECKSUMS.get(TASK_DOWNLOADS[wc.task_download], ""),
        mirror=MIRROR_ARG,
    shell:
        "npm-repro download --url {params.url:q} --sha256 '{params.sha256}' --out {output} {params.mirror}"
        " > {log} 2>&1"


rule download_task:
    """A task folder from its cached downloads (or its HF dataset) in the format of docs/task-formats.md, built
    under a temporary name and renamed into place once its loader reads it; `.complete` marks it done."""
    input:
        lambda wc: [str(cache_path(url)) for url in TASK_REGISTRY[wc.task].urls],
    output:
        f"data/tasks/{{task}}/{TASK_COMPLETE}",
    log:
        "logs/download_task/{task}.log",
    wildcard_constraints:
        task="|".join(TASK_REGISTRY),
    conda:
        "../envs/data.yaml"
    params:
        registry=TASK_REGISTRY_FILE,
    shell:
        "npm-repro download-task --task {wildcards.task} --out data/tasks/{wildcards.task}"
        " --registry {params.registry:q} > {log} 2>&1"


rule download_fuzzy_verbalizers:
    """The fuzzy verbalizers (agn.txt, sst2.txt, yahoo.json) from their cached zip, at its top or below its one top
    folder, checked with the verbalizer readers and checksum-recorded like a task folder; `.complete` marks them done
    (without a url in config/tasks.yaml, the job says where to place them by hand)."""
    input:
        [str(cache_path(FUZZY_URL))] if FUZZY_URL else [],
    output:
        FUZZY_VERBALIZERS,
    log:
        "logs/download_fuzzy_verbalizers.log",
    conda:
        "../envs/data.yaml"
    params:
        registry=TASK_REGISTRY_FILE,
        out=Path(FUZZY_VERBALIZERS).parent,
    shell:
        "npm-repro download-task --task fuzzy_verbalizers --out {params.out:q} --registry {params.registry:q}"
        " > {log} 2>&1"
