# kNN index (FAISS) per datastore and BM25 index (pyserini/Lucene) per corpus (reference 3.5, 3.8).
# Entry points come with the issue "datastore".


rule build_faiss_index:
    input:
        "data/datastore/{model}/{corpus}",
    output:
        "data/index/{model}/{corpus}.faiss",
    resources:
        gpu=1,
        mem_mb=32000,
        runtime=240,
        cpus_per_task=8,
    log:
        "logs/build_faiss_index/{model}/{corpus}.log",
    conda:
        "../envs/embed.yaml"
    shell:
        "npm-repro build-faiss-index --datastore {input} --out {output} > {log} 2>&1"


rule build_bm25_index:
    input:
        lambda wc: expand("data/blocks/{corpus}/shard{shard}.npz", corpus=wc.corpus, shard=shard_ids(wc.corpus)),
    output:
        directory("data/bm25/{corpus}"),
    resources:
        mem_mb=16000,
        runtime=240,
        cpus_per_task=4,
    log:
        "logs/build_bm25_index/{corpus}.log",
    conda:
        "../envs/bm25.yaml"
    shell:
        "npm-repro build-bm25-index --blocks {input} --out {output} > {log} 2>&1"
