# Contrastive pretraining of NPM (span masking) and NPM-single (uniform masking) (paper 3.2-3.3, 4.1;
# paper-map §2.3-§2.5). Checkpoints live in results/checkpoints/{model}/run-{id} (not a rule output, so Snakemake
# never deletes them): a killed job re-run by Snakemake resumes from the last one; a changed setting or rebuilt data
# (another run id) starts fresh beside it (npm.training.loop).
# A model for which config `models` names a released checkpoint (facebook/npm, facebook/npm-single or a local
# folder) is not trained: the rules downstream read that checkpoint (common.smk: model_name, model_input).


include: "pretrain.functions.smk"


rule pretrain:
    input:
        blocks=lambda wc: training_shards(wc.model)[0],
        masked=lambda wc: training_shards(wc.model)[1],
        tokenizer=TOKENIZER_INPUT,
    output:
        directory("results/models/{model}"),
    log:
        "logs/pretrain/{model}.log",
    benchmark:
        "results/benchmarks/rules/pretrain/{model}.tsv"
    priority: 10  # the head of the longest chain (pretrain -> embed -> evaluate): start it before the decoders
    conda:
        "../envs/train.yaml"
    resources:
        **RESOURCES["pretrain"],
    params:
        tracking=tracking_args,
        encoder=config["model"]["encoder"],
        tokenizer=TOKENIZER,
        settings=to_args(config["training"], TrainingSettings),
        launcher=torch_launcher,
    shell:
        "{params.launcher} train --model {wildcards.model} --encoder {params.encoder:q}"
        " --tokenizer {params.tokenizer:q} --blocks {input.blocks} --masked {input.masked}"
        " --out {output} --checkpoint-dir results/checkpoints/{wildcards.model} {params.settings}"
        " --summary results/checkpoints/{wildcards.model}/summary.json {params.tracking} > {log} 2>&1"
