"""docs/paper-map.md stays true: every function it names exists and every test it names is defined."""

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAP = (ROOT / "docs" / "paper-map.md").read_text(encoding="utf-8")


def _resolve(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_every_named_function_exists():
    names = sorted(set(re.findall(r"`(npm(?:\.[A-Za-z_]\w*)+)", MAP)))
    assert len(names) > 100
    missing = []
    for name in names:
        try:
            _resolve(name)
        except (ImportError, AttributeError):
            missing.append(name)
    assert not missing, missing


def test_every_named_test_exists():
    tests = sorted(set(re.findall(r"tests/(test_\w+)\.py::(\w+)", MAP)))
    assert len(tests) > 100
    missing = [f"{f}::{t}" for f, t in tests
               if not re.search(rf"^def {t}\b", (ROOT / "tests" / f"{f}.py").read_text(), flags=re.M)]
    assert not missing, missing


def test_every_cited_section_is_in_the_map():
    anchors = set(re.findall(r'^#+ (?:<a id="[^"]*"></a>)?(§[\w.]+)', MAP, flags=re.M))  # "### <a id=..></a>§D1.3"
    cited = set()
    for path in [*ROOT.glob("npm/**/*.py"), *ROOT.glob("workflow/rules/*.smk"), ROOT / "Snakefile"]:
        cited.update(re.findall(r"paper-map (§[A-Z]?\d+(?:\.\d+)*)", path.read_text(encoding="utf-8")))
    assert cited and cited <= anchors, sorted(cited - anchors)
