"""Every rate npm-repro prints says what it counts: no progress bar reads "it/s" (each names its unit), and the rate
lines of evaluate and DensePhrases name what is timed, so that two rates of one task (evaluate's examples/s, Table
4's #Q/sec, DensePhrases' questions/s) can be told apart."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


BARS = {"tqdm", "bar", "progress_bar"}  # tqdm itself and npm.progress.bar (imported as progress_bar or progress.bar)


def _tqdm_calls():
    """(file:line, call) of every progress bar made in npm/: ``tqdm(...)`` and ``npm.progress.bar(...)``."""
    for path in sorted((ROOT / "npm").rglob("*.py")):
        if path.name == "progress.py":  # npm.progress.bar passes its caller's unit= on to tqdm
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            if name in BARS and (name != "bar" or _is_progress(node.func)):
                yield f"{path.relative_to(ROOT)}:{node.lineno}", node


def _is_progress(func) -> bool:
    """``progress.bar`` (npm.progress), not ``ax.bar`` (a matplotlib bar chart)."""
    return isinstance(func, ast.Attribute) and getattr(func.value, "id", None) == "progress"


def test_every_progress_bar_names_its_unit():
    calls = list(_tqdm_calls())
    assert len(calls) >= 10  # the walk finds the bars
    unnamed = [where for where, call in calls if not any(k.arg == "unit" for k in call.keywords)]
    assert not unnamed, f"progress bars without unit= (tqdm prints 'it/s'): {unnamed}"


def _strings(path: str) -> list[str]:
    tree = ast.parse((ROOT / path).read_text())
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_rate_lines_name_what_is_timed():
    """The log lines with a rate say its unit and that loading the model and indexes is not in it."""
    for path, unit in (("npm/evaluation/harness.py", "examples/s"), ("npm/densephrases/cli.py", "questions/s")):
        lines = [s for s in _strings(path) if "/s" in s and "%" in s]
        assert lines and all(unit in s and "load excluded" in s for s in lines), (path, lines)
