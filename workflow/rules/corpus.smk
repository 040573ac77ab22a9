# Reference-corpus datastore per (model, corpus): flat token arrays, boundaries, fp16 embeddings
# (paper 3.1 and 4.2, reference 3.1-3.4). Entry point `npm-repro embed` comes with the issue "datastore".


rule embed_corpus:
    input:
        model="results/models/{model}",
        blocks=lambda wc: expand("data/blocks/{corpus}/shard{shard}.npz", corpus=wc.corpus, shard=shard_ids(wc.corpus)),
    output:
        directory("data/datastore/{model}/{corpus}"),
    resources:
        gpu=1,
        mem_mb=32000,
        runtime=720,
        cpus_per_task=8,
    log:
        "logs/embed_corpus/{model}/{corpus}.log",
    benchmark:
        "results/benchmarks/rules/embed_corpus/{model}/{corpus}.tsv"
    conda:
        "../envs/embed.yaml"
    shell:
        "npm-repro embed --model {input.model} --blocks {input.blocks} --out {output} > {log} 2>&1"
