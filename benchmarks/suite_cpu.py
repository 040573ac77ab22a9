"""Benchmark: where `make test`'s CPU goes, per Python process, test file and command.

The suite is CPU-bound on two cores (docs/demo-timings.md), so its wall time follows its CPU time, and most of that
CPU is spent in processes the tests start (workflow jobs, `npm-repro` commands, Lucene indexers), which junit's
per-test times do not show. This runs pytest (by default `make test`'s command) with a ``sitecustomize`` module on
PYTHONPATH that makes every Python process append, as it exits, one JSON line: its pid, parent, user and system CPU,
its command line, the xdist worker and the test that was running when it started (``PYTEST_CURRENT_TEST``, which a
test's child processes inherit). It then sums the lines by test file and by command, next to the CPU of everything
pytest started (Python or not: Lucene's JVM threads run inside Python processes; a process killed by a signal or
ending in ``os._exit`` writes no line), and writes results/benchmarks/suite-cpu.json. It measures; it asserts
nothing.

    .venv/bin/python benchmarks/suite_cpu.py [--out results/benchmarks/suite-cpu.json] [-- PYTEST ARGS]

Run it alone on the machine (the suite takes 20-40 minutes on 2 cores); `-- tests/test_bm25.py` measures one file.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTEST_ARGS = ["-q", "-ra", "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]  # the Makefile's `make test`
LOG_ENV = "NPM_SUITE_CPU_LOG"
# Imported by every Python process whose PYTHONPATH holds its folder: one JSON line per process at exit.
SITECUSTOMIZE = f'''
import atexit, json, os, resource, sys

def _npm_suite_cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    line = json.dumps({{"pid": os.getpid(), "ppid": os.getppid(), "user": usage.ru_utime, "sys": usage.ru_stime,
                       "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
                       "test": os.environ.get("PYTEST_CURRENT_TEST", ""), "argv": sys.argv}})
    with open(os.environ["{LOG_ENV}"], "a", encoding="utf-8") as f:
        f.write(line + "\\n")

if os.environ.get("{LOG_ENV}"):
    atexit.register(_npm_suite_cpu)
'''


def command_of(argv: list[str]) -> str:
    """A process's command, grouped: `npm-repro` with its leading subcommand words (and `--step`), `python -c`
    (pytest-xdist's workers, helpers), or the script's name (a module run with ``-m`` has its file there; a
    package's ``__main__.py`` is named by its package)."""
    if not argv:
        return "python"
    if argv[0] == "-c":
        return "python -c (pytest workers, helpers)"
    path = Path(argv[0])
    name = path.parent.name if path.name == "__main__.py" else path.name
    if name != "npm-repro":
        return name
    words = []
    for word in argv[1:3]:
        if word.startswith("-"):
            break
        words.append(word)
    if "--step" in argv[:-1]:
        words.append(f"--step {argv[argv.index('--step') + 1]}")
    return " ".join(["npm-repro", *words])


def summarise(records: list[dict], children_cpu: float | None = None) -> dict:
    """CPU seconds (user + system) by test file and by command, the processes counted, and the share of all of
    pytest's CPU (``children_cpu``) that the records account for."""
    by_file: dict[str, float] = defaultdict(float)
    by_command: dict[str, list] = defaultdict(lambda: [0, 0.0])
    total = 0.0
    for r in records:
        cpu = float(r["user"]) + float(r["sys"])
        total += cpu
        by_file[r["test"].split("::")[0] or "(pytest's own processes: in-process tests, collection)"] += cpu
        entry = by_command[command_of(list(r["argv"]))]
        entry[0] += 1
        entry[1] += cpu
    order = sorted(by_file.items(), key=lambda kv: -kv[1])
    return {"processes": len(records), "python_cpu_s": round(total, 1),
            "all_cpu_s": None if children_cpu is None else round(children_cpu, 1),
            "by_file": {k: round(v, 1) for k, v in order},
            "by_command": {k: {"processes": n, "cpu_s": round(c, 1)}
                           for k, (n, c) in sorted(by_command.items(), key=lambda kv: -kv[1][1])}}


def run_accounted(cmd: list[str], log: Path, cwd: Path = ROOT) -> tuple[int, float, float]:
    """Run ``cmd`` with every Python process under it logging its CPU to ``log``; ``(returncode, wall seconds, CPU
    seconds of all its processes)``."""
    with tempfile.TemporaryDirectory(prefix="suite-cpu.") as folder:
        (Path(folder) / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
        env = {**os.environ, LOG_ENV: str(log),
               "PYTHONPATH": os.pathsep.join(p for p in (folder, os.environ.get("PYTHONPATH")) if p)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        code = subprocess.run(cmd, cwd=cwd, env=env).returncode
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return code, wall, cpu


def read_log(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/benchmarks/suite-cpu.json", help="where the summary is written")
    parser.add_argument("--top", type=int, default=20, help="rows printed per table (the JSON keeps them all)")
    parser.add_argument("pytest_args", nargs="*", help="after `--`: pytest's arguments (default: make test's)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="suite-cpu-log.") as folder:
        log = Path(folder) / "processes.jsonl"
        log.touch()
        cmd = [sys.executable, "-m", "pytest", *(args.pytest_args or PYTEST_ARGS)]
        code, wall, cpu = run_accounted(cmd, log)
        summary = summarise(read_log(log), cpu)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    summary.update({"command": cmd[2:], "pytest_exit": code, "wall_s": round(wall, 1), "commit": commit,
                    "cores": len(os.sched_getaffinity(0))})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(f"pytest exit {code}, {wall / 60:.1f} min wall, {cpu / 60:.1f} CPU-min in all, "
          f"{summary['python_cpu_s'] / 60:.1f} of them in {summary['processes']} Python processes logged")
    for title, rows in (("test file", summary["by_file"]),
                        ("command", {k: v["cpu_s"] for k, v in summary["by_command"].items()})):
        print(f"\n| {title} | CPU s | share |\n|---|---|---|")
        for key, value in list(rows.items())[:args.top]:
            print(f"| {key} | {value:.0f} | {value / max(cpu, 1e-9):.1%} |")
    print(f"\nwritten: {out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
