"""Which snakemake run is working in a folder, for the Snakefile's start-up check.

Snakemake's own lock refuses a second run in the same working directory, but after the first run has marked its
running jobs' outputs incomplete, so the second one reads "IncompleteFilesException ... --rerun-incomplete" (advice
that would corrupt the running jobs) or "LockException", never that another run is at work. The Snakefile records
the main process of a run in ``RUN_FILE`` (``record_run`` in ``onstart``, ``forget_run`` in ``onsuccess`` /
``onerror``; a dry run records nothing) and, before building its DAG, a run stops with ``busy_message`` when that
file names another live process on this host. A file left by a killed run names a dead process (or a pid since
reused by another process, told apart by its start time) and is ignored.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from npm.io import read_yaml

RUN_FILE = Path(".snakemake") / "npm-run.json"  # relative to the working directory (--directory)


def _started(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux /proc); None where unknown."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int, started: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return started is None or _started(pid) in (None, started)


def record_run(path: str | os.PathLike = RUN_FILE) -> None:
    """Record this process as the run working in the folder (pid, host, start, command line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": _started(os.getpid()),
              "start": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": sys.argv}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def forget_run(path: str | os.PathLike = RUN_FILE) -> None:
    """Remove the record if it is this process's."""
    path = Path(path)
    if (other_run(path, include_self=True) or {}).get("pid") == os.getpid():
        path.unlink(missing_ok=True)


def other_run(path: str | os.PathLike = RUN_FILE, include_self: bool = False) -> dict | None:
    """The record of a live run of this host working in the folder, other than this process (unless
    ``include_self``); None when there is none (no file, an unreadable one, a dead process, another host)."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
        pid = int(record["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if record.get("host") != socket.gethostname() or (pid == os.getpid() and not include_self):
        return None
    return record if _alive(pid, record.get("started")) else None


def busy_message(record: dict, folder: str | os.PathLike) -> str:
    command = " ".join(map(str, record.get("command") or [])) or "snakemake"
    return (f"another snakemake run (pid {record['pid']}, started {record.get('start', '?')}: {command}) is working "
            f"in {Path(folder).resolve()}; wait for it to finish or stop it (kill {record['pid']}), then run again. "
            "Do not --unlock or --rerun-incomplete while it runs: that would redo the jobs it is running")


# ------------------------------------------------------------------------------------------- config files on the line
# Snakemake parses every --configfile before any workflow code runs, and a YAML error there reads only "Config file is
# not valid JSON or YAML" (no file, no line). The workflow profiles (profiles/default, which Snakemake uses by itself
# in this checkout, and profiles/slurm) run check_configfiles while Snakemake reads them, which is earlier.
def configfiles(argv: list[str]) -> list[str]:
    """The files that ``--configfile`` / ``--configfiles`` name on a snakemake command line."""
    found, taking = [], False
    for arg in argv[1:]:
        option, eq, value = arg.partition("=")
        if option in ("--configfile", "--configfiles"):
            taking = not eq
            found += [value] if eq else []
        elif arg.startswith("-"):
            taking = False
        elif taking:
            found.append(arg)
    return found


CONFIG_SUFFIXES = (".yaml", ".yml", ".json")  # a word with one of these after --configfile is meant as a config file


def check_configfiles(argv: list[str], *more: str) -> None:
    """Stop with one line at the first word of the command line's ``--configfile`` that is not a config file: a
    missing ``*.yaml`` / ``*.yml`` / ``*.json`` (a typo), or a target typed after ``--configfile``, which takes every
    word after it (a missing path or a folder: Snakemake would end in a FileNotFoundError traceback; an existing
    output such as a CSV table, which is no YAML mapping: "Config file must be given as JSON or YAML with keys at top
    level"); else at the first of those and of ``more`` that is not valid YAML (naming its file, line and column)."""
    for path in configfiles(argv):
        meant = Path(path).suffix.lower() in CONFIG_SUFFIXES
        if not Path(path).exists() and meant:
            _stop(f"config file {path} (--configfile) does not exist; check its path")
        what = _not_a_config(path, meant)
        if what and meant:  # a *.yaml that is no mapping (a list, a bare value, nothing)
            _stop(f"config file {path} (--configfile) {what.removeprefix('is not one: it ')}; a config file maps keys "
                  "(sources:, models:, ...) to values")
        if what:
            _stop(f"snakemake read {path} as a config file (--configfile takes every word after it), and it {what}: "
                  "put the targets before --configfile (snakemake [options] TARGET... --configfile FILE)")
    for path in [*configfiles(argv), *more]:
        if Path(path).is_file():
            try:
                read_yaml(path)
            except ValueError as e:
                _stop(str(e))


def _not_a_config(path: str, meant: bool) -> str | None:
    """Why ``path``, a word after --configfile, is not a config file ("does not exist", "is a folder", "is not one:
    ..."); None when it is one, or when it is ``meant`` as one (a YAML error is then reported with its line)."""
    if not Path(path).exists():
        return "does not exist"
    if Path(path).is_dir():
        return "is a folder"
    try:
        data = read_yaml(path)
    except ValueError:
        return None if meant else "is not one: it is not YAML"
    if isinstance(data, dict):
        return None
    return f"is not one: it holds {'nothing' if data is None else 'no YAML keys at its top level'}"


def _stop(message: str) -> None:
    print(f"npm-repro: error: {message}", file=sys.stderr)
    sys.exit(1)


# ------------------------------------------------------------------------------------------------------ the container
def container_problem(image: str, with_conda: bool) -> str | None:
    """Why `--sdm apptainer` cannot run with ``image`` (config `container`), or None."""
    if with_conda:
        return ("--sdm conda apptainer expects the rules' conda envs inside the image, and the Dockerfile's image "
                "holds the package instead: use --sdm apptainer alone (or --sdm conda without apptainer)")
    if "://" not in image and not Path(image).is_file():
        return (f"config container: the Apptainer image {image} does not exist in {Path.cwd()}: build it from the "
                "Dockerfile (docker build -t npm-repro:0.1.0 . && apptainer build npm-repro.sif "
                "docker-daemon://npm-repro:0.1.0) or set `container` to a docker:// URI of a pushed image")
    return None
