"""Conda envs: every rule names one, every package is pinned, and pins agree with pyproject.toml."""

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent


def pyproject_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return dict(r.split("==") for r in reqs)


def test_every_pyproject_dependency_is_pinned_exactly():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for req in project["dependencies"]:
        assert re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][0-9A-Za-z.+]*", req), req


def test_env_files_pin_every_package_to_pyproject_version():
    pins = pyproject_pins()
    envs = sorted((ROOT / "workflow" / "envs").glob("*.yaml"))
    assert {e.stem for e in envs} >= {"data", "train", "embed", "bm25", "eval", "report"}
    for env in envs:
        for dep in yaml.safe_load(env.read_text())["dependencies"]:
            for req in dep["pip"] if isinstance(dep, dict) else []:
                name, _, version = req.partition("==")
                assert version, f"{env.name}: {req} is not pinned"
                assert pins.get(name) == version, f"{env.name}: {req} disagrees with pyproject.toml ({pins.get(name)})"


def test_every_rule_names_a_conda_env():
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        text = smk.read_text()
        rules = re.findall(r"^rule (\w+):", text, flags=re.M)
        blocks = re.split(r"^rule \w+:", text, flags=re.M)[1:]
        for rule, block in zip(rules, blocks, strict=True):
            assert "conda:" in block, f"{smk.name}: rule {rule} has no conda: directive"
