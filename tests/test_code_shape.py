"""The shape of the package's code (issue 44): no function in npm/ is longer than a screen, MAX_LINES lines from its
``def`` to its last line (a method or a nested function counts on its own, and inside the function around it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80


def _function_lengths() -> dict[str, int]:
    """{``path::qualified name``: lines} of every function and method of the modules in npm/."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lengths[f"{where}::{name}"] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.", where)
            else:
                visit(child, prefix, where)

    for path in sorted((ROOT / "npm").rglob("*.py")):
        visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), "", path.relative_to(ROOT).as_posix())
    return lengths


def test_no_function_in_npm_is_longer_than_a_screen():
    too_long = {name: n for name, n in _function_lengths().items() if n > MAX_LINES}
    assert not too_long, f"functions over {MAX_LINES} lines (split them into named steps): {too_long}"


# ---- one home per default (issue 44): a keyword default that repeats a settings field. Read the settings object
# (``ratio: float = MaskingSettings.ratio``) or make the parameter required; one that only shares a field's name (a
# metric's ``seed`` is not the training seed) takes a name that says what it is.

def _settings_defaults() -> dict[str, list]:
    """{field name: its defaults} over every settings dataclass of npm/settings.py (a ``Section``); None is left out
    (a None default says "not given", it repeats no value)."""
    import dataclasses
    import inspect

    import npm.settings

    defaults: dict[str, list] = {}
    for cls in vars(npm.settings).values():
        if inspect.isclass(cls) and issubclass(cls, npm.settings.Section) and cls is not npm.settings.Section:
            for f in dataclasses.fields(cls):
                if f.default is not dataclasses.MISSING and f.default is not None:
                    defaults.setdefault(f.name, []).append(f.default)
    return defaults


def _same(value, default) -> bool:
    return value == default and isinstance(value, bool) == isinstance(default, bool)


def _repeated_defaults() -> set[str]:
    """``path::function::parameter`` of every parameter in npm/ named as a settings field whose default is a literal
    equal to that field's default: a second home of the default, free to drift from the first."""
    defaults = _settings_defaults()
    found = set()
    for path in sorted((ROOT / "npm").rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults, strict=True))
            pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
            for arg, node_default in pairs:
                if arg.arg not in defaults:
                    continue
                try:
                    value = ast.literal_eval(node_default)
                except ValueError:
                    continue  # not a literal: e.g. Settings.k, which reads the one home
                if any(_same(value, d) for d in defaults[arg.arg]):
                    found.add(f"{where}::{getattr(node, 'name', '<lambda>')}::{arg.arg}")
    return found


def test_no_keyword_default_repeats_a_settings_field():
    repeats = sorted(_repeated_defaults())
    assert not repeats, (f"{len(repeats)} keyword defaults repeat a settings field's default (npm/settings.py): make "
                         f"them required or read the settings object: {repeats}")

