# Zero-shot evaluation per task and system (paper 5, reference 4-6). Entry points come with the issue
# "evaluation"; the rules fix the file contracts of DESIGN.md section 3.


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
    shell:
        "npm-repro evaluate --task {wildcards.task} --system {wildcards.system}"
        " --predictions {output.predictions} --metrics {output.metrics} > {log} 2>&1"
