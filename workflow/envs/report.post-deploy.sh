#!/bin/sh
# Post-deploy script of workflow/envs/report.yaml. Under `--sdm conda`, Snakemake runs it once, right after creating
# the env: with the env activated, from a copy under the conda prefix, in Snakemake's working directory. It installs
# the npm-repro package (the rules' `npm-repro` entry point) from the checkout whose Snakefile runs (NPM_REPRO_ROOT,
# set by the Snakefile; else the working directory): editable, so that the env runs that checkout's code (Snakemake
# rebuilds an env only when its yaml or this script changes), and with --no-deps, so that the env keeps its pins.
set -eu
root="${NPM_REPRO_ROOT:-$(pwd)}"
if ! grep -qs '^name = "npm-repro"$' "$root/pyproject.toml"; then
    echo "post-deploy of report.yaml: $root is no npm-repro checkout (no pyproject.toml naming npm-repro);" \
        "start Snakemake with the repository's Snakefile, or set NPM_REPRO_ROOT to the checkout" >&2
    exit 1
fi
python -m pip install --no-deps --editable "$root"
