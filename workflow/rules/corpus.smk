# Reference-corpus datastore per (model, corpus): flat token arrays, word boundaries and streaming fp16 token
# vectors (paper 3.1 and 4.2; paper-map §3.1-§3.4). One datastore serves closed-set tasks (every stored vector)
# and open-set tasks (stop-word vectors ignored at query time, the candidates of the original's
# embeddings_wo_stopwords); `datastore.drop_stopwords` drops them on disk instead.


rule embed_corpus:
    """Blocks -> datastore (resumable: finished embedding shards survive a killed job)."""
    input:
        model=lambda wc: model_input(wc.model),  # the model's folder; none for a hub id (config `models`), passed as params.model
        blocks=lambda wc: corpus_blocks(wc.corpus),
    output:
        directory("data/datastore/{model}/{corpus}"),
    params:
        model=lambda wc: model_name(wc.model),
        d=config["datastore"],
        drop=lambda wc: "--drop-stopwords" if config["datastore"]["drop_stopwords"] else "",
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
        "npm-repro embed --model {params.model:q} --blocks {input.blocks} --out {output} {params.drop}"
        " --batch-blocks {params.d[batch_blocks]} --shard-blocks {params.d[shard_blocks]} > {log} 2>&1"
