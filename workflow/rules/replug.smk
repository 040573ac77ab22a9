# REPLUG as its own system (Shi et al. 2023, 6.1; docs/paper-map.md §R3): the language-modelling evaluation of the
# LM of config `baselines.lm` with the retrieve-and-ensemble method, in bits per byte, against the plain LM and random
# documents (its Table 1 and Figure 4). Config section `replug`; absent (config/paper.yaml) = no REPLUG targets.
REPLUG = config.get("replug") or {}


rule replug_texts:
    """Evaluation texts: a body section of each chosen article whose lead is in the retrieval corpus."""
    input:
        articles=lambda wc: f"data/docs/{REPLUG['texts_from']}.jsonl.gz",
        corpus=lambda wc: f"data/docs/{REPLUG['corpus']}.jsonl.gz",
    output:
        "data/replug/texts.jsonl",
    params:
        r=REPLUG,
        seed=config["seed"],
    log:
        "logs/replug/texts.log",
    conda:
        "../envs/data.yaml"
    shell:
        "npm-repro replug texts --articles {input.articles} --corpus {input.corpus} --n-texts {params.r[n_texts]}"
        " --max-chars {params.r[max_chars]} --seed {params.seed} --out {output} > {log} 2>&1"


rule replug_eval_lm:
    """Bits per byte of the plain LM, REPLUG at each k and k random documents (one LM pass per window and row)."""
    input:
        texts="data/replug/texts.jsonl",
        blocks=lambda wc: corpus_blocks(REPLUG["corpus"]),
        lm=lambda wc: model_input("lm"),
    output:
        "results/replug/lm_eval.json",
    params:
        r=REPLUG,
        lm=lambda wc: model_name("lm"),
        encoder=config["model"]["encoder"],
        k=lambda wc: " ".join(str(k) for k in REPLUG["k"]),
        seed=config["seed"],
    threads: 1
    resources:
        gpu=1,
        mem_mb=32000,
        runtime=720,
    log:
        "logs/replug/eval_lm.log",
    benchmark:
        "results/benchmarks/rules/replug_eval_lm.tsv"
    conda:
        "../envs/eval.yaml"
    shell:
        "npm-repro replug eval-lm --lm {params.lm:q} --texts {input.texts} --blocks {input.blocks}"
        " --corpus {params.r[corpus]} --retriever dense --encoder {params.encoder:q} --score {params.r[score]}"
        " --k {params.k} --context-len {params.r[context_len]} --pred-len {params.r[pred_len]}"
        " --doc-len {params.r[doc_len]} --weighting {params.r[weighting]} --temperature {params.r[temperature]}"
        " --seed {params.seed} --threads {threads} --out {output} > {log} 2>&1"


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
