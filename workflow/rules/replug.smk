# REPLUG as its own system (Shi et al. 2023, 6.1; docs/paper-map.md §R3): the language-modelling evaluation of the
# LM of config `baselines.lm` with the retrieve-and-ensemble method, in bits per byte, against the plain LM and random
# documents (its Table 1 and Figure 4). Config section `replug`; absent (config/paper.yaml) = no REPLUG targets.
from npm.settings import LsrSettings

REPLUG = config.get("replug") or {}


include: "replug.functions.smk"


use rule tokenize_blocks as replug_tokenize_blocks with:
    output:
        blocks="data/replug/blocks/{corpus}/shard{shard}.npz",
        summary="data/replug/blocks/{corpus}/shard{shard}.summary.json",
    log:
        "logs/replug/tokenize_blocks/{corpus}/shard{shard}.log",
    benchmark:
        "results/benchmarks/rules/replug_tokenize_blocks/{corpus}/shard{shard}.tsv"
    params:
        tokenizer=REPLUG_ENCODER,
        settings=tokenize_settings(word_boundaries="text"),


rule replug_texts:
    """Evaluation texts: a body section of each chosen article whose lead is in the retrieval corpus."""
    input:
        articles=lambda wc: f"data/docs/{REPLUG['texts_from']}.jsonl.gz",
        corpus=lambda wc: f"data/docs/{REPLUG['corpus']}.jsonl.gz",
    output:
        "data/replug/texts.jsonl",
    log:
        "logs/replug/texts.log",
    conda:
        "../envs/data.yaml"
    params:
        settings=lambda wc: to_args(REPLUG, ReplugSettings, "texts"),
        seed=config["seed"],
    shell:
        "npm-repro replug texts --articles {input.articles} --corpus {input.corpus} {params.settings}"
        " --seed {params.seed} --out {output} > {log} 2>&1"


rule replug_queries:
    """LSR training queries: body-text passages of the articles that are not evaluation texts."""
    input:
        articles=lambda wc: f"data/docs/{REPLUG['texts_from']}.jsonl.gz",
        corpus=lambda wc: f"data/docs/{REPLUG['corpus']}.jsonl.gz",
        exclude="data/replug/texts.jsonl",
    output:
        "data/replug/lsr_queries.jsonl",
    log:
        "logs/replug/queries.log",
    conda:
        "../envs/data.yaml"
    params:
        lsr=lambda wc: to_args(REPLUG["lsr"], LsrSettings, "queries"),
        seed=config["seed"],
    shell:
        "npm-repro replug queries --articles {input.articles} --corpus {input.corpus} --exclude {input.exclude}"
        " {params.lsr} --seed {params.seed} --out {output} > {log} 2>&1"


rule replug_train_lsr:
    """REPLUG LSR: the dense retriever trained from the frozen LM's preferences (resumable; checkpoints in
    results/checkpoints/replug_lsr/run-{id})."""
    input:
        queries="data/replug/lsr_queries.jsonl",
        blocks=lambda wc: replug_blocks(REPLUG["corpus"]),
        lm=lambda wc: model_input("lm"),
    output:
        directory("results/models/replug_lsr"),
    log:
        "logs/replug/train_lsr.log",
    benchmark:
        "results/benchmarks/rules/replug_train_lsr.tsv"
    conda:
        "../envs/eval.yaml"
    threads: 1
    resources:
        **RESOURCES["gpu_long"],
    params:
        tracking=tracking_args,
        lsr=lambda wc: to_args(REPLUG["lsr"], LsrSettings, "train-lsr"),
        settings=lambda wc: to_args(REPLUG, ReplugSettings, "train-lsr"),
        lm=lambda wc: model_name("lm"),
        encoder=REPLUG_ENCODER,
        seed=config["seed"],
    shell:
        "npm-repro replug train-lsr --encoder {params.encoder:q} --lm {params.lm:q} --blocks {input.blocks}"
        " --queries {input.queries} --out {output} --checkpoint-dir results/checkpoints/replug_lsr"
        " {params.lsr} {params.settings} --seed {params.seed}"
        " --threads {threads} {params.tracking} > {log} 2>&1"


rule replug_eval_lm:
    """Bits per byte of the plain LM, REPLUG (untrained and LSR retriever) at each k and k random documents."""
    input:
        texts="data/replug/texts.jsonl",
        blocks=lambda wc: replug_blocks(REPLUG["corpus"]),
        lm=lambda wc: model_input("lm"),
        lsr="results/models/replug_lsr",
    output:
        "results/replug/lm_eval.json",
    log:
        "logs/replug/eval_lm.log",
    benchmark:
        "results/benchmarks/rules/replug_eval_lm.tsv"
    conda:
        "../envs/eval.yaml"
    threads: 1
    resources:
        **RESOURCES["gpu"],
    params:
        tracking=tracking_args,
        settings=lambda wc: to_args(REPLUG, ReplugSettings, "eval-lm"),
        lm=lambda wc: model_name("lm"),
        encoder=REPLUG_ENCODER,
        corpus=lambda wc: REPLUG["corpus"],
        k=lambda wc: " ".join(str(k) for k in REPLUG["k"]),
        seed=config["seed"],
    shell:
        "npm-repro replug eval-lm --lm {params.lm:q} --texts {input.texts} --blocks {input.blocks}"
        " --corpus {params.corpus} --retriever dense --encoder {params.encoder:q} --lsr-encoder {input.lsr}"
        " --k {params.k} {params.settings} --seed {params.seed} --threads {threads} --out {output}"
        " {params.tracking} > {log} 2>&1"


rule replug_report:
    """REPLUG's Table 1 (bits per byte) and Figure 4 (bits per byte against k) in our world."""
    input:
        "results/replug/lm_eval.json",
    output:
        csv=report("results/tables/replug_lm.csv", category="Tables", caption="../report/replug_lm.rst"),
        md="results/tables/replug_lm.md",
        pdf=report("results/figures/replug_k.pdf", category="Figures", caption="../report/replug_k.rst"),
        png="results/figures/replug_k.png",
    log:
        "logs/replug/report.log",
    conda:
        "../envs/report.yaml"
    shell:
        "npm-repro replug report --results {input} --table {output.csv} --figure {output.pdf} > {log} 2>&1"
