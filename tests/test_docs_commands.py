"""Every command the documentation shows works as written (issue 40).

The commands are read from README.md, docs/*.md, config/README.md and profiles/README.md: every line of a fenced
``bash`` / ``sh`` / ``shell`` / ``console`` block, the lines of an unlabelled block that start with a known program, and
every inline `code` span that starts with one (continuation lines joined, ``# comments`` dropped, ``VAR=value``
prefixes kept as the command's environment). A command added to the docs is checked without editing this file:

* ``npm-repro ...`` (any prefix: ``.venv/bin/``): ``npm-repro SUBCOMMAND... --help`` exits 0 and lists every
  ``--option`` the command uses (a renamed flag in the docs fails);
* ``python SCRIPT ...`` (or ``-m MODULE``): the same with its ``--help``;
* ``snakemake ...``: a dry run (``-n``; ``--cores 1`` where neither cores nor a profile is given;
  ``NPM_SLURM_SOFTWARE=venv`` where conda is missing) in a copy of the checkout's files, which must exit 0 (a dry run
  writes only ``.snakemake/`` metadata); commands equal after that normalisation run once;
* any other program must be in ``SKIP`` with the reason it cannot be checked here, else the test fails.

Python snippets (```python blocks) are compiled, and every ``npm`` module and attribute they import or use must
exist; marked slow, each then runs in the finished run of .test/config that tests/test_workflow.py checks (one
session fixture, tests/conftest.py's ``embedded_test_run``).
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workflow_api import ROOT

BIN = Path(sys.executable).parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "config" / "README.md",
        ROOT / "profiles" / "README.md"]
SHELL_BLOCKS = {"bash", "sh", "shell", "console"}
CHECKED = {"snakemake", "npm-repro", "python"}
# Programs (or a program with one option) that cannot be checked here, with the reason.
SKIP = {
    "make": "make demo / make test run the whole workflow or the whole suite (20+ minutes); the suite itself is "
            "make test, and tests/test_workflow.py runs the workflow",
    "snakemake --report": "needs a finished workflow's results (make demo writes the report)",
    "snakemake --containerize": "reads every rule's env through conda, which this machine lacks; docs/paper-scale.md "
                                "names it only to say what --sdm conda apptainer would expect",
    "wandb": "needs a W&B account and the network (wandb login / wandb sync)",
    "docker": "no Docker engine or base image here (docs/paper-scale.md section 8)",
    "apptainer": "no Apptainer here; the image is built from the Dockerfile (tests/test_container.py)",
    "hf": "downloads from the Hugging Face hub (no network here)",
    "srun": "needs a SLURM allocation (tests/test_slurm.py runs the profile on a live SLURM)",
    "sbatch": "needs a SLURM cluster",
}
COMMAND_START = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S+\s+)*(?:\.venv/bin/)?(" + "|".join(
    map(re.escape, sorted({*CHECKED, *(key.split()[0] for key in SKIP)}, key=len, reverse=True))) + r")(?:\s|$)")


# ------------------------------------------------------------------------------------------------ extraction
def _join_and_strip(lines: list[str]) -> list[str]:
    """Lines of shell: continuation lines joined, comments and blank lines dropped."""
    commands, current = [], ""
    for line in lines:
        line = _strip_comment(line).rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            commands.append(" ".join(current.split()))
        current = ""
    return commands


def _strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a # outside quotes, at the start or after a space)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def doc_commands(path: Path) -> list[tuple[str, str]]:
    """(where, command) of every shell command shown in the Markdown file ``path``."""
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(ROOT)
    found, prose = [], []
    fence = re.compile(r"^(\s*)```(\w*)\s*$")
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = fence.match(lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        start, lang, block = i + 1, m.group(2).lower(), []
        i += 1
        while i < len(lines) and not fence.match(lines[i]):
            block.append(lines[i])
            i += 1
        prose += [""] * (i - start + 2)
        i += 1
        if lang in SHELL_BLOCKS:
            found += [(f"{rel}:{start}", cmd) for cmd in _join_and_strip(block)]
        elif lang == "":
            found += [(f"{rel}:{start}", cmd) for cmd in _join_and_strip(block) if COMMAND_START.match(cmd)]
    # Inline code spans of the prose (a span may run over a line break).
    body = "\n".join(prose)
    for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", body):
        span = " ".join(m.group(1).replace("\\|", "|").split())
        if COMMAND_START.match(span):
            found.append((f"{rel}:{body.count(chr(10), 0, m.start()) + 1}", span))
    return found


def python_snippets(path: Path) -> list[tuple[str, str]]:
    text = path.read_text(encoding="utf-8")
    found = []
    for m in re.finditer(r"^([ \t]*)```python[ \t]*\n(.*?)^[ \t]*```", text, re.M | re.S):
        indent = len(m.group(1))
        code = "\n".join(line[indent:] for line in m.group(2).splitlines())
        found.append((f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 2}", code))
    return found


ALL = [item for path in DOCS for item in doc_commands(path)]
SNIPPETS = [item for path in DOCS for item in python_snippets(path)]


# ------------------------------------------------------------------------------------------------ parsing
def split(command: str) -> tuple[dict[str, str], list[str]]:
    """(environment assignments, argv) of a documented command; a placeholder such as `<cpu partition>` becomes one
    word (CPU_PARTITION) and `...` (an elided part) is dropped. A line that only assigns a shell variable
    (`head=$(scontrol ...)`) has no argv."""
    if re.match(r"^[A-Za-z_]\w*=(\$\(.*\)|\S*)$", command):
        return {}, []
    words = shlex.split(re.sub(r"<([a-z][a-z ]*)>", lambda m: m.group(1).replace(" ", "_").upper(), command))
    env = {}
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, [w for w in words if w != "..."]


def program(argv: list[str]) -> str:
    """The program a command runs; `... -m npm.cli ARGS` (srun, torchrun, python) runs npm-repro."""
    if "npm.cli" in argv and argv[argv.index("npm.cli") - 1] == "-m":
        return "npm-repro"
    return Path(argv[0]).name if argv else ""


def skip_reason(argv: list[str]) -> str | None:
    name = program(argv)
    for key, reason in SKIP.items():
        prog, _, option = key.partition(" ")
        if name == prog and (not option or option in argv):
            return reason
    return None


def long_options(words: list[str]) -> set[str]:
    return {w.split("=")[0] for w in words if re.match(r"^--[a-z]", w)}


def npm_repro_commands() -> dict[tuple[str, ...], tuple[set[str], list[str]]]:
    """Subcommand path -> (the --options the docs use with it, where). `A / B / C` (alternatives in a table) are each
    checked: `npm-repro replug texts / queries` is `replug texts` and `replug queries`."""
    import argparse

    from npm.cli import build_parser

    top = build_parser()

    def subcommand(words):
        parser, path = top, []
        for word in words:
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            if not subs or word not in subs[0].choices:
                break
            parser, path = subs[0].choices[word], [*path, word]
        return tuple(path)

    found: dict[tuple[str, ...], tuple[set[str], list[str]]] = {}
    for where, command in ALL:
        argv = split(command)[1]
        if not argv or program(argv) != "npm-repro":
            continue
        args = argv[argv.index("npm.cli") + 1:] if "npm.cli" in argv else argv[1:]
        alternatives = " ".join(args).split(" / ")
        first = alternatives[0].split()
        paths = [subcommand(first)] + [subcommand(first[:len(subcommand(first)) - 1] + alt.split())
                                       for alt in alternatives[1:]]
        for path in paths:
            options, wheres = found.setdefault(path, (set(), []))
            options |= long_options(args) if path == paths[0] else set()
            wheres.append(where)
    return found


def python_scripts() -> dict[str, tuple[set[str], list[str]]]:
    """`python SCRIPT` or `python -m MODULE` -> (the --options the docs use with it, where)."""
    found: dict[str, tuple[set[str], list[str]]] = {}
    for where, command in ALL:
        argv = split(command)[1]
        if argv and program(argv) == "python":
            n = 3 if argv[1] == "-m" else 2
            options, wheres = found.setdefault(" ".join(argv[1:n]), (set(), []))
            options |= long_options(argv[n:])
            wheres.append(where)
    return found


DRY = ("-n", "--dry-run", "--dryrun")


def snakemake_runs() -> dict[tuple, list[str]]:
    """(argv after `snakemake`, environment) of each dry run, normalised (-n first, --cores 1 where no cores or
    profile is given) -> the places that show it."""
    found: dict[tuple, list[str]] = {}
    for where, command in ALL:
        env, argv = split(command)
        if not argv or program(argv) != "snakemake" or skip_reason(argv):
            continue
        args = [a for a in argv[1:] if a not in DRY]
        given = {a.split("=")[0] for a in args}
        cores = [] if given & {"--cores", "-c", "--jobs", "-j", "--profile", "--workflow-profile"} else ["--cores", "1"]
        found.setdefault((tuple(["-n", *cores, *args]), tuple(sorted(env.items()))), []).append(where)
    return found


def test_the_docs_show_commands_and_each_is_checked_or_skipped_with_a_reason():
    assert len(ALL) > 40 and len({c for _, c in ALL}) > 30, ALL
    assert {"snakemake", "npm-repro"} <= {program(split(c)[1]) for _, c in ALL}
    unknown = [(where, c) for where, c in ALL
               if split(c)[1] and program(split(c)[1]) not in CHECKED and not skip_reason(split(c)[1])]
    assert not unknown, f"commands of a program this test neither checks nor skips with a reason: {unknown}"
    # The README's two routes are among the dry runs.
    runs = {" ".join(args) for args, _ in snakemake_runs()}
    assert "-n --profile slurm results/check/paper.txt --configfile config/released.yaml" in runs, runs


# ------------------------------------------------------------------------------------------------ npm-repro, scripts
NPM_REPRO = npm_repro_commands()


@pytest.mark.parametrize("path", sorted(NPM_REPRO), ids=lambda path: " ".join(path) or "npm-repro")
def test_each_npm_repro_command_shown_exists_with_its_options(path):
    options, wheres = NPM_REPRO[path]
    out = subprocess.run([str(BIN / "npm-repro"), *path, "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, (wheres, out.stderr[-2000:])
    assert f"usage: npm-repro {' '.join(path)}".rstrip() in " ".join(out.stdout.split()), (wheres, out.stdout[:500])
    missing = sorted(o for o in options if not re.search(rf"{re.escape(o)}\b(?!-)", out.stdout))
    assert not missing, f"{' '.join(['npm-repro', *path])} has no option {missing} (shown in {wheres})"


PYTHON_SCRIPTS = python_scripts()


@pytest.mark.parametrize("script", sorted(PYTHON_SCRIPTS))
def test_each_python_script_shown_exists_with_its_options(script):
    options, wheres = PYTHON_SCRIPTS[script]
    out = subprocess.run([sys.executable, *script.split(), "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, (wheres, out.stderr[-2000:])
    missing = sorted(o for o in options if not re.search(rf"{re.escape(o)}\b(?!-)", out.stdout))
    assert not missing, f"{script} has no option {missing} (shown in {wheres})"


# ------------------------------------------------------------------------------------------------ snakemake
SNAKEMAKE_RUNS = snakemake_runs()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the checkout's files (tracked and not ignored, as they are now): no data/ or results/ of earlier runs,
    so that each dry run plans its whole DAG; the `slurm` symlink stays a symlink."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    copy = tmp_path_factory.mktemp("checkout")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_symlink() or source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name, follow_symlinks=False)
    return copy


def written(folder: Path) -> set[str]:
    """Every file under ``folder`` except Snakemake's metadata (.snakemake/ folders)."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if ".snakemake" not in p.parts and not p.is_dir()}


@pytest.mark.parametrize("run", sorted(SNAKEMAKE_RUNS), ids=lambda run: " ".join(run[0][1:]))
def test_each_snakemake_command_shown_dry_runs(run, checkout):
    """`snakemake -n ...` as the docs show it exits 0 and writes nothing but .snakemake/ metadata (the paper routes
    plan about 1,100 jobs each: 10-15 s)."""
    args, env = run
    environment = {**os.environ, "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")]),
                   "WANDB_MODE": "disabled", **dict(env)}
    if "NPM_SLURM_SOFTWARE" not in dict(env) and not shutil.which("conda", path=environment["PATH"]):
        environment["NPM_SLURM_SOFTWARE"] = "venv"  # profiles/slurm: conda envs need conda (profiles/README.md)
    before = written(checkout)
    out = subprocess.run([str(BIN / "snakemake"), *args], capture_output=True, text=True, cwd=checkout,
                         env=environment, timeout=600)
    assert out.returncode == 0, (SNAKEMAKE_RUNS[run], out.stdout[-3000:] + out.stderr[-3000:])
    assert "Traceback" not in out.stdout + out.stderr, out.stderr[-3000:]
    assert written(checkout) == before, (SNAKEMAKE_RUNS[run], sorted(written(checkout) - before)[:20])


# ------------------------------------------------------------------------------------------------ python snippets
def npm_names(code: str) -> list[str]:
    """Every `npm...` module and attribute path a snippet imports or uses (`npm.Predictor.from_config`)."""
    tree = ast.parse(code)
    bound, used = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "npm":
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else "npm"
                    used.append(alias.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "npm":
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                used.append(f"{node.module}.{alias.name}")
    for node in ast.walk(tree):
        chain = []
        while isinstance(node, ast.Attribute):
            chain.insert(0, node.attr)
            node = node.value
        if chain and isinstance(node, ast.Name) and node.id in bound:
            used.append(".".join([bound[node.id], *chain]))
    return list(dict.fromkeys(used))


def resolve(dotted: str):
    """The object of a dotted npm name: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ModuleNotFoundError:
            continue
        for attr in parts[n:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("where,code", SNIPPETS, ids=[where for where, _ in SNIPPETS])
def test_each_python_snippet_compiles_and_its_npm_names_exist(where, code):
    compile(code, where, "exec")
    names = npm_names(code)
    assert names, f"{where}: a snippet that uses nothing of npm"
    for name in names:
        try:
            resolve(name)
        except (ImportError, AttributeError) as e:
            pytest.fail(f"{where}: {name} does not exist ({e})")


@pytest.mark.slow
@pytest.mark.parametrize("where,code", SNIPPETS, ids=[where for where, _ in SNIPPETS])
def test_each_python_snippet_runs_in_a_finished_workflow(where, code, embedded_test_run):
    """The snippets read a finished workflow from its folder (`root="."`, `results(".")`): run each there as written."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=embedded_test_run,
                         env={**os.environ, "WANDB_MODE": "disabled"}, timeout=600)
    assert out.returncode == 0, f"{where}:\n{out.stderr[-3000:]}"
