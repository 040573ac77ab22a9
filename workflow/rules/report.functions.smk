# Input functions and names of the rules in report.smk (included at its top), out of its rules for `snakemake --lint`.
# The configured tasks of each table (config/tasks.yaml `report`), in the config's order.
TABLE8_TASKS = [t for t in EVAL["open_set_tasks"] if TASKS[t]["report"]["table"] == "table8"]
TABLE3_TASKS = [t for t in EVAL["open_set_tasks"] if TASKS[t]["report"]["table"] == "table3"]


def speed_metrics():
    s = EVAL["speed"]
    files = []
    if s["closed_set_task"] in EVAL["closed_set_tasks"]:
        files += metrics([s["closed_set_task"]], EVAL["closed_set_systems"])
    if s["open_set_task"] in EVAL["open_set_tasks"]:
        files += metrics([s["open_set_task"]], EVAL["open_set_systems"])
    return files


def report_targets():
    """Every table and figure of the report (rule report), with REPLUG's (rule replug_report) and DensePhrases'
    (rule densephrases_report) when config has their sections."""
    tables = ["table1", "table2", "table3", "table4", "table8"] + (["replug_lm"] if config.get("replug") else [])
    tables += ["densephrases"] if DP else []
    figures = ["figure6", "figure7", "figure8"] + (["replug_k"] if config.get("replug") else [])
    return [f"results/tables/{t}.csv" for t in tables] + [f"results/figures/{f}.pdf" for f in figures]
