# DensePhrases (Lee et al. 2021; docs/paper-map.md §D) as its own system: reading-comprehension data, the cross-attention
# teacher, the phrase and question encoders, the phrase dump and its FAISS indexes, query-side fine-tuning, and the
# evaluations of results/tables/densephrases.csv. The knowledge tables' DensePhrases row is rule evaluate's (the
# registry system `densephrases`, dp_model / dp_dump / dp_index below). Config section `densephrases`; absent
# (config/released.yaml) = no DensePhrases targets.
#   results/densephrases/teacher, results/densephrases/model_{negatives}[_qft]
#   data/densephrases/dump/{negatives}/{corpus}/shard{shard}/ (one job per blocks shard), then its meta.json
#   data/densephrases/index/{negatives}/{corpus}/{index}.faiss
#   data/densephrases/trimmed/{negatives}/{corpus}/   the dump's phrase edges (config `compressed`), indexed in
#     data/densephrases/index_trimmed/{negatives}/{corpus}/{index}.faiss, evaluated alone in
#     results/densephrases/eval/{negatives}/compressed.json
#   results/densephrases/eval/{variant}/{index}.json     open-domain; variant = {negatives} or {negatives}_qft
#   results/densephrases/eval/{negatives}/rc.json         reading comprehension ({p} and D_small)


include: "densephrases.functions.smk"


use rule tokenize_blocks as densephrases_tokenize_blocks with:
    output:
        blocks="data/densephrases/blocks/{corpus}/shard{shard}.npz",
        summary="data/densephrases/blocks/{corpus}/shard{shard}.summary.json",
    log:
        "logs/densephrases/tokenize_blocks/{corpus}/shard{shard}.log",
    benchmark:
        "results/benchmarks/rules/densephrases_tokenize_blocks/{corpus}/shard{shard}.tsv"
    params:
        tokenizer=DP_ENCODER,
        settings=tokenize_settings(word_boundaries="text"),


rule densephrases_manual_file:
    """A DensePhrases input placed by hand (config densephrases.rc: SQuAD v1.1 / NQ-RC JSON and the generated
    questions; densephrases.query_ft: JSONL questions; densephrases.truecase: the code's statistics); this job only
    fails with that instruction, so that `snakemake -n` still plans the whole DAG."""
    output:
        "{dp_manual}",
    log:
        "logs/densephrases/manual_file/{dp_manual}.log",
    wildcard_constraints:
        dp_manual=DP_MANUAL_PATTERN,
    conda:
        "../envs/data.yaml"
    shell:
        "echo 'densephrases: {output} does not exist; place it there by hand (SQuAD v1.1:"
        " https://rajpurkar.github.io/SQuAD-explorer/dataset/; NQ-RC, the generated questions and the open-domain"
        " NQ questions: the DensePhrases release; truecasing statistics: truecase/english_with_questions.dist of"
        " the DensePhrases data release, densephrases-data.tar.gz; see config/paper.yaml), then re-run.'"
        " | tee {log} >&2; exit 1"


rule densephrases_rc:
    """The embedded RC set (SQuAD v1.1 files, questions GENERATED) and its facts as cloze questions for query-side
    fine-tuning."""
    output:
        **{split: f"data/densephrases/rc/{split}.json" for split in ("train", "dev", "test")},
        cloze_train="data/densephrases/rc/cloze_train.jsonl",
        cloze_dev="data/densephrases/rc/cloze_dev.jsonl",
    log:
        "logs/densephrases/rc.log",
    conda:
        "../envs/data.yaml"
    params:
        max_articles=config["embedded"]["max_articles"] or 0,
        max_subjects=config["embedded"]["max_rc_subjects"] or 0,
        seed=config["seed"],
    shell:
        "npm-repro densephrases rc --max-articles {params.max_articles} --max-subjects {params.max_subjects}"
        " --seed {params.seed} --out-dir data/densephrases/rc > {log} 2>&1"


rule densephrases_train_teacher:
    """The cross-attention reader whose start/end distributions are distilled (resumable per epoch)."""
    input:
        train=lambda wc: dp_rc("train"),
    output:
        directory("results/densephrases/teacher"),
    log:
        "logs/densephrases/train_teacher.log",
    benchmark:
        "results/benchmarks/rules/densephrases_train_teacher.tsv"
    conda:
        "../envs/train.yaml"
    threads: 1
    resources:
        **RESOURCES["gpu"],
    params:
        tracking=tracking_args,
        teacher=lambda wc: to_args(DP["teacher"], DensePhrasesTeacher),
        encoder=DP_TEACHER_ENCODER,
        settings=lambda wc: dp_args("train-teacher"),
        seed=config["seed"],
    shell:
        "npm-repro densephrases train-teacher --encoder {params.encoder:q} --train {input.train} --out {output}"
        " --checkpoint-dir results/checkpoints/densephrases_teacher {params.teacher} {params.settings}"
        " --seed {params.seed} {params.tracking} > {log} 2>&1"


rule densephrases_filter:
    """Question generation's filter (paper 4.1, config `qg_filter`): the generated training questions that the
    teacher answers exactly."""
    input:
        train=lambda wc: dp_rc("train"),
        teacher="results/densephrases/teacher",
    output:
        "data/densephrases/rc/train.filtered.json",
    log:
        "logs/densephrases/filter.log",
    conda:
        "../envs/train.yaml"
    threads: 1
    resources:
        **RESOURCES["gpu_short"],
    params:
        settings=lambda wc: dp_args("filter"),
    shell:
        "npm-repro densephrases filter --teacher {input.teacher} --train {input.train} --out {output}"
        " {params.settings} > {log} 2>&1"


rule densephrases_train:
    """Phrase and question encoders (eq. 9) with the negatives of the wildcard (resumable per epoch); the teacher
    only where train.lambda_distill > 0; config rc.generated's questions joined to the training set, or trained
    first (train.generated_first, the code's two stages)."""
    input:
        train=lambda wc: dp_train_file(),
        generated=lambda wc: dp_generated(),
        teacher=lambda wc: ["results/densephrases/teacher"] if DP["train"]["lambda_distill"] else [],
    output:
        directory("results/densephrases/model_{negatives}"),
    log:
        "logs/densephrases/train_{negatives}.log",
    benchmark:
        "results/benchmarks/rules/densephrases_train/{negatives}.tsv"
    wildcard_constraints:
        negatives="none|in_batch|pre_batch",
    conda:
        "../envs/train.yaml"
    threads: 1
    resources:
        **RESOURCES["gpu_long"],
    params:
        tracking=tracking_args,
        train=lambda wc: to_args({**DP["train"], "negatives": wc.negatives}, DensePhrasesTrain),
        encoder=DP_ENCODER,
        settings=lambda wc: dp_args("train"),
        seed=config["seed"],
        teacher=lambda wc, input: f"--teacher {input.teacher}" if input.teacher else "",
        generated=lambda wc, input: f"--generated {input.generated}" if input.generated else "",
    shell:
        "npm-repro densephrases train --encoder {params.encoder:q} --train {input.train} {params.teacher}"
        " {params.generated}"
        " --out {output} --checkpoint-dir results/checkpoints/densephrases {params.train} {params.settings}"
        " --seed {params.seed} {params.tracking} > {log} 2>&1"


rule densephrases_dump:
    """One shard of the phrase dump: every token vector of the corpus's shard-th blocks file from the phrase encoder
    (fp16, the datastore's layout) and its part of the token table; one job per blocks shard."""
    input:
        model="results/densephrases/model_{negatives}",
        blocks=lambda wc: dp_blocks(wc.corpus)[int(wc.shard)],
    output:
        "data/densephrases/dump/{negatives}/{corpus}/shard{shard}/meta.json",
    log:
        "logs/densephrases/dump/{negatives}/{corpus}/shard{shard}.log",
    benchmark:
        "results/benchmarks/rules/densephrases_dump/{negatives}/{corpus}/shard{shard}.tsv"
    wildcard_constraints:
        negatives="none|in_batch|pre_batch",
    conda:
        "../envs/eval.yaml"
    threads: 1
    resources:
        **RESOURCES["gpu_large"],
    params:
        folder=lambda wc, output: Path(output[0]).parent.parent,
        settings=lambda wc: dp_args("dump"),
    shell:
        "npm-repro densephrases dump --checkpoint {input.model} --blocks {input.blocks} --out {params.folder}"
        " --shard {wildcards.shard} {params.settings} > {log} 2>&1"


rule densephrases_combine:
    """The phrase dump's meta.json, written once every shard is: the shards, their offsets and fingerprints (what
    the index and the searches read)."""
    input:
        lambda wc: [dp_dump_shard(wc.negatives, wc.corpus, k) for k in range(len(dp_blocks(wc.corpus)))],
    output:
        "data/densephrases/dump/{negatives}/{corpus}/meta.json",
    log:
        "logs/densephrases/combine/{negatives}/{corpus}.log",
    wildcard_constraints:
        negatives="none|in_batch|pre_batch",
    conda:
        "../envs/data.yaml"  # CPU job: reads the shards' meta.json files
    params:
        folder=lambda wc, output: Path(output[0]).parent,
        shards=lambda wc, input: len(input),
    shell:
        "npm-repro densephrases combine --dump {params.folder} --shards {params.shards} > {log} 2>&1"


rule densephrases_index:
    """The dump's FAISS index from the factory string named by the wildcard (config index / compare_indexes), trained
    on a seeded sample drawn across the shards and filled shard by shard; an index that would not fit the job's
    memory (mem_mb, the profile's) is refused before training, with its size and a smaller choice."""
    input:
        "data/densephrases/dump/{negatives}/{corpus}/meta.json",
    output:
        index="data/densephrases/index/{negatives}/{corpus}/{index}.faiss",
        sidecar="data/densephrases/index/{negatives}/{corpus}/{index}.faiss.json",
    log:
        "logs/densephrases/index/{negatives}/{corpus}/{index}.log",
    benchmark:
        "results/benchmarks/rules/densephrases_index/{negatives}/{corpus}/{index}.tsv"
    conda:
        "../envs/embed.yaml"
    threads: 1
    resources:
        **RESOURCES["gpu_large"],
    params:
        factory=lambda wc: DP_INDEXES[wc.index],
        folder=lambda wc, input: Path(input[0]).parent,
        settings=lambda wc: dp_args("index"),
        seed=config["seed"],
    shell:
        "npm-repro densephrases index --dump {params.folder} --out {output.index} --factory {params.factory:q}"
        " {params.settings} --seed {params.seed} --mem-mb {resources.mem_mb} > {log} 2>&1"


rule densephrases_trim:
    """The dump's tokens that can begin or end a phrase, the compressed index's filter (config `compressed`): the
    others never start or end one, so no phrase is lost; with config `compressed_filter_threshold`, only those the
    model's trained filter head keeps (appendix E)."""
    input:
        dump="data/densephrases/dump/{negatives}/{corpus}/meta.json",
        model="results/densephrases/model_{negatives}",
    output:
        "data/densephrases/trimmed/{negatives}/{corpus}/meta.json",
    log:
        "logs/densephrases/trim/{negatives}/{corpus}.log",
    benchmark:
        "results/benchmarks/rules/densephrases_trim/{negatives}/{corpus}.tsv"
    wildcard_constraints:
        negatives="none|in_batch|pre_batch",
    conda:
        "../envs/data.yaml"
    params:
        dump=lambda wc, input: Path(input.dump).parent,
        folder=lambda wc, output: Path(output[0]).parent,
        settings=lambda wc: dp_args("trim"),
    shell:
        "npm-repro densephrases trim --dump {params.dump} --out {params.folder} --checkpoint {input.model}"
        " {params.settings} > {log} 2>&1"


use rule densephrases_index as densephrases_index_trimmed with:
    input:
        "data/densephrases/trimmed/{negatives}/{corpus}/meta.json",
    output:
        index="data/densephrases/index_trimmed/{negatives}/{corpus}/{index}.faiss",
        sidecar="data/densephrases/index_trimmed/{negatives}/{corpus}/{index}.faiss.json",
    log:
        "logs/densephrases/index_trimmed/{negatives}/{corpus}/{index}.log",
    benchmark:
        "results/benchmarks/rules/densephrases_index_trimmed/{negatives}/{corpus}/{index}.tsv"
    wildcard_constraints:
        index=DP_COMPRESSED or "^$",
    params:
        factory=lambda wc: DP["compressed"],
        folder=lambda wc, input: Path(input[0]).parent,
        settings=lambda wc: dp_args("index"),
        seed=config["seed"],


rule densephrases_query_ft:
    """Query-side fine-tuning against the frozen dump and index of config `index` (the phrase side unchanged)."""
    input:
        model="results/densephrases/model_{negatives}",
        dump=lambda wc: dp_dump(wc.negatives, DP_CORPUS),
        index=lambda wc: dp_index(wc.negatives, DP_CORPUS, DP_INDEX),
        train=lambda wc: dp_qft("train"),
        dev=lambda wc: dp_qft("dev"),
        truecase=lambda wc: dp_truecase(),
    output:
        directory("results/densephrases/model_{negatives}_qft"),
    log:
        "logs/densephrases/query_ft_{negatives}.log",
    benchmark:
        "results/benchmarks/rules/densephrases_query_ft/{negatives}.tsv"
    conda:
        "../envs/train.yaml"
    threads: 1
    resources:
        **RESOURCES["gpu"],
    params:
        tracking=tracking_args,
        query_ft=lambda wc: to_args(DP["query_ft"], DensePhrasesQueryFt),
        dump=lambda wc, input: Path(input.dump).parent,
        dev=lambda wc, input: f"--dev {input.dev}" if input.dev else "",
        max_words=INFERENCE.phrase_max_words,
        settings=lambda wc: dp_args("query-ft"),
        seed=config["seed"],
    shell:
        "npm-repro densephrases query-ft --checkpoint {input.model} --dump {params.dump} --index {input.index}"
        " --train {input.train} {params.dev} --out {output} {params.query_ft} --max-words {params.max_words}"
        " {params.settings} --seed {params.seed} {params.tracking} > {log} 2>&1"


rule densephrases_evaluate_rc:
    """Reading comprehension of one negatives model on the RC test split: each question over its own passage ({p})
    and over all the test passages pooled (D_small); for the model of config train, the teacher and a random span
    beside."""
    input:
        model="results/densephrases/model_{negatives}",
        rc=lambda wc: dp_rc("test"),
        pool=lambda wc: [dp_rc(split) for split in DP["d_small_pool"]],
        teacher="results/densephrases/teacher",
    output:
        "results/densephrases/eval/{negatives}/rc.json",
    log:
        "logs/densephrases/evaluate_rc/{negatives}.log",
    benchmark:
        "results/benchmarks/rules/densephrases_evaluate_rc/{negatives}.tsv"
    wildcard_constraints:
        negatives="none|in_batch|pre_batch",
    conda:
        "../envs/eval.yaml"
    threads: 1
    resources:
        **RESOURCES["gpu_small"],
    params:
        tracking=tracking_args,
        teacher=lambda wc, input: f"--teacher {input.teacher}" if wc.negatives == DP_NEGATIVES else "",
        pool=lambda wc, input: f"--d-small-pool {input.pool}" if input.pool else "",
        settings=lambda wc: dp_args("evaluate"),
    shell:
        "npm-repro densephrases evaluate --checkpoint {input.model} --rc {input.rc} {params.pool} {params.teacher}"
        " {params.settings} --out {output} {params.tracking} > {log} 2>&1"


rule densephrases_evaluate:
    """One model variant over one index: open-domain EM@1 with queries/s on the table's tasks."""
    input:
        unpack(dp_evaluate_inputs),
    output:
        "results/densephrases/eval/{variant}/{index}.json",
    log:
        "logs/densephrases/evaluate/{variant}/{index}.log",
    benchmark:
        "results/benchmarks/rules/densephrases_evaluate/{variant}/{index}.tsv"
    wildcard_constraints:
        variant="(none|in_batch|pre_batch)(_qft)?",
        index="|".join(DP_INDEXES) or "^$",
    conda:
        "../envs/eval.yaml"
    threads: 1
    resources:
        **RESOURCES["gpu"],
    params:
        tracking=tracking_args,
        dump=lambda wc, input: Path(input.dump).parent,
        tasks=lambda wc: " ".join(DP["eval_tasks"]),
        search=lambda wc: dp_search_args(),
        settings=lambda wc: dp_args("evaluate"),
    shell:
        "npm-repro densephrases evaluate --checkpoint {input.model} --dump {params.dump} --index {input.index}"
        " --task {params.tasks} --tasks-root data/tasks {params.search} {params.settings}"
        " --out {output} {params.tracking} > {log} 2>&1"


rule densephrases_evaluate_compressed:
    """The compressed index (config `compressed`) alone: open-domain EM@1 with queries/s on the table's tasks, its
    phrases retrieved and scored from its codes over the trimmed dump (the dump's vectors never read), and the RC
    test questions over all the D_small passages through the same kind of index beside a Flat one."""
    input:
        unpack(dp_compressed_inputs),
    output:
        "results/densephrases/eval/{negatives}/compressed.json",
    log:
        "logs/densephrases/evaluate_compressed/{negatives}.log",
    benchmark:
        "results/benchmarks/rules/densephrases_evaluate_compressed/{negatives}.tsv"
    wildcard_constraints:
        negatives="none|in_batch|pre_batch",
    conda:
        "../envs/eval.yaml"
    threads: 1
    resources:
        **RESOURCES["gpu"],
    params:
        tracking=tracking_args,
        dump=lambda wc, input: Path(input.dump).parent,
        tasks=lambda wc: " ".join(DP["eval_tasks"]),
        pool=lambda wc, input: f"--d-small-pool {input.pool}" if input.pool else "",
        factory=lambda wc: DP["compressed"],
        search=lambda wc: dp_search_args(),
        settings=lambda wc: dp_args("evaluate"),
    shell:
        "npm-repro densephrases evaluate --checkpoint {input.model} --dump {params.dump} --index {input.index}"
        " --task {params.tasks} --tasks-root data/tasks --rc {input.rc} {params.pool}"
        " --d-small-index {params.factory:q} {params.search} {params.settings} --vectors index --refine-factor 1"
        " --out {output} {params.tracking} > {log} 2>&1"


rule densephrases_report:
    """results/tables/densephrases.csv: the DensePhrases paper's tables that run here, paper numbers beside ours."""
    input:
        lambda wc: dp_report_inputs(),
    output:
        csv=report("results/tables/densephrases.csv", category="Tables", caption="../report/densephrases.rst"),
        md="results/tables/densephrases.md",
    log:
        "logs/densephrases/report.log",
    conda:
        "../envs/report.yaml"
    params:
        tracking=tracking_args,
    shell:
        "npm-repro report densephrases --metrics {input} --out {output.csv} {params.tracking} > {log} 2>&1"
