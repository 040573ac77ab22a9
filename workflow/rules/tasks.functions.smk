# Input functions and names of the rules in tasks.smk (included at its top), out of its rules for `snakemake --lint`.
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
