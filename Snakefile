# npm-repro: Nonparametric Masked Language Modeling (Min et al., 2023), end to end.
#   snakemake --cores all                                   # embedded default (config/config.yaml)
#   snakemake --profile slurm results/tables/table1.csv     # paper scale on a SLURM cluster
# The workflow is workflow/Snakefile (the Snakemake workflow catalog's layout); this file only includes it, so that
# `snakemake` in the repository root finds it as before.


include: "workflow/Snakefile"


# An included file's default target does not carry over to the including one: name it again.
workflow.default_target = "all"
