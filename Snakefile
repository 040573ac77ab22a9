# npm-repro: Nonparametric Masked Language Modeling (Min et al., 2023), end to end.
#   snakemake --cores all                                   # embedded default (config/config.yaml)
#   snakemake --profile slurm results/tables/table1.csv     # paper scale on a SLURM cluster
import os
import sys

from snakemake.utils import min_version, validate

min_version("9.0")

# This checkout, for the conda envs' post-deploy scripts (workflow/envs/*.post-deploy.sh): Snakemake runs them with
# its own environment, from a copy under the conda prefix and in its working directory (--directory), not here.
os.environ.update(NPM_REPRO_ROOT=workflow.basedir)  # set, not read: no `envvars:` needed


# The embedded default, unless --configfile names another (the slurm profile names config/paper.yaml).
# Loading both would deep-merge them, mixing embedded sources into the paper config.
# read_yaml first: a YAML syntax error then names the file, line and column (Snakemake's own message names neither).
if not workflow.config_settings.configfiles:
    from npm.io import read_yaml

    read_yaml(f"{workflow.basedir}/config/config.yaml")

    configfile: f"{workflow.basedir}/config/config.yaml"


validate(config, "config/schema.yaml")


# One run per working directory: a second one stops here, naming the first, before Snakemake's own lock and
# incomplete-file checks (which would advise --unlock / --rerun-incomplete). A dry run is never refused and records
# nothing; cluster jobs (not the main process) skip both (npm.workflow_run).
if workflow.is_main_process:
    from npm.workflow_run import RUN_FILE, busy_message, forget_run, other_run, record_run

    _other = other_run(RUN_FILE)
    if _other and not workflow.output_settings.dryrun:
        print(f"npm-repro: error: {busy_message(_other, '.')}", file=sys.stderr)
        sys.exit(1)
    if _other:
        print(f"npm-repro: note: {busy_message(_other, '.')}", file=sys.stderr)


onstart:
    if workflow.is_main_process:
        record_run(RUN_FILE)


onsuccess:
    if workflow.is_main_process:
        forget_run(RUN_FILE)


onerror:
    if workflow.is_main_process:
        forget_run(RUN_FILE)


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/tasks.smk"
include: "workflow/rules/pretrain.smk"
include: "workflow/rules/corpus.smk"
include: "workflow/rules/index.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/replug.smk"
include: "workflow/rules/densephrases.smk"


report: "workflow/report/workflow.rst"


rule all:
    """Default target: masked batches of every training corpus, the models trained (except a model for which
    config `models` names a released checkpoint), the datastore, FAISS index and BM25 index of every reference
    corpus, every evaluation, and the paper's tables and figures (then `snakemake --report results/report.html`)."""
    input:
        data_targets(),
        expand("results/models/{model}", model=trained_models()),
        retrieval_targets(),
        embedded_task_targets(),
        report_targets(),
        "results/config.yaml",
    default_target: True
