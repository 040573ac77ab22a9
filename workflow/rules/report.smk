# Tables and figures named after the paper's (paper-map §7), regenerated from results/metrics (never by hand), each
# with a caption for `snakemake --report results/report.html` (workflow/report/*.rst). Regenerate one alone with
# e.g. `snakemake results/figures/figure7.pdf`: only the ablation's rules run.


include: "report.functions.smk"


# Seconds each (they read metrics files and write a table, a figure or the resolved config): on a cluster they run
# on the head node instead of waiting in the queue.
localrules:
    table1,
    table2,
    table3,
    table4,
    table8,
    figure6,
    figure7,
    figure8,
    resolved_config,
    check_paper,


rule table1:
    """Table 1: zero-shot closed-set accuracy."""
    input:
        metrics(EVAL["closed_set_tasks"], EVAL["closed_set_systems"]),
    output:
        csv=report("results/tables/table1.csv", category="Tables", caption="../report/table1.rst"),
        md="results/tables/table1.md",
    log:
        "logs/report/table1.log",
    conda:
        "../envs/report.yaml"
    params:
        tracking=tracking_args,
    shell:
        "npm-repro report table1 --metrics {input} --out {output.csv} {params.tracking} > {log} 2>&1"


rule table2:
    """Table 2: TempLAMA, outdated (2019) -> updated (2022) corpus."""
    input:
        table2_metrics(),
    output:
        csv=report("results/tables/table2.csv", category="Tables", caption="../report/table2.rst"),
        md="results/tables/table2.md",
    log:
        "logs/report/table2.log",
    conda:
        "../envs/report.yaml"
    params:
        tracking=tracking_args,
        outdated=lambda wc: outdated_corpus(TEMPLAMA_TASKS[0]) if TEMPLAMA_TASKS else "enwiki",
    shell:
        "npm-repro report table2 --metrics {input} --outdated-corpus {params.outdated} --out {output.csv} {params.tracking} > {log} 2>&1"


rule table3:
    """Table 3: entity translation."""
    input:
        metrics(TABLE3_TASKS, EVAL["open_set_systems"]),
    output:
        csv=report("results/tables/table3.csv", category="Tables", caption="../report/table3.rst"),
        md="results/tables/table3.md",
    log:
        "logs/report/table3.log",
    conda:
        "../envs/report.yaml"
    params:
        tracking=tracking_args,
    shell:
        "npm-repro report table3 --metrics {input} --out {output.csv} {params.tracking} > {log} 2>&1"


rule table4:
    """Table 4: queries per second and accuracy per system, from the evaluation runs."""
    input:
        speed_metrics(),
    output:
        csv=report("results/tables/table4.csv", category="Tables", caption="../report/table4.rst"),
        md="results/tables/table4.md",
    log:
        "logs/report/table4.log",
    conda:
        "../envs/report.yaml"
    params:
        tracking=tracking_args,
    shell:
        "npm-repro report table4 --metrics {input} --out {output.csv} {params.tracking} > {log} 2>&1"


rule table8:
    """Table 8: knowledge tasks (LAMA T-REx / Google-RE with UHN and Hard, KAMEL, TriviaQA, NQ)."""
    input:
        metrics(TABLE8_TASKS, EVAL["open_set_systems"]),
    output:
        csv=report("results/tables/table8.csv", category="Tables", caption="../report/table8.rst"),
        md="results/tables/table8.md",
    log:
        "logs/report/table8.log",
    conda:
        "../envs/report.yaml"
    params:
        tracking=tracking_args,
    shell:
        "npm-repro report table8 --metrics {input} --out {output.csv} {params.tracking} > {log} 2>&1"


rule figure6:
    """Figure 6: accuracy against parameters (log x), closed- and open-set averages."""
    input:
        metrics(EVAL["closed_set_tasks"], EVAL["closed_set_systems"]) + metrics(TABLE8_TASKS, EVAL["open_set_systems"]),
    output:
        pdf=report("results/figures/figure6.pdf", category="Figures", caption="../report/figure6.rst"),
        png=report("results/figures/figure6.png", category="Figures", caption="../report/figure6.rst"),
    log:
        "logs/report/figure6.log",
    conda:
        "../envs/report.yaml"
    shell:
        "npm-repro report figure6 --metrics {input} --out {output.pdf} > {log} 2>&1"


rule figure7:
    """Figure 7: the corpus-size ablation (config `ablation`)."""
    input:
        figure7_metrics(),
    output:
        pdf=report("results/figures/figure7.pdf", category="Figures", caption="../report/figure7.rst"),
        png=report("results/figures/figure7.png", category="Figures", caption="../report/figure7.rst"),
    log:
        "logs/report/figure7.log",
    conda:
        "../envs/report.yaml"
    shell:
        "npm-repro report figure7 --metrics {input} --out {output.pdf} > {log} 2>&1"


rule figure8:
    """Figure 8: exact match by the number of subword splits of the answer (knowledge tasks)."""
    input:
        predictions=[
            p.replace("results/metrics", "results/predictions").replace(".json", ".jsonl")
            for p in metrics(TABLE8_TASKS, EVAL["open_set_systems"])
        ],
        tokenizer=TOKENIZER_INPUT,
    output:
        pdf=report("results/figures/figure8.pdf", category="Figures", caption="../report/figure8.rst"),
        png=report("results/figures/figure8.png", category="Figures", caption="../report/figure8.rst"),
    log:
        "logs/report/figure8.log",
    conda:
        "../envs/report.yaml"
    params:
        tokenizer=TOKENIZER,
    shell:
        "npm-repro report figure8 --predictions {input.predictions} --tokenizer {params.tokenizer:q} --out {output.pdf} > {log} 2>&1"


rule check_paper:
    """OK / FAIL / not run per cell of the paper's Tables 1, 2, 3 and 8 (`npm-repro check --paper`,
    npm/report/expected/paper.yaml; docs/expected-numbers.md), after the tables those cells appear in. The report is
    the result: FAIL cells do not fail the rule (--report-only), since a cell off the paper is a finding to read
    beside the others, and a failed rule would lose the report; `npm-repro check --paper` run by hand exits 1 on any
    FAIL. A bad expected-numbers file still fails the rule."""
    input:
        expand("results/tables/table{n}.csv", n=[1, 2, 3, 8]),
    output:
        "results/check/paper.txt",
    log:
        "logs/report/check_paper.log",
    conda:
        "../envs/report.yaml"
    shell:
        "npm-repro check --paper --report-only --metrics-root results/metrics > {output} 2> {log}; cat {output}"


rule resolved_config:
    """The configuration this run used (config file + schema defaults), with the git commit, for the report."""
    output:
        report("results/config.yaml", category="Configuration", caption="../report/config.rst"),
    log:
        "logs/report/config.log",
    conda:
        "../envs/report.yaml"
    params:
        config=config,
    script:
        "../scripts/write_config.py"
