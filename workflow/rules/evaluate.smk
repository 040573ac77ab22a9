# Zero-shot evaluation per task and system (paper 4-6, reference 4-6): the predictions and metrics files of
# DESIGN.md section 3. `{run}` is `{system}` (the task's reference corpus, common.smk task_corpora) or
# `{system}@{corpus}` (another corpus: TempLAMA's outdated 2019 corpus, Figure 7's subsampled corpora).


rule evaluate:
    """NPM / NPM-single (closed set: kNN over the union of datastores with FAISS; open set: BM25-restricted phrase
    search), NPM without BM25 (npm_faiss, paper 6.4) and the parametric MLM baseline (mlm, reference 6)."""
    input:
        unpack(evaluate_inputs),
    output:
        predictions="results/predictions/{task}/{run}.jsonl",
        metrics="results/metrics/{task}/{run}.json",
    wildcard_constraints:
        run=r"(npm|npm_single|npm_faiss|mlm)(@[A-Za-z0-9_]+)?",
    params:
        system=lambda wc: split_run(wc.run)[0],
        args=evaluate_args,  # input-dependent (not tracked by Snakemake's params trigger); config values below are
        n=n_samples_arg(),
        inference=config["inference"],
    resources:
        gpu=1,
        mem_mb=32000,
        runtime=120,
    log:
        "logs/evaluate/{task}/{run}.log",
    benchmark:
        "results/benchmarks/rules/evaluate/{task}/{run}.tsv"
    conda:
        "../envs/eval.yaml"
    shell:
        "npm-repro evaluate --task {wildcards.task} --system {params.system} {params.args} {params.n}"
        " --closed-set-tau {params.inference[closed_set_tau]} --open-set-tau {params.inference[open_set_tau]}"
        " --predictions {output.predictions} --metrics {output.metrics} > {log} 2>&1"
