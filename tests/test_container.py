"""The container of `snakemake --sdm apptainer` (Dockerfile, workflow/Snakefile `containerized:`).

No Docker engine or base image is reachable here, so the image is never built in the tests. What can be checked is:
its pins are the project's (pyproject.toml, workflow/envs/gpu-pins.txt, the envs' python and pip, the Makefile's
--no-deps packages), hadolint finds nothing, the build context leaves out the venv and the outputs, and the workflow
stops with one line where the image is missing or where conda is asked for inside it.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import tomllib
import yaml

from tests.test_envs import gpu_pin_lines, pyproject_pins
from tests.workflow_api import ROOT

BIN = Path(sys.executable).parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def env_pins(name: str) -> dict:
    deps = yaml.safe_load((ROOT / "workflow" / "envs" / f"{name}.yaml").read_text())["dependencies"]
    return dict(d.split("==") for d in deps if isinstance(d, str))


def test_base_image_and_pip_are_the_envs():
    env = env_pins("train")
    assert re.search(r"^FROM python:(\S+)-slim-bookworm$", DOCKERFILE, re.M).group(1) == env["python"]
    assert f"pip install pip=={env['pip']}" in DOCKERFILE


def test_requirements_are_pyproject_without_the_cpu_builds(tmp_path):
    """The Dockerfile's own command writes requirements.txt from pyproject.toml: every pin but torch and faiss-cpu,
    whose GPU builds come from gpu-pins.txt. (Inside the shell's double quotes its \\n reaches Python unchanged.)"""
    code = re.search(r'python -c "(.+?)" > requirements.txt', DOCKERFILE).group(1)
    (tmp_path / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    written = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    requirements = dict(line.split("==") for line in written.stdout.split())
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert requirements == {name: version for name, version in (d.split("==") for d in dependencies)
                            if name not in ("torch", "faiss-cpu")}
    assert "COPY pyproject.toml workflow/envs/gpu-pins.txt ./" in DOCKERFILE
    assert "pip install -r gpu-pins.txt" in DOCKERFILE
    gpu = dict(line.split("==") for line in gpu_pin_lines() if "==" in line)
    assert gpu["torch"].split("+")[0] == pyproject_pins()["torch"] and "faiss-gpu" in gpu


def test_no_deps_packages_are_the_makefiles():
    makefile = re.findall(r"pip install --quiet --no-deps (\S+==\S+)", (ROOT / "Makefile").read_text())
    docker = re.search(r"pip install --no-deps ((?:\S+==\S+ ?)+)", DOCKERFILE).group(1).split()
    assert sorted(makefile) == sorted(docker) and makefile


def test_hadolint_is_clean():
    out = subprocess.run([str(BIN / "hadolint"), str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_build_context_leaves_out_the_venv_and_outputs():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv/", "data/", "results/", ".snakemake/"} <= set(ignored)


def test_sdm_apptainer_without_the_image_is_one_line(tmp_path):
    def dry_run(*sdm):
        return subprocess.run([str(BIN / "snakemake"), "-n", "--cores", "1", "-s", str(ROOT / "Snakefile"),
                               "--directory", str(tmp_path), "--sdm", *sdm], capture_output=True, text=True,
                              env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})

    out = dry_run("apptainer")
    assert out.returncode == 1
    assert "npm-repro: error: config container: the Apptainer image npm-repro.sif does not exist" in out.stderr
    assert "docker build" in out.stderr and "Traceback" not in out.stderr
    out = dry_run("conda", "apptainer")
    assert out.returncode == 1 and "use --sdm apptainer alone" in out.stderr
