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


include: "tasks.functions.smk"


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
