# Zero-shot evaluation per task and system (paper 5, reference 4-6): predictions and metrics files of DESIGN.md
# section 3. NPM and NPM-single run (`npm-repro evaluate`); the parametric MLM baseline (system mlm) is planned
# and its job fails with the CLI's "invalid choice" until it lands.


rule evaluate_closed_set:
    input:
        unpack(closed_set_inputs),
    output:
        predictions="results/predictions/{task}/{system}.jsonl",
        metrics="results/metrics/{task}/{system}.json",
    wildcard_constraints:
        system="npm|npm_single|mlm",
    resources:
        gpu=1,
        mem_mb=32000,
        runtime=120,
    log:
        "logs/evaluate_closed_set/{task}/{system}.log",
    benchmark:
        "results/benchmarks/rules/evaluate_closed_set/{task}/{system}.tsv"
    conda:
        "../envs/eval.yaml"
    params:
        model=lambda wc: released_model(wc.system) or f"results/models/{wc.system}",
        stores=lambda wc: " ".join(closed_set_inputs(wc).get("datastores", [])),
        indexes=lambda wc: " ".join(closed_set_inputs(wc).get("indexes", [])),
        tau=config["inference"]["closed_set_tau"],
    shell:
        "npm-repro evaluate --task {wildcards.task} --system {wildcards.system} --model {params.model:q}"
        " --datastore {params.stores} --faiss {params.indexes} --tau {params.tau}"
        " --predictions {output.predictions} --metrics {output.metrics} > {log} 2>&1"
