# kNN index (FAISS) per datastore and BM25 index (pyserini/Lucene) per corpus (paper-map §3.5, §3.8).


include: "index.functions.smk"


rule build_faiss_index:
    """FAISS index from a factory string, inner product (paper: HNSW; original code: IVF4096,PQ64). An index that would
    not fit the job's memory (mem_mb, the profile's) is refused before training, with its size and a smaller choice."""
    input:
        "data/datastore/{model}/{corpus}/meta.json",
    output:
        index="data/index/{model}/{corpus}.faiss",
        sidecar="data/index/{model}/{corpus}.faiss.json",
    log:
        "logs/build_faiss_index/{model}/{corpus}.log",
    benchmark:
        "results/benchmarks/rules/build_faiss_index/{model}/{corpus}.tsv"
    conda:
        "../envs/embed.yaml"
    resources:
        **RESOURCES["faiss"],
    params:
        datastore=datastore_dir,
        settings=to_args(config["datastore"], DatastoreSettings, "build-faiss-index"),
    shell:
        "npm-repro build-faiss-index --datastore {params.datastore} --out {output.index} {params.settings}"
        " --mem-mb {resources.mem_mb} > {log} 2>&1"


rule build_bm25_index:
    """Lucene BM25 index over the blocks of a corpus; docid = global block id (the datastore's block order). Config
    datastore.bm25_markers: each unit indexed as <s>...</s> (the original's contents; the tokenizer finds the units)."""
    input:
        blocks=lambda wc: corpus_blocks(wc.corpus),
        tokenizer=TOKENIZER_INPUT if config["datastore"]["bm25_markers"] else [],
    output:
        directory("data/bm25/{corpus}"),
    log:
        "logs/build_bm25_index/{corpus}.log",
    benchmark:
        "results/benchmarks/rules/build_bm25_index/{corpus}.tsv"
    conda:
        "../envs/bm25.yaml"
    resources:
        **RESOURCES["read_blocks"],
    params:
        markers="--markers" if config["datastore"]["bm25_markers"] else "--no-markers",
        tokenizer=TOKENIZER,
    shell:
        "npm-repro build-bm25-index --blocks {input.blocks} --out {output} {params.markers}"
        " --tokenizer {params.tokenizer:q} > {log} 2>&1"
