# Tables and figures named after the paper's (reference 7). Entry point comes with the issue "evaluation".


rule make_table1:
    """Table 1: zero-shot closed-set accuracy."""
    input:
        expand(
            "results/metrics/{task}/{system}.json",
            task=config["evaluation"]["closed_set_tasks"],
            system=config["evaluation"]["systems"],
        ),
    output:
        csv=report("results/tables/table1.csv", category="Tables", caption="../report/table1.rst"),
    log:
        "logs/report/table1.log",
    conda:
        "../envs/report.yaml"
    shell:
        "npm-repro report table1 --metrics {input} --out {output.csv} > {log} 2>&1"
