"""The shape of the package's code (issue 44): no function in npm/ is longer than a screen, MAX_LINES lines from its
``def`` to its last line (a method or a nested function counts on its own, and inside the function around it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80

# Functions still longer than MAX_LINES, each waiting for its own split (issue 44; other work owns these files). Only
# what is still too long may stay here: an entry whose function is split (or gone) fails the second test, so the list
# cannot go stale. Do not add to it: split the function.
PENDING = {
    "npm/datastore/embed.py::_embed_rows",
    "npm/datastore/faiss_index.py::build_faiss_index",
}


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
    too_long = {name: n for name, n in _function_lengths().items() if n > MAX_LINES and name not in PENDING}
    assert not too_long, f"functions over {MAX_LINES} lines (split them into named steps): {too_long}"


def test_the_pending_list_names_only_functions_still_too_long():
    lengths = _function_lengths()
    stale = sorted(name for name in PENDING if lengths.get(name, 0) <= MAX_LINES)
    assert not stale, f"{stale} are no longer over {MAX_LINES} lines (or gone): remove them from PENDING"
