# Contrastive pretraining of NPM and NPM-single (paper 3.2-3.3, reference 2.3-2.5).
# The `npm-repro train` entry point is built by the issue "Contrastive pretraining"; until it lands this
# rule is part of the planned DAG only (`snakemake -n`), and running it fails with the CLI's error.

rule pretrain:
    input:
        training_batches,
    output:
        directory("results/models/{model}"),
    params:
        encoder=config["model"]["encoder"],
    resources:
        gpu=1,
        mem_mb=64000,
        runtime=4320,
        cpus_per_task=8,
    log:
        "logs/pretrain/{model}.log",
    benchmark:
        "results/benchmarks/rules/pretrain/{model}.tsv"
    conda:
        "../envs/train.yaml"
    shell:
        "npm-repro train --model {wildcards.model} --encoder {params.encoder:q} --batches {input} --out {output} > {log} 2>&1"
