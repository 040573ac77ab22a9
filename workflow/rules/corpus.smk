# Reference-corpus datastore per (model, corpus): flat token arrays, word boundaries and streaming fp16 token
# vectors (paper 3.1 and 4.2; paper-map §3.1-§3.4). One datastore serves closed-set tasks (every stored vector)
# and open-set tasks (stop-word vectors ignored at query time, the candidates of the original's
# embeddings_wo_stopwords); `datastore.drop_stopwords` drops them on disk instead.
#
# Three rules (npm.datastore.embed): plan_datastore (token arrays + plan.json), one embed_shard job per shard
# (`datastore.shards` of them: a cluster embeds them in parallel, and a failed or killed job loses only its own
# shard, since every finished shard is the output of a finished job), and embed_corpus (meta.json, written last:
# the datastore is complete). Downstream rules read data/datastore/{model}/{corpus}/meta.json. A subsampled corpus of
# Figure 7 ({base}_p{percent}) takes its shards from rule slice_shard instead: rows of the full corpus's datastore.


include: "corpus.functions.smk"


rule plan_datastore:
    """Blocks -> the datastore's token arrays and shard plan (no encoder pass; the model is checked and fingerprinted)."""
    input:
        model=lambda wc: model_input(wc.model),  # the model's folder; none for a hub id (config `models`), passed as params.model
        blocks=lambda wc: corpus_blocks(wc.corpus),
    output:
        tokens="data/datastore/{model}/{corpus}/tokens.npz",
        stopwords="data/datastore/{model}/{corpus}/stopword_ids.npy",
        plan="data/datastore/{model}/{corpus}/plan.json",
    log:
        "logs/plan_datastore/{model}/{corpus}.log",
    conda:
        "../envs/data.yaml"  # CPU job: tokenizer, model config and fingerprint, no torch
    resources:
        **RESOURCES["plan_datastore"],
    params:
        model=lambda wc: model_name(wc.model),
        out=datastore_dir,
        settings=to_args(config["datastore"], DatastoreSettings, "embed --step plan"),
    shell:
        "npm-repro embed --step plan --checkpoint {params.model:q} --blocks {input.blocks} --out {params.out}"
        " {params.settings} > {log} 2>&1"


rule embed_shard:
    """One shard's vectors (resumable unit; a GPU job of its own)."""
    input:
        model=lambda wc: model_input(wc.model),
        tokens="data/datastore/{model}/{corpus}/tokens.npz",
        plan="data/datastore/{model}/{corpus}/plan.json",
    output:
        vectors="data/datastore/{model}/{corpus}/embeddings/shard{shard}.f16",
        done="data/datastore/{model}/{corpus}/embeddings/shard{shard}.done.json",
    log:
        "logs/embed_shard/{model}/{corpus}/shard{shard}.log",
    benchmark:
        "results/benchmarks/rules/embed_shard/{model}/{corpus}/shard{shard}.tsv"
    priority: 5  # on the NPM evaluations' path: before the decoder baselines that can wait
    conda:
        "../envs/embed.yaml"
    resources:
        **RESOURCES["embed"],
    params:
        out=datastore_dir,
        settings=to_args(config["datastore"], DatastoreSettings, "embed --step shard"),
    shell:
        "npm-repro embed --step shard --shard {wildcards.shard} --out {params.out} {params.settings} > {log} 2>&1"


rule slice_shard:
    """One shard of a subsampled corpus's datastore (Figure 7, {base}_p{percent}) copied from the rows of the full
    corpus's datastore: each block is encoded on its own, so its vectors are the same rows there (no GPU)."""
    input:
        tokens="data/datastore/{model}/{corpus}/tokens.npz",
        plan="data/datastore/{model}/{corpus}/plan.json",
        base=lambda wc: f"data/datastore/{wc.model}/{subsample_of(wc.corpus)[0]}/meta.json",
    output:
        vectors="data/datastore/{model}/{corpus}/embeddings/shard{shard}.f16",
        done="data/datastore/{model}/{corpus}/embeddings/shard{shard}.done.json",
    log:
        "logs/slice_shard/{model}/{corpus}/shard{shard}.log",
    wildcard_constraints:
        corpus=r"[A-Za-z0-9_]+_p[0-9]+",
    conda:
        "../envs/data.yaml"
    resources:
        **RESOURCES["read_blocks"],
    params:
        out=datastore_dir,
        base=lambda wc, input: str(Path(input.base).parent),
    shell:
        "npm-repro embed --step slice --shard {wildcards.shard} --out {params.out} --base {params.base} > {log} 2>&1"


ruleorder: slice_shard > embed_shard


rule embed_corpus:
    """The finished datastore: every shard checked against the plan, then meta.json."""
    input:
        plan="data/datastore/{model}/{corpus}/plan.json",
        shards=expand(
            "data/datastore/{{model}}/{{corpus}}/embeddings/shard{shard}.{ext}",
            shard=range(config["datastore"]["shards"]),
            ext=["f16", "done.json"],
        ),
    output:
        "data/datastore/{model}/{corpus}/meta.json",
    log:
        "logs/embed_corpus/{model}/{corpus}.log",
    conda:
        "../envs/data.yaml"
    resources:
        **RESOURCES["finish_datastore"],
    params:
        out=datastore_dir,
    shell:
        "npm-repro embed --step finish --out {params.out} > {log} 2>&1"
